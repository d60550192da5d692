//! Reconcile benchmark: the same plugin called through kplug and directly.
//!
//! Runs the real `kplug-apiserver standalone` and the real `hello-plugin`
//! (examples/hello-rust) as separate processes on 127.0.0.1; the plugin
//! registers with kplug as `bench`. The same Kubernetes object (about
//! 1 KiB and about 64 KiB, most of it in `spec`) is then reconciled two ways:
//!
//! - **through kplug**: `POST .../plugins/bench/reconcile` with a Reconcile,
//!   over HTTP/2 and TLS with the admin client certificate from the
//!   generated kubeconfig; kplug calls the plugin over gRPC;
//! - **directly**: `kplug.v1alpha1.Plugin/Reconcile` on the plugin, over a
//!   tonic channel, with `object` the same JSON bytes and the same deadline
//!   that kplug passes.
//!
//! It measures p50 and p99 latency with one call in flight, alternating the
//! two routes in rounds, and throughput with `IN_FLIGHT` calls in flight over
//! one and over four connections, with the CPU time each process spent.
//!
//! Both routes include the plugin's own time, which is mostly waiting: the
//! hello plugin awaits `tokio::time::sleep` of its `--delay-ms` fault knob
//! (0 by default) in every call, Tokio rounds that up to its next 1 ms
//! tick, and the idle worker parks in `epoll_wait` with a 1 ms timeout, so
//! every call waits about 1.08 ms. That is the same on both routes, so the
//! difference between them is what kplug adds.
//!
//! Results go to stdout as Markdown (for BENCHMARKS.md), progress to stderr.
//! Run with `cargo build --release -p kplug-apiserver -p kplug-example-hello
//! && cargo bench -p kplug-apiserver --bench reconcile`.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use http::StatusCode;
use kplug_proto::v1alpha1::ReconcileRequest;
use kplug_proto::v1alpha1::plugin_client::PluginClient;
use kplug_test_support::{Process, free_port, target_binary};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tonic::transport::{Channel, Endpoint};

use kplug_test_support::measure::{CpuSnapshot, Latencies, own_cpu_time, process_cpu_time};
use kplug_test_support::report::{micros, thousands, verdict};
use support::{ApiClient, REQUEST_TIMEOUT, STARTUP_TIMEOUT, Server, join_all, print_machine};

/// Builds both binaries measured here.
const BUILD: &str = "cargo build --release -p kplug-apiserver -p kplug-example-hello";
/// The command that produces these numbers, as printed in the report.
const COMMAND: &str = "cargo build --release -p kplug-apiserver -p kplug-example-hello && \
                       cargo bench -p kplug-apiserver --bench reconcile";

/// The plugin may ask for a 300 s heartbeat interval, so it stays Ready for
/// the whole run on one heartbeat.
const SERVER_FLAGS: &[&str] = &["--max-heartbeat-interval", "5m"];
const PLUGIN_NAME: &str = "bench";
const PLUGIN_INTERVAL_SECONDS: &str = "300";
const RECONCILE_PATH: &str = "/apis/plugins.kplug.io/v1alpha1/plugins/bench/reconcile";
const PLUGIN_PATH: &str = "/apis/plugins.kplug.io/v1alpha1/plugins/bench";
/// The deadline kplug gives the plugin when a Reconcile sets no
/// `timeoutSeconds` (its `--reconcile-timeout` default); direct calls send
/// the same, as `grpc-timeout` and as `timeout`.
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(30);
/// kplug's bound on messages to and from plugins; direct calls use it too.
const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// The objects reconciled.
struct PayloadSpec {
    label: &'static str,
    /// Size of the object's JSON, exactly.
    bytes: usize,
    /// Timed reconciles per throughput run.
    throughput_reconciles: usize,
}

const PAYLOADS: [PayloadSpec; 2] = [
    PayloadSpec {
        label: "1 KiB",
        bytes: 1 << 10,
        throughput_reconciles: 40_000,
    },
    PayloadSpec {
        label: "64 KiB",
        bytes: 64 << 10,
        throughput_reconciles: 5_000,
    },
];

/// Untimed calls per route before the sequential rounds.
const WARMUP: usize = 500;
/// Sequential calls: rounds of `PER_ROUND` per route, alternating which
/// route goes first, so that drift in the machine's load hits both.
const ROUNDS: usize = 5;
const PER_ROUND: usize = 1_000;

