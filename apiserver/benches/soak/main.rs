//! Soak run of the real `kplug-apiserver` binary (issue 8): a fleet of
//! plugins heartbeating for minutes against one kplug, in standalone mode
//! on 127.0.0.1 with its default flags.
//!
//! Every plugin is a task that heartbeats as the SDK does by default: it
//! asks for no interval, so kplug's `--default-heartbeat-interval` (10 s)
//! applies, and sleeps the interval kplug answers with ±10 % between
//! heartbeats; failures are retried with a doubling backoff. Each plugin
//! declares one instance (`NAME-0`, as a StatefulSet's pod). Their first
//! heartbeats are spread evenly over one interval; they share
//! `KPLUG_SOAK_CONNECTIONS` gRPC connections. A watch on the plugins stays open for the
//! whole run. Every `monitor::SAMPLE_EVERY` the bench reads kplug's memory
//! and CPU from `/proc` and its counters from `/metrics`.
//!
//! The run fails (non-zero exit) unless: no heartbeat failed or was refused;
//! kplug expired no plugin (`kplug_plugin_expiries_total`), the watch saw no
//! DELETED event and every plugin is listed at the end; every plugin was
//! Ready at every sample once all had registered; and resident memory in
//! the last minute is at most `RSS_GROWTH_BOUND` times the first minute's
//! (the larger of each minute's samples).
//!
//! With `KPLUG_BASELINE=REV` (a commit), kplug built at REV (the baseline,
//! with its own default flags) runs beside the current build, and the whole
//! soak runs against both at the same time: each has its own fleet of
//! `KPLUG_SOAK_PLUGINS` plugins, its own watch and its own sampling, and
//! neither server counts as the other's "other load". The report shows the
//! current build's checks (they alone decide the exit status), the
//! baseline's as information, and both builds' windows and samples side by
//! side: the before/after memory curve of a change, measured in one run
//! (hack/baseline.sh builds REV once into ~/.cache/kplug/baseline).
//! Progress lines then start with "baseline: " or "current: ".
//!
//! Knobs (environment): `KPLUG_SOAK_PLUGINS` (10000), `KPLUG_SOAK_DURATION`
//! (10m), `KPLUG_SOAK_INTERVAL` (unset: kplug's default; else the interval
//! the plugins ask for, e.g. 5s), `KPLUG_SOAK_CONNECTIONS` (4; the fleet's
//! gRPC connections: 10000 gives each plugin its own, as a real fleet),
//! `KPLUG_BASELINE` (unset). Results go to
//! stdout as Markdown (for BENCHMARKS.md), progress to stderr. Run with
//! `cargo bench -p kplug-apiserver --bench soak`.

mod fleet;
mod monitor;
mod report;
#[path = "../support/mod.rs"]
mod support;
mod watch;

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use kplug_test_support::measure::{CpuSnapshot, load_averages};
use serde::Deserialize;
use support::{ApiClient, BASELINE_VARIABLE, Server, baseline_binary, print_machine_with_notes};

use crate::fleet::{Fleet, Stats};
use crate::monitor::Sample;
use crate::watch::{Watch, WatchCounts};

const COMMAND: &str = "cargo bench -p kplug-apiserver --bench soak";
pub const PLUGINS_PATH: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";
/// gRPC connections the fleet shares unless `KPLUG_SOAK_CONNECTIONS` says
/// otherwise (as the load bench's). A real fleet holds one per instance.
const DEFAULT_CONNECTIONS: usize = 4;
/// kplug's `--default-heartbeat-interval`, which the plugins get when they
/// ask for none.
const KPLUG_DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// Memory is flat when the last minute's RSS is at most this many times the
/// first minute's (the larger sample of each: the first minute's first
/// sample comes before kplug's first status refreshes, at 30 s).
pub const RSS_GROWTH_BOUND: f64 = 1.2;

const PLUGINS_VARIABLE: &str = "KPLUG_SOAK_PLUGINS";
const DURATION_VARIABLE: &str = "KPLUG_SOAK_DURATION";
const INTERVAL_VARIABLE: &str = "KPLUG_SOAK_INTERVAL";
const CONNECTIONS_VARIABLE: &str = "KPLUG_SOAK_CONNECTIONS";

