//! Test harness: the real `kplug-apiserver` binary, real plugin processes
//! built with `kplug-sdk`, and real kubectl.
#![allow(dead_code)] // each test binary uses a different part of the harness

pub mod postgres;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

/// The kubectl the acceptance criteria name, plus older and newer ones when present.
pub const KUBECTL: &str = "/usr/bin/kubectl";
const OTHER_KUBECTLS: &[&str] = &[
    "/usr/lib/google-cloud-sdk/bin/kubectl.1.27",
    "/usr/lib/google-cloud-sdk/bin/kubectl.1.33",
];

/// Every kubectl on this machine that the tests should drive.
pub fn kubectls() -> Vec<PathBuf> {
    std::iter::once(KUBECTL)
        .chain(OTHER_KUBECTLS.iter().copied())
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect()
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_kplug-apiserver"))
        .parent()
        .expect("binary has a parent dir")
        .to_owned()
}

/// A binary of another workspace package; `cargo build --workspace` builds it.
pub fn workspace_binary(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace` before the tests (hack/test.sh does)",
        path.display()
    );
    path
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Kills the child when dropped, so a failing test leaves no process behind.
pub struct Process {
    pub child: Child,
    pub name: String,
}

impl Process {
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits for the exit, returning whether it was clean.
    pub fn terminate(&mut self, within: Duration) -> bool {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads a child's stdout lines on a thread, so tests can wait with a deadline.
pub struct Lines(Mutex<mpsc::Receiver<String>>);

impl Lines {
    pub fn new(stdout: ChildStdout) -> Self {
        Self::from_reader(stdout)
    }

    pub fn new_stderr(stderr: std::process::ChildStderr) -> Self {
        Self::from_reader(stderr)
    }

    fn from_reader(reader: impl std::io::Read + Send + 'static) -> Self {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(reader).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self(Mutex::new(rx))
    }

    /// Every line received so far and not yet read.
    pub fn drain(&self) -> Vec<String> {
        let receiver = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        receiver.try_iter().collect()
    }

    /// The first line (from now on) that satisfies `want`; panics after `within`.
    pub fn wait_for(&self, within: Duration, what: &str, want: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let received = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .recv_timeout(left);
            match received {
                Ok(line) if want(&line) => return line,
                Ok(line) => seen.push(line),
                Err(_) => panic!("timed out after {within:?} waiting for {what}; saw: {seen:#?}"),
            }
        }
    }
}

/// A running standalone kplug.
pub struct Kplug {
    pub process: Process,
    pub state: tempfile::TempDir,
    /// `https://127.0.0.1:PORT`
    pub api: String,
    /// `http://127.0.0.1:PORT`, for plugins.
    pub grpc: String,
    pub kubeconfig: PathBuf,
    pub stdout: Lines,
}

impl Kplug {
    /// Starts kplug with fast heartbeat settings (1 s minimum interval).
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Self {
        let state = tempfile::tempdir().expect("temp dir");
        Self::start_in(state, extra)
    }

    /// Starts kplug with its state in `state` (reused across restarts).
    pub fn start_in(state: tempfile::TempDir, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kplug-apiserver"))
            .args(["standalone", "--state-dir"])
            .arg(state.path())
            .args(["--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"])
            .args(extra)
            .env("KPLUG_LOG", "info,kplug_apiserver=debug")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn kplug-apiserver");
        let stdout = Lines::new(child.stdout.take().expect("stdout"));
        let process = Process {
            child,
            name: "kplug-apiserver".to_owned(),
        };
        let banner = stdout.wait_for(Duration::from_secs(30), "the serving banner", |l| {
            l.starts_with("kplug is serving")
        });
        let api = banner
            .split_whitespace()
            .find(|w| w.starts_with("https://"))
            .expect("API URL in banner")
            .to_owned();
        let grpc = banner
            .split("grpc://")
            .nth(1)
            .map(|rest| format!("http://{}", rest.trim_end_matches(')')))
            .expect("gRPC address in banner");
        let kubeconfig = state.path().join("kubeconfig");
        Self {
            process,
            state,
            api,
            grpc,
            kubeconfig,
            stdout,
        }
    }

    /// Runs `kubectl` (the default one) with this kplug's kubeconfig.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with(Path::new(KUBECTL), args)
    }

    pub fn kubectl_with(&self, kubectl: &Path, args: &[&str]) -> Output {
        Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// Runs kubectl and returns stdout, failing the test on a non-zero exit.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let output = self.kubectl(args);
        assert!(
            output.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
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
        let mut child = Command::new(KUBECTL)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn kubectl");
        let lines = Lines::new(child.stdout.take().expect("stdout"));
        (
            Process {
                child,
                name: "kubectl".to_owned(),
            },
            lines,
        )
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
        let mut command = Command::new("curl");
        command
            .args([
                "-sS",
                "--max-time",
                "10",
                "-X",
                method,
                "-w",
                "\n%{http_code}",
            ])
            .arg("--cacert")
            .arg(self.state.path().join("ca.crt"));
        if let Some((cert, key)) = credentials {
            command.arg("--cert").arg(cert).arg("--key").arg(key);
        }
        for header in headers {
            command.args(["-H", header]);
        }
        if let Some(body) = body {
            command.args(["--data-binary", body]);
        }
        let output = command
            .arg(format!("{}{path}", self.api))
            .output()
            .expect("run curl");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().parse().unwrap_or(0), body.to_owned())
    }

    /// Writes the admin client certificate and key out of the kubeconfig.
    pub fn admin_credentials(&self) -> (PathBuf, PathBuf) {
        let kubeconfig = std::fs::read_to_string(&self.kubeconfig).expect("kubeconfig");
        let field = |name: &str| -> Vec<u8> {
            let line = kubeconfig
                .lines()
                .find_map(|l| l.trim().strip_prefix(name))
                .expect("credential in kubeconfig");
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(line.trim())
                .expect("base64")
        };
        let cert = self.state.path().join("admin-test.crt");
        let key = self.state.path().join("admin-test.key");
        std::fs::write(&cert, field("client-certificate-data:")).expect("write cert");
        std::fs::write(&key, field("client-key-data:")).expect("write key");
        (cert, key)
    }

    /// Starts the hello plugin heartbeating here.
    pub fn plugin(&self, name: &str, extra: &[&str]) -> Process {
        let child = Command::new(workspace_binary("hello-plugin"))
            .args(["--registry", &self.grpc, "--name", name])
            .args(extra)
            // Flags in `extra` win over these defaults.
            .env("KPLUG_INTERVAL", "1")
            .env("KPLUG_ADDRESS", format!("127.0.0.1:{}", free_port()))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn hello-plugin");
        Process {
            child,
            name: name.to_owned(),
        }
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