/// Calls in flight during throughput runs, spread over this many connections.
const IN_FLIGHT: usize = 32;
const CONNECTIONS: [usize; 2] = [1, 4];
/// Untimed calls before each throughput run, as a share of its timed ones.
const THROUGHPUT_WARMUP_DIVISOR: usize = 10;
/// Through kplug, every this many answers is decoded and checked in full
/// during throughput runs (the others by their status code), so that the
/// load generator's JSON parsing does not take CPU from the processes
/// measured. Sequential runs check every answer, outside the timed part.
const CHECK_EVERY: usize = 64;

/// Upper bound of a phase, so that a wedged process fails the run instead of
/// hanging it (each call also has `support::REQUEST_TIMEOUT`).
const PHASE_TIMEOUT: Duration = Duration::from_secs(180);

/// Targets the report checks against.
const TARGET_ADDED_P50: Duration = Duration::from_micros(200);
const TARGET_SMALL_PER_SECOND: f64 = 5_000.0;

/// The object's `metadata.name`; the plugin answers with a greeting for it.
const OBJECT_NAME: &str = "bench-object";

fn main() -> Result<()> {
    let server_binary = target_binary("kplug-apiserver", BUILD)?;
    let plugin_binary = target_binary("hello-plugin", BUILD)?;
    let payloads = PAYLOADS
        .iter()
        .map(Payload::new)
        .collect::<Result<Vec<_>>>()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let usage_before = CpuSnapshot::now(&[])?;

    let report = {
        let server = Server::start(SERVER_FLAGS);
        // Declared after the server, so it is killed first.
        let plugin = PluginProcess::start(&plugin_binary, &server);
        runtime.block_on(run(&server, &plugin, payloads))?
    };

    let others = usage_before.usage()?.other_load();
    print_machine(
        &[("Server", &server_binary), ("Plugin", &plugin_binary)],
        COMMAND,
        others,
    )?;
    report.print();
    Ok(())
}

// ---------------------------------------------------------------------------
// The plugin process

/// A running `hello-plugin`, registered with kplug as `bench`; killed when
/// dropped.
struct PluginProcess {
    process: Process,
    address: SocketAddr,
}

impl PluginProcess {
    fn start(binary: &Path, server: &Server) -> Self {
        let address = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut command = Command::new(binary);
        // Settings come from the flags only.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("KPLUG_") {
                command.env_remove(key);
            }
        }
        let process = Process::spawn(
            command
                .args(["--registry", &format!("http://{}", server.grpc)])
                .args(["--name", PLUGIN_NAME])
                .args(["--listen", &address.to_string()])
                .args(["--heartbeat-interval", PLUGIN_INTERVAL_SECONDS])
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit()),
            "hello-plugin",
        );
        let plugin = Self { process, address };
        eprintln!(
            "started hello-plugin (pid {}) on {}",
            plugin.pid(),
            plugin.address
        );
        plugin
    }

    fn pid(&self) -> u32 {
        self.process.pid()
    }

    fn cpu_time(&self) -> Result<Duration> {
        process_cpu_time(self.pid())
    }
}

// ---------------------------------------------------------------------------
// Payloads

/// One object, ready to send both ways.
struct Payload {
    label: &'static str,
    throughput_reconciles: usize,
    /// The object's JSON: the plugin's `object` bytes.
    object: Vec<u8>,
    /// The Reconcile sent to kplug, with exactly those bytes as `spec.object`.
    body: Bytes,
}

impl Payload {
    fn new(spec: &PayloadSpec) -> Result<Self> {
        let object = object_of_size(spec.bytes)?;
        let mut body =
            br#"{"apiVersion":"plugins.kplug.io/v1alpha1","kind":"Reconcile","spec":{"object":"#
                .to_vec();
        body.extend_from_slice(&object);
        body.extend_from_slice(b"}}");
        Ok(Self {
            label: spec.label,
            throughput_reconciles: spec.throughput_reconciles,
            object,
            body: Bytes::from(body),
        })
    }
}

