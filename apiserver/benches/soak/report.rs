//! The Markdown report for BENCHMARKS.md, and the run's verdict: the checks
//! that failed.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kplug_test_support::measure::{Latencies, OtherLoad};
use kplug_test_support::report::{mib, ms, thousands, verdict};

use crate::monitor::{SAMPLE_EVERY, Sample, per_heartbeat};
use crate::watch::WatchCounts;
use crate::{CONNECTIONS, Outcome, RSS_GROWTH_BOUND, Settings};

/// kplug marks a plugin not Ready after this many missed intervals (and
/// expires it after `--ttl-intervals`, 3).
const LATE_AFTER_INTERVALS: u32 = 2;
const MINUTE: Duration = Duration::from_secs(60);

/// Samples taken over some span of the run, as one.
struct Window {
    heartbeats: u64,
    latencies: Latencies,
    kplug_cpu: Duration,
    /// The largest of the samples' RSS.
    rss_kib: u64,
    other: OtherLoad,
    seconds: f64,
}

impl Window {
    fn of<'a>(samples: impl Iterator<Item = &'a Sample>) -> Self {
        let samples: Vec<&Sample> = samples.collect();
        let mut latencies = Vec::new();
        for sample in &samples {
            latencies.extend_from_slice(&sample.latencies);
        }
        Self {
            heartbeats: samples.iter().map(|s| s.heartbeats).sum(),
            latencies: Latencies::new(latencies),
            kplug_cpu: samples.iter().map(|s| s.kplug_cpu).sum(),
            rss_kib: samples.iter().map(|s| s.rss_kib).max().unwrap_or_default(),
            other: samples.iter().map(|s| s.other).sum(),
            seconds: samples
                .iter()
                .map(|s| s.other.available.as_secs_f64())
                .sum::<f64>()
                / f64::from(kplug_test_support::measure::cpus()),
        }
    }

    fn row(&self, label: &str) -> String {
        format!(
            "| {label} | {} | {} | {} | {} | {} | {:.1} µs | {} | {:.0} % |",
            thousands(self.heartbeats as usize),
            thousands((self.heartbeats as f64 / self.seconds.max(f64::EPSILON)) as usize),
            ms(self.latencies.percentile(50.0), 2),
            ms(self.latencies.percentile(99.0), 2),
            ms(self.latencies.max(), 1),
            per_heartbeat(self.kplug_cpu, self.heartbeats),
            mib(self.rss_kib),
            self.other.percent(),
        )
    }
}

