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
//! - **through a relay**: the floor of any proxy here, TLS and HTTP/2 in
//!   and the gRPC call out with nothing between, in a process of its own
//!   (`relay`).
//!
//! It measures p50 and p99 latency with one call in flight, alternating the
//! routes in rounds, and throughput with `IN_FLIGHT` calls in flight over
//! one and over four connections, with the CPU time each process spent.
//!
//! Every route includes the plugin's own time, the same on each (the hello
//! plugin answers at once: its `--delay-ms` fault knob is 0), so the
//! difference between them is what kplug, or the relay, adds.
//!
//! With `KPLUG_BASELINE=REV` (a commit), an earlier build of kplug runs
//! beside the current one, each with its own plugin process, and a third
//! route goes **through kplug at REV**, alternating with the others: the
//! before/after of a change, measured in one run (hack/baseline.sh builds
//! it once into ~/.cache/kplug/baseline).
//!
//! Results go to stdout as Markdown (for BENCHMARKS.md), progress to stderr.
//! Run with `cargo build --release -p kplug-apiserver -p kplug-example-hello
//! && cargo bench -p kplug-apiserver --bench reconcile`.

mod payload;
mod relay;
mod report;
mod route;
#[path = "../support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kplug_test_support::bench_mode::BenchMode;
use kplug_test_support::measure::{CpuSnapshot, Latencies, own_cpu_time};
use kplug_test_support::plot::Plots;
use kplug_test_support::target_binary;
use tokio::task::JoinSet;

use payload::{PAYLOADS, Payload};
use report::{LatencyRun, Report, ThroughputRun};
use route::{Call, Caller, Deployment, Route, check_routes, connect_plugin_once_listening};
use support::{ApiClient, BASELINE_VARIABLE, Server, baseline_from_env, join_all, print_machine};

/// Builds both binaries measured here.
const BUILD: &str = "cargo build --release -p kplug-apiserver -p kplug-example-hello";
/// The command that produces these numbers, as printed in the report.
const COMMAND: &str = "cargo build --release -p kplug-apiserver -p kplug-example-hello && \
                       cargo bench -p kplug-apiserver --bench reconcile";

/// The plugin may ask for a 300 s heartbeat interval, so it stays Ready for
/// the whole run on one heartbeat.
const SERVER_FLAGS: &[&str] = &["--max-heartbeat-interval", "5m"];
pub const PLUGIN_NAME: &str = "bench";
pub const PLUGIN_INTERVAL_SECONDS: &str = "300";
pub const RECONCILE_PATH: &str = "/apis/plugins.kplug.io/v1alpha1/plugins/bench/reconcile";
pub const PLUGIN_PATH: &str = "/apis/plugins.kplug.io/v1alpha1/plugins/bench";
/// The deadline kplug gives the plugin when a Reconcile sets no
/// `timeoutSeconds` (its `--reconcile-timeout` default); direct calls send
/// the same, as `grpc-timeout` and as `timeout`.
pub const RECONCILE_TIMEOUT: Duration = Duration::from_secs(30);
/// kplug's bound on messages to and from plugins; direct calls use it too.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Untimed calls per route before the sequential rounds.
pub const WARMUP: usize = 500;
/// Sequential calls: rounds of `PER_ROUND` per route, alternating which
/// route goes first, so that drift in the machine's load hits both.
pub const ROUNDS: usize = 5;
pub const PER_ROUND: usize = 1_000;

/// Calls in flight during throughput runs, spread over this many connections.
pub const IN_FLIGHT: usize = 32;
const CONNECTIONS: [usize; 2] = [1, 4];
/// Throughput runs per route, alternating which route goes first; each
/// makes its share of the payload's reconciles.
pub const THROUGHPUT_ROUNDS: usize = 3;
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
pub const TARGET_ADDED_P50: Duration = Duration::from_micros(200);
pub const TARGET_SMALL_PER_SECOND: f64 = 5_000.0;

/// The object's `metadata.name`; the plugin answers with a greeting for it.
pub const OBJECT_NAME: &str = "bench-object";

