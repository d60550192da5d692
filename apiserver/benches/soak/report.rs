//! The Markdown report for BENCHMARKS.md, and the run's verdict: the checks
//! that failed.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kplug_test_support::measure::{Latencies, OtherLoad};
use kplug_test_support::report::{mib, ms, thousands, verdict};

use crate::monitor::{SAMPLE_EVERY, Sample, per_heartbeat};
use crate::watch::WatchCounts;
use crate::{Outcome, RSS_GROWTH_BOUND, Settings};

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

    fn per_second(&self) -> f64 {
        self.heartbeats as f64 / self.seconds.max(f64::EPSILON)
    }

    fn row(&self, label: &str) -> String {
        format!(
            "| {label} | {} | {} | {} | {} | {} | {:.1} µs | {} | {:.0} % |",
            thousands(self.heartbeats as usize),
            thousands(self.per_second() as usize),
            ms(self.latencies.percentile(50.0), 2),
            ms(self.latencies.percentile(99.0), 2),
            ms(self.latencies.max(), 1),
            per_heartbeat(self.kplug_cpu, self.heartbeats),
            mib(self.rss_kib),
            self.other.percent(),
        )
    }

    /// This window's figures over `before`'s, as the cells of a row after
    /// its labels.
    fn over(&self, before: &Self) -> String {
        let percentile = |p| ratio(self.latencies.percentile(p), before.latencies.percentile(p));
        format!(
            "{:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} |",
            self.heartbeats as f64 / before.heartbeats.max(1) as f64,
            self.per_second() / before.per_second().max(f64::EPSILON),
            percentile(50.0),
            percentile(99.0),
            ratio(self.latencies.max(), before.latencies.max()),
            per_heartbeat(self.kplug_cpu, self.heartbeats)
                / per_heartbeat(before.kplug_cpu, before.heartbeats).max(f64::EPSILON),
            self.rss_kib as f64 / before.rss_kib.max(1) as f64,
        )
    }
}

/// A check: what, the result, the bound, and whether it was met (`None`:
/// informational).
type Check = (&'static str, String, String, Option<bool>);

/// One build's run, summed up.
struct Summary<'a> {
    outcome: &'a Outcome,
    first_minute: Window,
    last_minute: Window,
    whole: Window,
    rss_ratio: f64,
    checks: Vec<Check>,
}

impl<'a> Summary<'a> {
    fn of(settings: &Settings, outcome: &'a Outcome) -> Self {
        let samples = &outcome.samples;
        let plugins = settings.plugins;
        let last = samples.last();
        let end = last.map_or(Duration::ZERO, |s| s.at);
        let first_minute = Window::of(samples.iter().filter(|s| s.at <= MINUTE));
        let last_minute = Window::of(samples.iter().filter(|s| s.at + MINUTE > end));
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

        let checks = vec![
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
            (
                "Peak RSS (`VmHWM`)",
                mib(outcome.peak_rss_kib),
                "informational".to_owned(),
                None,
            ),
            (
                "Longest gap between two accepted heartbeats of one plugin (the fleet's own pace)",
                format!("{:.2} s", stats.longest_gap().as_secs_f64()),
                format!(
                    "informational; kplug marks a plugin late after {:?}",
                    settings.expected_interval() * LATE_AFTER_INTERVALS
                ),
                None,
            ),
        ];
        Self {
            outcome,
            first_minute,
            last_minute,
            whole: Window::of(samples.iter()),
            rss_ratio,
            checks,
        }
    }

    /// The checks that failed, described.
    fn failed(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|(_, _, _, met)| *met == Some(false))
            .map(|(check, result, bound, _)| format!("{check}: {result}, bound {bound}"))
            .collect()
    }

    /// The checks' table, then the first errors and deletions.
    fn print_checks(&self) {
        println!("| Check | Result | Bound | Verdict |");
        println!("|---|---|---|---|");
        for (check, result, bound, met) in &self.checks {
            let cell = met.map_or("–", verdict);
            println!("| {check} | {result} | {bound} | {cell} |");
        }
        println!();
        print_errors(self.outcome);
    }

    /// The last minute's figures over the first minute's, as table cells
    /// after the label.
    fn last_over_first(&self) -> String {
        let (first, last) = (&self.first_minute, &self.last_minute);
        format!(
            "{:.2} | | {:.2} | {:.2} | | {:.2} | {:.3} | |",
            last.heartbeats as f64 / first.heartbeats.max(1) as f64,
            ratio(
                last.latencies.percentile(50.0),
                first.latencies.percentile(50.0)
            ),
            ratio(
                last.latencies.percentile(99.0),
                first.latencies.percentile(99.0)
            ),
            per_heartbeat(last.kplug_cpu, last.heartbeats)
                / per_heartbeat(first.kplug_cpu, first.heartbeats).max(f64::EPSILON),
            self.rss_ratio,
        )
    }

    fn accepted(&self) -> String {
        thousands(self.outcome.stats.accepted.load(Ordering::Relaxed) as usize)
    }

    /// The intervals kplug answered with.
    fn intervals(&self) -> String {
        let intervals = self.outcome.stats.intervals.lock();
        let texts: Vec<String> = intervals.iter().map(|i| format!("{i:?}")).collect();
        texts.join(", ")
    }
}

