//! Serving the Plugin service over TLS with client certificates (mutual TLS
//! from kplug): who gets in, certificates rotated on disk reaching new
//! connections without a restart, and settings refused at start. The
//! certificates come from CAs of the tests' own, made with rcgen. Every
//! wait is bounded. Unix only, for the kubelet's symlinks.
#![cfg(unix)]

mod fake;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kplug_sdk::proto::v1alpha1::ReconcileRequest;
use kplug_sdk::proto::v1alpha1::plugin_client::PluginClient;
use kplug_sdk::{ApiRef, Config, Error, PluginInfo, Server};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use fake::{Idle, Options, PATIENCE, Registry};

/// A CA that signs certificates for the tests.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).unwrap().pem();
        Self {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate and its key, as PEM: for serving as `localhost`, or
    /// for a client called `name`.
    fn issue(&self, name: &str, purpose: ExtendedKeyUsagePurpose) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![purpose];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn serving(&self, name: &str) -> (String, String) {
        self.issue(name, ExtendedKeyUsagePurpose::ServerAuth)
    }

    fn client(&self, name: &str) -> (String, String) {
        self.issue(name, ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// The files a plugin serves TLS from, laid out as the kubelet mounts a
/// Secret: `tls.crt` → `..data/tls.crt` → `..<version>/tls.crt`, so that
/// a rotation swaps the `..data` link in one step.
struct Files {
    dir: tempfile::TempDir,
    version: u32,
}

impl Files {
    const NAMES: [&'static str; 3] = ["tls.crt", "tls.key", "ca.crt"];

    fn new(cert: &(String, String), client_ca: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        for name in Self::NAMES {
            std::os::unix::fs::symlink(Path::new("..data").join(name), dir.path().join(name))
                .unwrap();
        }
        let mut files = Self { dir, version: 0 };
        files.rotate(cert, client_ca);
        files
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes a new version and swaps `..data` to it, as the kubelet does.
    fn rotate(&mut self, (cert, key): &(String, String), client_ca: &str) {
        self.version += 1;
        let version = format!("..v{}", self.version);
        let dir = self.dir.path();
        std::fs::create_dir(dir.join(&version)).unwrap();
        for (name, contents) in Self::NAMES.into_iter().zip([cert, key, client_ca]) {
            std::fs::write(dir.join(&version).join(name), contents).unwrap();
        }
        std::os::unix::fs::symlink(&version, dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    }

    fn config(&self) -> Config {
        Config::default()
            .tls(self.path("tls.crt"), self.path("tls.key"))
            .client_ca_file(self.path("ca.crt"))
    }
}

/// A plugin serving `config` against a fake registry.
struct Running {
    address: SocketAddr,
    registry: Registry,
    stop: oneshot::Sender<()>,
    served: JoinHandle<Result<(), Error>>,
}

impl Running {
    async fn start(config: Config) -> Self {
        let registry = Registry::start(Options::default()).await;
        let config = config
            .registry(registry.url())
            .listen("127.0.0.1:0".parse().unwrap());
        let server = bind(config).await.unwrap();
        let address = server.local_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        Self {
            address,
            registry,
            stop,
            served,
        }
    }

    async fn stop(self) {
        self.stop.send(()).unwrap();
        tokio::time::timeout(PATIENCE, self.served)
            .await
            .expect("shutdown hung")
            .unwrap()
            .unwrap();
    }
}

async fn bind(config: Config) -> Result<Server<Idle>, Error> {
    let info = PluginInfo::new("hello", ApiRef::new("example.com", "greetings", "v1"));
    Server::bind(Idle, info, config).await
}

/// A channel to the plugin at `address` over TLS, trusting `server_ca` and
/// presenting `identity`; connected on first use.
fn channel(address: SocketAddr, server_ca: &str, identity: Option<&(String, String)>) -> Channel {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(server_ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://{address}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_lazy()
}

/// Reconciles an object over `channel`; the error's text when it fails.
async fn reconcile(channel: Channel) -> Result<(), String> {
    let object = serde_json::json!({"metadata": {"name": "ada"}});
    let request = ReconcileRequest {
        object: serde_json::to_vec(&object).unwrap().into(),
        ..Default::default()
    };
    let answer = tokio::time::timeout(PATIENCE, PluginClient::new(channel).reconcile(request))
        .await
        .expect("the call hung");
    match answer {
        Ok(answer) => {
            assert!(answer.into_inner().success);
            Ok(())
        }
        Err(status) => Err(format!("{status:?}")),
    }
}

/// Calls the plugin on a new connection.
async fn call(
    address: SocketAddr,
    server_ca: &str,
    identity: Option<&(String, String)>,
) -> Result<(), String> {
    reconcile(channel(address, server_ca, identity)).await
}

/// The certificate the plugin serves a new connection, as DER.
async fn served_certificate(
    address: SocketAddr,
    server_ca: &str,
    (cert, key): &(String, String),
) -> Vec<u8> {
    let pem =
        |text: &str| rustls_pemfile::certs(&mut text.as_bytes()).collect::<Result<Vec<_>, _>>();
    let mut roots = rustls::RootCertStore::empty();
    for ca in pem(server_ca).unwrap() {
        roots.add(ca).unwrap();
    }
    let key = rustls_pemfile::private_key(&mut key.as_bytes())
        .unwrap()
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(pem(cert).unwrap(), key)
        .unwrap();
    let connecting = async {
        let tcp = TcpStream::connect(address).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
    };
    let stream = tokio::time::timeout(PATIENCE, connecting)
        .await
        .expect("the handshake hung")
        .expect("the handshake succeeds");
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn der(cert: &str) -> Vec<u8> {
    let certs = rustls_pemfile::certs(&mut cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    certs[0].to_vec()
}

#[tokio::test]
async fn only_callers_with_a_certificate_from_the_client_ca_get_in() {
    let server_ca = Ca::new("plugin CA");
    let kplug_ca = Ca::new("kplug client CA");
    let other_ca = Ca::new("another CA");
    let files = Files::new(&server_ca.serving("one"), &kplug_ca.pem);
    let mut running = Running::start(files.config().server_name("hello.plugins.svc")).await;
    let address = running.address;

    let kplug = kplug_ca.client("kplug");
    call(address, &server_ca.pem, Some(&kplug))
        .await
        .expect("kplug's certificate gets in");
    // Refused in the handshake, with TLS's reason.
    let refused = call(address, &server_ca.pem, None).await.unwrap_err();
    assert!(refused.contains("CertificateRequired"), "{refused}");
    let refused = call(address, &server_ca.pem, Some(&other_ca.client("stranger")))
        .await
        .unwrap_err();
    assert!(refused.contains("fatal alert"), "{refused}");
    // Nor does plain gRPC get through.
    let plain = Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_lazy();
    assert!(reconcile(plain).await.is_err());

    // kplug learns which name to check in the certificate.
    let (heartbeat, _) = running.registry.heartbeat().await;
    assert_eq!(heartbeat.server_name, "hello.plugins.svc");
    running.stop().await;
}

#[tokio::test]
async fn rotated_files_reach_new_connections_without_a_restart() {
    let server_ca = Ca::new("plugin CA");
    let kplug_ca = Ca::new("kplug client CA");
    let first = server_ca.serving("first");
    let mut files = Files::new(&first, &kplug_ca.pem);
    let running = Running::start(files.config()).await;
    let address = running.address;
    let kplug = kplug_ca.client("kplug");
    assert_eq!(
        served_certificate(address, &server_ca.pem, &kplug).await,
        der(&first.0)
    );
    let open = channel(address, &server_ca.pem, Some(&kplug));
    reconcile(open.clone()).await.unwrap();

    // cert-manager renews the certificate and kplug's client CA changes.
    let second = server_ca.serving("second");
    let new_kplug_ca = Ca::new("new kplug client CA");
    files.rotate(&second, &new_kplug_ca.pem);
    let new_kplug = new_kplug_ca.client("kplug");
    assert_eq!(
        served_certificate(address, &server_ca.pem, &new_kplug).await,
        der(&second.0)
    );
    call(address, &server_ca.pem, Some(&new_kplug))
        .await
        .expect("the new client CA is trusted");
    assert!(call(address, &server_ca.pem, Some(&kplug)).await.is_err());
    // The connection opened before keeps working.
    reconcile(open)
        .await
        .expect("an open connection outlives the rotation");

    // A half-written rotation (a key that does not go with the certificate)
    // is not served: the last good material is.
    let third = server_ca.serving("third");
    let stray_key = server_ca.serving("stray").1;
    files.rotate(&(third.0.clone(), stray_key), &new_kplug_ca.pem);
    assert_eq!(
        served_certificate(address, &server_ca.pem, &new_kplug).await,
        der(&second.0)
    );
    // Once complete, it is.
    files.rotate(&third, &new_kplug_ca.pem);
    assert_eq!(
        served_certificate(address, &server_ca.pem, &new_kplug).await,
        der(&third.0)
    );
    running.stop().await;
}

#[tokio::test]
async fn unauthenticated_clients_only_when_allowed() {
    let server_ca = Ca::new("plugin CA");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = server_ca.serving("one");
    let cert_file = dir.path().join("tls.crt");
    let key_file = dir.path().join("tls.key");
    std::fs::write(&cert_file, &cert).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    let tls = || Config::default().tls(&cert_file, &key_file);

    let refused = bind(tls()).await.unwrap_err();
    assert!(matches!(refused, Error::ServeTls { .. }), "{refused:?}");
    assert!(
        refused
            .to_string()
            .contains("--allow-unauthenticated-clients"),
        "{refused}"
    );

    let running = Running::start(tls().allow_unauthenticated_clients(true)).await;
    call(running.address, &server_ca.pem, None)
        .await
        .expect("any TLS client gets in when allowed");
    running.stop().await;
}

#[tokio::test]
async fn unusable_files_fail_at_start() {
    let server_ca = Ca::new("plugin CA");
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, contents: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        path
    };
    let (cert, key) = server_ca.serving("one");
    let cert_file = write("tls.crt", &cert);
    let key_file = write("tls.key", &key);
    let ca_file = write("ca.crt", &server_ca.pem);
    let config = |cert: &Path, key: &Path, ca: &Path| {
        Config::default()
            .listen("127.0.0.1:0".parse().unwrap())
            .tls(cert, key)
            .client_ca_file(ca)
    };

    let missing = dir.path().join("missing.key");
    match bind(config(&cert_file, &missing, &ca_file))
        .await
        .unwrap_err()
    {
        Error::ReadTlsFile { what, path, .. } => {
            assert_eq!((what, path), ("private key", missing));
        }
        other => panic!("expected a file error, got {other:?}"),
    }
    let stray_key = write("stray.key", &server_ca.serving("two").1);
    let error = bind(config(&cert_file, &stray_key, &ca_file))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("do not go together"), "{error}");
    let not_pem = write("not.pem", "hello");
    let error = bind(config(&cert_file, &key_file, &not_pem))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("client CA file holds no PEM"),
        "{error}"
    );
    // And all is well with the right files.
    bind(config(&cert_file, &key_file, &ca_file)).await.unwrap();
}
