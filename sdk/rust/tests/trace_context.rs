//! The W3C trace context end to end: a real tonic client calls a served
//! plugin with and without `traceparent` metadata, and the log lines of the
//! call, captured by a real `tracing` subscriber, carry the ids.
//!
//! The subscriber is process-wide, so this file is its own test binary;
//! tests running at once tell their lines apart by operation id.

use std::io::Write;
use std::sync::{Mutex, Once};
use std::time::Duration;

use kplug_sdk::proto::v1alpha1::ReconcileRequest;
use kplug_sdk::proto::v1alpha1::plugin_client::PluginClient;
use kplug_sdk::{
    ApiRef, Config, Error, Outcome, Plugin, PluginInfo, Request, Server, TRACEPARENT, TraceParent,
};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// Bounds every wait; far above anything a healthy run needs.
const PATIENCE: Duration = Duration::from_secs(10);
/// The example of the W3C specification.
const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const EXAMPLE_TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// Everything logged in this test binary.
static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        LOGS.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Logs the SDK (debug) and this test's plugin as a plugin's `main` would,
/// with the default format, which prints the fields of the spans.
fn capture_logs() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "kplug_sdk=debug,trace_context=info",
            ))
            .with_writer(|| Capture)
            .with_ansi(false)
            .init();
    });
}

/// The log lines of the call `operation_id`, in order.
fn lines_of(operation_id: &str) -> Vec<String> {
    let logs = LOGS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let needle = format!("operation_id={operation_id} ");
    String::from_utf8_lossy(&logs)
        .lines()
        .filter(|line| line.contains(&needle))
        .map(str::to_owned)
        .collect()
}

/// Reports every request it gets, logs a line, and answers with the trace
/// id it saw.
struct Traced(mpsc::UnboundedSender<Request>);

impl Traced {
    fn answer(&self, request: Request) -> Outcome {
        tracing::info!(object = request.name(), "the plugin's own line");
        let status = json!({ "traceID": request.trace_id() });
        let _ = self.0.send(request);
        Outcome::success().object_status(status)
    }
}

impl Plugin for Traced {
    async fn reconcile(&self, request: Request) -> Outcome {
        self.answer(request)
    }

    async fn finalize(&self, request: Request) -> Outcome {
        self.answer(request)
    }
}

/// A [`Traced`] plugin served on a free port.
struct Running {
    client: PluginClient<Channel>,
    requests: mpsc::UnboundedReceiver<Request>,
    stop: oneshot::Sender<()>,
    served: JoinHandle<Result<(), Error>>,
}

impl Running {
    async fn start() -> Self {
        capture_logs();
        let (seen, requests) = mpsc::unbounded_channel();
        let info = PluginInfo::new("traced", ApiRef::new("example.com", "traces", "v1"));
        // No registry listens there: the heartbeats fail, the serving does not.
        let config = Config::default()
            .registry("http://127.0.0.1:1")
            .listen("127.0.0.1:0".parse().expect("an address"));
        let server = Server::bind(Traced(seen), info, config)
            .await
            .expect("bind");
        let address = server.local_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        let channel = Channel::from_shared(format!("http://{address}"))
            .expect("a URI")
            .connect()
            .await
            .expect("connect");
        Self {
            client: PluginClient::new(channel),
            requests,
            stop,
            served,
        }
    }

    /// Calls Reconcile (or Finalize) as `operation_id` with `traceparent`
    /// metadata, if given, once per value when there are several; returns
    /// the request the plugin saw and the object status it answered.
    async fn call(
        &mut self,
        finalize: bool,
        operation_id: &str,
        traceparents: &[&str],
    ) -> (Request, Value) {
        let message = ReconcileRequest {
            operation_id: operation_id.into(),
            object: serde_json::to_vec(&json!({"metadata": {"name": operation_id}}))
                .expect("JSON")
                .into(),
            ..Default::default()
        };
        let mut call = tonic::Request::new(message);
        for value in traceparents {
            call.metadata_mut()
                .append(TRACEPARENT, value.parse().expect("ASCII metadata"));
        }
        let answer = if finalize {
            self.client.finalize(call).await
        } else {
            self.client.reconcile(call).await
        };
        let answer = answer
            .expect("a trace context never fails the call")
            .into_inner();
        assert!(answer.success);
        let status = serde_json::from_slice(&answer.object_status).expect("JSON status");
        let request = tokio::time::timeout(PATIENCE, self.requests.recv())
            .await
            .expect("the plugin saw nothing in time")
            .expect("the plugin is gone");
        assert_eq!(request.operation_id(), operation_id);
        (request, status)
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let served = tokio::time::timeout(PATIENCE, self.served)
            .await
            .expect("serve did not return in time")
            .expect("serve panicked");
        assert!(served.is_ok(), "{served:?}");
    }
}

