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

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{
    ExtensionKind, HeartbeatRequest, PROTOCOL_VERSION, PluginApi, Protocol,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};

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

/// Upper bounds, so that a wedged server fails the run instead of hanging it.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
const PHASE_TIMEOUT: Duration = Duration::from_secs(180);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause before reading memory, so the numbers are not mid-burst.
const SETTLE: Duration = Duration::from_secs(1);

/// Targets the report checks against.
const TARGET_HEARTBEATS_PER_SECOND: f64 = 10_000.0;
const TARGET_LIST_P50: Duration = Duration::from_millis(50);
const TARGET_RSS_KIB: u64 = 100 * 1024;

/// Linux reports process CPU time in ticks of this many per second (USER_HZ).
const TICKS_PER_SECOND: u64 = 100;

const TABLE_ACCEPT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
const PLUGINS_PATH: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";

fn main() -> Result<()> {
    let binary = server_binary()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let usage_before = CpuUsage::now()?;

    let (lists, memory) = {
        let server = Server::start(&binary)?;
        runtime.block_on(lists_and_memory(&server))?
    };
    let steady = {
        let server = Server::start(&binary)?;
        runtime.block_on(unchanged_heartbeats(&server))?
    };
    let first = {
        let server = Server::start(&binary)?;
        runtime.block_on(first_registrations(&server))?
    };

    let others = CpuUsage::now()?.others_since(&usage_before);
    print_machine(&binary, &others)?;
    print_heartbeats(&[steady, first]);
    print_lists(&lists);
    print_memory(&memory);
    Ok(())
}

// ---------------------------------------------------------------------------
// The server process

/// `target/<profile>/kplug-apiserver`, next to this bench's `deps/` directory.
fn server_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the bench executable")?;
    let profile_dir = exe
        .ancestors()
        .find(|dir| dir.join("deps").is_dir())
        .context("the bench executable is not inside a cargo target profile directory")?;
    let binary = profile_dir.join("kplug-apiserver");
    ensure!(
        binary.exists(),
        "{} is missing: run `cargo build --release -p kplug-apiserver` first",
        binary.display()
    );
    Ok(binary)
}

/// A running `kplug-apiserver standalone`; killed when dropped, so a failed
/// or panicking run leaves no process behind.
struct Server {
    child: Child,
    state: tempfile::TempDir,
    api: SocketAddr,
    grpc: SocketAddr,
}

