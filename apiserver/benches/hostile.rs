//! What a hostile plugin costs its neighbours: the latency of a
//! well-behaved plugin's reconciles through kplug while another plugin
//! attacks, beside the same calls with no attack, in alternating rounds of
//! one run (the ratio is the result; the machine's other load hits both).
//!
//! kplug (`standalone`, release) and the neighbour (`hello-plugin`,
//! release) are real processes; the hostile plugin is the fake of
//! `kplug_test_support::hostile`, registered with real heartbeats, in this
//! process. Attacks, each while the neighbour calls for [`PHASE`] a round:
//!
//! - **heartbeat flood**: the hostile plugin's unchanged heartbeat aimed at
//!   10,000 a second over one connection (64 in flight);
//! - **100 MiB answers**: reconciles of the hostile plugin, one after the
//!   other, each answered with a 100 MiB status that kplug refuses;
//! - **silent**: the hostile plugin holds `--max-inflight-per-plugin`
//!   calls that it never answers, and more are sent, refused with 429.
//!
//! Results go to stdout as Markdown (for BENCHMARKS.md), progress to
//! stderr. Run with `cargo build --release -p kplug-apiserver -p
//! kplug-example-hello && cargo bench -p kplug-apiserver --bench hostile`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use kplug_test_support::hostile::{Hostile, Mode, Registration};
use kplug_test_support::measure::{CpuSnapshot, Latencies};
use kplug_test_support::report::{mib, ms, seconds};
use kplug_test_support::workspace_binary;

#[path = "support/mod.rs"]
mod support;

use support::{ApiClient, Server, print_machine};

const COMMAND: &str = "cargo build --release -p kplug-apiserver -p kplug-example-hello && \
                       cargo bench -p kplug-apiserver --bench hostile";
const NEIGHBOUR: &str = "/apis/plugins.kplug.io/v1alpha1/plugins/neighbour/reconcile";
const HOSTILE: &str = "/apis/plugins.kplug.io/v1alpha1/plugins/hostile/reconcile";
/// Neighbour calls before the rounds, untimed.
const WARMUP: usize = 300;
/// How long each phase of a round makes sequential neighbour calls.
const PHASE: Duration = Duration::from_secs(3);
const ROUNDS: usize = 5;
const HUNDRED_MIB: usize = 100 << 20;
/// kplug's calls in flight per plugin instance, which a silent plugin fills.
const IN_FLIGHT: usize = 32;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Attack {
    Quiet,
    Flood,
    Huge,
    Silent,
}

impl Attack {
    const ALL: [Attack; 4] = [Self::Quiet, Self::Flood, Self::Huge, Self::Silent];

    fn name(self) -> &'static str {
        match self {
            Self::Quiet => "none",
            Self::Flood => "heartbeats aimed at 10,000/s",
            Self::Huge => "100 MiB answers, one after another",
            Self::Silent => "never answers (32 calls held, the in-flight bound)",
        }
    }
}

fn body(name: &str) -> Bytes {
    Bytes::from(
        serde_json::json!({"apiVersion": "plugins.kplug.io/v1alpha1", "kind": "Reconcile",
            "spec": {"object": {"apiVersion": "example.com/v1", "kind": "Greeting",
            "metadata": {"name": name}}, "timeoutSeconds": 30}})
        .to_string(),
    )
}

/// One neighbour call, which must succeed; its latency.
async fn neighbour_call(client: &mut ApiClient) -> Result<Duration> {
    let started = Instant::now();
    let (status, answer) = client.post_json(NEIGHBOUR, body("n")).await?;
    ensure!(
        status == http::StatusCode::CREATED,
        "the neighbour was refused: {status}: {}",
        String::from_utf8_lossy(&answer)
    );
    Ok(started.elapsed())
}

/// What one phase measured.
struct Phase {
    latencies: Latencies,
    /// kplug's CPU time meanwhile.
    cpu: Duration,
    /// Attacking calls or heartbeats made meanwhile.
    attacks: usize,
}

