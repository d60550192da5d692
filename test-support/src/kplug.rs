//! kplug in cluster mode (`kplug-apiserver serve`) as an aggregated API
//! server of a real [`ControlPlane`], installed the way the repository
//! ships it: the RBAC of `deploy/`, kplug's own ServiceAccount, a serving
//! certificate from `kplug-apiserver certs` and the APIService of
//! `apiservice/render.sh`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;

use crate::control_plane::ControlPlane;
use crate::curl::Curl;
use crate::process::{Lines, Process, free_port, output_text, wait_until};
use crate::workspace::{repo_root, workspace_binary};

/// The APIService `deploy/` and `apiservice/` register.
const APISERVICE: &str = "v1alpha1.plugins.kplug.io";
const GROUP_VERSION: &str = "/apis/plugins.kplug.io/v1alpha1";

/// What kplug needs from the cluster before it can serve, shared by every
/// kplug process started on it.
pub struct Installation {
    /// A kubeconfig with the token of kplug's ServiceAccount
    /// `kplug-system/kplug`, so kplug runs with exactly the shipped RBAC.
    pub kubeconfig: PathBuf,
    /// `ca.crt`, `ca.key`, `tls.crt` and `tls.key` from `kplug-apiserver
    /// certs` for the Service `kplug-system/kplug`.
    pub certs: PathBuf,
    /// What `kplug-apiserver certs` printed: the APIService's caBundle.
    pub ca_bundle: String,
}

