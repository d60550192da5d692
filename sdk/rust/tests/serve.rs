//! `serve_with_shutdown` end to end: a real tonic client calls the plugin
//! while a real fake registry records its heartbeats. Every wait is bounded
//! so that a hang fails instead of stalling the suite.

mod fake;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kplug_sdk::proto::v1alpha1::plugin_client::PluginClient;
use kplug_sdk::proto::v1alpha1::{
    DeregisterRequest, HeartbeatRequest, ReconcileRequest, ReconcileResponse,
    Severity as WireSeverity,
};
use kplug_sdk::{
    ApiRef, Condition, Config, Error, ObjectRef, Outcome, Plugin, PluginInfo, Request, Server,
    Severity,
};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use fake::{Call, Options, PATIENCE, Registry};

/// A plugin steered by its object's spec: `sleepMs` delays the answer,
/// `panic` panics with that message; otherwise it echoes what it got.
#[derive(Default)]
struct Echo {
    /// Calls that reached the plugin.
    calls: Arc<AtomicUsize>,
    /// Calls whose future was dropped before it finished.
    cancelled: Arc<AtomicUsize>,
    /// Reports each call's object name as it starts.
    started: Option<mpsc::UnboundedSender<String>>,
    /// When each sleeping call finished sleeping.
    finished: Arc<Mutex<Vec<Instant>>>,
}

/// Counts a future dropped before `finished` is set.
struct CancelGuard {
    cancelled: Arc<AtomicUsize>,
    finished: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Echo {
    async fn behave(&self, request: &Request) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some(started) = &self.started {
            let _ = started.send(request.name().unwrap_or_default().to_owned());
        }
        if let Some(message) = request.object["spec"]["panic"].as_str() {
            panic!("{message}");
        }
        if let Some(ms) = request.object["spec"]["sleepMs"].as_u64() {
            let mut guard = CancelGuard {
                cancelled: Arc::clone(&self.cancelled),
                finished: false,
            };
            tokio::time::sleep(Duration::from_millis(ms)).await;
            guard.finished = true;
            self.finished.lock().unwrap().push(Instant::now());
        }
    }
}

impl Plugin for Echo {
    async fn reconcile(&self, request: Request) -> Outcome {
        self.behave(&request).await;
        let mut outcome = Outcome::success()
            .result(Severity::Normal, "Echoed", &request.operation_id)
            .result(Severity::Warning, "Careful", "just so you know")
            .condition(Condition::new("Synced", true, "Echoed", "all good"))
            .object_status(json!({
                "object": request.object,
                "dryRun": request.dry_run,
                "hasDeadline": request.deadline.is_some(),
            }))
            .requeue_after(Duration::from_millis(1500));
        for extension in &request.extensions {
            if let Some(reference) = ObjectRef::of(extension) {
                outcome = outcome.extension_status(reference, extension["spec"].clone());
            }
        }
        outcome
    }

    async fn finalize(&self, request: Request) -> Outcome {
        self.behave(&request).await;
        Outcome::failure(
            "StillInUse",
            format!("{} is in use", request.name().unwrap_or_default()),
        )
    }
}

/// A plugin served on a free port against a fake registry.
struct Running {
    client: PluginClient<Channel>,
    channel: Channel,
    address: SocketAddr,
    registry: Registry,
    stop: Option<oneshot::Sender<()>>,
    served: JoinHandle<Result<(), Error>>,
}

impl Running {
    async fn start(plugin: Echo, config: Config) -> Self {
        let info = PluginInfo::new("echo", ApiRef::new("example.com", "echoes", "v1"))
            .version("1.0.0")
            .implementation("Echo");
        Self::start_with(plugin, info, config).await
    }

