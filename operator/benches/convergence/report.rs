//! The report, as Markdown on stdout, and what it says of the operator's log.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use kplug_test_support::bench_mode::BenchMode;
use kplug_test_support::measure::{Latencies, OtherLoad, cpus};
use kplug_test_support::plot::{Corner, Line, Lines, Plots};
use kplug_test_support::report::{Machine, ms, seconds, thousands};

use crate::Counts;
use crate::phases::Results;
use crate::{BASELINE_NAMESPACE, IN_FLIGHT, NAMESPACE, QUIET_SHARE, QUIET_WINDOW, SETTLE, TARGET};

pub struct OperatorLog {
    /// Delegated reconciles it logged ("reconciled" with an operation id).
    reconciled: usize,
    warnings: Vec<String>,
    errors: Vec<String>,
}

impl OperatorLog {
    pub fn read(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let text = without_colours(&text);
        let lines = || text.lines();
        Ok(Self {
            reconciled: lines()
                .filter(|l| l.contains(" reconciled ") && l.contains("operation_id="))
                .count(),
            warnings: lines()
                .filter(|l| l.contains(" WARN "))
                .map(str::to_owned)
                .collect(),
            errors: lines()
                .filter(|l| l.contains(" ERROR "))
                .map(str::to_owned)
                .collect(),
        })
    }
}

/// `text` without ANSI colour sequences (`ESC [ ... m`), which a log
/// written to a terminal-less pipe should not have, but may.
fn without_colours(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("\u{1b}[") {
        plain.push_str(&rest[..start]);
        rest = &rest[start + 2..];
        match rest.find('m') {
            Some(end) => rest = &rest[end + 1..],
            None => rest = "",
        }
    }
    plain.push_str(rest);
    plain
}

fn rate(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(f64::EPSILON)
}

/// The head of a table of latencies, one [`latency_row`] each.
pub fn latency_header() {
    println!("| Measure | Samples | p50 | p90 | max |");
    println!("|---|---:|---:|---:|---:|");
}

pub fn latency_row(what: &str, latencies: &Latencies) {
    println!(
        "| {what} | {} | {} | {} | {} |",
        latencies.len(),
        ms(latencies.percentile(50.0), 1),
        ms(latencies.percentile(90.0), 1),
        ms(latencies.max(), 1),
    );
}

pub struct Report<'a> {
    pub mode: BenchMode,
    pub results: &'a Results,
    pub log: &'a OperatorLog,
    pub processes: &'a [(&'static str, u32)],
    pub load_at_start: &'a str,
    pub binaries: &'a [(&'a str, &'a Path)],
    /// Where it ran: the section's title, what shared the CPUs, the
    /// cluster, and the command.
    pub setting: Setting<'a>,
}

pub struct Setting<'a> {
    pub title: &'a str,
    /// The file name of the convergence curve's picture.
    pub plot: &'a str,
    pub shared_by: &'a str,
    pub cluster: String,
    pub command: &'a str,
}