/// `deploy/` as `kubectl apply -k` would apply it, less what the cluster
/// cannot serve: the test control plane's kube-apiserver v1.20 predates
/// `policy/v1` (Kubernetes 1.21), so the PodDisruptionBudget is left out
/// there, and only there.
fn deploy_manifests(cluster: &ControlPlane) -> String {
    let rendered =
        cluster.kubectl_ok(&["kustomize", &repo_root().join("deploy").to_string_lossy()]);
    let versions = cluster.kubectl_ok(&["api-versions"]);
    if versions.lines().any(|v| v.trim() == "policy/v1") {
        return rendered;
    }
    rendered
        .split("\n---\n")
        .filter(|document| !document.contains("kind: PodDisruptionBudget"))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

impl Installation {
    /// Applies `deploy/` (`kubectl apply -k`), writes kplug's kubeconfig and
    /// makes its certificates, all under `work_dir`.
    pub fn install(cluster: &ControlPlane, work_dir: &Path) -> Self {
        cluster.apply(&deploy_manifests(cluster));
        let kubeconfig = work_dir.join("kplug.kubeconfig");
        cluster.kubeconfig_for_token(&kubeconfig, &cluster.token("kplug-system", "kplug"));
        let certs = work_dir.join("kplug-certs");
        let output = Command::new(workspace_binary("kplug-apiserver"))
            .args([
                "certs",
                "--service",
                "kplug",
                "--namespace",
                "kplug-system",
                "--out-dir",
            ])
            .arg(&certs)
            .stdin(Stdio::null())
            .output()
            .expect("run kplug-apiserver certs");
        assert!(
            output.status.success(),
            "kplug-apiserver certs: {}",
            output_text(&output)
        );
        Self {
            kubeconfig,
            certs,
            ca_bundle: String::from_utf8_lossy(&output.stdout).into_owned(),
        }
    }
}

/// Flags for [`AggregatedKplug::start`] with which a test need not wait:
/// token reviews and access decisions cached one second (a new RBAC
/// binding applies at once), heartbeats allowed every second.
pub const FAST_REVIEWS: &[&str] = &[
    "--authentication-cache-ttl",
    "1s",
    "--authorization-allowed-cache-ttl",
    "1s",
    "--authorization-denied-cache-ttl",
    "1s",
    "--min-heartbeat-interval",
    "1s",
];

/// A running `kplug-apiserver serve` on 127.0.0.1, killed on drop.
pub struct AggregatedKplug {
    process: Process,
    /// kplug's log (stderr, without colours).
    pub log: Lines,
    /// The log lines read while waiting for kplug to serve.
    startup: Vec<String>,
    /// The HTTPS port of the API (the certificate is for `localhost`).
    pub https: u16,
    /// The gRPC (TLS) port plugins heartbeat to.
    pub grpc: u16,
    /// kplug's certificates, see [`Installation::certs`].
    pub certs: PathBuf,
    /// See [`Installation::ca_bundle`].
    pub ca_bundle: String,
}

impl AggregatedKplug {
    /// Installs kplug in `cluster` ([`Installation::install`], files under
    /// `work_dir`), starts it with `extra_flags` ([`AggregatedKplug::serve`])
    /// and registers it ([`AggregatedKplug::register`]): when this returns,
    /// kube-apiserver serves plugins.kplug.io through kplug.
    pub fn start(cluster: &ControlPlane, work_dir: &Path, extra_flags: &[&str]) -> Self {
        let installation = Installation::install(cluster, work_dir);
        let kplug = Self::serve(&installation, extra_flags);
        kplug.register(cluster);
        kplug
    }

    /// Starts `kplug-apiserver serve` on free ports with the installation's
    /// kubeconfig and certificates plus `extra_flags` (cache TTLs, `--log`,
    /// ...), and waits until it serves. Several may run on one installation.
    pub fn serve(installation: &Installation, extra_flags: &[&str]) -> Self {
        Self::serve_binary(
            &workspace_binary("kplug-apiserver"),
            installation,
            extra_flags,
        )
    }

    /// As [`AggregatedKplug::serve`], with another build of kplug (a
    /// bench's baseline).
    pub fn serve_binary(binary: &Path, installation: &Installation, extra_flags: &[&str]) -> Self {
        let (https, grpc) = (free_port(), free_port());
        let certs = &installation.certs;
        let (process, log) = Process::spawn_with_stderr(
            Command::new(binary)
                .args([
                    "serve",
                    "--listen",
                    &format!("127.0.0.1:{https}"),
                    "--grpc-listen",
                    &format!("127.0.0.1:{grpc}"),
                ])
                .arg("--tls-cert-file")
                .arg(certs.join("tls.crt"))
                .arg("--tls-private-key-file")
                .arg(certs.join("tls.key"))
                .arg("--kubeconfig")
                .arg(&installation.kubeconfig)
                .args(extra_flags)
                .env("NO_COLOR", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::null()),
            "kplug-apiserver serve",
        );
        let startup = Mutex::new(Vec::new());
        log.wait_for(Duration::from_secs(30), "kplug serving", |l| {
            startup
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(l.to_owned());
            l.contains("kplug is serving")
        });
        Self {
            process,
            log,
            startup: startup.into_inner().unwrap_or_else(PoisonError::into_inner),
            https,
            grpc,
            certs: certs.clone(),
            ca_bundle: installation.ca_bundle.clone(),
        }
    }

    /// Makes kube-apiserver proxy plugins.kplug.io to this kplug: the
    /// Service `kplug-system/kplug` becomes an ExternalName for localhost
    /// on kplug's port (there are no pods on loopback), the APIService from
    /// `apiservice/render.sh` is applied, and this waits until it is
    /// Available and the group is served through kube-apiserver.
    pub fn register(&self, cluster: &ControlPlane) {
        cluster.kubectl_ok(&["-n", "kplug-system", "delete", "service", "kplug"]);
        cluster.apply(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: kplug, namespace: kplug-system}}\nspec:\n  type: ExternalName\n  externalName: localhost\n  ports:\n  - {{name: https, port: {}}}\n",
            self.https
        ));
        let apiservice = Command::new(repo_root().join("apiservice/render.sh"))
            .arg(self.certs.join("ca.crt"))
            .args(["kplug", "kplug-system", &self.https.to_string()])
            .stdin(Stdio::null())
            .output()
            .expect("run apiservice/render.sh");
        assert!(
            apiservice.status.success(),
            "apiservice/render.sh: {}",
            output_text(&apiservice)
        );
        cluster.apply(&String::from_utf8_lossy(&apiservice.stdout));
        wait_until("APIService Available=True", Duration::from_secs(60), || {
            let out = cluster.kubectl_ok(&["get", "apiservice", APISERVICE, "-o", "json"]);
            let service: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
            let available = service["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Available").cloned())
                .unwrap_or_default();
            (available["status"] == "True")
                .then_some(())
                .ok_or_else(|| available.to_string())
        });
        // The aggregator's proxy for a new group can lag the Available condition.
        wait_until(
            "the group served through kube-apiserver",
            Duration::from_secs(30),
            || cluster.kubectl_check(&["get", "--raw", GROUP_VERSION]),
        );
    }

    /// The first log line since start that satisfies `want`, whether it came
    /// before kplug served (startup lines are read while waiting for that)
    /// or comes within `within`; panics as [`Lines::wait_for`].
    pub fn wait_for_log(
        &self,
        within: Duration,
        what: &str,
        want: impl Fn(&str) -> bool,
    ) -> String {
        match self.startup.iter().find(|line| want(line)) {
            Some(line) => line.clone(),
            None => self.log.wait_for(within, what, want),
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// curl straight to kplug (not through kube-apiserver), trusting kplug's
    /// CA, with an optional client certificate (cert, key) and `headers`;
    /// returns (curl's exit code, HTTP status or 0, body).
    pub fn curl(
        &self,
        cert: Option<(&str, &str)>,
        headers: &[&str],
        path: &str,
    ) -> (i32, u16, String) {
        Curl {
            ca: &self.certs.join("ca.crt"),
            client: cert.map(|(cert, key)| (Path::new(cert), Path::new(key))),
            method: "GET",
            url: &format!("https://localhost:{}{path}", self.https),
            headers,
            body: None,
        }
        .send()
    }
}
