//! Heartbeats per second: unchanged heartbeats to registered plugins (the
//! steady state) and first registrations into an empty registry, from
//! `CHANNELS` × `IN_FLIGHT_PER_CHANNEL` concurrent callers, as a call each
//! and as messages on streams.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_proto::v1alpha1::{HeartbeatRequest, HeartbeatResponse};
use kplug_test_support::measure::{Latencies, own_cpu_time};
use kplug_test_support::report::thousands;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

use crate::support::heartbeats::{connect_registry, declaration};
use crate::support::{Server, join_all};
use crate::{Build, PHASE_TIMEOUT, round_order};

/// Plugins declare this interval (the server allows up to 5 minutes).
const PLUGIN_INTERVAL_SECONDS: u64 = 300;
/// Live plugins during the steady-state heartbeat run.
const STEADY_PLUGINS: usize = 10_000;
/// Unchanged heartbeats sent per build, in rounds over the live plugins.
pub const STEADY_HEARTBEATS: usize = 200_000;
/// New names registered into an empty registry, per build and round.
pub const FIRST_REGISTRATIONS: usize = 50_000;
/// Rounds per variant; each build runs once per round, and which goes first
/// alternates. Unchanged heartbeats are split between the rounds.
pub const ROUNDS: usize = 2;
/// gRPC connections, and requests in flight on each.
pub const CHANNELS: usize = 4;
pub const IN_FLIGHT_PER_CHANNEL: usize = 64;

/// How heartbeats travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// A `Heartbeat` call each, as before streams and from the Python SDK.
    Calls,
    /// Messages on `Heartbeats` streams, one per in-flight slot, as the
    /// Rust SDK sends them: one at a time, each after the last's answer.
    Streams,
}

impl Way {
    fn words(self) -> &'static str {
        match self {
            Way::Calls => "a call each",
            Way::Streams => "on streams",
        }
    }
}

/// What a run's heartbeats were.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Unchanged heartbeats of live plugins: the steady state.
    Unchanged,
    /// First registrations into an empty registry.
    First,
}

/// Every variant for every build: unchanged heartbeats and first
/// registrations, each as calls and on streams (for a build that takes
/// streams).
pub fn run(runtime: &Runtime, builds: &[Build]) -> Result<Vec<HeartbeatRun>> {
    let mut runs: Vec<HeartbeatRun> = Vec::new();
    let mut record = |build: usize, mut run: HeartbeatRun| {
        run.build = build;
        match runs
            .iter()
            .position(|r| r.build == build && r.kind == run.kind && r.way == run.way)
        {
            Some(earlier) => {
                let earlier = runs.swap_remove(earlier);
                runs.push(earlier.merge(run));
            }
            None => runs.push(run),
        }
    };

    let steady = heartbeat_requests(0..STEADY_PLUGINS);
    let servers: Vec<Server> = builds.iter().map(Build::start).collect();
    let mut ways = Vec::with_capacity(builds.len());
    for server in &servers {
        eprintln!("registering {STEADY_PLUGINS} plugins");
        runtime.block_on(send_heartbeats(
            server,
            Way::Calls,
            steady.clone(),
            STEADY_PLUGINS,
        ))?;
        ways.push(runtime.block_on(ways_taken(server))?);
    }
    for round in 0..ROUNDS {
        for build in round_order(round, builds.len()) {
            for &way in &ways[build] {
                eprintln!(
                    "sending {} unchanged heartbeats to {}, {}",
                    STEADY_HEARTBEATS / ROUNDS,
                    builds[build].label,
                    way.words()
                );
                let run = runtime.block_on(send_heartbeats(
                    &servers[build],
                    way,
                    steady.clone(),
                    STEADY_HEARTBEATS / ROUNDS,
                ))?;
                record(build, run.of(Kind::Unchanged));
            }
        }
    }
    drop(servers);

    let first = heartbeat_requests(0..FIRST_REGISTRATIONS);
    for round in 0..ROUNDS {
        for build in round_order(round, builds.len()) {
            for &way in &ways[build] {
                let server = builds[build].start();
                eprintln!(
                    "registering {FIRST_REGISTRATIONS} new plugins with {}, {}",
                    builds[build].label,
                    way.words()
                );
                let run = runtime.block_on(send_heartbeats(
                    &server,
                    way,
                    first.clone(),
                    FIRST_REGISTRATIONS,
                ))?;
                record(build, run.of(Kind::First));
            }
        }
    }
    runs.sort_by_key(|run| (run.build, run.kind == Kind::First, run.way == Way::Streams));
    Ok(runs)
}

/// The ways `server` takes heartbeats: calls, and streams unless it
/// answers a stream `UNIMPLEMENTED` (a build from before them).
pub async fn ways_taken(server: &Server) -> Result<Vec<Way>> {
    let mut clients = connect_registry(server.grpc, 1).await?;
    let client = clients.first_mut().context("a registry client")?;
    match client.heartbeats(tokio_stream::empty()).await {
        Ok(_) => Ok(vec![Way::Calls, Way::Streams]),
        Err(status) if status.code() == tonic::Code::Unimplemented => Ok(vec![Way::Calls]),
        Err(status) => Err(status).context("opening a heartbeat stream"),
    }
}