fn main() -> Result<()> {
    if let Some(relayed) = relay::serve_if_relay() {
        return relayed;
    }
    let server_binary = target_binary("kplug-apiserver", BUILD)?;
    let plugin_binary = target_binary("hello-plugin", BUILD)?;
    let baseline = baseline_from_env()?;
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
        let current =
            Deployment::start(Server::start(SERVER_FLAGS), &plugin_binary).with_relay()?;
        let baseline = baseline.as_ref().map(|(binary, rev)| {
            let server = Server::start_binary(binary, SERVER_FLAGS);
            (Deployment::start(server, &plugin_binary), rev.clone())
        });
        runtime.block_on(run(&current, baseline.as_ref(), payloads))?
    };

    let others = usage_before.usage()?.other_load();
    let mut binaries = vec![
        ("Server", server_binary.as_path()),
        ("Plugin", &plugin_binary),
    ];
    if let Some((binary, _)) = &baseline {
        binaries.push(("Baseline server", binary));
    }
    let command = match &baseline {
        Some((_, rev)) => format!("{BASELINE_VARIABLE}={rev} {COMMAND}"),
        None => COMMAND.to_owned(),
    };
    print_machine(&binaries, &command, others)?;
    report.print();
    report.plot(&Plots::new(BenchMode::from_args())?)?;
    Ok(())
}

async fn run(
    current: &Deployment,
    baseline: Option<&(Deployment, String)>,
    payloads: Vec<Payload>,
) -> Result<Report> {
    let mut kplug = ApiClient::connect(&current.server).await?;
    let mut direct = connect_plugin_once_listening(current.plugin.address).await?;
    let relayed = Caller::connect(Route::Relay, current).await?;
    let mut earlier = match baseline {
        Some((deployment, _)) => Some(ApiClient::connect(&deployment.server).await?),
        None => None,
    };
    let mut routes = vec![Route::Kplug, Route::Direct, Route::Relay];
    if baseline.is_some() {
        routes.insert(1, Route::Baseline);
    }
    let mut report = Report {
        baseline: baseline.map(|(_, rev)| rev.clone()),
        latency: Vec::new(),
        floor: Latencies::new(Vec::new()),
        floor_bytes: 0,
        throughput: Vec::new(),
    };
    let payloads: Vec<Arc<Payload>> = payloads.into_iter().map(Arc::new).collect();
    for payload in &payloads {
        let answer_bytes = check_routes(&mut kplug, &mut direct, payload).await?;
        if let Some(earlier) = &mut earlier {
            check_routes(earlier, &mut direct, payload).await?;
        }
        eprintln!(
            "timing {} sequential reconciles of the {} object per route, after {WARMUP} untimed",
            ROUNDS * PER_ROUND,
            payload.label
        );
        let mut callers = vec![
            (Route::Kplug, Caller::Kplug(kplug.clone())),
            (Route::Direct, Caller::Direct(direct.clone())),
            (Route::Relay, relayed.clone()),
        ];
        if let Some(earlier) = &earlier {
            callers.push((Route::Baseline, Caller::Kplug(earlier.clone())));
        }
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
            let mut runs: Vec<ThroughputRun> = Vec::new();
            for round in 0..THROUGHPUT_ROUNDS {
                for offset in 0..routes.len() {
                    let route = routes[(round + offset) % routes.len()];
                    let reconciles = payload.throughput_reconciles / THROUGHPUT_ROUNDS;
                    eprintln!(
                        "round {}: timing {reconciles} reconciles of the {} object {}, {IN_FLIGHT} in flight over {connections} connection(s)",
                        round + 1,
                        payload.label,
                        route.label()
                    );
                    let deployment = match (route, baseline) {
                        (Route::Baseline, Some((deployment, _))) => deployment,
                        _ => current,
                    };
                    let run =
                        throughput(deployment, route, connections, payload, reconciles).await?;
                    match runs.iter().position(|r| r.route == route) {
                        Some(index) => {
                            let earlier = runs.swap_remove(index);
                            runs.push(earlier.merge(run));
                        }
                        None => runs.push(run),
                    }
                }
            }
            runs.sort_by_key(|run| routes.iter().position(|r| *r == run.route));
            report.throughput.extend(runs);
        }
    }
    Ok(report)
}

/// Sequential latencies of one payload.
pub struct Sequential {
    pub kplug: Latencies,
    pub direct: Latencies,
    /// Through the baseline build, when there is one.
    pub baseline: Option<Latencies>,
    /// Through the relay: the floor of any proxy here.
    pub relay: Latencies,
    /// Through kplug: how long kplug's gRPC call to the plugin took.
    pub plugin_call: Latencies,
    /// Through kplug: the rest, i.e. the answer's latency less kplug's gRPC
    /// call (client and kplug HTTP/2 and TLS, decoding, selection,
    /// encoding the answer).
    pub outside_plugin_call: Latencies,
    /// Through kplug: each stage of its `Server-Timing`, in order, and last
    /// `CONNECTION`: the answer's latency less all of them.
    pub stages: Vec<(String, Latencies)>,
}