/// The run's knobs.
pub struct Settings {
    pub plugins: usize,
    pub duration: Duration,
    /// What the plugins ask for; `None`: kplug's default.
    pub interval: Option<Duration>,
    /// gRPC connections the fleet shares (plugin `i` uses `i % connections`).
    pub connections: usize,
    /// The baseline's commit (`KPLUG_BASELINE`), if one runs beside.
    pub baseline: Option<String>,
    /// The knobs that were set, as `NAME=value`, for the command line.
    set: Vec<String>,
}

impl Settings {
    fn from_env() -> Result<Self> {
        let mut set = Vec::new();
        let mut variable = |name: &str| match std::env::var(name) {
            Ok(value) if !value.is_empty() => {
                set.push(format!("{name}={value}"));
                Some(value)
            }
            _ => None,
        };
        let duration = |name: &str, text: &str| {
            kplug_proto::duration::parse(text)
                .map_err(|e| anyhow::anyhow!("{name}={text}: {e}"))
                .and_then(|d| match d.is_zero() {
                    true => bail!("{name} must be more than zero"),
                    false => Ok(d),
                })
        };
        let plugins = match variable(PLUGINS_VARIABLE) {
            Some(text) => text
                .parse()
                .with_context(|| format!("{PLUGINS_VARIABLE}={text} is not a count"))?,
            None => 10_000,
        };
        let run = match variable(DURATION_VARIABLE) {
            Some(text) => duration(DURATION_VARIABLE, &text)?,
            None => Duration::from_secs(600),
        };
        let interval = match variable(INTERVAL_VARIABLE) {
            Some(text) => Some(duration(INTERVAL_VARIABLE, &text)?),
            None => None,
        };
        let connections = match variable(CONNECTIONS_VARIABLE) {
            Some(text) => text
                .parse()
                .with_context(|| format!("{CONNECTIONS_VARIABLE}={text} is not a count"))?,
            None => DEFAULT_CONNECTIONS,
        };
        anyhow::ensure!(connections > 0, "{CONNECTIONS_VARIABLE} must be at least 1");
        let baseline = variable(BASELINE_VARIABLE);
        anyhow::ensure!(plugins > 0, "{PLUGINS_VARIABLE} must be at least 1");
        Ok(Self {
            plugins,
            duration: run,
            interval,
            connections,
            baseline,
            set,
        })
    }

    /// The interval the plugins expect until kplug answers.
    pub fn expected_interval(&self) -> Duration {
        self.interval.unwrap_or(KPLUG_DEFAULT_INTERVAL)
    }

    fn command(&self) -> String {
        let mut words = self.set.clone();
        words.push(COMMAND.to_owned());
        words.join(" ")
    }
}

/// What the run saw.
pub struct Outcome {
    pub samples: Vec<Sample>,
    pub stats: std::sync::Arc<Stats>,
    pub watch: std::sync::Arc<WatchCounts>,
    /// Why the watch could not be held, if it could not.
    pub watch_error: Option<String>,
    /// Plugins in the list at the end, and how many of the fleet's were not.
    pub listed: usize,
    pub missing: usize,
    /// kplug's peak resident memory (`VmHWM`), in KiB.
    pub peak_rss_kib: u64,
}

/// One kplug under soak, as its monitor sees it.
pub struct Subject<'a> {
    pub server: &'a Server,
    /// Its pid, then the other server's if two run: neither is "other
    /// load" of the other.
    pub pids: Vec<u32>,
    /// Starts its progress lines: "baseline: " or "current:  " when two
    /// run, else empty.
    pub prefix: &'static str,
}