/// Runs `attack` while the neighbour makes calls for [`PHASE`].
async fn phase(
    attack: Attack,
    server: &Server,
    hostile: &Arc<Hostile>,
    client: &mut ApiClient,
) -> Result<Phase> {
    let stop = Arc::new(AtomicBool::new(false));
    let attacks = Arc::new(AtomicUsize::new(0));
    // The flood runs on a thread of its own: it drives the hostile
    // plugin's runtime, which cannot be entered from this one.
    let mut flooder = None;
    let mut callers = None;
    match attack {
        Attack::Quiet => {}
        Attack::Flood => {
            let (hostile, stop, attacks) = (hostile.clone(), stop.clone(), attacks.clone());
            let registration = Registration::plain(&server.kplug.grpc, "hostile", &hostile.address);
            flooder = Some(std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let flood =
                        hostile.flood(&registration, 1, 10_000, Duration::from_millis(500), 64);
                    attacks.fetch_add(flood.sent, Ordering::SeqCst);
                }
            }));
        }
        Attack::Huge | Attack::Silent => {
            hostile.set(match attack {
                Attack::Huge => Mode::Huge(HUNDRED_MIB),
                _ => Mode::Silent,
            });
            let client = ApiClient::connect(server).await?;
            // The silent plugin holds as many calls as kplug lets it.
            let count = if attack == Attack::Silent {
                IN_FLIGHT
            } else {
                1
            };
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..count {
                let (mut client, stop, attacks) = (client.clone(), stop.clone(), attacks.clone());
                tasks.spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        // Counted when sent: a silent plugin's calls never end here.
                        attacks.fetch_add(1, Ordering::SeqCst);
                        let (status, _) = client.post_json(HOSTILE, body("h")).await?;
                        ensure!(!status.is_success(), "the hostile plugin's answer passed");
                    }
                    Ok(())
                });
            }
            callers = Some(tasks);
        }
    }
    let cpu = CpuSnapshot::now(&[server.pid()])?;
    let mut samples = Vec::new();
    let started = Instant::now();
    while started.elapsed() < PHASE {
        samples.push(neighbour_call(client).await?);
    }
    let used = cpu.usage()?.processes.first().copied().unwrap_or_default();
    stop.store(true, Ordering::SeqCst);
    if let Some(flooder) = flooder {
        flooder
            .join()
            .map_err(|_| anyhow::anyhow!("the flood's thread panicked"))?;
    }
    if let Some(tasks) = callers {
        // The silent plugin's held calls end at their deadline: not waited for.
        if attack == Attack::Silent {
            drop(tasks);
        } else {
            support::join_all(tasks).await?;
        }
    }
    Ok(Phase {
        latencies: Latencies::new(samples),
        cpu: used,
        attacks: attacks.load(Ordering::SeqCst),
    })
}

fn main() -> Result<()> {
    // Outside any runtime: the hostile plugin runs its own.
    let hostile = Arc::new(Hostile::start(Mode::Silent));
    let server = Server::start(&["--max-inflight-per-plugin", &IN_FLIGHT.to_string()]);
    hostile.heartbeat(&server.kplug.grpc, "hostile", &hostile.address);
    let _neighbour = server.kplug.plugin("neighbour", &[]);
    for name in ["hostile", "neighbour"] {
        server.kplug.wait_for_plugin(name, |p| {
            p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        });
    }
    let runtime = tokio::runtime::Runtime::new().context("the bench's runtime")?;
    let (phases, others) = runtime.block_on(measure(&server, &hostile))?;
    let peak = server.peak_rss_kib()?;
    print_machine(
        &[
            ("Server", &workspace_binary("kplug-apiserver")),
            ("Neighbour", &workspace_binary("hello-plugin")),
        ],
        COMMAND,
        others,
    )?;
    println!(
        "\n## Neighbour latency under attack\n\n{ROUNDS} rounds of {} of sequential neighbour reconciles per attack, the attacks alternating; kplug `--max-inflight-per-plugin {IN_FLIGHT}`; kplug's peak RSS over the run {}.\n",
        seconds(PHASE),
        mib(peak)
    );
    println!(
        "| Attack | Neighbour calls | Neighbour p50 | p99 | p50 ratio to none | kplug CPU per phase (median) | Attacking calls or heartbeats sent per phase (median) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let summaries: Vec<_> = phases
        .into_iter()
        .map(|phases| {
            let cpu = median(phases.iter().map(|p| p.cpu.as_secs_f64()).collect());
            let attacks = median(phases.iter().map(|p| p.attacks as f64).collect());
            let all = phases
                .into_iter()
                .map(|p| p.latencies)
                .fold(Latencies::new(Vec::new()), Latencies::merge);
            (all, cpu, attacks)
        })
        .collect();
    let quiet = summaries
        .first()
        .map(|(all, _, _)| all.percentile(50.0))
        .context("no quiet phase")?;
    for (attack, (all, cpu, attacks)) in Attack::ALL.into_iter().zip(&summaries) {
        println!(
            "| {} | {} | {} | {} | {:.2} | {} | {:.0} |",
            attack.name(),
            all.len(),
            ms(all.percentile(50.0), 2),
            ms(all.percentile(99.0), 2),
            all.percentile(50.0).as_secs_f64() / quiet.as_secs_f64(),
            ms(Duration::from_secs_f64(*cpu), 0),
            attacks
        );
    }
    Ok(())
}

/// Warms up, then runs every attack [`ROUNDS`] times, alternating; the
/// phases by attack, and the machine's other load meanwhile.
async fn measure(
    server: &Server,
    hostile: &Arc<Hostile>,
) -> Result<(Vec<Vec<Phase>>, kplug_test_support::measure::OtherLoad)> {
    let mut client = ApiClient::connect(server).await?;
    for _ in 0..WARMUP {
        neighbour_call(&mut client).await?;
    }
    let machine = CpuSnapshot::now(&[])?;
    let mut phases: Vec<Vec<Phase>> = Attack::ALL.iter().map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        for (attack, measured) in Attack::ALL.into_iter().zip(&mut phases) {
            eprintln!("round {}/{ROUNDS}: {}", round + 1, attack.name());
            measured.push(phase(attack, server, hostile, &mut client).await?);
        }
    }
    Ok((phases, machine.usage()?.other_load()))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or_default()
}