/// A custom resource whose compact JSON is exactly `bytes` long: realistic
/// metadata, and a `spec` of list entries padded to size. Compact, with
/// sorted keys, so the plugin gets these very bytes through kplug too,
/// whether kplug passes the object on as received or re-encodes it.
fn object_of_size(bytes: usize) -> Result<Vec<u8>> {
    let mut object = json!({
        "apiVersion": "example.com/v1",
        "kind": "Greeting",
        "metadata": {
            "name": OBJECT_NAME,
            "namespace": "default",
            "uid": "6f1c2a3e-8d4b-4f7a-9c1e-2b3d4e5f6a7b",
            "resourceVersion": "184467",
            "generation": 3,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {
                "app.kubernetes.io/name": "greeter",
                "app.kubernetes.io/part-of": "kplug-bench",
            },
            "annotations": {"kplug.io/owner": "team-a"},
        },
        "spec": {"greeting": "hello", "replicas": 3, "entries": [], "padding": ""},
    });
    let length = |object: &Value| serde_json::to_vec(object).map_or(0, |json| json.len());
    ensure!(
        length(&object) <= bytes,
        "the bare object is over {bytes} bytes"
    );
    for index in 0.. {
        let entry = json!({
            "name": format!("entry-{index:05}"),
            "value": format!("{index:032x}"),
            "weight": index % 100,
        });
        let entries = object["spec"]["entries"]
            .as_array_mut()
            .context("spec.entries")?;
        entries.push(entry);
        if length(&object) > bytes {
            object["spec"]["entries"]
                .as_array_mut()
                .context("spec.entries")?
                .pop();
            break;
        }
    }
    let missing = bytes - length(&object);
    object["spec"]["padding"] = Value::String("p".repeat(missing));
    let json = serde_json::to_vec(&object)?;
    ensure!(json.len() == bytes, "the object is not {bytes} bytes");
    Ok(json)
}

// ---------------------------------------------------------------------------
// Calling the plugin

/// Which way a call goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Kplug,
    Direct,
}

impl Route {
    fn label(self) -> &'static str {
        match self {
            Self::Kplug => "through kplug",
            Self::Direct => "direct",
        }
    }
}

/// One connection to call over.
#[derive(Clone)]
enum Caller {
    Kplug(ApiClient),
    Direct(PluginClient<Channel>),
}

/// The parts of kplug's answer that are checked.
#[derive(Deserialize)]
struct Answer {
    status: AnswerStatus,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AnswerStatus {
    success: bool,
    plugin: AnswerPlugin,
    /// How long kplug waited for the plugin's gRPC answer.
    duration_milliseconds: f64,
}

#[derive(Deserialize)]
struct AnswerPlugin {
    name: String,
}

/// What one call measured.
struct Call {
    /// From sending the request to having read the whole answer.
    elapsed: Duration,
    /// Through kplug, with a checked answer: how long kplug's own gRPC call
    /// to the plugin took (`status.durationMilliseconds`).
    plugin_call: Option<Duration>,
}

impl Caller {
    async fn connect(route: Route, server: &Server, plugin: &PluginProcess) -> Result<Self> {
        Ok(match route {
            Route::Kplug => Self::Kplug(ApiClient::connect(server).await?),
            Route::Direct => Self::Direct(connect_plugin(plugin.address).await?),
        })
    }