impl Server {
    fn start(binary: &Path) -> Result<Self> {
        let state = tempfile::tempdir().context("creating a state directory")?;
        let mut child = Command::new(binary)
            .args(["standalone", "--state-dir"])
            .arg(state.path())
            .args(["--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"])
            .args(SERVER_FLAGS)
            .env("KPLUG_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let stdout = child.stdout.take().context("the server's stdout")?;
        // Own the child before anything can fail, so Drop kills it.
        let mut server = Self {
            child,
            state,
            api: SocketAddr::from(([127, 0, 0, 1], 0)),
            grpc: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let banner = wait_for_banner(stdout)?;
        (server.api, server.grpc) = parse_banner(&banner)?;
        eprintln!(
            "started kplug-apiserver (pid {}): api {}, grpc {}",
            server.child.id(),
            server.api,
            server.grpc
        );
        Ok(server)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory now, in KiB.
    fn rss_kib(&self) -> Result<u64> {
        proc_status_kib(self.pid(), "VmRSS")
    }

    /// Peak resident memory so far, in KiB.
    fn peak_rss_kib(&self) -> Result<u64> {
        proc_status_kib(self.pid(), "VmHWM")
    }

    fn cpu_time(&self) -> Result<Duration> {
        cpu_time(&format!("/proc/{}/stat", self.pid()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads the server's stdout on a thread until the serving banner, then keeps
/// draining it so the server never blocks on a full pipe.
fn wait_for_banner(stdout: std::process::ChildStdout) -> Result<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("kplug is serving") {
                let _ = tx.send(line);
            }
        }
    });
    rx.recv_timeout(STARTUP_TIMEOUT)
        .with_context(|| format!("the server printed no serving banner within {STARTUP_TIMEOUT:?}"))
}

/// `kplug is serving plugins.kplug.io on https://ADDR (heartbeats: grpc://ADDR)`
fn parse_banner(banner: &str) -> Result<(SocketAddr, SocketAddr)> {
    let address = |scheme: &str| -> Result<SocketAddr> {
        let rest = banner
            .split(scheme)
            .nth(1)
            .with_context(|| format!("no {scheme} address in the banner {banner:?}"))?;
        let text = rest
            .split(|c: char| c.is_whitespace() || c == ')')
            .next()
            .unwrap_or_default();
        let address: SocketAddr = text
            .parse()
            .with_context(|| format!("bad {scheme} address {text:?} in the banner"))?;
        ensure!(
            address.ip().is_loopback(),
            "{address} is not a loopback address"
        );
        Ok(address)
    };
    Ok((address("https://")?, address("grpc://")?))
}

fn proc_status_kib(pid: u32, field: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {field} in {path}"))
}

/// Sums `fields` of a `/proc/.../stat` file, in ticks; field 0 is the one
/// after the parenthesized command name (field 3, state, in proc(5)).
fn stat_ticks(stat_path: &str, fields: RangeInclusive<usize>) -> Result<u64> {
    let stat =
        std::fs::read_to_string(stat_path).with_context(|| format!("reading {stat_path}"))?;
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    let values: Vec<&str> = after_name.split_whitespace().collect();
    fields
        .map(|index| {
            values
                .get(index)
                .and_then(|value| value.parse::<u64>().ok())
        })
        .sum::<Option<u64>>()
        .with_context(|| format!("malformed {stat_path}"))
}

fn ticks(ticks: u64) -> Duration {
    Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND)
}

/// User plus system CPU time of all threads of a process (utime, stime).
fn cpu_time(stat_path: &str) -> Result<Duration> {
    stat_ticks(stat_path, 11..=12).map(ticks)
}

fn own_cpu_time() -> Result<Duration> {
    cpu_time("/proc/self/stat")
}

/// CPU time of the whole machine, to tell how much other work shared it.
struct CpuUsage {
    at: Instant,
    /// Busy time of all CPUs (everything but idle and iowait).
    machine_busy: Duration,
    /// This bench plus its servers, which are children it has waited for.
    own: Duration,
}

impl CpuUsage {
    fn now() -> Result<Self> {
        let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        // cpu user nice system idle iowait irq softirq steal ...
        let totals: Vec<u64> = stat
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("cpu "))
            .context("no cpu line in /proc/stat")?
            .split_whitespace()
            .take(8)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .context("malformed /proc/stat")?;
        ensure!(totals.len() == 8, "malformed /proc/stat");
        let busy = totals[0] + totals[1] + totals[2] + totals[5] + totals[6] + totals[7];
        Ok(Self {
            at: Instant::now(),
            machine_busy: ticks(busy),
            // utime, stime, cutime, cstime
            own: ticks(stat_ticks("/proc/self/stat", 11..=14)?),
        })
    }

    /// CPU time other processes used since `before`, and the CPU time there was.
    fn others_since(&self, before: &Self) -> OtherLoad {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        let busy = self.machine_busy.saturating_sub(before.machine_busy);
        let own = self.own.saturating_sub(before.own);
        OtherLoad {
            used: busy.saturating_sub(own),
            available: (self.at - before.at) * u32::try_from(cpus).unwrap_or(1),
        }
    }
}

/// Competition from other processes during the run.
struct OtherLoad {
    used: Duration,
    available: Duration,
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

async fn join_all<T: 'static>(mut tasks: JoinSet<Result<T>>) -> Result<Vec<T>> {
    let mut results = Vec::with_capacity(tasks.len());
    while let Some(joined) = tasks.join_next().await {
        results.push(joined.context("a load task panicked")??);
    }
    Ok(results)
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

/// One HTTP/2 connection over TLS to the API, as the admin user.
struct ApiClient {
    sender: SendRequest<Empty<Bytes>>,
    base: String,
}

impl ApiClient {
    async fn connect(server: &Server) -> Result<Self> {
        let tls = TlsConnector::from(Arc::new(admin_tls_config(server.state.path())?));
        let tcp = TcpStream::connect(server.api)
            .await
            .with_context(|| format!("connecting to {}", server.api))?;
        tcp.set_nodelay(true)?;
        let name = ServerName::IpAddress(server.api.ip().into());
        let stream = tls
            .connect(name, tcp)
            .await
            .context("TLS handshake with the API")?;
        ensure!(
            stream.get_ref().1.alpn_protocol() == Some(b"h2"),
            "the API did not negotiate HTTP/2"
        );
        // Flow-control windows as Go's HTTP/2 transport (kubectl's) uses.
        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(4 << 20)
            .initial_connection_window_size(1 << 30)
            .handshake(TokioIo::new(stream))
            .await
            .context("HTTP/2 handshake with the API")?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("API connection ended: {e}");
            }
        });
        Ok(Self {
            sender,
            base: format!("https://{}", server.api),
        })
    }

    /// GETs `path` and returns the whole body of a 200 response.
    async fn get(&mut self, path: &str, accept: &str) -> Result<Bytes> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.get_untimed(path, accept))
            .await
            .with_context(|| format!("GET {path} took longer than {REQUEST_TIMEOUT:?}"))?
    }

    async fn get_untimed(&mut self, path: &str, accept: &str) -> Result<Bytes> {
        let request = http::Request::get(format!("{}{path}", self.base))
            .header(http::header::ACCEPT, accept)
            .body(Empty::new())
            .context("building the request")?;
        self.sender
            .ready()
            .await
            .context("the API connection closed")?;
        let response = self
            .sender
            .send_request(request)
            .await
            .with_context(|| format!("GET {path}"))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .with_context(|| format!("reading the body of GET {path}"))?
            .to_bytes();
        if !status.is_success() {
            bail!("GET {path}: {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(body)
    }
}

/// rustls client config trusting the server's CA and presenting the admin
/// certificate from the kubeconfig that standalone mode wrote.
fn admin_tls_config(state: &Path) -> Result<rustls::ClientConfig> {
    let ca_path = state.join("ca.crt");
    let ca = std::fs::read(&ca_path).with_context(|| format!("reading {}", ca_path.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca.as_slice()) {
        roots.add(cert.context("parsing ca.crt")?)?;
    }
    let kubeconfig_path = state.join("kubeconfig");
    let kubeconfig = std::fs::read_to_string(&kubeconfig_path)
        .with_context(|| format!("reading {}", kubeconfig_path.display()))?;
    let cert_pem = kubeconfig_field(&kubeconfig, "client-certificate-data")?;
    let key_pem = kubeconfig_field(&kubeconfig, "client-key-data")?;
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut cert_pem.as_slice())
        .collect::<Result<_, _>>()
        .context("parsing the admin certificate")?;
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .context("parsing the admin key")?
        .context("no private key in the kubeconfig")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .context("the admin client certificate")?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The base64-decoded value of `field:` in a kubeconfig.
fn kubeconfig_field(kubeconfig: &str, field: &str) -> Result<Vec<u8>> {
    let value = kubeconfig
        .lines()
        .find_map(|line| line.trim().strip_prefix(field)?.strip_prefix(':'))
        .with_context(|| format!("no {field} in the kubeconfig"))?;
    STANDARD
        .decode(value.trim())
        .with_context(|| format!("{field} is not base64"))
}

// ---------------------------------------------------------------------------
// Statistics and the report

/// Latency samples, sorted.
struct Latencies(Vec<Duration>);

impl Latencies {
    fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        Self(samples)
    }

    /// Nearest-rank percentile, `p` in 0..=100.
    fn percentile(&self, p: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let rank = (p / 100.0 * self.0.len() as f64).ceil() as usize;
        self.0[rank.clamp(1, self.0.len()) - 1]
    }
}

fn millis(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1000.0)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn size(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{:.2} MiB", bytes as f64 / f64::from(1 << 20))
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

/// 12345 → "12,345".
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "**missed**" }
}

