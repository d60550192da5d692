//! The heartbeat loop against a real tonic server hosting a scriptable fake
//! registry. Timing checks use lower bounds (timers never fire early) and
//! generous upper bounds, and every wait has a timeout so a hang fails.

mod fake;
mod support;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kplug_sdk::heartbeat::Outcome;
use kplug_sdk::proto::v1alpha1::registry_server::{Registry, RegistryServer};
use kplug_sdk::proto::v1alpha1::{
    DeregisterRequest, DeregisterResponse, HeartbeatRequest, HeartbeatResponse, PROTOCOL_VERSION,
};
use kplug_sdk::{ApiRef, Error, Heartbeater, PluginInfo};
use kplug_test_support::free_port;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Code, Request, Response, Streaming};

use support::{Answers, Client, PATIENCE, answer_each, assert_gaps_at_least};

/// What the fake does with one heartbeat.
#[derive(Clone)]
enum Reply {
    Accept,
    Refuse,
    Fail,
    /// Accepts, then ends the stream it came on (as kplug does when it
    /// shuts down); a call is accepted.
    AcceptAndEnd,
}

/// Something the fake registry received.
#[derive(Debug)]
enum Call {
    Heartbeat(Box<HeartbeatRequest>, Instant),
    Deregister(DeregisterRequest),
}

/// Answers heartbeats from a script, then accepts; reports every call.
/// Takes heartbeats as calls and, with `streams`, on streams.
#[derive(Clone)]
struct FakeRegistry {
    script: Arc<Mutex<VecDeque<Reply>>>,
    interval: Duration,
    calls: mpsc::UnboundedSender<Call>,
    streams: bool,
    streams_opened: Arc<AtomicUsize>,
}

impl FakeRegistry {
    /// The scripted answer to `request`, and whether it ends its stream.
    fn answer(
        &self,
        request: HeartbeatRequest,
    ) -> (Result<HeartbeatResponse, tonic::Status>, bool) {
        let _ = self
            .calls
            .send(Call::Heartbeat(Box::new(request), Instant::now()));
        let reply = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Reply::Accept);
        let interval = Some(self.interval.try_into().unwrap());
        let accepted = HeartbeatResponse {
            accepted: true,
            interval,
            ttl: Some((self.interval * 3).try_into().unwrap()),
            uid: "uid-1".into(),
            ..Default::default()
        };
        match reply {
            Reply::Accept => (Ok(accepted), false),
            Reply::AcceptAndEnd => (Ok(accepted), true),
            Reply::Refuse => (
                Ok(HeartbeatResponse {
                    accepted: false,
                    reason: "AddressConflict".into(),
                    message: "taken".into(),
                    interval,
                    ..Default::default()
                }),
                false,
            ),
            Reply::Fail => (Err(tonic::Status::unavailable("injected failure")), true),
        }
    }
}

#[tonic::async_trait]
impl Registry for FakeRegistry {
    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, tonic::Status> {
        self.answer(request.into_inner()).0.map(Response::new)
    }

    type HeartbeatsStream = Answers;

    async fn heartbeats(
        &self,
        request: Request<Streaming<HeartbeatRequest>>,
    ) -> Result<Response<Answers>, tonic::Status> {
        if !self.streams {
            return Err(tonic::Status::unimplemented("no streams here"));
        }
        self.streams_opened.fetch_add(1, Ordering::SeqCst);
        let fake = self.clone();
        let answers = answer_each(request.into_inner(), move |request| fake.answer(request));
        Ok(Response::new(answers))
    }

    async fn deregister(
        &self,
        request: Request<DeregisterRequest>,
    ) -> Result<Response<DeregisterResponse>, tonic::Status> {
        let _ = self.calls.send(Call::Deregister(request.into_inner()));
        Ok(Response::new(DeregisterResponse { removed: true }))
    }
}

/// A fake registry served on `listener` until dropped.
struct Server {
    calls: mpsc::UnboundedReceiver<Call>,
    streams_opened: Arc<AtomicUsize>,
    _stop: oneshot::Sender<()>,
}

