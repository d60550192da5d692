//! Mutual TLS between kplug and plugins in tests: certificates from
//! `kplug-apiserver plugin-certs`, files replaced the way the kubelet
//! replaces a mounted Secret's, and the hello plugin serving TLS.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use std::time::Duration;

use kplug_proto::v1alpha1::ReconcileRequest;
use kplug_proto::v1alpha1::plugin_client::PluginClient;
use serde_json::Value;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::control_plane::ControlPlane;
use crate::kplug::AggregatedKplug;
use crate::plugins::hello_plugin_command;
use crate::process::{Process, output_text};
use crate::workspace::workspace_binary;

/// A plugin CA made by `kplug-apiserver plugin-certs` in `dir`, with
/// kplug's client certificate and plugins' serving certificates.
pub struct PluginCerts {
    pub dir: PathBuf,
}

impl PluginCerts {
    /// A new plugin CA in `dir` (which must not hold one), kplug's client
    /// certificate and a serving certificate for each of `dns_names`.
    pub fn make(dir: &Path, dns_names: &[&str]) -> Self {
        let certs = Self {
            dir: dir.to_owned(),
        };
        certs.run(&["client"]);
        for name in dns_names {
            certs.run(&["serving", name]);
        }
        certs
    }

    /// Runs `kplug-apiserver plugin-certs --out-dir DIR ARGS...`.
    pub fn run(&self, args: &[&str]) {
        let output = Command::new(workspace_binary("kplug-apiserver"))
            .arg("plugin-certs")
            .arg("--out-dir")
            .arg(&self.dir)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run kplug-apiserver plugin-certs");
        assert!(
            output.status.success(),
            "kplug-apiserver plugin-certs {args:?}: {}",
            output_text(&output)
        );
    }

    /// The CA certificate: kplug's `--plugin-ca-file` and the plugins'
    /// `--client-ca-file`.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// kplug's client certificate and key.
    pub fn client(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.join("kplug-client.crt"),
            self.dir.join("kplug-client.key"),
        )
    }

    /// The serving certificate and key made for `dns_name`.
    pub fn serving(&self, dns_name: &str) -> (PathBuf, PathBuf) {
        let dir = self.dir.join("plugins").join(dns_name);
        (dir.join("tls.crt"), dir.join("tls.key"))
    }
}

/// Replaces `to` with a copy of `from` by one rename, so that a reader sees
/// the old file or the new one, never a mix (as with a Secret volume).
pub fn replace_file(from: &Path, to: &Path) {
    let staged = to.with_extension("staged");
    std::fs::copy(from, &staged)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), staged.display()));
    std::fs::rename(&staged, to)
        .unwrap_or_else(|e| panic!("rename {} to {}: {e}", staged.display(), to.display()));
}

/// The files a plugin serves TLS from (`--tls-cert-file`, `--tls-key-file`,
/// `--client-ca-file`), and the name it declares (`--server-name`, `None`:
/// the host of its address).
pub struct PluginTlsFlags<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
    pub client_ca: &'a Path,
    pub server_name: Option<&'a str>,
}

/// The hello plugin heartbeating to `kplug` every second as `name` with the
/// token in `token_file`, serving its Plugin service over TLS as `tls`
/// says, logging to stderr.
pub fn hello_plugin_tls(
    kplug: &AggregatedKplug,
    name: &str,
    token_file: &Path,
    tls: &PluginTlsFlags<'_>,
) -> Process {
    let mut command = hello_plugin_command(kplug, name, token_file);
    command
        .args(["--heartbeat-interval", "1"])
        .arg("--tls-cert-file")
        .arg(tls.cert)
        .arg("--tls-key-file")
        .arg(tls.key)
        .arg("--client-ca-file")
        .arg(tls.client_ca)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(server_name) = tls.server_name {
        command.args(["--server-name", server_name]);
    }
    Process::spawn(&mut command, name)
}

/// The address the plugin `name` declared (`spec.address`).
pub fn plugin_address(cluster: &ControlPlane, name: &str) -> String {
    let plugin: Value =
        serde_json::from_str(&cluster.kubectl_ok(&["get", "plugin", name, "-o", "json"]))
            .expect("plugin JSON");
    plugin["spec"]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("plugin {name} has no spec.address: {plugin}"))
        .to_owned()
}

/// The object every plugin TLS test reconciles: a Greeting named ada,
/// which the hello plugin greets.
pub const GREETING: &str =
    r#"{"apiVersion":"example.com/v1","kind":"Greeting","metadata":{"name":"ada"}}"#;