pub fn print_report(report: &Report<'_>) -> Result<()> {
    let r = report.results;
    let Counts {
        warmup_objects,
        latency_objects,
        objects,
    } = r.counts;
    println!("## {}\n", report.setting.title);
    if let Some(warning) = report.mode.warning() {
        println!("{warning}");
    }
    print_machine(report)?;

    println!("### Apply → Ready, one object at a time\n");
    println!(
        "Create a Widget in `{NAMESPACE}`, then wait until the bench's watch on the namespace \
         shows `Ready=True` for its generation; {latency_objects} objects after {warmup_objects} \
         untimed. Below it, from the same run, one at a time on Widgets in `{BASELINE_NAMESPACE}` \
         (not watched by the operator), the calls the operator makes per object, without the \
         operator ({latency_objects} each): each write's round trip, and the time from its start \
         until a watch on that namespace (the bench's, open only for this) sees the new \
         resourceVersion.\n"
    );
    latency_header();
    let row = latency_row;
    row(
        "**apply → Ready=True, through the operator**",
        &r.apply_to_ready,
    );
    row("create: round trip", &r.create_rtt);
    row("create: until a watch sees it", &r.create_seen);
    row("merge patch of `/status`: round trip", &r.merge_status_rtt);
    row(
        "merge patch of `/status`: until a watch sees it",
        &r.merge_status_seen,
    );
    row(
        "server-side apply of `/status`: round trip",
        &r.apply_status_rtt,
    );
    row(
        "server-side apply of `/status`: until a watch sees it",
        &r.apply_status_seen,
    );
    row(
        "`create reconciles` through kube-apiserver and kplug to the plugin: round trip",
        &r.reconcile_rtt,
    );
    let sequential = r.create_seen.percentile(50.0)
        + r.merge_status_seen.percentile(50.0)
        + r.reconcile_rtt.percentile(50.0)
        + r.apply_status_seen.percentile(50.0);
    println!(
        "| *the operator's path without the operator: create, finalizer patch and status apply each until a watch sees it, plus one reconcile (sum of the p50s)* | | {} | | |\n",
        ms(sequential, 1)
    );

    println!(
        "### {} objects, {IN_FLIGHT} in flight\n",
        thousands(objects)
    );
    println!(
        "The raw rows are the same kube-apiserver without the operator, on {} Widgets in \
         `{BASELINE_NAMESPACE}`: creates, then one merge patch of each one's `/status` \
         (`{{\"status\":{{\"greeting\":\"x\"}}}}`), then one server-side apply of it, then one \
         `create reconciles` for each. The operator row creates {} Widgets in `{NAMESPACE}` with \
         {IN_FLIGHT} in flight and is timed from the first create until the watch has seen all of \
         them `Ready=True` (operator `--concurrency {IN_FLIGHT}`). The ratio is each rate over the \
         raw merge-patch status writes per second.\n",
        thousands(objects),
        thousands(objects),
    );
    let merge_rate = rate(objects, r.merge_status_writes);
    let bound = r.bound();
    println!("| Run | Objects | Elapsed | Per second | Ratio to raw status writes/s |");
    println!("|---|---:|---:|---:|---:|");
    for (what, elapsed) in [
        ("raw creates", r.creates),
        ("raw merge patches of `/status`", r.merge_status_writes),
        (
            "raw server-side applies of `/status`",
            r.apply_status_writes,
        ),
        ("raw `create reconciles`", r.reconciles),
        (
            "*bound: the 4 writes and 1 reconcile of each object at the raw rates above*",
            bound,
        ),
        (
            "**through the operator: first create → all Ready**",
            r.convergence.elapsed,
        ),
    ] {
        let per_second = rate(objects, elapsed);
        println!(
            "| {what} | {} | {} | {} | {:.2} |",
            thousands(objects),
            seconds(elapsed),
            thousands(per_second.round() as usize),
            per_second / merge_rate,
        );
    }
    plot_convergence(report, bound)?;
    println!(
        "\nThe bound row is the sum of the raw times for what each object needs: two creates (the \
         object and its Event), a patch (the finalizer, timed as the merge patch), a server-side \
         apply of `/status` and a reconcile call: the rate if the operator's writes cost what the \
         raw ones do and it added nothing."
    );
    let c = &r.convergence;
    let met = c.elapsed < TARGET;
    println!(
        "\nTarget: {} objects Ready in under {} s: **{}** ({}).\n",
        thousands(objects),
        TARGET.as_secs(),
        if met { "met" } else { "missed" },
        seconds(c.elapsed),
    );
    let at = |fraction: f64| {
        let index = ((fraction * c.ready_after.len() as f64).ceil() as usize)
            .clamp(1, c.ready_after.len().max(1))
            - 1;
        c.ready_after.get(index).copied().unwrap_or_default()
    };
    println!(
        "Timeline after the first create: the last create returned at {}; the first object was \
         Ready at {}, 10 % at {}, 50 % at {}, 90 % at {}, all at {}. Each object's create → Ready: \
         p50 {}, p90 {}, max {}.\n",
        seconds(c.creates_done),
        seconds(c.ready_after.first().copied().unwrap_or_default()),
        seconds(at(0.1)),
        seconds(at(0.5)),
        seconds(at(0.9)),
        seconds(c.elapsed),
        seconds(c.per_object.percentile(50.0)),
        seconds(c.per_object.percentile(90.0)),
        seconds(c.per_object.max()),
    );

    println!(
        "### What the {} objects cost kube-apiserver\n",
        thousands(objects)
    );
    println!(
        "Requests kube-apiserver counted (`apiserver_request_total`, all response codes) from the \
         first create until {} after the last object was Ready, including the bench's own creates \
         and watch. kube-apiserver v1.20 does not count requests it proxies to an aggregated API \
         server, so the operator's `create reconciles` are missing here; the operator's log counts \
         them below.\n",
        seconds(SETTLE)
    );
    println!("| Request | Count | Per object |");
    println!("|---|---:|---:|");
    for (request, count) in &r.requests {
        println!(
            "| `{request}` | {} | {:.2} |",
            thousands(count.round() as usize),
            count / objects as f64
        );
    }
    println!(
        "\nThe operator logged {} delegated reconciles in the whole run ({} objects), {} warnings \
         and {} errors.\n",
        thousands(report.log.reconciled),
        thousands(warmup_objects + latency_objects + objects),
        report.log.warnings.len(),
        report.log.errors.len(),
    );
    for line in report
        .log
        .warnings
        .iter()
        .chain(&report.log.errors)
        .take(10)
    {
        eprintln!("operator: {line}");
    }

    println!("### CPU time per phase\n");
    println!(
        "CPU-seconds from `/proc/PID/stat`; \"others\" is the machine's busy time less all of \
         these, i.e. other processes on the machine. {} CPUs.\n",
        cpus()
    );
    let names: Vec<&str> = report.processes.iter().map(|(name, _)| *name).collect();
    println!(
        "| Phase | Elapsed | {} | bench | others | machine busy | kube-apiserver CPU per object or request |",
        names.join(" | ")
    );
    println!(
        "|---|---:|{}---:|---:|---:|---:|",
        "---:|".repeat(names.len())
    );
    for (phase, items, usage) in &r.phases {
        let total: Duration = usage.processes.iter().sum::<Duration>() + usage.own + usage.others;
        let available = usage.elapsed * cpus();
        let cells: Vec<String> = usage
            .processes
            .iter()
            .map(|cpu| format!("{:.2}", cpu.as_secs_f64()))
            .collect();
        let apiserver = usage.processes.first().copied().unwrap_or_default();
        println!(
            "| {phase} | {} | {} | {:.2} | {:.2} | {:.0} % | {} |",
            seconds(usage.elapsed),
            cells.join(" | "),
            usage.own.as_secs_f64(),
            usage.others.as_secs_f64(),
            100.0 * total.as_secs_f64() / available.as_secs_f64().max(f64::EPSILON),
            ms(
                apiserver / u32::try_from((*items).max(1)).unwrap_or(u32::MAX),
                1
            ),
        );
    }
    println!();
    Ok(())
}

