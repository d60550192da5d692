//! What a shadow costs the caller: the latency of reconciles through kplug
//! of a plugin without a shadow, of one whose shadow receives a dry-run
//! copy of every reconcile, and of one whose shadow never answers, in
//! alternating phases of one run (the ratio to "no shadow" is the result;
//! the machine's other load hits every phase).
//!
//! kplug (`standalone`, release) and every plugin instance (`hello-plugin`,
//! release, started with the SDK's own flags) are real processes: three
//! plugins of one instance each that answer callers, and two shadow
//! instances (`--shadow`, under the names of the second and third).
//!
//! Results go to stdout as Markdown (for BENCHMARKS.md), progress to
//! stderr. Run with `cargo build --release -p kplug-apiserver -p
//! kplug-example-hello && cargo bench -p kplug-apiserver --bench shadow`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use kplug_api::shadow::PluginShadow;
use kplug_test_support::measure::{CpuSnapshot, Latencies};
use kplug_test_support::report::{ms, seconds};
use kplug_test_support::workspace_binary;

#[path = "support/mod.rs"]
mod support;

use support::{ApiClient, Server, print_machine};

const COMMAND: &str = "cargo build --release -p kplug-apiserver -p kplug-example-hello && \
                       cargo bench -p kplug-apiserver --bench shadow";
/// Calls before the rounds, untimed, for each plugin.
const WARMUP: usize = 300;
/// How long each phase of a round makes sequential calls.
const PHASE: Duration = Duration::from_secs(3);
const ROUNDS: usize = 5;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Setup {
    Alone,
    Shadowed,
    Hanging,
}

impl Setup {
    const ALL: [Setup; 3] = [Self::Alone, Self::Shadowed, Self::Hanging];

    fn plugin(self) -> &'static str {
        match self {
            Self::Alone => "alone",
            Self::Shadowed => "shadowed",
            Self::Hanging => "hanging",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Alone => "no shadow",
            Self::Shadowed => "a shadow copied every reconcile (--shadow)",
            Self::Hanging => "a shadow that never answers (--shadow, --delay-ms 600000)",
        }
    }
}

fn body() -> Bytes {
    Bytes::from(
        serde_json::json!({"apiVersion": "plugins.kplug.io/v1alpha1", "kind": "Reconcile",
            "spec": {"object": {"apiVersion": "example.com/v1", "kind": "Greeting",
            "metadata": {"name": "world", "namespace": "default"}}, "timeoutSeconds": 30}})
        .to_string(),
    )
}

/// One reconcile of `setup`'s plugin, which must succeed; its latency.
async fn call(client: &mut ApiClient, setup: Setup) -> Result<Duration> {
    let path = format!(
        "/apis/plugins.kplug.io/v1alpha1/plugins/{}/reconcile",
        setup.plugin()
    );
    let started = Instant::now();
    let (status, answer) = client.post_json(&path, body()).await?;
    ensure!(
        status == http::StatusCode::CREATED,
        "{} was refused: {status}: {}",
        setup.plugin(),
        String::from_utf8_lossy(&answer)
    );
    Ok(started.elapsed())
}

async fn shadow_record(client: &mut ApiClient, setup: Setup) -> Result<PluginShadow> {
    let path = format!(
        "/apis/plugins.kplug.io/v1alpha1/plugins/{}/shadow",
        setup.plugin()
    );
    let body = client.get(&path, "application/json").await?;
    serde_json::from_slice(&body).context("a PluginShadow")
}