impl Server {
    /// A registry that takes heartbeat streams, as kplug does.
    async fn start(listener: TcpListener, interval: Duration, script: Vec<Reply>) -> Self {
        Self::start_with(listener, interval, script, true).await
    }

    async fn start_with(
        listener: TcpListener,
        interval: Duration,
        script: Vec<Reply>,
        streams: bool,
    ) -> Self {
        let (calls_tx, calls) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let streams_opened = Arc::new(AtomicUsize::new(0));
        let fake = FakeRegistry {
            script: Arc::new(Mutex::new(script.into())),
            interval,
            calls: calls_tx,
            streams,
            streams_opened: streams_opened.clone(),
        };
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RegistryServer::new(fake))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                }),
        );
        Self {
            calls,
            streams_opened,
            _stop: stop,
        }
    }

    fn streams_opened(&self) -> usize {
        self.streams_opened.load(Ordering::SeqCst)
    }

    async fn next(&mut self) -> Call {
        tokio::time::timeout(PATIENCE, self.calls.recv())
            .await
            .expect("registry heard nothing in time")
            .expect("registry stopped")
    }

    async fn heartbeat(&mut self) -> (HeartbeatRequest, Instant) {
        match self.next().await {
            Call::Heartbeat(request, at) => (*request, at),
            other => panic!("expected a heartbeat, got {other:?}"),
        }
    }

    /// Skips heartbeats until the deregistration.
    async fn deregistration(&mut self) -> DeregisterRequest {
        loop {
            if let Call::Deregister(request) = self.next().await {
                return request;
            }
        }
    }
}

async fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.unwrap()
}

fn info() -> PluginInfo {
    PluginInfo::new("hello", ApiRef::new("example.com", "greetings", "v1"))
        .version("1.0.0")
        .implementation("Hello")
        .address("127.0.0.1:50052")
        .label("team", "a")
}

fn url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

#[tokio::test]
async fn first_heartbeat_is_immediate_and_declares_the_plugin() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    // A long requested and answered interval: only an immediate first
    // heartbeat can arrive in time.
    let mut server = Server::start(listener, Duration::from_secs(3600), vec![]).await;
    let started = Instant::now();
    let mut client =
        Client::start(Heartbeater::new(url(addr), info()).interval(Duration::from_secs(3600)));

    let (request, _) = server.heartbeat().await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(request.name, "hello");
    assert_eq!(request.version, "1.0.0");
    assert_eq!(request.implementation, "Hello");
    assert_eq!(request.address, "127.0.0.1:50052");
    assert_eq!(request.labels["team"], "a");
    assert_eq!(request.interval.unwrap().seconds, 3600);
    let api = request.api.unwrap();
    assert_eq!(
        (
            api.group.as_str(),
            api.resource.as_str(),
            api.version.as_str()
        ),
        ("example.com", "greetings", "v1")
    );
    let protocol = request.protocol.unwrap();
    assert_eq!(protocol.version, PROTOCOL_VERSION);
    assert!(protocol.sdk.starts_with("kplug-sdk-rust/"));

    let status = client.wait_status(|s| s.last.is_some()).await;
    assert_eq!(status.uid.as_deref(), Some("uid-1"));
    assert_eq!(status.last, Some(Outcome::Accepted));
    assert_eq!(status.interval, Some(Duration::from_secs(3600)));
    assert_eq!(status.ttl, Some(Duration::from_secs(3 * 3600)));
    client.stop().await;
}

#[tokio::test]
async fn follows_the_interval_the_registry_answers() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let interval = Duration::from_millis(100);
    let mut server = Server::start(listener, interval, vec![]).await;
    // Asks for an hour; the registry's 100ms must win.
    let client =
        Client::start(Heartbeater::new(url(addr), info()).interval(Duration::from_secs(3600)));

    let (_, mut previous) = server.heartbeat().await;
    for _ in 0..4 {
        let (_, at) = server.heartbeat().await;
        let gap = at - previous;
        // 100ms - 10% jitter, with a little slack for clock granularity.
        assert!(
            gap >= Duration::from_millis(85),
            "gap {gap:?} below the interval"
        );
        assert!(
            gap < Duration::from_secs(3),
            "gap {gap:?} far above the interval"
        );
        previous = at;
    }
    client.stop().await;
}

