//! The report of `writes`: what an object costs in writes by kube-apiserver's
//! audit log, with and without a finalizer, and with children.

use std::collections::BTreeSet;
use std::time::Duration;

use kplug_test_support::audit::Writes;
use kplug_test_support::report::{seconds, thousands};

use crate::phases::{Convergence, Results};
use crate::replay::Replays;
use crate::report::{latency_header, latency_row};
use crate::writes::{CHILDREN_PER_OBJECT, WriteResults};
use crate::{IN_FLIGHT, NAMESPACE};

/// The bench's own write: the objects' creates.
const BENCH_CREATE: &str = "create widgets.bench.kplug.io";
/// The operator's reconciles, which kube-apiserver logs (and proxies to
/// kplug) but which store nothing.
const RECONCILE: &str = "create reconciles.plugins.kplug.io";

fn rate(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(f64::EPSILON)
}

/// Writes per object in `writes`, the bench's creates and the reconciles
/// left out.
fn operator_writes(writes: &Writes, objects: usize) -> f64 {
    let total: usize = writes
        .iter()
        .filter(|(request, _)| ![BENCH_CREATE, RECONCILE].contains(&request.as_str()))
        .map(|(_, count)| count)
        .sum();
    total as f64 / objects.max(1) as f64
}

pub fn print(results: &Results, more: &WriteResults) {
    let objects = results.counts.objects;
    let Some(with_finalize) = &results.writes else {
        return;
    };
    println!("### What an object writes (kube-apiserver's audit log)\n");
    println!(
        "Every write answered in `{NAMESPACE}` (the audit policy logs creates, updates, patches and \
         deletes there, at the `Metadata` level), counted from the log over each run of {} \
         objects and divided by {}: objects whose plugin declares `Finalize` (the run above), \
         objects whose plugin declares no Finalize (`hello --without-finalize`), and objects \
         whose plugin (the same, `--greeting-config-maps 3`) asks for {CHILDREN_PER_OBJECT} \
         ConfigMaps each. The bench's own create of each object is the first row, and the \
         operator's reconciles (kube-apiserver logs them as creates, proxied to kplug; nothing is \
         stored) the second; the others are the operator's writes.\n",
        thousands(objects),
        thousands(objects),
    );
    let runs = [with_finalize, &more.lean_writes, &more.parent_writes];
    let requests: BTreeSet<&String> = runs.iter().flat_map(|w| w.keys()).collect();
    println!("| Request | Finalize declared | no Finalize | {CHILDREN_PER_OBJECT} children |");
    println!("|---|---:|---:|---:|");
    let per_object = |writes: &Writes, request: &str| {
        writes.get(request).copied().unwrap_or_default() as f64 / objects.max(1) as f64
    };
    let mut ordered: Vec<&String> = requests.into_iter().collect();
    ordered.sort_by_key(|r| {
        (
            r.as_str() != BENCH_CREATE,
            r.as_str() != RECONCILE,
            r.to_string(),
        )
    });
    for request in ordered {
        let cells: Vec<String> = runs
            .iter()
            .map(|w| format!("{:.2}", per_object(w, request)))
            .collect();
        println!("| `{request}` | {} |", cells.join(" | "));
    }
    let totals: Vec<String> = runs
        .iter()
        .map(|w| format!("**{:.2}**", operator_writes(w, objects)))
        .collect();
    println!(
        "| **the operator's writes per object** | {} |",
        totals.join(" | ")
    );
    println!(
        "\nThe bounds: with Finalize, the finalizer patch, the status apply and the Event (3); \
         without it, the status apply and the Event (2); with children, one apply per child and \
         the status apply ({}), and the Event.\n",
        CHILDREN_PER_OBJECT + 1
    );

    let finalize = &results.convergence;
    println!(
        "| Run, {} objects, {IN_FLIGHT} in flight | Elapsed | Per second | Ratio to the run with Finalize |",
        thousands(objects)
    );
    println!("|---|---:|---:|---:|");
    let run = |what: &str, c: &Convergence| {
        println!(
            "| {what} | {} | {} | {:.2} |",
            seconds(c.elapsed),
            thousands(rate(objects, c.elapsed).round() as usize),
            rate(objects, c.elapsed) / rate(objects, finalize.elapsed),
        );
    };
    run("plugin declares Finalize", finalize);
    run("**plugin declares no Finalize**", &more.lean);
    println!();

    print_children(results, more);
}