    /// Reconciles `payload` once. `check` decodes kplug's JSON answer and
    /// checks it, after the timed part; the plugin's answer is always checked.
    async fn reconcile(&mut self, payload: &Payload, number: usize, check: bool) -> Result<Call> {
        match self {
            Self::Kplug(api) => {
                let started = Instant::now();
                let (status, body) = api.post_json(RECONCILE_PATH, payload.body.clone()).await?;
                let elapsed = started.elapsed();
                if status != StatusCode::CREATED {
                    bail!(
                        "reconcile {number} through kplug: {status}: {}",
                        String::from_utf8_lossy(&body)
                    );
                }
                let mut plugin_call = None;
                if check {
                    let answer: Answer = serde_json::from_slice(&body).with_context(|| {
                        format!("reconcile {number} through kplug: undecodable answer")
                    })?;
                    ensure!(
                        answer.status.success && answer.status.plugin.name == PLUGIN_NAME,
                        "reconcile {number} through kplug did not succeed on {PLUGIN_NAME}: {}",
                        String::from_utf8_lossy(&body)
                    );
                    plugin_call = Some(Duration::from_secs_f64(
                        answer.status.duration_milliseconds.max(0.0) / 1000.0,
                    ));
                }
                Ok(Call {
                    elapsed,
                    plugin_call,
                })
            }
            Self::Direct(client) => {
                let mut request = tonic::Request::new(ReconcileRequest {
                    // Same length as kplug's UUIDs.
                    operation_id: format!("00000000-0000-4000-8000-{number:012x}"),
                    dry_run: false,
                    object: payload.object.clone(),
                    extensions: Vec::new(),
                    timeout: prost_types::Duration::try_from(RECONCILE_TIMEOUT).ok(),
                });
                request.set_timeout(RECONCILE_TIMEOUT);
                let started = Instant::now();
                let reply = tokio::time::timeout(REQUEST_TIMEOUT, client.reconcile(request))
                    .await
                    .with_context(|| format!("direct reconcile {number} took too long"))?
                    .with_context(|| format!("direct reconcile {number}"))?
                    .into_inner();
                let elapsed = started.elapsed();
                ensure!(
                    reply.success,
                    "direct reconcile {number} did not succeed: {reply:?}"
                );
                Ok(Call {
                    elapsed,
                    plugin_call: None,
                })
            }
        }
    }
}

/// One HTTP/2 connection to the plugin, configured as kplug's proxy
/// configures its own.
async fn connect_plugin(address: SocketAddr) -> Result<PluginClient<Channel>> {
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .context("the plugin's endpoint")?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .connect()
        .await
        .with_context(|| format!("connecting to the plugin at {address}"))?;
    Ok(PluginClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// Waits until kplug reconciles with the plugin (it has registered and is
/// Ready), then checks one answer of each route in full. Returns the size of
/// kplug's answer.
async fn check_routes(
    kplug: &mut ApiClient,
    direct: &mut PluginClient<Channel>,
    payload: &Payload,
) -> Result<usize> {
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    let body = loop {
        let (status, body) = kplug
            .post_json(RECONCILE_PATH, payload.body.clone())
            .await?;
        match status {
            StatusCode::CREATED => break body,
            // Not registered yet, or not Ready yet.
            StatusCode::NOT_FOUND | StatusCode::SERVICE_UNAVAILABLE
                if Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ => bail!(
                "reconcile through kplug: {status}: {}",
                String::from_utf8_lossy(&body)
            ),
        }
    };
    let greeting = format!("hello, {OBJECT_NAME}");
    let answer: Value = serde_json::from_slice(&body).context("kplug's answer is not JSON")?;
    let object: Value = serde_json::from_slice(&payload.object)?;
    ensure!(
        answer["status"]["success"] == true
            && answer["status"]["plugin"]["name"] == PLUGIN_NAME
            && answer["status"]["objectStatus"]["greeting"] == greeting.as_str()
            && answer["spec"]["object"] == object,
        "unexpected answer through kplug: {answer}"
    );
    let reply = direct
        .reconcile(ReconcileRequest {
            operation_id: "00000000-0000-4000-8000-000000000000".to_owned(),
            object: payload.object.clone(),
            timeout: prost_types::Duration::try_from(RECONCILE_TIMEOUT).ok(),
            ..ReconcileRequest::default()
        })
        .await
        .context("direct reconcile")?
        .into_inner();
    let status: Value =
        serde_json::from_slice(&reply.object_status).context("the plugin's objectStatus")?;
    ensure!(
        reply.success && status["greeting"] == greeting.as_str(),
        "unexpected direct answer: {reply:?}"
    );
    Ok(body.len())
}

// ---------------------------------------------------------------------------
// Measuring

/// Sequential latencies of one payload, both routes.
struct LatencyRun {
    payload: &'static str,
    object_bytes: usize,
    request_bytes: usize,
    answer_bytes: usize,
    latencies: Sequential,
}

impl LatencyRun {
    fn added(&self, p: f64) -> f64 {
        self.latencies.kplug.percentile(p).as_secs_f64()
            - self.latencies.direct.percentile(p).as_secs_f64()
    }
}

/// One throughput run.
struct ThroughputRun {
    payload: &'static str,
    connections: usize,
    route: Route,
    reconciles: usize,
    elapsed: Duration,
    latencies: Latencies,
    client_cpu: Duration,
    server_cpu: Duration,
    plugin_cpu: Duration,
}

impl ThroughputRun {
    fn per_second(&self) -> f64 {
        self.reconciles as f64 / self.elapsed.as_secs_f64()
    }

    fn cpu_per_reconcile(&self, cpu: Duration) -> String {
        micros(cpu / u32::try_from(self.reconciles.max(1)).unwrap_or(u32::MAX))
    }
}

struct Report {
    latency: Vec<LatencyRun>,
    /// GETs of the plugin's own object, for scale.
    floor: Latencies,
    floor_bytes: usize,
    throughput: Vec<ThroughputRun>,
}

async fn run(server: &Server, plugin: &PluginProcess, payloads: Vec<Payload>) -> Result<Report> {
    let mut kplug = ApiClient::connect(server).await?;
    let mut direct = tokio::time::timeout(STARTUP_TIMEOUT, async {
        loop {
            match connect_plugin(plugin.address).await {
                Ok(client) => return client,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .with_context(|| format!("the plugin did not listen on {} in time", plugin.address))?;
    let mut report = Report {
        latency: Vec::new(),
        floor: Latencies::new(Vec::new()),
        floor_bytes: 0,
        throughput: Vec::new(),
    };
    let payloads: Vec<Arc<Payload>> = payloads.into_iter().map(Arc::new).collect();
    for payload in &payloads {
        let answer_bytes = check_routes(&mut kplug, &mut direct, payload).await?;
        eprintln!(
            "timing {} sequential reconciles of the {} object per route",
            ROUNDS * PER_ROUND,
            payload.label
        );
        let mut callers = [Caller::Kplug(kplug.clone()), Caller::Direct(direct.clone())];
        let latencies = tokio::time::timeout(PHASE_TIMEOUT, sequential(&mut callers, payload))
            .await
            .with_context(|| format!("sequential reconciles took over {PHASE_TIMEOUT:?}"))??;
        report.latency.push(LatencyRun {
            payload: payload.label,
            object_bytes: payload.object.len(),
            request_bytes: payload.body.len(),
            answer_bytes,
            latencies,
        });
    }
    eprintln!("timing {} GETs of {PLUGIN_PATH}", ROUNDS * PER_ROUND);
    (report.floor, report.floor_bytes) =
        tokio::time::timeout(PHASE_TIMEOUT, https_floor(&mut kplug))
            .await
            .with_context(|| format!("GETs took over {PHASE_TIMEOUT:?}"))??;
    for payload in &payloads {
        for connections in CONNECTIONS {
            for route in [Route::Kplug, Route::Direct] {
                eprintln!(
                    "timing {} reconciles of the {} object {}, {IN_FLIGHT} in flight over {connections} connection(s)",
                    payload.throughput_reconciles,
                    payload.label,
                    route.label()
                );
                let run = throughput(server, plugin, route, connections, payload).await?;
                report.throughput.push(run);
            }
        }
    }
    Ok(report)
}

/// Sequential latencies of one payload.
struct Sequential {
    kplug: Latencies,
    direct: Latencies,
    /// Through kplug: how long kplug's gRPC call to the plugin took.
    plugin_call: Latencies,
    /// Through kplug: the rest, i.e. the answer's latency less kplug's gRPC
    /// call (client and kplug HTTP/2 and TLS, decoding, selection,
    /// encoding the answer).
    outside_plugin_call: Latencies,
}

/// `ROUNDS` rounds of `PER_ROUND` calls on each of `[kplug, direct]`, after
/// `WARMUP` calls each.
async fn sequential(callers: &mut [Caller; 2], payload: &Payload) -> Result<Sequential> {
    let mut number = 0;
    for caller in callers.iter_mut() {
        for _ in 0..WARMUP {
            caller.reconcile(payload, number, true).await?;
            number += 1;
        }
    }
    let mut samples = [
        Vec::with_capacity(ROUNDS * PER_ROUND),
        Vec::with_capacity(ROUNDS * PER_ROUND),
    ];
    let mut plugin_call = Vec::with_capacity(ROUNDS * PER_ROUND);
    let mut outside_plugin_call = Vec::with_capacity(ROUNDS * PER_ROUND);
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for index in order {
            for _ in 0..PER_ROUND {
                let call = callers[index].reconcile(payload, number, true).await?;
                samples[index].push(call.elapsed);
                if let Some(inside) = call.plugin_call {
                    plugin_call.push(inside);
                    outside_plugin_call.push(call.elapsed.saturating_sub(inside));
                }
                number += 1;
            }
        }
    }
    let [kplug, direct] = samples;
    Ok(Sequential {
        kplug: Latencies::new(kplug),
        direct: Latencies::new(direct),
        plugin_call: Latencies::new(plugin_call),
        outside_plugin_call: Latencies::new(outside_plugin_call),
    })
}

/// The floor under a call through kplug: `GET` of the plugin's object on the
/// same kind of connection, which takes TLS, HTTP/2, authentication and a
/// small JSON answer but calls no plugin. `WARMUP` untimed, then
/// `ROUNDS` × `PER_ROUND` timed; returns them and the answer's size.
async fn https_floor(api: &mut ApiClient) -> Result<(Latencies, usize)> {
    let mut bytes = 0;
    for _ in 0..WARMUP {
        bytes = api.get(PLUGIN_PATH, "application/json").await?.len();
    }
    let mut samples = Vec::with_capacity(ROUNDS * PER_ROUND);
    for _ in 0..ROUNDS * PER_ROUND {
        let started = Instant::now();
        api.get(PLUGIN_PATH, "application/json").await?;
        samples.push(started.elapsed());
    }
    Ok((Latencies::new(samples), bytes))
}

/// `payload.throughput_reconciles` calls on `route` from `IN_FLIGHT`
/// concurrent callers over `connections` fresh connections, after an
/// untimed warm-up on the same connections.
async fn throughput(
    server: &Server,
    plugin: &PluginProcess,
    route: Route,
    connections: usize,
    payload: &Arc<Payload>,
) -> Result<ThroughputRun> {
    let mut callers = Vec::with_capacity(connections);
    for _ in 0..connections {
        callers.push(Caller::connect(route, server, plugin).await?);
    }
    let total = payload.throughput_reconciles;
    let warmup = (total / THROUGHPUT_WARMUP_DIVISOR).max(IN_FLIGHT);
    concurrent(&callers, payload, warmup).await?;

    let (server_cpu, plugin_cpu, client_cpu) =
        (server.cpu_time()?, plugin.cpu_time()?, own_cpu_time()?);
    let started = Instant::now();
    let latencies = concurrent(&callers, payload, total).await?;
    let elapsed = started.elapsed();
    Ok(ThroughputRun {
        payload: payload.label,
        connections,
        route,
        reconciles: latencies.len(),
        elapsed,
        latencies,
        client_cpu: own_cpu_time()?.saturating_sub(client_cpu),
        server_cpu: server.cpu_time()?.saturating_sub(server_cpu),
        plugin_cpu: plugin.cpu_time()?.saturating_sub(plugin_cpu),
    })
}

/// `total` calls from `IN_FLIGHT` workers spread over `callers`.
async fn concurrent(callers: &[Caller], payload: &Arc<Payload>, total: usize) -> Result<Latencies> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = JoinSet::new();
    for slot in 0..IN_FLIGHT {
        workers.spawn(worker(
            callers[slot % callers.len()].clone(),
            payload.clone(),
            next.clone(),
            total,
        ));
    }
    let results = tokio::time::timeout(PHASE_TIMEOUT, join_all(workers))
        .await
        .with_context(|| format!("{total} reconciles did not finish within {PHASE_TIMEOUT:?}"))??;
    let samples: Vec<Duration> = results.into_iter().flatten().collect();
    ensure!(
        samples.len() == total,
        "{} of {total} reconciles ran",
        samples.len()
    );
    Ok(Latencies::new(samples))
}

/// One in-flight slot: takes the next call number until `total` are made.
async fn worker(
    mut caller: Caller,
    payload: Arc<Payload>,
    next: Arc<AtomicUsize>,
    total: usize,
) -> Result<Vec<Duration>> {
    let mut latencies = Vec::new();
    loop {
        let number = next.fetch_add(1, Ordering::Relaxed);
        if number >= total {
            return Ok(latencies);
        }
        let check = number.is_multiple_of(CHECK_EVERY);
        latencies.push(caller.reconcile(&payload, number, check).await?.elapsed);
    }
}

// ---------------------------------------------------------------------------
// The report

/// `+123 µs`, or `−5 µs`.
fn signed_micros(seconds: f64) -> String {
    let sign = if seconds < 0.0 { "−" } else { "+" };
    format!("{sign}{:.0} µs", seconds.abs() * 1e6)
}

impl Report {
    fn print(&self) {
        println!("## Reconcile: through kplug vs direct\n");
        println!(
            "The `hello-plugin` example, registered as `{PLUGIN_NAME}`, reconciles the same \
             object two ways: **through kplug**, `POST {RECONCILE_PATH}` with a Reconcile over \
             HTTP/2 and TLS with the admin client certificate; **direct**, \
             `kplug.v1alpha1.Plugin/Reconcile` over a tonic channel with `object` = the same \
             JSON bytes and the same {} s deadline. Each call is timed until the whole answer is \
             read.\n",
            RECONCILE_TIMEOUT.as_secs()
        );
        println!("| Object | Object JSON | Reconcile request body | kplug's answer |");
        println!("|---|---:|---:|---:|");
        for run in &self.latency {
            println!(
                "| {} | {} B | {} B | {} B |",
                run.payload,
                thousands(run.object_bytes),
                thousands(run.request_bytes),
                thousands(run.answer_bytes)
            );
        }
        println!();

        println!(
            "### Latency, 1 in flight\n\nOne reused connection per route; {WARMUP} warm-up calls \
             per route, then {ROUNDS} rounds of {} calls per route, alternating which route goes \
             first. Target: kplug adds < {} at p50.\n",
            thousands(PER_ROUND),
            micros(TARGET_ADDED_P50)
        );
        println!(
            "| Object | Calls per route | kplug p50 | direct p50 | Added p50 | kplug p99 | direct p99 | Added p99 | Target |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
        for run in &self.latency {
            let latencies = &run.latencies;
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                run.payload,
                thousands(latencies.kplug.len()),
                micros(latencies.kplug.percentile(50.0)),
                micros(latencies.direct.percentile(50.0)),
                signed_micros(run.added(50.0)),
                micros(latencies.kplug.percentile(99.0)),
                micros(latencies.direct.percentile(99.0)),
                signed_micros(run.added(99.0)),
                verdict(run.added(50.0) < TARGET_ADDED_P50.as_secs_f64()),
            );
        }
        println!();
        println!(
            "Through kplug, split by the answer's `status.durationMilliseconds` (how long kplug's \
             own gRPC call to the plugin took) into that call and the rest (TLS and HTTP/2 on \
             both ends, decoding, selection, encoding the answer):\n"
        );
        println!("| Object | kplug's gRPC call p50 | direct call p50 | Rest p50 | Rest p99 |");
        println!("|---|---:|---:|---:|---:|");
        for run in &self.latency {
            let latencies = &run.latencies;
            println!(
                "| {} | {} | {} | {} | {} |",
                run.payload,
                micros(latencies.plugin_call.percentile(50.0)),
                micros(latencies.direct.percentile(50.0)),
                micros(latencies.outside_plugin_call.percentile(50.0)),
                micros(latencies.outside_plugin_call.percentile(99.0)),
            );
        }
        println!();
        println!(
            "For scale, `GET {PLUGIN_PATH}` ({} B of JSON; TLS, HTTP/2 and authentication, no \
             plugin call) on the same connection: p50 {}, p99 {} over {} requests.\n",
            thousands(self.floor_bytes),
            micros(self.floor.percentile(50.0)),
            micros(self.floor.percentile(99.0)),
            thousands(self.floor.len()),
        );

        println!(
            "### Throughput, {IN_FLIGHT} in flight\n\n{IN_FLIGHT} concurrent callers spread over \
             1 or 4 fresh connections per run (kplug itself always uses one HTTP/2 connection to \
             the plugin); an untimed warm-up of a tenth of the calls first. CPU is user + system \
             time from `/proc/PID/stat` over the timed part, divided by the reconciles; the \
             client is this bench. Target: ≥ {} reconciles/s of the 1 KiB object through \
             kplug.\n",
            thousands(TARGET_SMALL_PER_SECOND as usize)
        );
        println!(
            "| Object | Connections | Route | Reconciles | Elapsed | Reconciles/s | p50 | p99 | CPU per reconcile: client / kplug / plugin | Target |"
        );
        println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---|");
        for run in &self.throughput {
            let target = if run.route == Route::Kplug && run.payload == PAYLOADS[0].label {
                verdict(run.per_second() >= TARGET_SMALL_PER_SECOND)
            } else {
                "–"
            };
            println!(
                "| {} | {} | {} | {} | {:.2} s | {} | {} | {} | {} / {} / {} | {target} |",
                run.payload,
                run.connections,
                run.route.label(),
                thousands(run.reconciles),
                run.elapsed.as_secs_f64(),
                thousands(run.per_second() as usize),
                micros(run.latencies.percentile(50.0)),
                micros(run.latencies.percentile(99.0)),
                run.cpu_per_reconcile(run.client_cpu),
                run.cpu_per_reconcile(run.server_cpu),
                run.cpu_per_reconcile(run.plugin_cpu),
            );
        }
        println!();
    }
}
