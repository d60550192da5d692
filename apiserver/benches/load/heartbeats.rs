//! Heartbeats per second: unchanged heartbeats to registered plugins (the
//! steady state) and first registrations into an empty registry, from
//! `CHANNELS` × `IN_FLIGHT_PER_CHANNEL` concurrent callers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kplug_proto::v1alpha1::HeartbeatRequest;
use kplug_proto::v1alpha1::registry_client::RegistryClient;
use kplug_test_support::measure::{Latencies, own_cpu_time};
use kplug_test_support::report::thousands;
use tokio::runtime::Runtime;
use tokio::task::JoinSet;
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

/// Both variants for every build: `[steady, first]` per build, in build order.
pub fn run(runtime: &Runtime, builds: &[Build]) -> Result<Vec<HeartbeatRun>> {
    let mut runs: Vec<Option<HeartbeatRun>> = (0..builds.len() * 2).map(|_| None).collect();
    let mut record = |build: usize, slot: usize, mut run: HeartbeatRun| {
        run.build = build;
        let index = build * 2 + slot;
        runs[index] = Some(match runs[index].take() {
            Some(earlier) => earlier.merge(run),
            None => run,
        });
    };

    let steady = heartbeat_requests(0..STEADY_PLUGINS);
    let servers: Vec<Server> = builds.iter().map(Build::start).collect();
    for server in &servers {
        eprintln!("registering {STEADY_PLUGINS} plugins");
        runtime.block_on(send_heartbeats(
            server,
            "registration".to_owned(),
            steady.clone(),
            STEADY_PLUGINS,
        ))?;
    }
    let variant = format!("unchanged ({} live plugins)", thousands(STEADY_PLUGINS));
    for round in 0..ROUNDS {
        for build in round_order(round, builds.len()) {
            eprintln!(
                "sending {} unchanged heartbeats to {}",
                STEADY_HEARTBEATS / ROUNDS,
                builds[build].label
            );
            let run = runtime.block_on(send_heartbeats(
                &servers[build],
                variant.clone(),
                steady.clone(),
                STEADY_HEARTBEATS / ROUNDS,
            ))?;
            record(build, 0, run);
        }
    }
    drop(servers);

    let first = heartbeat_requests(0..FIRST_REGISTRATIONS);
    for round in 0..ROUNDS {
        for build in round_order(round, builds.len()) {
            let server = builds[build].start();
            eprintln!(
                "registering {FIRST_REGISTRATIONS} new plugins with {}",
                builds[build].label
            );
            let run = runtime.block_on(send_heartbeats(
                &server,
                "first registrations (empty registry)".to_owned(),
                first.clone(),
                FIRST_REGISTRATIONS,
            ))?;
            record(build, 1, run);
        }
    }
    Ok(runs.into_iter().flatten().collect())
}

pub fn heartbeat_requests(indices: std::ops::Range<usize>) -> Arc<[HeartbeatRequest]> {
    let interval = Duration::from_secs(PLUGIN_INTERVAL_SECONDS);
    indices
        .map(|index| declaration(index, Some(interval)))
        .collect()
}

/// What one heartbeat run measured.
pub struct HeartbeatRun {
    pub variant: String,
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

/// Sends `total` heartbeats, cycling through `requests`, from
/// `CHANNELS` × `IN_FLIGHT_PER_CHANNEL` concurrent callers.
pub async fn send_heartbeats(
    server: &Server,
    variant: String,
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
        build: 0,
        accepted,
        elapsed,
        latencies: Latencies::new(latencies),
        server_cpu: server.cpu_time()? - server_cpu,
        client_cpu: own_cpu_time()? - client_cpu,
    })
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
