//! The hello plugin as a process: called with a W3C trace context, it
//! reports the trace id in the object status, and the line it logs for the
//! call carries the trace id and the operation id.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kplug_sdk::TRACEPARENT;
use kplug_sdk::proto::v1alpha1::ReconcileRequest;
use kplug_sdk::proto::v1alpha1::plugin_client::PluginClient;
use serde_json::{Value, json};

/// Bounds every wait; far above anything a healthy run needs.
const PATIENCE: Duration = Duration::from_secs(20);
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// The plugin process, killed when dropped, and its stderr line by line.
struct Hello {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Hello {
    fn spawn() -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hello-plugin"))
            // No registry listens there: the heartbeats fail, the serving
            // does not.
            .args(["--registry", "http://127.0.0.1:1"])
            .args(["--listen", "127.0.0.1:0", "--report-trace-id"])
            .env("RUST_LOG", "info")
            .env_remove("KPLUG_REGISTRY")
            .env_remove("KPLUG_LISTEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the hello-plugin binary runs");
        let stderr = child.stderr.take().expect("piped stderr");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// The next line of stderr containing `needle`; every line read is
    /// kept in `seen` for failure messages.
    fn line_with(&self, needle: &str, seen: &mut Vec<String>) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => seen.push(line),
                Err(error) => panic!("no line with {needle:?} ({error}); stderr so far: {seen:#?}"),
            }
        }
    }
}

impl Drop for Hello {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn reports_and_logs_the_trace_id_it_was_called_with() {
    let hello = Hello::spawn();
    let mut seen = Vec::new();
    let serving = hello.line_with("serving", &mut seen);
    let address = serving
        .split_whitespace()
        .find_map(|field| field.strip_prefix("local_addr="))
        .unwrap_or_else(|| panic!("no local_addr in {serving:?}"))
        .to_owned();
    let mut client = PluginClient::connect(format!("http://{address}"))
        .await
        .expect("connect to the plugin");

    let message = |operation_id: &str| ReconcileRequest {
        operation_id: operation_id.into(),
        object: serde_json::to_vec(&json!({"metadata": {"name": "ada"}}))
            .expect("JSON")
            .into(),
        ..Default::default()
    };
    let mut traced = tonic::Request::new(message("op-traced"));
    traced.metadata_mut().insert(
        TRACEPARENT,
        format!("00-{TRACE_ID}-00f067aa0ba902b7-01")
            .parse()
            .expect("ASCII metadata"),
    );
    let answer = client
        .reconcile(traced)
        .await
        .expect("reconcile")
        .into_inner();
    let status: Value = serde_json::from_slice(&answer.object_status).expect("JSON status");
    assert_eq!(
        status,
        json!({"greeting": "hello, ada", "traceID": TRACE_ID})
    );
    let line = hello.line_with("greeting", &mut seen);
    assert!(line.contains("operation_id=op-traced"), "{line}");
    assert!(line.contains(&format!("trace_id={TRACE_ID}")), "{line}");

    // Without a trace context: the status and the line have no trace id.
    let answer = client
        .reconcile(message("op-untraced"))
        .await
        .expect("reconcile")
        .into_inner();
    let status: Value = serde_json::from_slice(&answer.object_status).expect("JSON status");
    assert_eq!(status, json!({"greeting": "hello, ada"}));
    let line = hello.line_with("greeting", &mut seen);
    assert!(line.contains("operation_id=op-untraced"), "{line}");
    assert!(!line.contains("trace_id="), "{line}");
}
