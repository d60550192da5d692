//! Load benchmark of the real `kplug-apiserver` binary, run as a separate
//! process on 127.0.0.1:
//!
//! 1. heartbeats per second over gRPC, for unchanged heartbeats (the steady
//!    state, read path) and for first registrations (write path);
//! 2. latency and size of `GET .../plugins` with 1,000 and 10,000 live
//!    plugins, as JSON and as a server-side Table, over one HTTP/2 TLS
//!    connection authenticated with the admin client certificate;
//! 3. the server's resident memory, idle and with 1,000 and 10,000 plugins.
//!
//! Results go to stdout as Markdown (for BENCHMARKS.md), progress to stderr.
//! Run with `cargo build --release -p kplug-apiserver && cargo bench -p
//! kplug-apiserver --bench load`.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{
    ExtensionKind, HeartbeatRequest, PROTOCOL_VERSION, PluginApi, Protocol,
};
use tokio::task::JoinSet;
use tonic::transport::{Channel, Endpoint};

use kplug_test_support::measure::{CpuSnapshot, Latencies, own_cpu_time};
use kplug_test_support::report::{mib, ms, size, thousands, verdict};
use support::{ApiClient, REQUEST_TIMEOUT, Server, join_all, print_machine};

/// The command that produces these numbers, as printed in the report.
const COMMAND: &str =
    "cargo build --release -p kplug-apiserver && cargo bench -p kplug-apiserver --bench load";

/// Flags of every server started here: plugins heartbeat every 300 s and
/// live 15 minutes, so none expires or turns late during a run; a 5 minute
/// status refresh keeps unchanged heartbeats on the read path throughout.
const SERVER_FLAGS: &[&str] = &[
    "--max-heartbeat-interval",
    "5m",
    "--ttl-intervals",
    "3",
    "--status-refresh-interval",
    "5m",
];
const PLUGIN_INTERVAL_SECONDS: i64 = 300;

/// Live plugins during the steady-state heartbeat run.
const STEADY_PLUGINS: usize = 10_000;
/// Unchanged heartbeats sent, in rounds over the live plugins.
const STEADY_HEARTBEATS: usize = 200_000;
/// New names registered into an empty registry.
const FIRST_REGISTRATIONS: usize = 50_000;
/// gRPC connections, and requests in flight on each.
const CHANNELS: usize = 4;
const IN_FLIGHT_PER_CHANNEL: usize = 64;

/// Registry sizes at which lists and memory are measured.
const LIST_SIZES: [usize; 2] = [1_000, 10_000];
/// Untimed lists before the timed ones.
const LIST_WARMUP: usize = 5;
/// Timed lists per size and representation.
const LIST_REQUESTS: usize = 100;
/// kubectl get asks for pages of this many (its --chunk-size default).
const KUBECTL_CHUNK: usize = 500;

/// Upper bound of a phase, so that a wedged server fails the run instead of
/// hanging it (requests have `support::REQUEST_TIMEOUT`).
const PHASE_TIMEOUT: Duration = Duration::from_secs(180);
/// Pause before reading memory, so the numbers are not mid-burst.
const SETTLE: Duration = Duration::from_secs(1);

/// Targets the report checks against.
const TARGET_HEARTBEATS_PER_SECOND: f64 = 10_000.0;
const TARGET_LIST_P50: Duration = Duration::from_millis(50);
const TARGET_RSS_KIB: u64 = 100 * 1024;

const TABLE_ACCEPT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
const PLUGINS_PATH: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";

fn main() -> Result<()> {
    let binary = server_binary()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let usage_before = CpuSnapshot::now(&[])?;

    let (lists, memory) = {
        let server = Server::start(SERVER_FLAGS);
        runtime.block_on(lists_and_memory(&server))?
    };
    let steady = {
        let server = Server::start(SERVER_FLAGS);
        runtime.block_on(unchanged_heartbeats(&server))?
    };
    let first = {
        let server = Server::start(SERVER_FLAGS);
        runtime.block_on(first_registrations(&server))?
    };

    let others = usage_before.usage()?.other_load();
    print_machine(&[("Server", &binary)], COMMAND, others)?;
    print_heartbeats(&[steady, first]);
    print_lists(&lists);
    print_memory(&memory);
    Ok(())
}

/// `target/<profile>/kplug-apiserver`, next to this bench's `deps/` directory.
fn server_binary() -> Result<PathBuf> {
    kplug_test_support::target_binary(
        "kplug-apiserver",
        "cargo build --release -p kplug-apiserver",
    )
}