#[tokio::test]
async fn failures_back_off_then_recover() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    // With a 10s interval, only backoff starting near 200ms gets through
    // three failures within the test's patience.
    let mut server = Server::start(
        listener,
        Duration::from_secs(10),
        vec![Reply::Fail, Reply::Fail, Reply::Fail],
    )
    .await;
    let mut client =
        Client::start(Heartbeater::new(url(addr), info()).interval(Duration::from_secs(10)));

    let mut times = Vec::new();
    for _ in 0..4 {
        times.push(server.heartbeat().await.1);
    }
    let gaps: Vec<_> = times.windows(2).map(|w| w[1] - w[0]).collect();
    // Backoff 200ms, 400ms, 800ms, each -10% at worst.
    for (gap, min_ms) in gaps.iter().zip([170, 350, 700]) {
        assert!(
            *gap >= Duration::from_millis(min_ms),
            "gaps {gaps:?} do not back off"
        );
    }
    assert!(
        times[3] - times[0] < Duration::from_secs(8),
        "gaps {gaps:?} too slow"
    );

    let status = client.wait_accepted().await;
    assert_eq!(status.consecutive_failures, 0);
    client.stop().await;
}

#[tokio::test]
async fn reports_failures_in_status() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let _server = Server::start(listener, Duration::from_secs(10), vec![Reply::Fail; 100]).await;
    let mut client = Client::start(Heartbeater::new(url(addr), info()));

    let status = client.wait_status(|s| s.consecutive_failures >= 2).await;
    match status.last {
        Some(Outcome::Failed { code, message }) => {
            assert_eq!(code, Code::Unavailable);
            assert_eq!(message, "injected failure");
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    assert_eq!(status.uid, None);
    client.stop().await;
}

#[tokio::test]
async fn reconnects_when_the_registry_comes_up_late() {
    // A port nothing listens on yet, so the first dials are refused.
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut client =
        Client::start(Heartbeater::new(url(addr), info()).interval(Duration::from_secs(10)));
    let status = client.wait_status(|s| s.consecutive_failures >= 2).await;
    assert!(matches!(
        status.last,
        Some(Outcome::Failed {
            code: Code::Unavailable,
            ..
        })
    ));

    let listener = TcpListener::bind(addr).await.unwrap();
    let mut server = Server::start(listener, Duration::from_secs(10), vec![]).await;
    server.heartbeat().await;
    let status = client.wait_accepted().await;
    assert_eq!(status.consecutive_failures, 0);
    client.stop().await;
    assert_eq!(server.deregistration().await.name, "hello");
}

#[tokio::test]
async fn refusals_are_retried_at_the_interval() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    // 300ms tells retry-at-interval apart from the 200ms first backoff.
    let interval = Duration::from_millis(300);
    let mut server = Server::start(listener, interval, vec![Reply::Refuse, Reply::Refuse]).await;
    let mut client = Client::start(Heartbeater::new(url(addr), info()));

    let status = client
        .wait_status(|s| matches!(s.last, Some(Outcome::Refused { .. })))
        .await;
    assert_eq!(
        status.last,
        Some(Outcome::Refused {
            reason: "AddressConflict".into(),
            message: "taken".into()
        })
    );
    assert_eq!(status.uid, None);
    assert_eq!(status.consecutive_failures, 0);

    let mut times = Vec::new();
    for _ in 0..3 {
        times.push(server.heartbeat().await.1);
    }
    assert_gaps_at_least(&times, Duration::from_millis(260));
    client.wait_accepted().await;
    client.stop().await;
}