fn main() -> Result<()> {
    let server = Server::start(&[]);
    let kplug = &server.kplug;
    let _instances = [
        kplug.plugin("alone", &[]),
        kplug.plugin("shadowed", &[]),
        kplug.plugin("shadowed", &["--shadow"]),
        kplug.plugin("hanging", &[]),
        kplug.plugin("hanging", &["--shadow", "--delay-ms", "600000"]),
    ];
    for setup in Setup::ALL {
        let instances = if setup == Setup::Alone { 1 } else { 2 };
        kplug.wait_for_plugin(setup.plugin(), |p| {
            p["status"]["instances"]
                .as_array()
                .is_some_and(|i| i.iter().filter(|i| i["ready"] == true).count() == instances)
        });
    }
    let runtime = tokio::runtime::Runtime::new().context("the bench's runtime")?;
    let (phases, records, others) = runtime.block_on(measure(&server))?;
    print_machine(
        &[
            ("Server", &workspace_binary("kplug-apiserver")),
            ("Plugins", &workspace_binary("hello-plugin")),
        ],
        COMMAND,
        others,
    )?;
    println!(
        "\n## The caller's latency with a shadow\n\n{ROUNDS} rounds of {} of sequential \
         reconciles per setup, the setups alternating; each plugin has one instance that \
         answers callers, on its own hello-plugin process.\n",
        seconds(PHASE)
    );
    println!(
        "| Shadow | Calls | p50 | p99 | p50 ratio to no shadow | kplug CPU per call | Copies compared / failed / skipped |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|");
    let merged: Vec<(Latencies, Duration)> = phases
        .into_iter()
        .map(|phases| {
            let cpu = phases.iter().map(|(_, cpu)| *cpu).sum();
            let all = phases
                .into_iter()
                .map(|(latencies, _)| latencies)
                .fold(Latencies::new(Vec::new()), Latencies::merge);
            (all, cpu)
        })
        .collect();
    let alone = merged
        .first()
        .map(|(all, _)| all.percentile(50.0))
        .context("no phase without a shadow")?;
    for ((setup, (all, cpu)), record) in Setup::ALL.into_iter().zip(&merged).zip(&records) {
        let calls = u32::try_from(all.len()).unwrap_or(u32::MAX).max(1);
        let copies = match setup {
            Setup::Alone => "none".to_owned(),
            _ => format!(
                "{} / {} / {}",
                record.status.compared, record.status.failed, record.status.skipped
            ),
        };
        println!(
            "| {} | {} | {} | {} | {:.3} | {} | {copies} |",
            setup.name(),
            all.len(),
            ms(all.percentile(50.0), 3),
            ms(all.percentile(99.0), 3),
            all.percentile(50.0).as_secs_f64() / alone.as_secs_f64(),
            ms(*cpu / calls, 3),
        );
    }
    Ok(())
}

type Measured = (
    Vec<Vec<(Latencies, Duration)>>,
    Vec<PluginShadow>,
    kplug_test_support::measure::OtherLoad,
);

/// Warms up, then runs every setup [`ROUNDS`] times, alternating: the
/// phases' latencies and kplug's CPU time, by setup; the shadow records at
/// the end; the machine's other load meanwhile.
async fn measure(server: &Server) -> Result<Measured> {
    let mut client = ApiClient::connect(server).await?;
    for setup in Setup::ALL {
        for _ in 0..WARMUP {
            call(&mut client, setup).await?;
        }
    }
    let machine = CpuSnapshot::now(&[])?;
    let mut phases: Vec<Vec<(Latencies, Duration)>> =
        Setup::ALL.iter().map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        for (setup, measured) in Setup::ALL.into_iter().zip(&mut phases) {
            eprintln!("round {}/{ROUNDS}: {}", round + 1, setup.name());
            let cpu = CpuSnapshot::now(&[server.pid()])?;
            let mut samples = Vec::new();
            let started = Instant::now();
            while started.elapsed() < PHASE {
                samples.push(call(&mut client, setup).await?);
            }
            let used = cpu.usage()?.processes.first().copied().unwrap_or_default();
            measured.push((Latencies::new(samples), used));
        }
    }
    let others = machine.usage()?.other_load();
    let mut records = Vec::new();
    for setup in Setup::ALL {
        records.push(shadow_record(&mut client, setup).await?);
    }
    Ok((phases, records, others))
}