// ---------------------------------------------------------------------------
// Heartbeats

/// A realistic declaration for plugin number `index`.
fn heartbeat_request(index: usize) -> HeartbeatRequest {
    HeartbeatRequest {
        name: format!("bench-plugin-{index:05}"),
        version: "1.4.2".to_owned(),
        api: Some(PluginApi {
            group: "databases.bench.kplug.io".to_owned(),
            resource: "databasetables".to_owned(),
            version: "v1alpha1".to_owned(),
        }),
        implementation: "PostgreSQL".to_owned(),
        // Never dialled: the registry only records where plugins listen.
        address: format!("plugin-{index:05}.bench.invalid:50051"),
        extensions: vec![ExtensionKind {
            group: "backups.bench.kplug.io".to_owned(),
            kind: "Backup".to_owned(),
            version: String::new(),
        }],
        labels: HashMap::from([
            ("team".to_owned(), format!("team-{}", index % 10)),
            ("tier".to_owned(), "gold".to_owned()),
        ]),
        interval: Some(prost_types::Duration {
            seconds: PLUGIN_INTERVAL_SECONDS,
            nanos: 0,
        }),
        protocol: Some(Protocol {
            version: PROTOCOL_VERSION.to_owned(),
            sdk: "kplug-bench/0.1.0".to_owned(),
            capabilities: vec!["Reconcile".to_owned(), "Finalize".to_owned()],
        }),
    }
}

fn heartbeat_requests(indices: std::ops::Range<usize>) -> Arc<[HeartbeatRequest]> {
    indices.map(heartbeat_request).collect()
}

/// What one heartbeat run measured.
struct HeartbeatRun {
    variant: String,
    accepted: usize,
    elapsed: Duration,
    latencies: Latencies,
    server_cpu: Duration,
    client_cpu: Duration,
}

impl HeartbeatRun {
    fn per_second(&self) -> f64 {
        self.accepted as f64 / self.elapsed.as_secs_f64()
    }
}

/// What one in-flight slot saw.
#[derive(Default)]
struct WorkerResult {
    accepted: usize,
    latencies: Vec<Duration>,
}

/// Steady state: `STEADY_HEARTBEATS` unchanged heartbeats in rounds over
/// `STEADY_PLUGINS` registered plugins.
async fn unchanged_heartbeats(server: &Server) -> Result<HeartbeatRun> {
    let requests = heartbeat_requests(0..STEADY_PLUGINS);
    eprintln!("registering {STEADY_PLUGINS} plugins");
    send_heartbeats(
        server,
        "registration".to_owned(),
        requests.clone(),
        STEADY_PLUGINS,
    )
    .await?;
    eprintln!("sending {STEADY_HEARTBEATS} unchanged heartbeats");
    let variant = format!("unchanged ({} live plugins)", thousands(STEADY_PLUGINS));
    send_heartbeats(server, variant, requests, STEADY_HEARTBEATS).await
}

/// Write path: `FIRST_REGISTRATIONS` new names into an empty registry.
async fn first_registrations(server: &Server) -> Result<HeartbeatRun> {
    eprintln!("registering {FIRST_REGISTRATIONS} new plugins");
    let requests = heartbeat_requests(0..FIRST_REGISTRATIONS);
    let variant = "first registrations (empty registry)".to_owned();
    let total = requests.len();
    send_heartbeats(server, variant, requests, total).await
}

/// Sends `total` heartbeats, cycling through `requests`, from
/// `CHANNELS` × `IN_FLIGHT_PER_CHANNEL` concurrent callers.
async fn send_heartbeats(
    server: &Server,
    variant: String,
    requests: Arc<[HeartbeatRequest]>,
    total: usize,
) -> Result<HeartbeatRun> {
    let clients = connect_registry(server.grpc).await?;
    let next = Arc::new(AtomicUsize::new(0));
    let (server_cpu, client_cpu) = (server.cpu_time()?, own_cpu_time()?);
    let started = Instant::now();
    let mut workers = JoinSet::new();
    for client in &clients {
        for _ in 0..IN_FLIGHT_PER_CHANNEL {
            workers.spawn(heartbeat_worker(
                client.clone(),
                requests.clone(),
                next.clone(),
                total,
            ));
        }
    }
    let results = tokio::time::timeout(PHASE_TIMEOUT, join_all(workers))
        .await
        .with_context(|| format!("{total} heartbeats did not finish within {PHASE_TIMEOUT:?}"))??;
    let elapsed = started.elapsed();
    let mut latencies = Vec::with_capacity(total);
    let mut accepted = 0;
    for result in results {
        accepted += result.accepted;
        latencies.extend(result.latencies);
    }
    Ok(HeartbeatRun {
        variant,
        accepted,
        elapsed,
        latencies: Latencies::new(latencies),
        server_cpu: server.cpu_time()? - server_cpu,
        client_cpu: own_cpu_time()? - client_cpu,
    })
}

