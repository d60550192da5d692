//! The in-cluster mode (`KPLUG_BENCH_IN_CLUSTER=1`): kplug and the hello
//! plugin as pods on the real single-node cluster of `hack/cluster.sh`
//! (Kubernetes v1.20.2 on this machine), as README.md installs them (2 kplug
//! replicas, 2 plugin replicas, mutual TLS between them), instead of
//! processes on 127.0.0.1. `kplug_test_support::in_cluster::prepare`
//! builds the images and installs what is missing.
//!
//! From a pod (the toolbox pod of `in_cluster::client_pod`: the bench's
//! measuring threads enter its network namespace, `netns`), the same 1 KiB
//! reconcile goes four ways, side by side in every round: through
//! kube-apiserver (the admin's certificate, to its address on the pods'
//! bridge; the aggregator proxies to the Service `kplug-system/kplug`),
//! straight to a kplug pod (the front proxy's certificate, as the
//! aggregator sends it), to kplug's Service with a ServiceAccount's token
//! (an operator's `--kplug-url`), and direct to a plugin pod (plain gRPC
//! with kplug's client certificate).
//! It measures latency one call at a time and throughput with `IN_FLIGHT`
//! in flight, the CPU of kube-apiserver and of the pods (their processes,
//! read from `/proc`), the time their CPU limits throttled them, and the
//! memory of every pod at rest, at its peak under the load, and after.
//!
//! `cargo bench -p kplug-apiserver --bench cluster` with the variable set;
//! the cluster must be up (`hack/cluster.sh up`).

mod netns;
mod report;
mod routes;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kplug_test_support::bench_mode::BenchMode;
use kplug_test_support::in_cluster::{self, Installation, MemoryRun, MemoryWatch, Node, Pod};
use kplug_test_support::measure::{CpuSnapshot, Latencies, OtherLoad};
use kplug_test_support::target_binary;
use tokio::task::JoinSet;

use routes::{Caller, Callers, Payload, Route};

use super::reconciles::object_of_size;
use super::{BUILD, OBJECT_BYTES, PHASE_TIMEOUT};
use crate::support::join_all;

/// The command that produces these numbers, as printed in the report.
const COMMAND: &str = "hack/cluster.sh up && \
                       KPLUG_BENCH_IN_CLUSTER=1 cargo bench -p kplug-apiserver --bench cluster";

/// Calls in flight in the throughput runs, spread over the route's
/// connections.
const IN_FLIGHT: usize = 32;

/// How many calls a run makes.
#[derive(Clone, Copy)]
pub(super) struct Counts {
    /// Untimed and timed calls per route, one at a time.
    pub(super) latency_warmup: usize,
    pub(super) latency_calls: usize,
    /// Throughput rounds (alternating the routes) and calls per route per round.
    pub(super) throughput_rounds: usize,
    pub(super) throughput_calls: usize,
}

impl Counts {
    fn of(mode: BenchMode) -> Self {
        mode.pick(
            Self {
                latency_warmup: 200,
                latency_calls: 2_000,
                throughput_rounds: 3,
                throughput_calls: 6_000,
            },
            // Every route of both phases, each pod of each route called.
            Self {
                latency_warmup: 4,
                latency_calls: 20,
                throughput_rounds: 1,
                throughput_calls: 4 * IN_FLIGHT,
            },
        )
    }
}
/// How long the pods idle before their memory at rest is read, and how
/// often it is sampled under load.
const SETTLE: Duration = Duration::from_secs(5);
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

pub(super) fn main(mode: BenchMode) -> Result<()> {
    let counts = Counts::of(mode);
    // It makes the installation's certificates.
    let kplug_binary = target_binary("kplug-apiserver", BUILD)?;
    let node = Node::connect()?;
    let work = in_cluster::installation_dir(env!("CARGO_TARGET_TMPDIR"));
    let installation = in_cluster::prepare(&node, &kplug_binary, &work)?;
    let client = in_cluster::client_pod(&node)?;
    let load_at_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    // The runtime is built inside the pod's namespace, so its workers (and
    // every connection they open) are in it too.
    let results = netns::run_in(&client, || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the tokio runtime")?
            .block_on(measure(&node, &installation, counts))
    })?;
    report::print(&report::Report {
        mode,
        results: &results,
        client: &client,
        tree: &in_cluster::tree()?,
        load_at_start: load_at_start.trim(),
        command: COMMAND,
    })
}

