//! kplug in standalone mode (`kplug-apiserver standalone`): its own CA,
//! admin certificate and kubeconfig in a private state directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use crate::curl::Curl;
use crate::kubectl::{self, KUBECTL};
use crate::process::{Lines, Process, free_port};
use crate::workspace::workspace_binary;

/// A running standalone kplug on 127.0.0.1, killed on drop.
pub struct StandaloneKplug {
    pub process: Process,
    /// The state directory (CA, certificates, kubeconfig), kept across
    /// restarts with [`StandaloneKplug::start_in`].
    pub state: tempfile::TempDir,
    /// `https://127.0.0.1:PORT`
    pub api: String,
    /// `http://127.0.0.1:PORT`, for plugins.
    pub grpc: String,
    /// The admin kubeconfig kplug wrote.
    pub kubeconfig: PathBuf,
    /// kplug's stdout: the serving banner.
    pub stdout: Lines,
    admin_files: OnceLock<(PathBuf, PathBuf)>,
    /// How it was started, to restart it.
    binary: PathBuf,
    extra: Vec<String>,
    log: Log,
}

/// Where a kplug process's log (stderr) goes.
#[derive(Clone, Copy)]
enum Log {
    /// The test's own stderr.
    Inherited,
    /// Nowhere: see [`Process::spawn_with_lost_stderr`].
    Lost,
}

impl StandaloneKplug {
    /// Starts kplug with a fresh state directory and the default settings.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts kplug with a fresh state directory and `extra` flags.
    pub fn start_with(extra: &[&str]) -> Self {
        let state = tempfile::tempdir().expect("a temporary state directory");
        Self::start_in(state, extra)
    }

    /// [`StandaloneKplug::start_with`], with kplug's log lost: see
    /// [`Process::spawn_with_lost_stderr`].
    pub fn start_with_lost_log(extra: &[&str]) -> Self {
        let state = tempfile::tempdir().expect("a temporary state directory");
        let extra: Vec<String> = extra.iter().map(|flag| (*flag).to_owned()).collect();
        let binary = workspace_binary("kplug-apiserver");
        Self::spawn(
            &binary,
            state,
            ("127.0.0.1:0", "127.0.0.1:0"),
            extra,
            Log::Lost,
        )
    }

    /// Starts kplug with its state in `state` (reused across restarts) and
    /// `extra` flags, logging `info,kplug_apiserver=debug` to stderr unless
    /// `extra` has `--log`; waits for the serving banner.
    pub fn start_in(state: tempfile::TempDir, extra: &[&str]) -> Self {
        Self::start_binary_in(&workspace_binary("kplug-apiserver"), state, extra)
    }

    /// As [`StandaloneKplug::start_in`], with another build of kplug.
    pub fn start_binary_in(binary: &Path, state: tempfile::TempDir, extra: &[&str]) -> Self {
        let extra: Vec<String> = extra.iter().map(|flag| (*flag).to_owned()).collect();
        Self::spawn(
            binary,
            state,
            ("127.0.0.1:0", "127.0.0.1:0"),
            extra,
            Log::Inherited,
        )
    }

    /// Kills this kplug and starts the same build again with the same state
    /// directory, ports and flags: a restarted pod behind the same Service.
    pub fn restart(mut self) -> Self {
        self.process.kill();
        let (api, grpc) = (
            self.api_address().to_string(),
            self.grpc_address().to_string(),
        );
        let (binary, extra, log) = (
            std::mem::take(&mut self.binary),
            std::mem::take(&mut self.extra),
            self.log,
        );
        let state = std::mem::replace(
            &mut self.state,
            tempfile::tempdir().expect("a temporary directory"),
        );
        Self::spawn(&binary, state, (&api, &grpc), extra, log)
    }