async fn connect_registry(address: SocketAddr) -> Result<Vec<RegistryClient<Channel>>> {
    let endpoint = Endpoint::from_shared(format!("http://{address}"))
        .context("the gRPC endpoint")?
        .timeout(REQUEST_TIMEOUT);
    let mut clients = Vec::with_capacity(CHANNELS);
    for _ in 0..CHANNELS {
        // One Endpoint::connect is one HTTP/2 connection.
        let channel = endpoint
            .connect()
            .await
            .with_context(|| format!("connecting to grpc://{address}"))?;
        clients.push(RegistryClient::new(channel));
    }
    Ok(clients)
}

/// One in-flight slot: takes the next heartbeat number until `total` are sent.
async fn heartbeat_worker(
    mut client: RegistryClient<Channel>,
    requests: Arc<[HeartbeatRequest]>,
    next: Arc<AtomicUsize>,
    total: usize,
) -> Result<WorkerResult> {
    let mut result = WorkerResult::default();
    loop {
        let number = next.fetch_add(1, Ordering::Relaxed);
        if number >= total {
            return Ok(result);
        }
        let request = requests[number % requests.len()].clone();
        let sent = Instant::now();
        let reply = client
            .heartbeat(request)
            .await
            .with_context(|| format!("heartbeat {number} failed"))?
            .into_inner();
        result.latencies.push(sent.elapsed());
        ensure!(
            reply.accepted,
            "heartbeat {number} was refused: {}: {}",
            reply.reason,
            reply.message
        );
        result.accepted += 1;
    }
}

// ---------------------------------------------------------------------------
// Lists and memory

/// One way of listing plugins.
struct ListVariant {
    label: &'static str,
    accept: &'static str,
    query: &'static str,
    /// Where the list's entries are in the response.
    items_field: &'static str,
    limit: Option<usize>,
}

static LIST_VARIANTS: [ListVariant; 3] = [
    ListVariant {
        label: "JSON",
        accept: "application/json",
        query: "",
        items_field: "items",
        limit: None,
    },
    ListVariant {
        label: "Table",
        accept: TABLE_ACCEPT,
        query: "",
        items_field: "rows",
        limit: None,
    },
    ListVariant {
        label: "Table, limit=500 (kubectl get's first page)",
        accept: TABLE_ACCEPT,
        query: "?limit=500",
        items_field: "rows",
        limit: Some(KUBECTL_CHUNK),
    },
];

/// What one list variant measured.
struct ListRun {
    plugins: usize,
    variant: &'static str,
    latencies: Latencies,
    bytes: usize,
}

/// The server's resident memory at one point of the run.
struct MemoryPoint {
    state: String,
    rss_kib: u64,
}

/// Registers plugins up to each of `LIST_SIZES`, reading memory and timing
/// lists at each size.
async fn lists_and_memory(server: &Server) -> Result<(Vec<ListRun>, Vec<MemoryPoint>)> {
    tokio::time::sleep(SETTLE).await;
    let mut memory = vec![MemoryPoint {
        state: "idle (no plugins, no connections)".to_owned(),
        rss_kib: server.rss_kib()?,
    }];
    let mut api = ApiClient::connect(server).await?;
    let mut lists = Vec::new();
    let mut registered = 0;
    for size in LIST_SIZES {
        eprintln!("registering plugins {registered}..{size}");
        let requests = heartbeat_requests(registered..size);
        let total = requests.len();
        send_heartbeats(server, "registration".to_owned(), requests, total).await?;
        registered = size;
        tokio::time::sleep(SETTLE).await;
        memory.push(MemoryPoint {
            state: format!("{} plugins, before listing", thousands(size)),
            rss_kib: server.rss_kib()?,
        });
        for variant in &LIST_VARIANTS {
            eprintln!(
                "timing {LIST_REQUESTS} lists of {size} plugins as {}",
                variant.label
            );
            lists.push(measure_list(&mut api, size, variant).await?);
        }
    }
    tokio::time::sleep(SETTLE).await;
    let last = thousands(registered);
    memory.push(MemoryPoint {
        state: format!("{last} plugins, after the list runs"),
        rss_kib: server.rss_kib()?,
    });
    memory.push(MemoryPoint {
        state: "peak during the run (VmHWM)".to_owned(),
        rss_kib: server.peak_rss_kib()?,
    });
    Ok((lists, memory))
}