pub fn heartbeat_requests(indices: std::ops::Range<usize>) -> Arc<[HeartbeatRequest]> {
    let interval = Duration::from_secs(PLUGIN_INTERVAL_SECONDS);
    indices
        .map(|index| declaration(index, Some(interval)))
        .collect()
}

/// What one heartbeat run measured.
pub struct HeartbeatRun {
    pub kind: Kind,
    pub way: Way,
    /// Index of the build in `main`'s list.
    pub build: usize,
    pub accepted: usize,
    pub elapsed: Duration,
    pub latencies: Latencies,
    pub server_cpu: Duration,
    pub client_cpu: Duration,
}

impl HeartbeatRun {
    /// Two runs of the same variant and build as one.
    fn merge(self, other: Self) -> Self {
        Self {
            accepted: self.accepted + other.accepted,
            elapsed: self.elapsed + other.elapsed,
            latencies: self.latencies.merge(other.latencies),
            server_cpu: self.server_cpu + other.server_cpu,
            client_cpu: self.client_cpu + other.client_cpu,
            ..self
        }
    }

    fn of(self, kind: Kind) -> Self {
        Self { kind, ..self }
    }

    /// What the report calls this run.
    pub fn variant(&self) -> String {
        match self.kind {
            Kind::Unchanged => format!(
                "unchanged ({} live plugins), {}",
                thousands(STEADY_PLUGINS),
                self.way.words()
            ),
            Kind::First => format!("first registrations (empty registry), {}", self.way.words()),
        }
    }

    pub fn per_second(&self) -> f64 {
        self.accepted as f64 / self.elapsed.as_secs_f64()
    }
}

/// What one in-flight slot saw.
#[derive(Default)]
struct WorkerResult {
    accepted: usize,
    latencies: Vec<Duration>,
}

/// Sends `total` heartbeats `way`, cycling through `requests`, from
/// `CHANNELS` × `IN_FLIGHT_PER_CHANNEL` concurrent callers.
pub async fn send_heartbeats(
    server: &Server,
    way: Way,
    requests: Arc<[HeartbeatRequest]>,
    total: usize,
) -> Result<HeartbeatRun> {
    let clients = connect_registry(server.grpc, CHANNELS).await?;
    let next = Arc::new(AtomicUsize::new(0));
    let (server_cpu, client_cpu) = (server.cpu_time()?, own_cpu_time()?);
    let started = Instant::now();
    let mut workers = JoinSet::new();
    for client in &clients {
        for _ in 0..IN_FLIGHT_PER_CHANNEL {
            workers.spawn(heartbeat_worker(
                Sender::new(client.clone(), way),
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
        kind: Kind::Unchanged,
        way,
        build: 0,
        accepted,
        elapsed,
        latencies: Latencies::new(latencies),
        server_cpu: server.cpu_time()? - server_cpu,
        client_cpu: own_cpu_time()? - client_cpu,
    })
}

/// One stream per plugin of `requests`, each opened by the plugin's
/// heartbeat, as plugin instances open theirs, spread over `connections`
/// connections; they stay open until the senders are dropped.
pub async fn open_streams(
    server: &Server,
    requests: &[HeartbeatRequest],
    connections: usize,
) -> Result<Vec<Sender>> {
    let clients = connect_registry(server.grpc, connections).await?;
    let mut open = Vec::with_capacity(requests.len());
    for (request, client) in requests.iter().zip(clients.iter().cycle()) {
        let mut sender = Sender::new(client.clone(), Way::Streams);
        let reply = sender.send(request.clone()).await?;
        ensure!(
            reply.accepted,
            "{} was refused on its stream: {}: {}",
            request.name,
            reply.reason,
            reply.message
        );
        open.push(sender);
    }
    Ok(open)
}

/// One in-flight slot's way to the registry (or one plugin's stream).
pub struct Sender {
    client: RegistryClient<Channel>,
    way: Way,
    /// On streams: the slot's stream, opened by its first heartbeat, as a
    /// plugin opens its stream with its first.
    open: Option<(mpsc::Sender<HeartbeatRequest>, Streaming<HeartbeatResponse>)>,
}

impl Sender {
    fn new(client: RegistryClient<Channel>, way: Way) -> Self {
        Self {
            client,
            way,
            open: None,
        }
    }

    /// Sends `request` and reads its answer.
    async fn send(&mut self, request: HeartbeatRequest) -> Result<HeartbeatResponse> {
        if self.way == Way::Calls {
            return Ok(self.client.heartbeat(request).await?.into_inner());
        }
        let (requests, answers) = match &mut self.open {
            Some(open) => open,
            None => {
                let (requests, outbound) = mpsc::channel(1);
                let answers = self
                    .client
                    .heartbeats(ReceiverStream::new(outbound))
                    .await?
                    .into_inner();
                self.open.insert((requests, answers))
            }
        };
        requests
            .send(request)
            .await
            .context("the heartbeat stream was closed")?;
        answers
            .message()
            .await?
            .context("the heartbeat stream ended")
    }
}

/// One in-flight slot: takes the next heartbeat number until `total` are sent.
async fn heartbeat_worker(
    mut sender: Sender,
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
        let reply = sender
            .send(request)
            .await
            .with_context(|| format!("heartbeat {number} failed"))?;
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