/// Prints the report; returns the checks that failed, described.
pub fn print(settings: &Settings, outcome: &Outcome) -> Vec<String> {
    let samples = &outcome.samples;
    let plugins = settings.plugins;
    let interval = settings.expected_interval();
    let last = samples.last();
    let end = last.map_or(Duration::ZERO, |s| s.at);
    let first_minute = Window::of(samples.iter().filter(|s| s.at <= MINUTE));
    let last_minute = Window::of(samples.iter().filter(|s| s.at + MINUTE > end));
    let whole = Window::of(samples.iter());
    let rss_ratio = last_minute.rss_kib as f64 / first_minute.rss_kib.max(1) as f64;
    let stats = &outcome.stats;
    let (failures, refusals) = (
        stats.failures.load(Ordering::Relaxed),
        stats.refusals.load(Ordering::Relaxed),
    );
    let not_accepted = last.map_or(0, |s| s.not_accepted);
    let expiries = last.map_or(0, |s| s.expiries);
    let watch = &outcome.watch;
    let deleted = WatchCounts::get(&watch.deleted);
    let steady: Vec<&Sample> = samples.iter().filter(|s| s.registered == plugins).collect();
    let lowest_ready = steady.iter().map(|s| s.ready).min();
    let intervals = stats.intervals.lock().clone();

    let mut checks: Vec<(&str, String, String, Option<bool>)> = vec![
        (
            "Heartbeat errors: RPC failures and timeouts / refusals",
            format!("{failures} / {refusals}"),
            "0".to_owned(),
            Some(failures + refusals == 0),
        ),
        (
            "Heartbeats kplug did not accept (`kplug_heartbeats_total`)",
            thousands(not_accepted as usize),
            "0".to_owned(),
            Some(not_accepted == 0),
        ),
        (
            "Expiries (`kplug_plugin_expiries_total`)",
            thousands(expiries as usize),
            "0".to_owned(),
            Some(expiries == 0),
        ),
        (
            "DELETED events on the watch",
            format!(
                "{deleted} (ADDED {}, MODIFIED {}, BOOKMARK {}, resumed {}×)",
                thousands(WatchCounts::get(&watch.added) as usize),
                thousands(WatchCounts::get(&watch.modified) as usize),
                WatchCounts::get(&watch.bookmarks),
                WatchCounts::get(&watch.resumed),
            ),
            "0".to_owned(),
            Some(deleted == 0 && outcome.watch_error.is_none()),
        ),
        (
            "Plugins listed at the end",
            format!(
                "{} ({} of the fleet's missing)",
                thousands(outcome.listed),
                outcome.missing
            ),
            format!("all {}", thousands(plugins)),
            Some(outcome.missing == 0 && outcome.listed == plugins),
        ),
        (
            "Ready plugins (`kplug_plugins{ready=\"true\"}`), lowest sample once all had registered",
            lowest_ready.map_or("no such sample".to_owned(), |r| thousands(r as usize)),
            thousands(plugins),
            Some(lowest_ready == Some(plugins as u64)),
        ),
        (
            "RSS, last minute / first minute (the larger sample of each)",
            format!(
                "{rss_ratio:.3} ({} / {})",
                mib(last_minute.rss_kib),
                mib(first_minute.rss_kib)
            ),
            format!("≤ {RSS_GROWTH_BOUND}"),
            Some(rss_ratio <= RSS_GROWTH_BOUND),
        ),
    ];
    let failed: Vec<String> = checks
        .iter()
        .filter(|(_, _, _, met)| *met == Some(false))
        .map(|(check, result, bound, _)| format!("{check}: {result}, bound {bound}"))
        .collect();
    checks.push((
        "Peak RSS (`VmHWM`)",
        mib(outcome.peak_rss_kib),
        "informational".to_owned(),
        None,
    ));
    checks.push((
        "Longest gap between two accepted heartbeats of one plugin (the fleet's own pace)",
        format!("{:.2} s", stats.longest_gap().as_secs_f64()),
        format!(
            "informational; kplug marks a plugin late after {:?}",
            interval * LATE_AFTER_INTERVALS
        ),
        None,
    ));

    println!(
        "## Soak: {} plugins for {}\n",
        thousands(plugins),
        minutes(settings.duration)
    );
    println!(
        "{} plugins, one instance each, heartbeating at the interval kplug answered with \
         ({}; {}) ±10 % jitter, over {CONNECTIONS} gRPC connections; their first heartbeats \
         spread over one interval. kplug runs with its default flags. A watch on the plugins \
         stays open for the whole run; kplug is sampled every {} s. {} heartbeats accepted.\n",
        thousands(plugins),
        intervals
            .iter()
            .map(|i| format!("{i:?}"))
            .collect::<Vec<_>>()
            .join(", "),
        match settings.interval {
            Some(asked) => format!("the plugins asked for {asked:?}"),
            None => "the plugins asked for none, as the SDK by default".to_owned(),
        },
        SAMPLE_EVERY.as_secs(),
        thousands(stats.accepted.load(Ordering::Relaxed) as usize),
    );
    println!("| Check | Result | Bound | Verdict |");
    println!("|---|---|---|---|");
    for (check, result, bound, met) in &checks {
        let cell = met.map_or("–", verdict);
        println!("| {check} | {result} | {bound} | {cell} |");
    }
    println!();
    print_errors(outcome);

    let header = "| Heartbeats | Heartbeats/s | Latency p50 | Latency p99 | Max | kplug CPU per heartbeat | RSS | Other load |";
    println!("| Window {header}\n|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "{}",
        first_minute.row("first minute (with the registrations)")
    );
    println!("{}", last_minute.row("last minute"));
    println!("{}", whole.row("whole run"));
    println!(
        "| last / first | {:.2} | | {:.2} | {:.2} | | {:.2} | {rss_ratio:.3} | |",
        last_minute.heartbeats as f64 / first_minute.heartbeats.max(1) as f64,
        ratio(
            last_minute.latencies.percentile(50.0),
            first_minute.latencies.percentile(50.0)
        ),
        ratio(
            last_minute.latencies.percentile(99.0),
            first_minute.latencies.percentile(99.0)
        ),
        per_heartbeat(last_minute.kplug_cpu, last_minute.heartbeats)
            / per_heartbeat(first_minute.kplug_cpu, first_minute.heartbeats).max(f64::EPSILON),
    );
    println!();

    println!(
        "Every {} s (latencies and CPU over the {} s before):\n",
        SAMPLE_EVERY.as_secs(),
        SAMPLE_EVERY.as_secs()
    );
    println!(
        "| At | RSS | Ready | Not Ready | Expiries | Heartbeats | p50 | p99 | kplug CPU per heartbeat | Other load |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for sample in samples {
        let latencies = sample.latencies();
        println!(
            "| {} s | {} | {} | {} | {} | {} | {} | {} | {:.1} µs | {:.0} % |",
            sample.at.as_secs(),
            mib(sample.rss_kib),
            thousands(sample.ready as usize),
            sample.not_ready,
            sample.expiries,
            thousands(sample.heartbeats as usize),
            ms(latencies.percentile(50.0), 2),
            ms(latencies.percentile(99.0), 2),
            sample.cpu_per_heartbeat(),
            sample.other.percent(),
        );
    }
    println!();
    failed
}

/// The first errors and deletions, if there were any.
fn print_errors(outcome: &Outcome) {
    let errors = outcome.stats.errors.lock();
    let deletions = outcome.watch.deletions.lock();
    if errors.is_empty() && deletions.is_empty() && outcome.watch_error.is_none() {
        return;
    }
    for error in errors.iter() {
        println!("- Heartbeat error: {error}");
    }
    for name in deletions.iter() {
        println!("- DELETED: {name}");
    }
    if let Some(error) = &outcome.watch_error {
        println!("- Watch: {error}");
    }
    println!();
}

fn ratio(after: Duration, before: Duration) -> f64 {
    after.as_secs_f64() / before.as_secs_f64().max(f64::EPSILON)
}

/// "10 minutes", "90 s".
fn minutes(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        60 => "1 minute".to_owned(),
        s if s % 60 == 0 => format!("{} minutes", s / 60),
        s => format!("{s} s"),
    }
}