/// One route's calls one at a time.
pub(super) struct LatencyRun {
    pub(super) route: Route,
    pub(super) latencies: Latencies,
    /// Through kplug: kplug's own gRPC call to the plugin, per call.
    pub(super) kplug_calls: Latencies,
}

/// One route's calls with `IN_FLIGHT` in flight, over all rounds.
pub(super) struct ThroughputRun {
    pub(super) route: Route,
    pub(super) calls: usize,
    pub(super) elapsed: Duration,
    pub(super) latencies: Latencies,
    /// CPU time: kube-apiserver, the kplug pods, the plugin pods, the bench.
    pub(super) cpu: [Duration; 4],
    /// Each kplug pod's CPU time: how the route spread the work.
    pub(super) kplug_pods: Vec<Duration>,
    /// Time the CPU limits held back the kplug pods and the plugin pods.
    pub(super) throttled: [Duration; 2],
    pub(super) others: OtherLoad,
}

pub(super) struct Results {
    pub(super) counts: Counts,
    pub(super) request_bytes: usize,
    pub(super) latency: Vec<LatencyRun>,
    pub(super) throughput: Vec<ThroughputRun>,
    pub(super) memory: MemoryRun,
}

async fn measure(node: &Node, installation: &Installation, counts: Counts) -> Result<Results> {
    let object = object_of_size(OBJECT_BYTES)?;
    let payload = Arc::new(Payload::new(&object)?);
    let pods: Vec<(&'static str, Pod)> = [
        ("kplug", &installation.kplug),
        ("plugin", &installation.plugins),
    ]
    .into_iter()
    .flat_map(|(role, pods)| pods.iter().map(move |pod| (role, pod.clone())))
    .chain([("operator", installation.operator.clone())])
    .collect();
    let plain: Vec<Pod> = pods.iter().map(|(_, pod)| pod.clone()).collect();

    eprintln!("letting the pods idle for {SETTLE:?}, then reading their memory at rest");
    tokio::time::sleep(SETTLE).await;
    let at_rest = plain.iter().map(Pod::memory).collect::<Result<Vec<_>>>()?;
    let watch = MemoryWatch::start(&plain, SAMPLE_EVERY);

    let mut callers = Callers::connect(node, installation).await?;
    routes::check(&mut callers, &payload, &object).await?;
    let latency = latency_runs(&mut callers, &payload, counts).await?;
    let throughput = throughput_runs(node, installation, &callers, &payload, counts).await?;

    let peak = watch.finish()?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = plain.iter().map(Pod::memory).collect::<Result<Vec<_>>>()?;
    Ok(Results {
        counts,
        request_bytes: payload.body.len(),
        latency,
        throughput,
        memory: MemoryRun {
            pods,
            settle: SETTLE,
            every: SAMPLE_EVERY,
            at_rest,
            peak,
            after,
        },
    })
}

/// The latency calls per route one at a time, the routes taking turns
/// (which goes first rotates), each route's connections in turn.
async fn latency_runs(
    callers: &mut Callers,
    payload: &Payload,
    counts: Counts,
) -> Result<Vec<LatencyRun>> {
    let Counts {
        latency_warmup,
        latency_calls,
        ..
    } = counts;
    eprintln!(
        "{latency_warmup} untimed calls per route, then {latency_calls} timed, one at a time"
    );
    for route in Route::ALL {
        for number in 0..latency_warmup {
            let targets = callers.route_mut(route);
            let count = targets.len();
            targets[number % count]
                .reconcile(payload, number, false)
                .await?;
        }
    }
    let mut samples: [Vec<Duration>; Route::ALL.len()] = Default::default();
    let mut kplug_calls: [Vec<Duration>; Route::ALL.len()] = Default::default();
    let deadline = Instant::now() + PHASE_TIMEOUT;
    for number in 0..latency_calls {
        ensure!(
            Instant::now() < deadline,
            "the latency runs took longer than {PHASE_TIMEOUT:?}"
        );
        for step in 0..Route::ALL.len() {
            let index = (number + step) % Route::ALL.len();
            let targets = callers.route_mut(Route::ALL[index]);
            let count = targets.len();
            let call = targets[number % count]
                .reconcile(payload, number, true)
                .await?;
            samples[index].push(call.elapsed);
            kplug_calls[index].extend(call.kplug_call);
        }
    }
    Ok(Route::ALL
        .into_iter()
        .zip(samples.into_iter().zip(kplug_calls))
        .map(|(route, (samples, calls))| LatencyRun {
            route,
            latencies: Latencies::new(samples),
            kplug_calls: Latencies::new(calls),
        })
        .collect())
}

