//! Heartbeats on one `Heartbeats` stream, against the real kplug binary:
//! each is answered in order, as its own call would be, and kplug ends the
//! open streams when it shuts down instead of waiting for them.

use std::time::Duration;

use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{HeartbeatRequest, HeartbeatResponse};
use kplug_test_support::{StandaloneKplug, heartbeat_request};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// Far above anything a healthy exchange needs.
const PATIENCE: Duration = Duration::from_secs(10);

fn heartbeat(name: &str, address: &str) -> HeartbeatRequest {
    heartbeat_request(name, "", address, Duration::from_secs(60))
}

/// One open stream to kplug's registry.
struct Stream {
    requests: mpsc::Sender<HeartbeatRequest>,
    answers: Streaming<HeartbeatResponse>,
}

impl Stream {
    async fn open(kplug: &StandaloneKplug) -> Self {
        let mut client = RegistryClient::connect(kplug.grpc.clone())
            .await
            .expect("connect to the registry");
        let (requests, outbound) = mpsc::channel(1);
        let answers = client
            .heartbeats(ReceiverStream::new(outbound))
            .await
            .expect("a heartbeat stream")
            .into_inner();
        Self { requests, answers }
    }

    /// Sends `request` and reads the answer, which must be an acceptance.
    async fn accepted(&mut self, request: HeartbeatRequest) -> HeartbeatResponse {
        self.requests
            .send(request)
            .await
            .expect("the stream is open");
        let answer = tokio::time::timeout(PATIENCE, self.answers.message())
            .await
            .expect("an answer in time")
            .expect("an answer, not an error")
            .expect("an answer, not the stream's end");
        assert!(answer.accepted, "{answer:?}");
        answer
    }
}

#[test]
fn heartbeats_on_one_stream_are_answered_in_order() {
    let kplug = StandaloneKplug::start();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let mut stream = Stream::open(&kplug).await;
        let first = stream.accepted(heartbeat("alpha", "127.0.0.1:7000")).await;
        let other = stream.accepted(heartbeat("beta", "127.0.0.1:7001")).await;
        let again = stream.accepted(heartbeat("alpha", "127.0.0.1:7000")).await;
        assert_ne!(first.uid, other.uid, "two plugins, two registrations");
        assert_eq!(first.uid, again.uid, "an unchanged heartbeat keeps its uid");
        let capabilities = first.server_protocol.expect("the server's protocol");
        assert!(
            capabilities
                .capabilities
                .iter()
                .any(|c| c == "HeartbeatStream"),
            "{capabilities:?}"
        );
    });
    let listed = kplug.kubectl_ok(&["get", "plugins", "-o", "name"]);
    assert_eq!(
        listed.split_whitespace().collect::<Vec<_>>(),
        [
            "plugin.plugins.kplug.io/alpha",
            "plugin.plugins.kplug.io/beta"
        ]
    );
}

#[test]
fn shutdown_ends_open_streams_instead_of_waiting_for_them() {
    // Long enough that waiting for the stream would fail `terminate` below.
    let mut kplug = StandaloneKplug::start_with(&["--shutdown-timeout", "60s"]);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let mut stream = runtime.block_on(async {
        let mut stream = Stream::open(&kplug).await;
        stream.accepted(heartbeat("alpha", "127.0.0.1:7000")).await;
        stream
    });
    assert!(
        kplug.process.terminate(Duration::from_secs(20)),
        "kplug did not exit cleanly within 20 s of SIGTERM with a heartbeat stream open"
    );
    let end = runtime
        .block_on(async { tokio::time::timeout(PATIENCE, stream.answers.message()).await })
        .expect("the stream ends in time");
    assert!(
        matches!(end, Ok(None)),
        "the stream ends with OK, not {end:?}"
    );
}