#[tokio::test]
async fn shutdown_deregisters_and_ends_promptly() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let mut server = Server::start(listener, Duration::from_secs(3600), vec![]).await;
    let mut client = Client::start(Heartbeater::new(url(addr), info()));
    server.heartbeat().await;
    client.wait_status(|s| s.uid.is_some()).await;
    let mut status = client.status.clone();

    // Shutdown lands in the hour-long sleep: it must cut it short.
    let took = client.stop().await;
    assert!(took < Duration::from_secs(3), "shutdown took {took:?}");
    let request = server.deregistration().await;
    assert_eq!(request.name, "hello");
    assert_eq!(request.address, "127.0.0.1:50052");

    let last = status.borrow_and_update().clone();
    assert!(last.stopped);
    assert_eq!(last.uid, None);
    // The loop is gone: its sender closed.
    assert!(status.changed().await.is_err());
}

#[tokio::test]
async fn shutdown_is_bounded_when_the_registry_hangs() {
    // Accepts connections but never speaks HTTP/2, like a wedged registry.
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let (first_connection, _hold) = fake::wedged(listener);
    let client = Client::start(Heartbeater::new(url(addr), info()));
    // Stop while the heartbeat is stuck on the connection, not before it.
    tokio::time::timeout(PATIENCE, first_connection)
        .await
        .expect("the heartbeater connects")
        .expect("the listener runs");

    let took = client.stop().await;
    assert!(took < Duration::from_secs(6), "shutdown took {took:?}");
}

#[tokio::test]
async fn invalid_registry_address_is_an_error() {
    let result = tokio::time::timeout(
        PATIENCE,
        Heartbeater::new("ftp://kplug:50051", info()).run(std::future::pending()),
    )
    .await
    .expect("run should fail at once");
    assert!(matches!(result, Err(Error::InvalidRegistryAddress { .. })));
}

#[tokio::test]
async fn heartbeats_go_on_one_stream() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let mut server = Server::start(listener, Duration::from_millis(50), vec![]).await;
    let mut client = Client::start(Heartbeater::new(url(addr), info()));
    for _ in 0..5 {
        server.heartbeat().await;
    }
    client.wait_accepted().await;
    assert_eq!(server.streams_opened(), 1);
    client.stop().await;
    assert_eq!(server.deregistration().await.name, "hello");
}

#[tokio::test]
async fn a_stream_the_registry_ends_is_replaced_without_a_failure() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    // Every stream ends after its first answer, as a kplug shutting down
    // ends them; the next heartbeat finds its stream ended.
    let script = vec![Reply::AcceptAndEnd; 4];
    let mut server = Server::start(listener, Duration::from_millis(50), script).await;
    let mut client = Client::start(Heartbeater::new(url(addr), info()));
    let mut watched = client.status.clone();
    let saw_a_failure = tokio::spawn(async move {
        let mut failed = false;
        while watched.changed().await.is_ok() {
            failed |= matches!(
                watched.borrow_and_update().last,
                Some(Outcome::Failed { .. })
            );
        }
        failed
    });
    for _ in 0..5 {
        server.heartbeat().await;
    }
    client.wait_accepted().await;
    assert!(
        server.streams_opened() >= 5,
        "{} streams for five heartbeats, each answered on a stream that then ended",
        server.streams_opened()
    );
    client.stop().await;
    assert!(
        !saw_a_failure.await.unwrap(),
        "an ended stream was reported as a failed heartbeat"
    );
}

#[tokio::test]
async fn a_registry_without_streams_gets_a_call_each() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let mut server = Server::start_with(
        listener,
        Duration::from_millis(50),
        vec![Reply::Refuse],
        false,
    )
    .await;
    let mut client = Client::start(Heartbeater::new(url(addr), info()));
    for _ in 0..3 {
        server.heartbeat().await;
    }
    let status = client.wait_accepted().await;
    assert_eq!(status.consecutive_failures, 0);
    assert_eq!(server.streams_opened(), 0);
    client.stop().await;
    assert_eq!(server.deregistration().await.name, "hello");
}