/// kplug for the plugin TLS tests, registered with `cluster`: caches and
/// reloads of one second, heartbeats as often, `--plugin-tls=required` and
/// `plugin_tls` (the files it calls plugins with); the namespace plugins
/// made, and a `Reconcile` of [`GREETING`] written to DIR/reconcile.json.
/// Returns kplug and that file.
pub fn kplug_with_plugin_tls(
    cluster: &ControlPlane,
    dir: &Path,
    plugin_tls: &[String],
) -> (AggregatedKplug, PathBuf) {
    let mut flags = vec![
        "--authentication-cache-ttl=1s",
        "--authorization-allowed-cache-ttl=1s",
        "--cert-reload-interval=1s",
        "--min-heartbeat-interval=1s",
        "--plugin-tls=required",
    ];
    flags.extend(plugin_tls.iter().map(String::as_str));
    let kplug = AggregatedKplug::start(cluster, dir, &flags);
    cluster.kubectl_ok(&["create", "namespace", "plugins"]);
    let request = dir.join("reconcile.json");
    let object: Value = serde_json::from_str(GREETING).expect("the Greeting is JSON");
    let body = serde_json::json!({
        "apiVersion": "plugins.kplug.io/v1alpha1",
        "kind": "Reconcile",
        "spec": {"object": object},
    });
    std::fs::write(&request, body.to_string())
        .unwrap_or_else(|e| panic!("write {}: {e}", request.display()));
    (kplug, request)
}

/// Calls the plugin at `address` directly, not through kplug, on a new
/// connection, as a pod that learned the address could: verifying the
/// plugin's certificate against `ca` for `server_name`, presenting the
/// client certificate `identity` (cert, key) if any. Ok when it answered.
pub fn call_plugin_directly(
    address: &str,
    server_name: &str,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<(), String> {
    let read = |path: &Path| {
        std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
    };
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(ca)))
        .domain_name(server_name);
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(read(cert), read(key)));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let channel = Endpoint::from_shared(format!("https://{address}"))
            .map_err(|e| e.to_string())?
            .tls_config(tls)
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        let request = ReconcileRequest {
            operation_id: "direct".to_owned(),
            object:
                br#"{"apiVersion":"example.com/v1","kind":"Greeting","metadata":{"name":"ada"}}"#
                    .to_vec()
                    .into(),
            ..ReconcileRequest::default()
        };
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            PluginClient::new(channel).reconcile(request),
        )
        .await
        .map_err(|_| "no answer within 10s".to_owned())?;
        answer.map(drop).map_err(|status| format!("{status:?}"))
    })
}

/// The verdict of the plugin at `address` on a TLS handshake with the
/// client certificate `identity` (cert, key) if any, verifying the plugin
/// against `ca` for `server_name`: `Ok` when it takes the caller, else the
/// TLS alert it refused with (`received fatal alert: CertificateRequired`),
/// or whatever else ended the attempt. In TLS 1.3 the plugin checks the
/// caller's certificate after the handshake ends on the caller's side, so
/// its verdict is the first thing to read: its HTTP/2 preface (a gRPC
/// server sends it at once), or the alert.
pub fn tls_verdict(
    address: &str,
    server_name: &str,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<(), String> {
    use tokio::io::AsyncReadExt;

    let pem = |path: &Path| {
        std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
    };
    let certs = |path: &Path| {
        rustls_pemfile::certs(&mut pem(path).as_slice())
            .collect::<Result<Vec<_>, _>>()
            .unwrap_or_else(|e| panic!("certificates in {}: {e}", path.display()))
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs(ca) {
        roots
            .add(cert)
            .unwrap_or_else(|e| panic!("{}: {e}", ca.display()));
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let key = rustls_pemfile::private_key(&mut pem(key).as_slice())
                .ok()
                .flatten()
                .unwrap_or_else(|| panic!("a private key in {}", key.display()));
            builder
                .with_client_auth_cert(certs(cert), key)
                .unwrap_or_else(|e| panic!("{}: {e}", cert.display()))
        }
    };
    let name = rustls::pki_types::ServerName::try_from(server_name.to_owned())
        .unwrap_or_else(|e| panic!("{server_name}: {e}"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let verdict = async {
            let tcp = tokio::net::TcpStream::connect(address)
                .await
                .map_err(|e| format!("connect {address}: {e}"))?;
            let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
                .connect(name, tcp)
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            match tls.read(&mut [0; 1]).await {
                Ok(0) => Err("closed without a word".to_owned()),
                Ok(_) => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        };
        tokio::time::timeout(Duration::from_secs(10), verdict)
            .await
            .map_err(|_| "no verdict within 10s".to_owned())?
    })
}

/// Whether [`tls_verdict`] is a refusal in TLS (an alert), rather than any
/// other failure (nothing listening, a timeout).
pub fn refused_in_tls_handshake(verdict: &Result<(), String>) -> bool {
    verdict
        .as_ref()
        .is_err_and(|error| error.contains("received fatal alert"))
}

/// Reconciles through kube-apiserver and kplug with the `Reconcile` body in
/// the file `request`: kplug's answer, or kubectl's error.
pub fn reconcile(cluster: &ControlPlane, plugin: &str, request: &Path) -> Result<String, String> {
    let path = format!("/apis/plugins.kplug.io/v1alpha1/plugins/{plugin}/reconcile");
    let request = request.to_string_lossy();
    let output = cluster.kubectl(&["create", "--raw", &path, "-f", &request]);
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(output_text(&output))
    }
}
