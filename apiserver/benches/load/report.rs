//! The Markdown report for BENCHMARKS.md: one row per build, and with a
//! baseline build, the current build's figures as ratios to it.

use std::time::Duration;

use anyhow::Result;
use kplug_test_support::plot::Plots;
use kplug_test_support::report::{mib, ms, size, thousands, verdict};

use crate::Build;
use crate::crd_status::{CrdStatusRun, OBJECTS, WRITERS};
use crate::heartbeats::{CHANNELS, HeartbeatRun, IN_FLIGHT_PER_CHANNEL, Kind, ROUNDS};
use crate::lists::{LIST_REQUESTS, LIST_ROUNDS, LIST_WARMUP, ListRun, MemoryPoint, PLUGINS_PATH};

/// Targets the report checks against (issue 10: lists from cached bytes).
const TARGET_HEARTBEATS_PER_SECOND: f64 = 10_000.0;
const TARGET_LIST_P50: Duration = Duration::from_millis(10);
const TARGET_RSS_KIB: u64 = 50 * 1024;
/// kplug's heartbeats against the same heartbeats written as CRD status
/// (issue 29): unchanged ones, and first registrations.
const TARGET_UNCHANGED_RATIO: f64 = 50.0;
const TARGET_FIRST_RATIO: f64 = 40.0;
/// Heartbeat throughput must not fall below the baseline's; runs of the
/// same build differ by a few percent, so this much below still counts as
/// level.
const BASELINE_TOLERANCE: f64 = 1.05;

/// The baseline's label when one ran (it is the last build).
fn baseline(builds: &[Build]) -> Option<&str> {
    builds.get(1).map(|b| b.label.as_str())
}

pub fn print_heartbeats(builds: &[Build], runs: &[HeartbeatRun]) {
    println!(
        "## Heartbeats\n\n{CHANNELS} gRPC connections × {IN_FLIGHT_PER_CHANNEL} heartbeats in \
         flight, in {ROUNDS} runs per build (alternating which build goes first); target ≥ {} \
         accepted/s{}.\n",
        thousands(TARGET_HEARTBEATS_PER_SECOND as usize),
        match baseline(builds) {
            Some(rev) => format!(
                " and, against `{rev}`, a throughput ratio ≥ {:.2}",
                1.0 / BASELINE_TOLERANCE
            ),
            None => String::new(),
        }
    );
    println!(
        "| Variant | Build | Heartbeats | Elapsed | Accepted/s | Latency p50 | Latency p99 | Server CPU per heartbeat | Server CPU / client CPU | Target |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for run in runs {
        let per_heartbeat = run.server_cpu.as_secs_f64() * 1e6 / run.accepted.max(1) as f64;
        println!(
            "| {} | {} | {} | {:.2} s | {} | {} | {} | {per_heartbeat:.1} µs | {:.1} s / {:.1} s | {} |",
            run.variant(),
            builds[run.build].label,
            thousands(run.accepted),
            run.elapsed.as_secs_f64(),
            thousands(run.per_second() as usize),
            ms(run.latencies.percentile(50.0), 2),
            ms(run.latencies.percentile(99.0), 2),
            run.server_cpu.as_secs_f64(),
            run.client_cpu.as_secs_f64(),
            verdict(run.per_second() >= TARGET_HEARTBEATS_PER_SECOND),
        );
    }
    println!();
    if let Some(rev) = baseline(builds) {
        println!("| Variant | Accepted/s, current / `{rev}` | Target |");
        println!("|---|---:|---|");
        for run in runs.iter().filter(|r| r.build == 0) {
            let Some(before) = runs
                .iter()
                .find(|r| r.build == 1 && r.kind == run.kind && r.way == run.way)
            else {
                continue;
            };
            let ratio = run.per_second() / before.per_second();
            println!(
                "| {} | {ratio:.2} | {} |",
                run.variant(),
                verdict(ratio >= 1.0 / BASELINE_TOLERANCE)
            );
        }
        println!();
    }
}