fn print_machine(binary: &Path, others: &OtherLoad) -> Result<()> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").context("reading /proc/cpuinfo")?;
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name")?.split_once(':'))
        .map_or("unknown", |(_, model)| model.trim());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .context("reading the kernel release")?;
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let memory = proc_meminfo_kib("MemTotal")?;
    println!("## Machine\n");
    println!("- CPU: {model}, {cpus} CPUs (`nproc`), shared by the server and the load generator");
    println!("- Memory: {}", mib(memory));
    println!("- Kernel: Linux {}", kernel.trim());
    println!(
        "- Other processes used {:.1} of the {:.1} CPU-seconds there were during the run ({:.0} %)",
        others.used.as_secs_f64(),
        others.available.as_secs_f64(),
        100.0 * others.used.as_secs_f64() / others.available.as_secs_f64().max(f64::EPSILON),
    );
    println!("- Server: `{}` (release build)", binary.display());
    println!("- Command: `{COMMAND}`");
    println!();
    Ok(())
}

fn proc_meminfo_kib(field: &str) -> Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    meminfo
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {field} in /proc/meminfo"))
}

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
            millis(run.latencies.percentile(50.0)),
            millis(run.latencies.percentile(99.0)),
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
        millis(TARGET_LIST_P50)
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
            millis(run.latencies.percentile(50.0)),
            millis(run.latencies.percentile(99.0)),
            millis(run.latencies.percentile(100.0)),
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