/// The throughput rounds, each route's calls with `IN_FLIGHT` in flight,
/// the routes taking turns.
async fn throughput_runs(
    node: &Node,
    installation: &Installation,
    callers: &Callers,
    payload: &Arc<Payload>,
    counts: Counts,
) -> Result<Vec<ThroughputRun>> {
    let Counts {
        throughput_rounds,
        throughput_calls,
        ..
    } = counts;
    let kplug_count = installation.kplug.len();
    let pids: Vec<u32> = std::iter::once(node.daemon_pid("kube-apiserver")?)
        .chain(installation.kplug.iter().map(|pod| pod.pid))
        .chain(installation.plugins.iter().map(|pod| pod.pid))
        .collect();
    let limited: Vec<&Pod> = installation
        .kplug
        .iter()
        .chain(&installation.plugins)
        .collect();
    let mut runs: Vec<ThroughputRun> = Route::ALL
        .into_iter()
        .map(|route| ThroughputRun {
            route,
            calls: 0,
            elapsed: Duration::ZERO,
            latencies: Latencies::new(Vec::new()),
            cpu: [Duration::ZERO; 4],
            kplug_pods: vec![Duration::ZERO; kplug_count],
            throttled: [Duration::ZERO; 2],
            others: OtherLoad::default(),
        })
        .collect();
    for round in 0..throughput_rounds {
        for step in 0..Route::ALL.len() {
            let index = (round + step) % Route::ALL.len();
            let run = &mut runs[index];
            eprintln!(
                "round {}: {throughput_calls} calls {} with {IN_FLIGHT} in flight",
                round + 1,
                run.route.label()
            );
            let throttled_before = throttled(&limited)?;
            let before = CpuSnapshot::now(&pids)?;
            let started = Instant::now();
            let samples = load(callers.route(run.route), payload, throughput_calls).await?;
            run.elapsed += started.elapsed();
            let usage = before.usage()?;
            let throttled_after = throttled(&limited)?;
            let (kplug, plugins) = usage.processes[1..].split_at(kplug_count);
            for (total, used) in run.cpu.iter_mut().zip([
                usage.processes[0],
                kplug.iter().sum(),
                plugins.iter().sum(),
                usage.own,
            ]) {
                *total += used;
            }
            for (total, used) in run.kplug_pods.iter_mut().zip(kplug) {
                *total += *used;
            }
            let held: Vec<Duration> = throttled_after
                .iter()
                .zip(&throttled_before)
                .map(|(after, before)| after.saturating_sub(*before))
                .collect();
            let (kplug, plugins) = held.split_at(kplug_count);
            run.throttled[0] += kplug.iter().sum::<Duration>();
            run.throttled[1] += plugins.iter().sum::<Duration>();
            run.others = [run.others, usage.other_load()].into_iter().sum();
            run.calls += samples.len();
            let latencies = std::mem::replace(&mut run.latencies, Latencies::new(Vec::new()));
            run.latencies = latencies.merge(Latencies::new(samples));
        }
    }
    Ok(runs)
}

fn throttled(pods: &[&Pod]) -> Result<Vec<Duration>> {
    pods.iter().map(|pod| pod.throttled()).collect()
}

/// `total` calls with `IN_FLIGHT` in flight, caller `i` of them on
/// connection `i` modulo the route's connections; each call's latency.
async fn load(callers: &[Caller], payload: &Arc<Payload>, total: usize) -> Result<Vec<Duration>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for task in 0..IN_FLIGHT {
        let mut caller = callers[task % callers.len()].clone();
        let (next, payload) = (Arc::clone(&next), Arc::clone(payload));
        tasks.spawn(async move {
            let mut samples = Vec::new();
            loop {
                let number = next.fetch_add(1, Ordering::Relaxed);
                if number >= total {
                    return Ok(samples);
                }
                // Every 64th answer of kplug's is read and checked.
                let call = caller
                    .reconcile(&payload, number, number.is_multiple_of(64))
                    .await?;
                samples.push(call.elapsed);
            }
        });
    }
    let samples = tokio::time::timeout(PHASE_TIMEOUT, join_all(tasks))
        .await
        .with_context(|| format!("{total} calls took longer than {PHASE_TIMEOUT:?}"))??;
    Ok(samples.concat())
}