/// Prints the report; returns the current build's checks that failed,
/// described. With `baseline` (its commit and what it saw), the same for
/// the baseline, which ran at the same time, as information, and both
/// builds' windows and samples side by side.
pub fn print(
    settings: &Settings,
    outcome: &Outcome,
    baseline: Option<(&str, &Outcome)>,
) -> Vec<String> {
    let current = Summary::of(settings, outcome);
    let baseline = baseline.map(|(rev, outcome)| (rev, Summary::of(settings, outcome)));
    print_introduction(settings, &current, baseline.as_ref());
    match &baseline {
        None => {
            current.print_checks();
            print_windows(&current);
            print_samples(&outcome.samples);
        }
        Some((rev, before)) => {
            println!("The current build's checks, which decide the run:\n");
            current.print_checks();
            println!(
                "The baseline's (`{rev}`), for information only: they do not decide the run.\n"
            );
            before.print_checks();
            print_windows_compared(before, &current);
            print_samples_compared(&before.outcome.samples, &outcome.samples);
        }
    }
    current.failed()
}

/// The heading and what ran.
fn print_introduction(settings: &Settings, current: &Summary, baseline: Option<&(&str, Summary)>) {
    let plugins = thousands(settings.plugins);
    let duration = minutes(settings.duration);
    let mut intervals = current.intervals();
    let (heading, servers, accepted) = match baseline {
        None => (
            format!("## Soak: {plugins} plugins for {duration}"),
            "kplug runs with its default flags.".to_owned(),
            format!("{} heartbeats accepted.", current.accepted()),
        ),
        Some((rev, before)) => {
            if before.intervals() != intervals {
                intervals = format!("{intervals}; the baseline {}", before.intervals());
            }
            (
                format!("## Soak: {plugins} plugins for {duration}, against `{rev}`"),
                format!(
                    "Two kplugs run at the same time, each with its default flags and with a \
                     fleet of {plugins} plugins, a watch and samples of its own: the current \
                     build and the baseline, built at `{rev}`; neither counts as the other's \
                     other load."
                ),
                format!(
                    "{} heartbeats accepted by the current build, {} by the baseline.",
                    current.accepted(),
                    before.accepted()
                ),
            )
        }
    };
    println!("{heading}\n");
    println!(
        "{plugins} plugins, one instance each, heartbeating at the interval kplug answered with \
         ({intervals}; {}) ±10 % jitter, over {} gRPC connections; their first \
         heartbeats spread over one interval. {servers} A watch on the plugins stays open for \
         the whole run; kplug is sampled every {} s. {accepted}\n",
        match settings.interval {
            Some(asked) => format!("the plugins asked for {asked:?}"),
            None => "the plugins asked for none, as the SDK by default".to_owned(),
        },
        thousands(settings.connections),
        SAMPLE_EVERY.as_secs(),
    );
}

const WINDOW_COLUMNS: &str = "| Heartbeats | Heartbeats/s | Latency p50 | Latency p99 | Max | kplug CPU per heartbeat | RSS | Other load |";
const FIRST_MINUTE: &str = "first minute (with the registrations)";

fn print_windows(current: &Summary) {
    println!("| Window {WINDOW_COLUMNS}\n|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!("{}", current.first_minute.row(FIRST_MINUTE));
    println!("{}", current.last_minute.row("last minute"));
    println!("{}", current.whole.row("whole run"));
    println!("| last / first | {}", current.last_over_first());
    println!();
}

/// Each window for the baseline, the current build, and the current
/// build's figures over the baseline's.
fn print_windows_compared(before: &Summary, current: &Summary) {
    println!(
        "| Window | Build {WINDOW_COLUMNS}\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (label, before, after) in [
        (FIRST_MINUTE, &before.first_minute, &current.first_minute),
        ("last minute", &before.last_minute, &current.last_minute),
        ("whole run", &before.whole, &current.whole),
    ] {
        println!("{}", before.row(&format!("{label} | baseline")));
        println!("{}", after.row(&format!("{label} | current")));
        println!("| {label} | current / baseline | {} |", after.over(before));
    }
    println!("| last / first | baseline | {}", before.last_over_first());
    println!("| last / first | current | {}", current.last_over_first());
    println!();
}

fn print_samples(samples: &[Sample]) {
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
}

/// The two builds' samples side by side (each build's times count from
/// its own fleet's start; the two started together).
fn print_samples_compared(before: &[Sample], current: &[Sample]) {
    println!(
        "Every {} s, both builds (latencies and CPU over the {} s before; other load as the \
         current build's monitor saw it):\n",
        SAMPLE_EVERY.as_secs(),
        SAMPLE_EVERY.as_secs()
    );
    println!(
        "| At | RSS baseline | RSS current | current / baseline | p99 baseline | p99 current | kplug CPU per heartbeat, baseline | kplug CPU per heartbeat, current | Ready, baseline / current | Expiries, baseline / current | Other load |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (before, after) in before.iter().zip(current) {
        println!(
            "| {} s | {} | {} | {:.2} | {} | {} | {:.1} µs | {:.1} µs | {} / {} | {} / {} | {:.0} % |",
            after.at.as_secs(),
            mib(before.rss_kib),
            mib(after.rss_kib),
            after.rss_kib as f64 / before.rss_kib.max(1) as f64,
            ms(before.latencies().percentile(99.0), 2),
            ms(after.latencies().percentile(99.0), 2),
            before.cpu_per_heartbeat(),
            after.cpu_per_heartbeat(),
            thousands(before.ready as usize),
            thousands(after.ready as usize),
            before.expiries,
            after.expiries,
            after.other.percent(),
        );
    }
    println!();
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