fn print_children(results: &Results, more: &WriteResults) {
    let objects = results.counts.objects;
    let children = objects * CHILDREN_PER_OBJECT;
    println!(
        "### Children: {} parents × {CHILDREN_PER_OBJECT} ConfigMaps\n",
        thousands(objects)
    );
    println!(
        "One at a time, {} parents: create one whose plugin asks for {CHILDREN_PER_OBJECT} \
         ConfigMaps and wait until the watch shows it `Ready` (its children applied and \
         existing); then, by hand, `kubectl apply --server-side -f -` of the same {CHILDREN_PER_OBJECT} \
         ConfigMaps in another namespace, timed until kubectl returns (a process started each \
         time, as a person or a script does).\n",
        more.children_ready.len()
    );
    latency_header();
    let row = latency_row;
    row(
        "**create → children Ready, through the operator**",
        &more.children_ready,
    );
    row(
        "`kubectl apply --server-side` of the ConfigMaps",
        &more.kubectl_applies,
    );
    println!(
        "\nRatio of the p50s (operator / kubectl): **{:.2}**.\n",
        more.children_ready.percentile(50.0).as_secs_f64()
            / more
                .kubectl_applies
                .percentile(50.0)
                .as_secs_f64()
                .max(f64::EPSILON)
    );
    // Per parent: its create, one apply per child and the status apply, at
    // the raw rates of this run.
    let bound = results.creates + more.raw_child_applies + results.apply_status_writes;
    println!("| Run, {IN_FLIGHT} in flight | Objects | Elapsed | Rate | Ratio to the bound |");
    println!("|---|---:|---:|---:|---:|");
    let parents = rate(objects, more.parents.elapsed);
    let bound_rate = rate(objects, bound);
    println!(
        "| raw server-side applies of ConfigMaps | {} | {} | {} per second | |",
        thousands(children),
        seconds(more.raw_child_applies),
        thousands(rate(children, more.raw_child_applies).round() as usize),
    );
    for (what, elapsed) in [
        (
            "*bound: per parent its create, 3 ConfigMap applies and 1 status apply at the raw rates*",
            bound,
        ),
        (
            "**parents through the operator: first create → all Ready**",
            more.parents.elapsed,
        ),
    ] {
        let per_second = rate(objects, elapsed);
        println!(
            "| {what} | {} | {} | {} | {:.2} |",
            thousands(objects),
            seconds(elapsed),
            thousands(per_second.round() as usize),
            per_second / bound_rate,
        );
    }
    println!(
        "\nThe operator's rate is {:.2} of the bound's ({} parents/s against {}).\n",
        parents / bound_rate,
        thousands(parents.round() as usize),
        thousands(bound_rate.round() as usize),
    );
}

/// The operator's own requests replayed by the bench (`replay`), against
/// the bound and the operator's run.
pub fn print_replays(results: &Results, replays: &Replays) {
    let objects = results.counts.objects;
    println!("### The operator's requests, replayed without it\n");
    println!(
        "What the bound leaves out. The bench copies what the operator wrote for one object of \
         the latency run (its finalizers, its status apply of {} bytes with its field manager, \
         its Event) and sends the same requests for {} new objects in the operator's order \
         (create, the finalizer's JSON patch, `create reconciles`, the status apply, the Event), \
         {IN_FLIGHT} objects in flight: once with no watch on their namespace, once with two \
         watches open on it, as the operator's run has (the operator's and the bench's). \
         kube-apiserver's CPU per object in each is in the CPU table above.\n",
        replays.status_bytes,
        thousands(objects),
    );
    let bound = rate(objects, results.bound());
    let watched = rate(objects, replays.watched);
    println!(
        "| Run, {} objects, {IN_FLIGHT} in flight | Elapsed | Per second | Ratio to the bound |",
        thousands(objects)
    );
    println!("|---|---:|---:|---:|");
    for (what, elapsed) in [
        (
            "*bound: 4 writes and 1 reconcile at the raw rates*",
            results.bound(),
        ),
        (
            "the operator's requests replayed, no watch",
            replays.unwatched,
        ),
        ("**the same, two watches open**", replays.watched),
        ("**through the operator**", results.convergence.elapsed),
    ] {
        let per_second = rate(objects, elapsed);
        println!(
            "| {what} | {} | {} | {:.2} |",
            seconds(elapsed),
            thousands(per_second.round() as usize),
            per_second / bound,
        );
    }
    println!(
        "\nThe operator converges at {:.2} of the rate of its own requests sent without it, with \
         the same watches open.\n",
        rate(objects, results.convergence.elapsed) / watched,
    );
}