fn main() -> Result<()> {
    let settings = Settings::from_env()?;
    let binary = kplug_test_support::target_binary(
        "kplug-apiserver",
        "cargo build --release -p kplug-apiserver",
    )?;
    // Built (the first time) before anything is measured.
    let baseline = match &settings.baseline {
        Some(rev) => Some((baseline_binary(rev)?, rev.as_str())),
        None => None,
    };
    let load_before = load_averages()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let before = baseline
        .as_ref()
        .map(|(binary, _)| Server::start_binary(binary, &[]));
    let server = Server::start_binary(&binary, &[]);
    let pids: Vec<u32> = std::iter::once(server.pid())
        .chain(before.as_ref().map(Server::pid))
        .collect();
    if let (Some(before), Some((_, rev))) = (&before, &baseline) {
        eprintln!(
            "baseline (`{rev}`): pid {}; current: pid {}",
            before.pid(),
            server.pid()
        );
    }
    let usage = CpuSnapshot::now(&pids)?;
    let (outcome, baseline_outcome) = runtime.block_on(async {
        let Some(before) = &before else {
            let current = Subject {
                server: &server,
                pids: pids.clone(),
                prefix: "",
            };
            return Ok((soak(&current, &settings).await?, None));
        };
        let current = Subject {
            server: &server,
            pids: pids.clone(),
            // As wide as the baseline's, so that the columns line up.
            prefix: "current:  ",
        };
        let baseline = Subject {
            server: before,
            pids: pids.iter().rev().copied().collect(),
            prefix: "baseline: ",
        };
        let (current, baseline) =
            tokio::try_join!(soak(&current, &settings), soak(&baseline, &settings))?;
        anyhow::Ok((current, Some(baseline)))
    })?;
    let usage = usage.usage()?;

    let kplug_cpu = match (usage.processes.get(1), &baseline) {
        (Some(before), Some((_, rev))) => format!(
            "The current kplug used {:.1} CPU-seconds, the baseline (`{rev}`) {:.1}, the bench \
             {:.1} (both fleets, watches, metrics parser)",
            usage.processes[0].as_secs_f64(),
            before.as_secs_f64(),
            usage.own.as_secs_f64()
        ),
        _ => format!(
            "kplug used {:.1} CPU-seconds, the bench {:.1} (plugins, watch, metrics parser)",
            usage.processes[0].as_secs_f64(),
            usage.own.as_secs_f64()
        ),
    };
    let notes = [
        format!(
            "Load average (`uptime`) before the run: {:.2}, {:.2}, {:.2}",
            load_before[0], load_before[1], load_before[2]
        ),
        kplug_cpu,
    ];
    let baseline_role = baseline
        .as_ref()
        .map(|(_, rev)| format!("Baseline (`{rev}`)"));
    let mut binaries = Vec::new();
    if let (Some(role), Some((path, _))) = (&baseline_role, &baseline) {
        binaries.push((role.as_str(), path.as_path()));
    }
    binaries.push(("Server", binary.as_path()));
    print_machine_with_notes(&binaries, &settings.command(), usage.other_load(), &notes)?;
    let compared = settings.baseline.as_deref().zip(baseline_outcome.as_ref());
    let failed = report::print(&settings, &outcome, compared);
    if !failed.is_empty() {
        bail!("the soak run failed: {}", failed.join("; "));
    }
    Ok(())
}

async fn soak(subject: &Subject<'_>, settings: &Settings) -> Result<Outcome> {
    let server = subject.server;
    let mut api = ApiClient::connect(server).await?;
    // Longer than the run: kplug ends a watch at its timeout.
    let watch = Watch::start(
        api.clone(),
        (settings.duration * 2).as_secs().max(60),
        subject.prefix,
    );
    eprintln!(
        "{}starting {} plugins for {:?} (interval {:?})",
        subject.prefix,
        settings.plugins,
        settings.duration,
        settings.expected_interval()
    );
    let fleet = Fleet::start(server, settings).await?;
    let start = tokio::time::Instant::now();
    let samples = monitor::run(
        subject,
        &mut api,
        &fleet.stats,
        &watch.counts,
        start,
        settings.duration,
    )
    .await?;
    // While the plugins still heartbeat.
    let (listed, missing) = list(&mut api, settings.plugins).await?;
    let peak_rss_kib = server.peak_rss_kib()?;
    let stats = fleet.stats.clone();
    fleet.stop().await?;
    let counts = watch.counts.clone();
    let watch_error = watch.stop().await.err().map(|e| format!("{e:#}"));
    Ok(Outcome {
        samples,
        stats,
        watch: counts,
        watch_error,
        listed,
        missing,
        peak_rss_kib,
    })
}

#[derive(Deserialize)]
struct List {
    items: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    metadata: Metadata,
}

#[derive(Deserialize)]
struct Metadata {
    name: String,
}

/// How many plugins kplug lists, and how many of the fleet's it does not.
async fn list(api: &mut ApiClient, plugins: usize) -> Result<(usize, usize)> {
    let body = api.get(PLUGINS_PATH, "application/json").await?;
    let list: List = serde_json::from_slice(&body).context("the plugin list")?;
    let names: HashSet<String> = list.items.into_iter().map(|i| i.metadata.name).collect();
    let missing = (0..plugins)
        .filter(|index| !names.contains(&support::heartbeats::plugin_name(*index)))
        .count();
    Ok((names.len(), missing))
}