async fn measure_list(
    api: &mut ApiClient,
    plugins: usize,
    variant: &'static ListVariant,
) -> Result<ListRun> {
    let path = format!("{PLUGINS_PATH}{}", variant.query);
    let body = api.get(&path, variant.accept).await?;
    let expected = variant.limit.map_or(plugins, |limit| limit.min(plugins));
    let listed = count_entries(&body, variant.items_field)?;
    ensure!(
        listed == expected,
        "{} list returned {listed} entries, expected {expected}",
        variant.label
    );
    for _ in 0..LIST_WARMUP {
        api.get(&path, variant.accept).await?;
    }
    let mut samples = Vec::with_capacity(LIST_REQUESTS);
    let mut bytes = body.len();
    for _ in 0..LIST_REQUESTS {
        let started = Instant::now();
        let body = api.get(&path, variant.accept).await?;
        samples.push(started.elapsed());
        bytes = body.len();
    }
    Ok(ListRun {
        plugins,
        variant: variant.label,
        latencies: Latencies::new(samples),
        bytes,
    })
}

fn count_entries(body: &[u8], field: &str) -> Result<usize> {
    let value: serde_json::Value =
        serde_json::from_slice(body).context("the list response is not JSON")?;
    value
        .get(field)
        .and_then(serde_json::Value::as_array)
        .map(Vec::len)
        .with_context(|| format!("the list response has no {field:?} array"))
}

// ---------------------------------------------------------------------------
// The report

fn print_heartbeats(runs: &[HeartbeatRun]) {
    println!(
        "## Heartbeats\n\n{CHANNELS} gRPC connections × {IN_FLIGHT_PER_CHANNEL} heartbeats in \
         flight; target ≥ {} accepted/s.\n",
        thousands(TARGET_HEARTBEATS_PER_SECOND as usize)
    );
    println!(
        "| Variant | Heartbeats | Elapsed | Accepted/s | Latency p50 | Latency p99 | Server CPU per heartbeat | Server CPU / client CPU | Target |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for run in runs {
        let per_heartbeat = run.server_cpu.as_secs_f64() * 1e6 / run.accepted.max(1) as f64;
        println!(
            "| {} | {} | {:.2} s | {} | {} | {} | {per_heartbeat:.1} µs | {:.1} s / {:.1} s | {} |",
            run.variant,
            thousands(run.accepted),
            run.elapsed.as_secs_f64(),
            thousands(run.per_second() as usize),
            ms(run.latencies.percentile(50.0), 2),
            ms(run.latencies.percentile(99.0), 2),
            run.server_cpu.as_secs_f64(),
            run.client_cpu.as_secs_f64(),
            verdict(run.per_second() >= TARGET_HEARTBEATS_PER_SECOND),
        );
    }
    println!();
}

fn print_lists(runs: &[ListRun]) {
    println!(
        "## Listing plugins\n\n`GET {PLUGINS_PATH}` over one reused HTTP/2 TLS connection with the \
         admin client certificate; {LIST_WARMUP} warm-up requests, then {LIST_REQUESTS} timed \
         (until the whole body is read); target p50 < {} at 10,000 plugins.\n",
        ms(TARGET_LIST_P50, 2)
    );
    println!("| Plugins | Representation | p50 | p99 | Max | Response size | Target |");
    println!("|---:|---|---:|---:|---:|---:|---|");
    for run in runs {
        let target = if run.plugins == 10_000 {
            verdict(run.latencies.percentile(50.0) < TARGET_LIST_P50)
        } else {
            "–"
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {target} |",
            thousands(run.plugins),
            run.variant,
            ms(run.latencies.percentile(50.0), 2),
            ms(run.latencies.percentile(99.0), 2),
            ms(run.latencies.percentile(100.0), 2),
            size(run.bytes),
        );
    }
    println!();
}

fn print_memory(points: &[MemoryPoint]) {
    println!(
        "## Server memory\n\nResident set size (`VmRSS` in `/proc/PID/status`); target < {} at \
         10,000 plugins.\n",
        mib(TARGET_RSS_KIB)
    );
    println!("| State | RSS | Target |");
    println!("|---|---:|---|");
    for point in points {
        let target = if point.state.starts_with("10,000") {
            verdict(point.rss_kib < TARGET_RSS_KIB)
        } else {
            "–"
        };
        println!("| {} | {} | {target} |", point.state, mib(point.rss_kib));
    }
    println!();
}