/// Asserts that the call logged the plugin's line and the SDK's, and that
/// every line of it carries `trace_id` (or, for `None`, none does).
fn assert_logged(operation_id: &str, trace_id: Option<&str>) -> Vec<String> {
    // The lines were written before the answer was sent.
    let lines = lines_of(operation_id);
    assert!(
        lines.iter().any(|l| l.contains("the plugin's own line")),
        "{lines:#?}"
    );
    assert!(lines.iter().any(|l| l.contains("answered")), "{lines:#?}");
    for line in &lines {
        match trace_id {
            Some(trace_id) => assert!(line.contains(&format!("trace_id={trace_id} ")), "{line}"),
            None => assert!(!line.contains("trace_id="), "{line}"),
        }
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_sees_the_trace_context_and_its_lines_carry_the_ids() {
    let mut running = Running::start().await;
    let expected: TraceParent = EXAMPLE.parse().expect("valid");

    let (request, status) = running.call(false, "op-traced", &[EXAMPLE]).await;
    assert_eq!(request.trace_parent(), Some(&expected));
    assert_eq!(request.trace_id().as_deref(), Some(EXAMPLE_TRACE_ID));
    assert_eq!(status["traceID"], EXAMPLE_TRACE_ID);
    let lines = assert_logged("op-traced", Some(EXAMPLE_TRACE_ID));
    assert!(
        lines.iter().all(
            |l| l.contains("operation_id=op-traced trace_id=4bf92f3577b34da6a3ce929d0e0e4736 ")
        ),
        "{lines:#?}"
    );

    // Finalize too; and a later version's extra fields are ignored.
    let later = "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-more-to-come";
    let (request, status) = running.call(true, "op-finalize-traced", &[later]).await;
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    assert_eq!(request.trace_id().as_deref(), Some(trace_id));
    assert_eq!(
        request.trace_parent().map(ToString::to_string).as_deref(),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")
    );
    assert_eq!(status["traceID"], trace_id);
    let lines = assert_logged("op-finalize-traced", Some(trace_id));
    assert!(
        lines
            .iter()
            .all(|l| l.contains("call{operation=\"Finalize\"")),
        "{lines:#?}"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_trace_context_the_call_has_none() {
    let mut running = Running::start().await;
    let (request, status) = running.call(false, "op-untraced", &[]).await;
    assert_eq!(request.trace_parent(), None);
    assert_eq!(request.trace_id(), None);
    assert_eq!(status["traceID"], Value::Null);
    let lines = assert_logged("op-untraced", None);
    assert!(
        lines
            .iter()
            .all(|l| l.contains("operation_id=op-untraced object=")),
        "{lines:#?}"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_trace_context_is_ignored_and_the_call_goes_ahead() {
    let mut running = Running::start().await;
    let cases: [(&str, &[&str]); 6] = [
        (
            "op-bad-uppercase",
            &["00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"],
        ),
        (
            "op-bad-version",
            &["ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"],
        ),
        (
            "op-bad-zero",
            &["00-00000000000000000000000000000000-00f067aa0ba902b7-01"],
        ),
        ("op-bad-extra", &[&format!("{EXAMPLE}-extra")]),
        ("op-bad-garbage", &["not a traceparent"]),
        ("op-bad-twice", &[EXAMPLE, EXAMPLE]),
    ];
    for (operation_id, traceparents) in cases {
        let (request, status) = running.call(false, operation_id, traceparents).await;
        assert_eq!(request.trace_parent(), None, "{operation_id}");
        assert_eq!(status["traceID"], Value::Null, "{operation_id}");
        let lines = assert_logged(operation_id, None);
        assert!(
            lines
                .iter()
                .any(|l| l.contains("ignoring the traceparent metadata")),
            "{lines:#?}"
        );
    }
    running.stop().await;
}