    async fn start_with(plugin: impl Plugin, info: PluginInfo, config: Config) -> Self {
        // A kplug before instances: deregistered at once on shutdown.
        let registry = Registry::start(Options {
            instances: false,
            ..Options::default()
        })
        .await;
        let registry_url = registry.url();
        let config = config
            .registry(registry_url)
            .listen("127.0.0.1:0".parse().unwrap());
        let server = Server::bind(plugin, info, config).await.unwrap();
        let address = server.local_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        let channel = Channel::from_shared(format!("http://{address}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Self {
            client: PluginClient::new(channel.clone()),
            channel,
            address,
            registry,
            stop: Some(stop),
            served,
        }
    }

    async fn heartbeat(&mut self) -> HeartbeatRequest {
        self.registry.heartbeat().await.0
    }

    async fn deregistration(&mut self) -> (DeregisterRequest, Instant) {
        loop {
            if let Call::Deregister(request, at) = self.registry.next().await {
                return (request, at);
            }
        }
    }

    /// Signals shutdown; `wait` then collects the result.
    fn shut_down(&mut self) {
        let _ = self.stop.take().expect("shut down once").send(());
    }

    async fn wait(self) -> (Result<(), Error>, Instant) {
        let result = tokio::time::timeout(PATIENCE, self.served)
            .await
            .expect("serve did not return in time")
            .expect("serve panicked");
        (result, Instant::now())
    }
}

fn object(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Echo", "metadata": {"name": name}, "spec": spec})
}

fn request(object: &Value) -> ReconcileRequest {
    ReconcileRequest {
        operation_id: "op-1".into(),
        object: serde_json::to_vec(object).unwrap().into(),
        ..Default::default()
    }
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("JSON from the plugin")
}

#[tokio::test]
async fn declares_itself_with_the_real_port_and_capabilities() {
    let mut running = Running::start(Echo::default(), Config::default().name("renamed")).await;
    let heartbeat = running.heartbeat().await;
    assert_eq!(heartbeat.name, "renamed");
    assert_eq!(heartbeat.address, running.address.to_string());
    assert_ne!(running.address.port(), 0);
    assert_eq!(heartbeat.implementation, "Echo");
    let protocol = heartbeat.protocol.unwrap();
    assert_eq!(protocol.capabilities, ["Reconcile", "Finalize", "DryRun"]);
    running.shut_down();
    assert!(running.wait().await.0.is_ok());
}

/// Reconciles only: its objects leave nothing to clean up.
struct Stateless;

impl Plugin for Stateless {
    async fn reconcile(&self, _request: Request) -> Outcome {
        Outcome::success()
    }
}

#[tokio::test]
async fn a_plugin_without_finalize_declares_no_finalize_capability() {
    let info =
        PluginInfo::new("stateless", ApiRef::new("example.com", "echoes", "v1")).without_finalize();
    let mut running = Running::start_with(Stateless, info, Config::default()).await;
    let protocol = running.heartbeat().await.protocol.unwrap();
    assert_eq!(protocol.capabilities, ["Reconcile", "DryRun"]);
    running.shut_down();
    assert!(running.wait().await.0.is_ok());
}

#[tokio::test]
async fn reconcile_and_finalize_round_trip_json_losslessly() {
    let mut running = Running::start(Echo::default(), Config::default()).await;
    let spec = json!({
        "max": u64::MAX,
        "min": i64::MIN,
        "big": 12345678901234567890u64,
        "float": 2.718281828459045e10,
        "tiny": 1e-300,
        "nothing": null,
        "nested": {"list": [1, "two", null, {"deep": [[]]}], "empty": {}},
        "text": "ünïcødé \"quoted\" \\ \n",
    });
    let object = object("users", spec.clone());
    let extension = json!({
        "apiVersion": "myorg.org/v1alpha1",
        "kind": "EchoExtension",
        "metadata": {"name": "users", "namespace": "db"},
        "spec": {"engine": "InnoDB", "limit": u64::MAX},
    });
    let mut message = request(&object);
    message.dry_run = true;
    message.extensions = vec![serde_json::to_vec(&extension).unwrap().into()];

    let answer: ReconcileResponse = running
        .client
        .reconcile(message.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(answer.success);
    assert_eq!(answer.results.len(), 2);
    assert_eq!(answer.results[0].reason, "Echoed");
    assert_eq!(answer.results[0].message, "op-1");
    assert_eq!(answer.results[0].severity(), WireSeverity::Normal);
    assert_eq!(answer.results[1].severity(), WireSeverity::Warning);
    assert_eq!(answer.conditions[0].r#type, "Synced");
    assert_eq!(answer.conditions[0].status, "True");
    assert_eq!(answer.conditions[0].message, "all good");
    let status = json_of(&answer.object_status);
    // Compared as values: every number, null and nesting came back as sent.
    assert_eq!(status["object"], object);
    assert_eq!(status["object"]["spec"]["max"].as_u64(), Some(u64::MAX));
    assert_eq!(status["object"]["spec"]["min"].as_i64(), Some(i64::MIN));
    assert_eq!(status["dryRun"], true);
    assert_eq!(status["hasDeadline"], false);
    let requeue = answer.requeue_after.unwrap();
    assert_eq!((requeue.seconds, requeue.nanos), (1, 500_000_000));
    let [extension_status] = answer.extension_statuses.as_slice() else {
        panic!("one extension status expected: {answer:?}");
    };
    let reference = extension_status.r#ref.as_ref().unwrap();
    assert_eq!(
        (
            reference.api_version.as_str(),
            reference.kind.as_str(),
            reference.namespace.as_str(),
            reference.name.as_str()
        ),
        ("myorg.org/v1alpha1", "EchoExtension", "db", "users")
    );
    assert_eq!(json_of(&extension_status.status), extension["spec"]);

    let answer = running.client.finalize(message).await.unwrap().into_inner();
    assert!(!answer.success);
    assert_eq!(answer.results[0].severity(), WireSeverity::Error);
    assert_eq!(answer.results[0].reason, "StillInUse");
    assert_eq!(answer.results[0].message, "users is in use");
    assert!(
        answer.object_status.is_empty(),
        "no status means empty bytes"
    );
    assert!(answer.requeue_after.is_none());

    running.shut_down();
    assert!(running.wait().await.0.is_ok());
}

#[tokio::test]
async fn invalid_json_is_invalid_argument_and_never_reaches_the_plugin() {
    let plugin = Echo::default();
    let calls = Arc::clone(&plugin.calls);
    let mut running = Running::start(plugin, Config::default()).await;
    // (object, extensions, what the message must say)
    type Case<'a> = (&'a [u8], &'a [&'a [u8]], &'a str);
    let cases: [Case; 4] = [
        (b"{\"kind\": ", &[], "object is not valid JSON"),
        (b"", &[], "object is empty"),
        (b"[1, 2]", &[], "object must be a JSON object, not an array"),
        (b"{}", &[b"{}", b"nope"], "extensions[1] is not valid JSON"),
    ];
    for (object, extensions, expected) in cases {
        let message = ReconcileRequest {
            object: object.to_vec().into(),
            extensions: extensions.iter().map(|e| e.to_vec().into()).collect(),
            ..Default::default()
        };
        let status = running.client.reconcile(message).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(expected), "{status:?}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the plugin saw bad JSON");
    // A valid call is the plugin's first.
    let answer = running
        .client
        .reconcile(request(&object("ok", json!({}))))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.success);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    running.shut_down();
    assert!(running.wait().await.0.is_ok());
}

// On the multi-threaded runtime, as plugins run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_is_internal_and_the_server_keeps_serving() {
    let mut running = Running::start(Echo::default(), Config::default()).await;
    for _ in 0..3 {
        let status = running
            .client
            .reconcile(request(&object("boom", json!({"panic": "kaboom 42"}))))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Internal, "{status:?}");
        assert_eq!(status.message(), "plugin panicked: kaboom 42");
    }
    // Same connection, same server: still answering.
    let answer = running
        .client
        .reconcile(request(&object("fine", json!({}))))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.success);
    running.shut_down();
    assert!(running.wait().await.0.is_ok());
}