/// What a call through kplug took beyond the stages kplug measured: TLS,
/// HTTP/2 and the network both ways, and the client.
pub const CONNECTION: &str = "the connection (the answer's latency − the stages)";

/// `ROUNDS` rounds of `PER_ROUND` calls on each route, after `WARMUP`
/// calls each; every round starts with the next route.
async fn sequential(callers: &mut [(Route, Caller)], payload: &Payload) -> Result<Sequential> {
    let mut number = 0;
    for (_, caller) in callers.iter_mut() {
        for _ in 0..WARMUP {
            caller.reconcile(payload, number, true).await?;
            number += 1;
        }
    }
    let mut samples = vec![Vec::with_capacity(ROUNDS * PER_ROUND); callers.len()];
    let mut plugin_call = Vec::with_capacity(ROUNDS * PER_ROUND);
    let mut outside_plugin_call = Vec::with_capacity(ROUNDS * PER_ROUND);
    let mut stages: Vec<(String, Vec<Duration>)> = Vec::new();
    for round in 0..ROUNDS {
        for offset in 0..callers.len() {
            let index = (round + offset) % callers.len();
            let (route, caller) = &mut callers[index];
            for _ in 0..PER_ROUND {
                let call = caller.reconcile(payload, number, true).await?;
                samples[index].push(call.elapsed);
                if let (Route::Kplug, Some(inside)) = (*route, call.plugin_call) {
                    plugin_call.push(inside);
                    outside_plugin_call.push(call.elapsed.saturating_sub(inside));
                    record_stages(&mut stages, &call)?;
                }
                number += 1;
            }
        }
    }
    let mut by_route = callers
        .iter()
        .map(|(route, _)| *route)
        .zip(samples.into_iter().map(Latencies::new))
        .collect::<Vec<_>>();
    let mut take = |wanted: Route| {
        by_route
            .iter()
            .position(|(route, _)| *route == wanted)
            .map(|index| by_route.swap_remove(index).1)
    };
    Ok(Sequential {
        kplug: take(Route::Kplug).context("no calls through kplug")?,
        direct: take(Route::Direct).context("no direct calls")?,
        baseline: take(Route::Baseline),
        relay: take(Route::Relay).context("no calls through the relay")?,
        plugin_call: Latencies::new(plugin_call),
        outside_plugin_call: Latencies::new(outside_plugin_call),
        stages: stages
            .into_iter()
            .map(|(stage, samples)| (stage, Latencies::new(samples)))
            .collect(),
    })
}

/// Adds `call`'s stages, and what its latency took beyond them, to
/// `stages`; every call through kplug must name the same stages in the
/// same order (a reconcile by value).
fn record_stages(stages: &mut Vec<(String, Vec<Duration>)>, call: &Call) -> Result<()> {
    ensure!(
        !call.stages.is_empty(),
        "an answer through kplug without its Server-Timing"
    );
    let measured: Duration = call.stages.iter().map(|(_, took)| *took).sum();
    let connection = (CONNECTION.to_owned(), call.elapsed.saturating_sub(measured));
    for (index, (stage, took)) in call
        .stages
        .iter()
        .cloned()
        .chain(std::iter::once(connection))
        .enumerate()
    {
        match stages.get_mut(index) {
            Some((known, samples)) => {
                ensure!(
                    *known == stage,
                    "stage {index} is {stage:?} in one answer, {known:?} in another"
                );
                samples.push(took);
            }
            None => stages.push((stage, vec![took])),
        }
    }
    Ok(())
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

/// `total` calls on `route` from `IN_FLIGHT`
/// concurrent callers over `connections` fresh connections, after an
/// untimed warm-up on the same connections.
async fn throughput(
    deployment: &Deployment,
    route: Route,
    connections: usize,
    payload: &Arc<Payload>,
    total: usize,
) -> Result<ThroughputRun> {
    let mut callers = Vec::with_capacity(connections);
    for _ in 0..connections {
        callers.push(Caller::connect(route, deployment).await?);
    }
    let warmup = (total / THROUGHPUT_WARMUP_DIVISOR).max(IN_FLIGHT);
    concurrent(&callers, payload, warmup).await?;

    let plugin = &deployment.plugin;
    let (proxy_cpu, plugin_cpu, client_cpu) = (
        deployment.proxy_cpu_time(route)?,
        plugin.cpu_time()?,
        own_cpu_time()?,
    );
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
        proxy_cpu: deployment.proxy_cpu_time(route)?.saturating_sub(proxy_cpu),
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