fn print_machine(report: &Report<'_>) -> Result<()> {
    let others: OtherLoad = report
        .results
        .phases
        .iter()
        .map(|(_, _, usage)| usage.other_load())
        .sum();
    let waits: Vec<String> = report
        .results
        .quiet_waits
        .iter()
        .map(|w| seconds(*w))
        .collect();
    Machine {
        heading: "### Machine",
        shared_by: report.setting.shared_by,
        memory: false,
        notes: &[
            format!("Load average before the run: {}", report.load_at_start),
            format!(
                "Before the latency run and the operator run, the bench waited {} for \
                 kube-apiserver to use under {:.0} % of a CPU for {}",
                waits.join(" and "),
                QUIET_SHARE * 100.0,
                seconds(QUIET_WINDOW),
            ),
        ],
        others: (others, "the measured phases"),
        details: std::slice::from_ref(&report.setting.cluster),
        binaries: report.binaries,
        binary_note: "",
        command: report.setting.command,
    }
    .print()
}

/// Objects Ready over time through the operator, beside the straight lines
/// of the raw status-write rate and of the bound, from the same run.
fn plot_convergence(report: &Report<'_>, bound: Duration) -> Result<()> {
    let r = report.results;
    let objects = r.counts.objects as f64;
    let mut ready = vec![(0.0, 0.0)];
    ready.extend(
        r.convergence
            .ready_after
            .iter()
            .enumerate()
            .map(|(i, after)| (after.as_secs_f64(), (i + 1) as f64)),
    );
    let straight = |label: &str, elapsed: Duration| Line {
        label: label.to_owned(),
        points: vec![(0.0, 0.0), (elapsed.as_secs_f64(), objects)],
    };
    let path = Plots::new(report.mode)?.lines(
        report.setting.plot,
        &Lines {
            title: format!(
                "{} objects through the operator, {IN_FLIGHT} in flight",
                thousands(r.counts.objects)
            ),
            x: "seconds from the first create".to_owned(),
            y: "objects Ready".to_owned(),
            lines: vec![
                Line {
                    label: "through the operator".to_owned(),
                    points: ready,
                },
                straight(
                    "raw status writes, same kube-apiserver",
                    r.merge_status_writes,
                ),
                straight("bound: 4 writes and 1 reconcile per object", bound),
            ],
            legend: Corner::UpperLeft,
        },
    )?;
    println!("\nPlot: `{path}`");
    Ok(())
}