// On the multi-threaded runtime, as plugins run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_deadline_is_deadline_exceeded_and_cancelled() {
    let plugin = Echo::default();
    let cancelled = Arc::clone(&plugin.cancelled);
    let mut running = Running::start(plugin, Config::default()).await;
    let slow = object("slow", json!({"sleepMs": 5000}));

    // The deadline as the grpc-timeout header, as kplug sends it.
    let mut call = tonic::Request::new(request(&slow));
    call.set_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let status = running.client.reconcile(call).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("300ms"), "{status:?}");
    assert!(
        took >= Duration::from_millis(250),
        "answered early: {took:?}"
    );
    assert!(took < Duration::from_secs(2), "answered late: {took:?}");

    // The deadline as the request's own timeout field only.
    let mut message = request(&slow);
    message.timeout = Some(Duration::from_millis(300).try_into().unwrap());
    let status = running.client.finalize(message).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");

    // Both abandoned calls were cancelled, not left running.
    tokio::time::timeout(PATIENCE, async {
        while cancelled.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("abandoned calls were not cancelled");

    // A call within its deadline sees it and succeeds.
    let mut call = tonic::Request::new(request(&object("quick", json!({"sleepMs": 10}))));
    call.set_timeout(Duration::from_secs(5));
    let answer = running.client.reconcile(call).await.unwrap().into_inner();
    assert_eq!(json_of(&answer.object_status)["hasDeadline"], true);
    running.shut_down();
    assert!(running.wait().await.0.is_ok());
}

#[tokio::test]
async fn health_reports_serving() {
    let mut running = Running::start(Echo::default(), Config::default()).await;
    let mut health = HealthClient::new(running.channel.clone());
    for service in ["", "kplug.v1alpha1.Plugin"] {
        let answer = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.status(), ServingStatus::Serving, "{service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    running.heartbeat().await;
    running.shut_down();
    assert!(running.wait().await.0.is_ok());
}

// On the multi-threaded runtime, as plugins run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_deregisters_first_then_drains_in_flight_calls() {
    let (started, mut starts) = mpsc::unbounded_channel();
    let plugin = Echo {
        started: Some(started),
        ..Echo::default()
    };
    let finished = Arc::clone(&plugin.finished);
    let mut running = Running::start(plugin, Config::default()).await;
    let registered = running.heartbeat().await;

    let mut client = running.client.clone();
    let slow = tokio::spawn(async move {
        client
            .reconcile(request(&object("slow", json!({"sleepMs": 1500}))))
            .await
    });
    let name = tokio::time::timeout(PATIENCE, starts.recv()).await.unwrap();
    assert_eq!(name.as_deref(), Some("slow"));

    running.shut_down();
    let (deregistered, deregistered_at) = running.deregistration().await;
    assert_eq!(deregistered.name, registered.name);
    assert_eq!(deregistered.address, registered.address);
    assert!(
        !slow.is_finished(),
        "deregistration must come before the drain"
    );
    let address = running.address;
    let (result, returned_at) = running.wait().await;
    assert!(result.is_ok(), "{result:?}");

    let answer = tokio::time::timeout(PATIENCE, slow).await.unwrap().unwrap();
    let answer = answer.expect("the in-flight call completes").into_inner();
    assert!(answer.success);
    let finished_at = finished.lock().unwrap()[0];
    assert!(
        deregistered_at < finished_at,
        "deregistered after the call finished"
    );
    assert!(
        finished_at <= returned_at,
        "serve returned before the call finished"
    );
    // And nothing listens any more.
    assert!(tokio::net::TcpStream::connect(address).await.is_err());
}

#[tokio::test]
async fn calls_outliving_the_drain_timeout_are_cancelled() {
    let (started, mut starts) = mpsc::unbounded_channel();
    let plugin = Echo {
        started: Some(started),
        ..Echo::default()
    };
    let cancelled = Arc::clone(&plugin.cancelled);
    let config = Config::default().drain_timeout(Duration::from_millis(300));
    let mut running = Running::start(plugin, config).await;
    let mut client = running.client.clone();
    let stuck = tokio::spawn(async move {
        client
            .reconcile(request(&object("stuck", json!({"sleepMs": 60_000}))))
            .await
    });
    tokio::time::timeout(PATIENCE, starts.recv()).await.unwrap();

    let stopping = Instant::now();
    running.shut_down();
    let (result, returned_at) = running.wait().await;
    assert!(result.is_ok(), "{result:?}");
    let took = returned_at - stopping;
    assert!(
        took >= Duration::from_millis(300),
        "did not wait for the drain: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "drain not bounded: {took:?}");
    let status = tokio::time::timeout(PATIENCE, stuck)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("shut down"), "{status:?}");
    assert_eq!(cancelled.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn serving_locally_writes_the_address_and_never_heartbeats() {
    // As kubectl kplug render starts a plugin: TLS settings it inherits are
    // not used, and the registry hears nothing.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("address");
    let config = Config::default()
        .tls("/nonexistent/tls.crt", "/nonexistent/tls.key")
        .local_address_file(&file);
    let mut running = Running::start(Echo::default(), config).await;
    let answer = running
        .client
        .reconcile(request(&object("a", json!({}))))
        .await
        .expect("a plain gRPC call")
        .into_inner();
    assert!(answer.success);
    // Written before the server answered anything.
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        running.address.to_string()
    );
    running.shut_down();
    tokio::time::timeout(PATIENCE, &mut running.served)
        .await
        .expect("serve did not return in time")
        .expect("serve panicked")
        .expect("served without an error");
    running.registry.assert_quiet();
}

#[tokio::test]
async fn a_taken_port_is_a_bind_error() {
    let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = Config::default()
        .registry("http://127.0.0.1:1")
        .listen(taken.local_addr().unwrap());
    let info = PluginInfo::new("echo", ApiRef::new("example.com", "echoes", "v1"));
    let error = Server::bind(Echo::default(), info, config)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Bind { .. }), "{error:?}");
    assert!(
        error.to_string().contains("cannot listen on 127.0.0.1:"),
        "{error}"
    );

    let config = Config::default().registry("ftp://kplug:50051");
    let info = PluginInfo::new("echo", ApiRef::new("example.com", "echoes", "v1"));
    let error = Server::bind(Echo::default(), info, config)
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::InvalidRegistryAddress { .. }),
        "{error:?}"
    );
}