pub fn print_lists(builds: &[Build], runs: &[ListRun]) {
    println!(
        "## Listing plugins\n\n`GET {PLUGINS_PATH}` over one reused HTTP/2 TLS connection per \
         build with the admin client certificate; {LIST_WARMUP} warm-up requests, then \
         {LIST_REQUESTS} timed (until the whole body is read) in {LIST_ROUNDS} rounds that \
         alternate between the builds; target p50 < {} at 10,000 plugins.\n",
        ms(TARGET_LIST_P50, 2)
    );
    let rev = baseline(builds);
    match rev {
        Some(rev) => {
            println!(
                "| Plugins | Representation | p50 | p99 | Max | Response size | p50 `{rev}` | p99 `{rev}` | p50 current / `{rev}` | Target |"
            );
            println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|");
        }
        None => {
            println!("| Plugins | Representation | p50 | p99 | Max | Response size | Target |");
            println!("|---:|---|---:|---:|---:|---:|---|");
        }
    }
    for run in runs.iter().filter(|r| r.build == 0) {
        let p50 = run.latencies.percentile(50.0);
        let target = if run.plugins == 10_000 {
            verdict(p50 < TARGET_LIST_P50)
        } else {
            "–"
        };
        let before = runs
            .iter()
            .find(|r| r.build == 1 && r.plugins == run.plugins && r.variant == run.variant);
        let compared = match before {
            Some(before) => {
                let before_p50 = before.latencies.percentile(50.0);
                format!(
                    " {} | {} | {:.2} |",
                    ms(before_p50, 2),
                    ms(before.latencies.percentile(99.0), 2),
                    p50.as_secs_f64() / before_p50.as_secs_f64(),
                )
            }
            None => String::new(),
        };
        println!(
            "| {} | {} | {} | {} | {} | {} |{compared} {target} |",
            thousands(run.plugins),
            run.variant,
            ms(p50, 2),
            ms(run.latencies.percentile(99.0), 2),
            ms(run.latencies.percentile(100.0), 2),
            size(run.bytes),
        );
    }
    println!();
}

pub fn print_memory(builds: &[Build], points: &[MemoryPoint]) {
    println!(
        "## Server memory\n\nResident set size (`VmRSS` in `/proc/PID/status`); target < {} at \
         10,000 plugins after the list runs.\n",
        mib(TARGET_RSS_KIB)
    );
    let rev = baseline(builds);
    match rev {
        Some(rev) => {
            println!("| State | RSS | RSS `{rev}` | Target |");
            println!("|---|---:|---:|---|");
        }
        None => {
            println!("| State | RSS | Target |");
            println!("|---|---:|---|");
        }
    }
    for point in points {
        let current = point.rss_kib.first().copied().unwrap_or_default();
        let target = if point.state.starts_with("10,000 plugins, after") {
            verdict(current < TARGET_RSS_KIB)
        } else {
            "–"
        };
        let before = match point.rss_kib.get(1) {
            Some(kib) => format!(" {} |", mib(*kib)),
            None => String::new(),
        };
        println!("| {} | {} |{before} {target} |", point.state, mib(current));
    }
    println!();
}

/// The current build's heartbeats beside the CRD-status way, from the same
/// run.
pub fn print_against_crd_status(runs: &[HeartbeatRun], crd: &CrdStatusRun) {
    let per_write = crd.server_cpu.as_secs_f64() * 1e6 / crd.writes.max(1) as f64;
    println!(
        "## Heartbeats against the CRD-status way\n\nThe same heartbeats written as the status of \
         a custom resource, in this run: {} objects of a CRD with a status subresource on \
         `hack/control-plane.sh`'s kube-apiserver and etcd, {WRITERS} merge patches of \
         `status.lastHeartbeatTime` in flight, {} timed after one warm-up write per object: \
         {} writes/s, p50 {}, p99 {}, kube-apiserver and etcd CPU {per_write:.1} µs per write.\n",
        thousands(OBJECTS),
        thousands(crd.writes),
        thousands(crd.per_second() as usize),
        ms(crd.latencies.percentile(50.0), 2),
        ms(crd.latencies.percentile(99.0), 2),
    );
    println!("| kplug (current build) | Accepted/s | CRD status writes/s | Ratio | Target |");
    println!("|---|---:|---:|---:|---|");
    for run in runs.iter().filter(|r| r.build == 0) {
        let target = match run.kind {
            Kind::Unchanged => TARGET_UNCHANGED_RATIO,
            Kind::First => TARGET_FIRST_RATIO,
        };
        let ratio = run.per_second() / crd.per_second();
        println!(
            "| {} | {} | {} | {ratio:.1} | ≥ {target:.0}: {} |",
            run.variant(),
            thousands(run.per_second() as usize),
            thousands(crd.per_second() as usize),
            verdict(ratio >= target),
        );
    }
    println!();
}

/// The table above as bars: the current build's heartbeats per second and
/// the CRD status writes per second of the same run.
pub fn plot_against_crd_status(
    plots: &Plots,
    runs: &[HeartbeatRun],
    crd: &CrdStatusRun,
) -> Result<()> {
    let mut bars: Vec<(String, f64)> = runs
        .iter()
        .filter(|r| r.build == 0)
        .map(|run| {
            (
                format!("kplug, {}", short_variant(&run.variant())),
                run.per_second(),
            )
        })
        .collect();
    bars.push(("CRD status writes".to_owned(), crd.per_second()));
    let path = plots.bars(
        "heartbeats-against-crd-status",
        "Heartbeats per second against the CRD-status way",
        "per second",
        &bars,
    )?;
    println!("Plot: `{path}`\n");
    Ok(())
}

/// "unchanged (10,000 live plugins), on streams" → "unchanged, on streams".
fn short_variant(variant: &str) -> String {
    match (variant.split_once(" ("), variant.rsplit_once("), ")) {
        (Some((kind, _)), Some((_, way))) => format!("{kind}, {way}"),
        _ => variant.to_owned(),
    }
}