    /// A second kplug process with a copy of this one's state directory:
    /// the same CA, serving certificate and admin credentials, so that one
    /// client trusts either, as when a Service sends it to any replica. Its
    /// registry is its own.
    pub fn replica(&self, extra: &[&str]) -> Self {
        let state = tempfile::tempdir().expect("a temporary state directory");
        let entries = std::fs::read_dir(self.state.path()).expect("read the state directory");
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_file()) {
                std::fs::copy(entry.path(), state.path().join(entry.file_name()))
                    .unwrap_or_else(|e| panic!("copy {}: {e}", entry.path().display()));
            }
        }
        let extra: Vec<String> = extra.iter().map(|flag| (*flag).to_owned()).collect();
        let addresses = ("127.0.0.1:0", "127.0.0.1:0");
        Self::spawn(&self.binary, state, addresses, extra, self.log)
    }

    fn spawn(
        binary: &Path,
        state: tempfile::TempDir,
        (api, grpc): (&str, &str),
        extra: Vec<String>,
        log: Log,
    ) -> Self {
        let (mut process, stdout) = Process::spawn_with_stdout(
            Command::new(binary)
                .args(["standalone", "--state-dir"])
                .arg(state.path())
                .args(["--listen", api, "--grpc-listen", grpc])
                .args(&extra)
                .env("KPLUG_LOG", "info,kplug_apiserver=debug")
                .stdin(Stdio::null())
                .stderr(match log {
                    Log::Inherited => Stdio::inherit(),
                    Log::Lost => Stdio::piped(),
                }),
            "kplug-apiserver standalone",
        );
        // Piped only to be lost: the reading end closes here.
        drop(process.child.stderr.take());
        let banner = stdout.wait_for(Duration::from_secs(30), "the serving banner", |l| {
            l.starts_with("kplug is serving")
        });
        let api = banner
            .split_whitespace()
            .find(|w| w.starts_with("https://"))
            .unwrap_or_else(|| panic!("no API URL in the banner {banner:?}"))
            .to_owned();
        let grpc = banner
            .split("grpc://")
            .nth(1)
            .map(|rest| format!("http://{}", rest.trim_end_matches(')')))
            .unwrap_or_else(|| panic!("no gRPC address in the banner {banner:?}"));
        let kubeconfig = state.path().join("kubeconfig");
        Self {
            process,
            state,
            api,
            grpc,
            kubeconfig,
            stdout,
            admin_files: OnceLock::new(),
            binary: binary.to_owned(),
            extra,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The API's address, from [`StandaloneKplug::api`].
    pub fn api_address(&self) -> SocketAddr {
        socket_address(&self.api, "https://")
    }

    /// The gRPC address, from [`StandaloneKplug::grpc`].
    pub fn grpc_address(&self) -> SocketAddr {
        socket_address(&self.grpc, "http://")
    }

    /// Runs `kubectl` (the default one) with this kplug's kubeconfig.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with(Path::new(KUBECTL), args)
    }

    /// Runs the given kubectl (see [`crate::kubectls`]) with this kplug's
    /// kubeconfig.
    pub fn kubectl_with(&self, kubectl: &Path, args: &[&str]) -> Output {
        kubectl::run(kubectl, &self.kubeconfig, args)
    }

    /// Runs kubectl and returns stdout, failing the test on a non-zero exit.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        kubectl::run_ok(&self.kubeconfig, args)
    }

    /// Runs kubectl expecting failure; returns stderr.
    pub fn kubectl_err(&self, args: &[&str]) -> String {
        let output = self.kubectl(args);
        assert!(
            !output.status.success(),
            "kubectl {args:?} should have failed, printed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    /// Starts a kubectl that keeps running (e.g. `get -w`).
    pub fn kubectl_spawn(&self, args: &[&str]) -> (Process, Lines) {
        kubectl::spawn(&self.kubeconfig, args)
    }

    /// curl against the API with the admin client certificate; returns
    /// (HTTP status, body).
    pub fn curl(
        &self,
        method: &str,
        path: &str,
        headers: &[&str],
        body: Option<&str>,
    ) -> (u16, String) {
        let admin = self.admin_credentials();
        self.curl_as(Some(&admin), method, path, headers, body)
    }

    /// curl with the given client credentials (cert, key) or none.
    pub fn curl_as(
        &self,
        credentials: Option<&(PathBuf, PathBuf)>,
        method: &str,
        path: &str,
        headers: &[&str],
        body: Option<&str>,
    ) -> (u16, String) {
        let (_, code, body) = Curl {
            ca: &self.state.path().join("ca.crt"),
            client: credentials.map(|(cert, key)| (cert.as_path(), key.as_path())),
            method,
            url: &format!("{}{path}", self.api),
            headers,
            body,
        }
        .send();
        (code, body)
    }

    /// The admin client certificate and key (PEM) from the kubeconfig.
    pub fn admin_pem(&self) -> (Vec<u8>, Vec<u8>) {
        let kubeconfig = std::fs::read_to_string(&self.kubeconfig).unwrap_or_else(|e| {
            panic!(
                "cannot read the kubeconfig {}: {e}",
                self.kubeconfig.display()
            )
        });
        let field = |name: &str| -> Vec<u8> {
            let value = kubeconfig
                .lines()
                .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
                .unwrap_or_else(|| panic!("no {name} in the kubeconfig"));
            STANDARD
                .decode(value.trim())
                .unwrap_or_else(|e| panic!("{name} in the kubeconfig is not base64: {e}"))
        };
        (field("client-certificate-data"), field("client-key-data"))
    }

    /// The admin client certificate and key out of the kubeconfig, written
    /// once for curl (rewriting them per call raced with concurrent
    /// curls reading them); returns their paths (cert, key).
    pub fn admin_credentials(&self) -> (PathBuf, PathBuf) {
        self.admin_files
            .get_or_init(|| {
                let (cert_pem, key_pem) = self.admin_pem();
                let cert = self.state.path().join("admin-test.crt");
                let key = self.state.path().join("admin-test.key");
                std::fs::write(&cert, cert_pem).expect("write the admin certificate");
                std::fs::write(&key, key_pem).expect("write the admin key");
                (cert, key)
            })
            .clone()
    }

    /// Starts the hello plugin (examples/hello-rust) heartbeating here every
    /// second on a free port; flags in `extra` win over these defaults.
    pub fn plugin(&self, name: &str, extra: &[&str]) -> Process {
        Process::spawn(
            self.plugin_command(name, extra)
                .stdout(Stdio::null())
                .stderr(Stdio::inherit()),
            name,
        )
    }

    /// [`plugin`](Self::plugin), with its log lost (see
    /// [`Process::spawn_with_lost_stderr`]).
    pub fn plugin_with_lost_log(&self, name: &str, extra: &[&str]) -> Process {
        Process::spawn_with_lost_stderr(
            self.plugin_command(name, extra).stdout(Stdio::null()),
            name,
        )
    }

    /// [`plugin`](Self::plugin), with its log (stderr) to read.
    pub fn plugin_logging(&self, name: &str, extra: &[&str]) -> (Process, Lines) {
        Process::spawn_with_stderr(self.plugin_command(name, extra).stdout(Stdio::null()), name)
    }

    fn plugin_command(&self, name: &str, extra: &[&str]) -> Command {
        let mut command = Command::new(workspace_binary("hello-plugin"));
        command
            .args(["--registry", &self.grpc, "--name", name])
            .args(extra)
            // Defaults through the environment, so that flags win.
            .env("KPLUG_HEARTBEAT_INTERVAL", "1s")
            .env("KPLUG_LISTEN", format!("127.0.0.1:{}", free_port()))
            .env("RUST_LOG", "info");
        command
    }

    /// [`plugin`](Self::plugin), once registered, and the address it
    /// serves at (to register other instances in front of it by hand).
    pub fn plugin_serving(&self, name: &str, extra: &[&str]) -> (Process, String) {
        let process = self.plugin(name, extra);
        (process, self.plugin_address(name))
    }

    /// The address the plugin `name` registered, once it has.
    pub fn plugin_address(&self, name: &str) -> String {
        let plugin = self.wait_for_plugin(name, |plugin| plugin["spec"]["address"].is_string());
        plugin["spec"]["address"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// `POST path` of the JSON `body` as the admin: the code and the
    /// answer, which must be JSON.
    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        let (code, text) = self.curl(
            "POST",
            path,
            &["Content-Type: application/json"],
            Some(&body.to_string()),
        );
        let answer = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("POST {path} answered {code}, not JSON ({e}): {text}"));
        (code, answer)
    }

    /// Waits until `kubectl get plugin NAME` succeeds and satisfies `want`.
    pub fn wait_for_plugin(
        &self,
        name: &str,
        want: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let output = self.kubectl(&["get", "plugin", name, "-o", "json"]);
            if output.status.success()
                && let Ok(object) = serde_json::from_slice::<serde_json::Value>(&output.stdout)
                && want(&object)
            {
                return object;
            }
            assert!(
                Instant::now() < deadline,
                "plugin {name} did not appear as expected"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `kubectl get plugin NAME` says NotFound.
    pub fn wait_for_absent(&self, name: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let output = self.kubectl(&["get", "plugin", name]);
            if !output.status.success()
                && String::from_utf8_lossy(&output.stderr).contains("NotFound")
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "plugin {name} is still listed after {within:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `SCHEME127.0.0.1:PORT` as a socket address.
fn socket_address(url: &str, scheme: &str) -> SocketAddr {
    url.strip_prefix(scheme)
        .and_then(|address| address.parse().ok())
        .unwrap_or_else(|| panic!("{url:?} is not {scheme}IP:PORT"))
}
