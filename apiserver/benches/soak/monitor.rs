//! Every `SAMPLE_EVERY` of the run: kplug's resident memory and CPU, its
//! own counters from `/metrics` (Ready plugins, expiries, heartbeats by
//! result), the fleet's heartbeats and their latencies, and what else ran
//! on the machine.

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use kplug_test_support::measure::{CpuSnapshot, Latencies, OtherLoad};
use kplug_test_support::metrics::Samples;
use tokio::time::Instant;

use crate::Subject;
use crate::fleet::Stats;
use crate::support::ApiClient;
use crate::watch::WatchCounts;

/// How often the monitor samples.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(30);
const METRICS_ACCEPT: &str = "application/openmetrics-text; version=1.0.0";

/// One sample: the state at `at`, and what happened since the last one.
pub struct Sample {
    /// Since the first heartbeat was due.
    pub at: Duration,
    pub rss_kib: u64,
    /// Accepted heartbeats since the last sample, and their latencies.
    pub heartbeats: u64,
    pub latencies: Vec<Duration>,
    /// kplug's CPU time since the last sample.
    pub kplug_cpu: Duration,
    /// Other processes' CPU since the last sample (neither kplug counts).
    pub other: OtherLoad,
    /// Plugins with an accepted heartbeat so far.
    pub registered: usize,
    /// kplug's figures: `kplug_plugins{ready}`, `kplug_plugin_expiries_total`
    /// and the heartbeats it did not accept (`kplug_heartbeats_total` by
    /// result), counted since it started.
    pub ready: u64,
    pub not_ready: u64,
    pub expiries: u64,
    pub not_accepted: u64,
    /// The fleet's errors and the watch's DELETED events so far.
    pub errors: u64,
    pub deleted: u64,
}

impl Sample {
    pub fn latencies(&self) -> Latencies {
        Latencies::new(self.latencies.clone())
    }

    /// kplug's CPU time per accepted heartbeat, in microseconds.
    pub fn cpu_per_heartbeat(&self) -> f64 {
        per_heartbeat(self.kplug_cpu, self.heartbeats)
    }
}

pub fn per_heartbeat(cpu: Duration, heartbeats: u64) -> f64 {
    cpu.as_secs_f64() * 1e6 / heartbeats.max(1) as f64
}

/// Samples `subject` from `start` every [`SAMPLE_EVERY`], and at `start +
/// duration`.
pub async fn run(
    subject: &Subject<'_>,
    api: &mut ApiClient,
    stats: &Stats,
    watch: &WatchCounts,
    start: Instant,
    duration: Duration,
) -> Result<Vec<Sample>> {
    let mut samples = Vec::new();
    let mut cpu = CpuSnapshot::now(&subject.pids)?;
    let mut accepted = 0;
    let mut at = Duration::ZERO;
    while at < duration {
        at = (at + SAMPLE_EVERY).min(duration);
        tokio::time::sleep_until(start + at).await;
        let usage = cpu.usage()?;
        cpu = CpuSnapshot::now(&subject.pids)?;
        let total = stats.accepted.load(Ordering::Relaxed);
        let metrics = scrape(api).await?;
        let sample = Sample {
            at,
            rss_kib: subject.server.rss_kib()?,
            heartbeats: total - accepted,
            latencies: stats.take_latencies(),
            kplug_cpu: usage.processes[0],
            other: usage.other_load(),
            registered: stats.registered.load(Ordering::Relaxed),
            ready: count(metrics.sum("kplug_plugins", &[("ready", "true")])),
            not_ready: count(metrics.sum("kplug_plugins", &[("ready", "false")])),
            expiries: count(metrics.sum("kplug_plugin_expiries_total", &[])),
            not_accepted: count(
                metrics.sum("kplug_heartbeats_total", &[])
                    - metrics.sum("kplug_heartbeats_total", &[("result", "accepted")]),
            ),
            errors: stats.errors(),
            deleted: WatchCounts::get(&watch.deleted),
        };
        accepted = total;
        eprintln!(
            "{}{:>4} s: RSS {:.1} MiB, Ready {}/{}, expiries {}, {} heartbeats (p99 {:.1} ms), \
             errors {}, DELETED {}, other load {:.0} %",
            subject.prefix,
            at.as_secs(),
            sample.rss_kib as f64 / 1024.0,
            sample.ready,
            sample.ready + sample.not_ready,
            sample.expiries,
            sample.heartbeats,
            sample.latencies().percentile(99.0).as_secs_f64() * 1e3,
            sample.errors,
            sample.deleted,
            sample.other.percent(),
        );
        samples.push(sample);
    }
    Ok(samples)
}

/// A gauge's or counter's value as a count.
fn count(value: f64) -> u64 {
    value.max(0.0).round() as u64
}

/// kplug's `/metrics`, read with the Prometheus project's parser.
async fn scrape(api: &mut ApiClient) -> Result<Samples> {
    let body = api.get("/metrics", METRICS_ACCEPT).await?;
    let text = String::from_utf8(body.to_vec()).context("/metrics is not UTF-8")?;
    tokio::task::spawn_blocking(move || Samples::try_parse(&text))
        .await
        .context("the metrics parser's task")?
}
