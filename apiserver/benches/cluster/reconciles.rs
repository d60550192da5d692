//! Reconciles: the kube-apiserver hop, through it versus straight to kplug;
//! and the object checks, as a caller kplug checks, before and after.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use kplug_test_support::AggregatedKplug;
use kplug_test_support::measure::Latencies;
use kplug_test_support::report::{micros, size, thousands};
use serde_json::{Value, json};

use super::clients::Endpoints;
use super::{Counts, OBJECT_BYTES, OPERATOR, PHASE_TIMEOUT, RECONCILE_PATH};
use crate::support::ApiClient;

pub(super) struct ReconcileRuns {
    request_bytes: usize,
    via_apiserver: Latencies,
    direct: Latencies,
    /// Straight to kplug as [`OPERATOR`], whose rights kplug checks.
    checked: Latencies,
    /// The same, to the baseline build, when one runs.
    checked_before: Option<Latencies>,
}

/// A Greeting whose compact JSON is exactly `bytes` long.
pub(super) fn object_of_size(bytes: usize) -> Result<Value> {
    let mut object = json!({
        "apiVersion": "example.com/v1",
        "kind": "Greeting",
        "metadata": {
            "name": "ada",
            "namespace": "default",
            "uid": "6f1c2a3e-8d4b-4f7a-9c1e-2b3d4e5f6a7b",
            "resourceVersion": "184467",
            "generation": 3,
            "labels": {"app.kubernetes.io/name": "greeter"},
        },
        "spec": {"greeting": "hello", "replicas": 3, "padding": ""},
    });
    let length = serde_json::to_vec(&object)?.len();
    ensure!(length <= bytes, "the bare object is over {bytes} bytes");
    object["spec"]["padding"] = Value::String("p".repeat(bytes - length));
    ensure!(serde_json::to_vec(&object)?.len() == bytes);
    Ok(object)
}

pub(super) async fn reconcile_runs(
    env: &Endpoints,
    warm: &AggregatedKplug,
    before: Option<&AggregatedKplug>,
    counts: Counts,
) -> Result<ReconcileRuns> {
    let body = Bytes::from(serde_json::to_vec(&json!({
        "apiVersion": "plugins.kplug.io/v1alpha1",
        "kind": "Reconcile",
        "spec": {"object": object_of_size(OBJECT_BYTES)?},
    }))?);
    let mut routes = vec![
        env.apiserver_admin().await?,
        env.front_proxy(warm, "admin", "system:masters").await?,
        env.front_proxy(warm, OPERATOR, "system:authenticated")
            .await?,
    ];
    if let Some(before) = before {
        routes.push(
            env.front_proxy(before, OPERATOR, "system:authenticated")
                .await?,
        );
    }
    for route in &mut routes {
        let (status, answer) = route.post_json(RECONCILE_PATH, body.clone()).await?;
        ensure!(
            status.is_success(),
            "reconcile: {status}: {}",
            String::from_utf8_lossy(&answer)
        );
        let answer: Value = serde_json::from_slice(&answer)?;
        ensure!(
            answer["status"]["objectStatus"]["greeting"] == "hello, ada",
            "unexpected reconcile answer {answer}"
        );
        for _ in 0..counts.reconcile_warmup {
            reconcile(route, &body).await?;
        }
    }
    eprintln!("{} reconciles per route, alternating", counts.reconciles);
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); routes.len()];
    let deadline = Instant::now() + PHASE_TIMEOUT;
    for round in 0..counts.reconciles {
        ensure!(
            Instant::now() < deadline,
            "reconciles took longer than {PHASE_TIMEOUT:?}"
        );
        // Rotate which route goes first.
        for step in 0..routes.len() {
            let index = (round + step) % routes.len();
            samples[index].push(reconcile(&mut routes[index], &body).await?);
        }
    }
    let mut latencies = samples.into_iter().map(Latencies::new);
    let mut next = || latencies.next().context("a route without samples");
    Ok(ReconcileRuns {
        request_bytes: body.len(),
        via_apiserver: next()?,
        direct: next()?,
        checked: next()?,
        checked_before: before.map(|_| next()).transpose()?,
    })
}

async fn reconcile(route: &mut ApiClient, body: &Bytes) -> Result<Duration> {
    let started = Instant::now();
    let (status, answer) = route.post_json(RECONCILE_PATH, body.clone()).await?;
    let elapsed = started.elapsed();
    ensure!(
        status.is_success(),
        "reconcile: {status}: {}",
        String::from_utf8_lossy(&answer)
    );
    Ok(elapsed)
}

pub(super) fn print_reconciles(runs: &ReconcileRuns, counts: Counts, baseline: Option<&str>) {
    println!("## Reconcile: through kube-apiserver versus straight to kplug\n");
    println!(
        "`POST {RECONCILE_PATH}` with a {} Reconcile (a {OBJECT_BYTES}-byte object), one at a time, \
         {} per route alternating, after {} untimed; kplug calls the hello-plugin \
         over gRPC. Through kube-apiserver: the admin client certificate, proxied by the aggregator. \
         Straight: the front-proxy certificate as `admin` in `system:masters` (no SubjectAccessReview \
         on either route).\n",
        size(runs.request_bytes),
        thousands(counts.reconciles),
        counts.reconcile_warmup,
    );
    println!("| Route | Reconciles | p50 | p90 | p99 |");
    println!("|---|---:|---:|---:|---:|");
    for (label, latencies) in [
        ("through kube-apiserver", &runs.via_apiserver),
        ("straight to kplug", &runs.direct),
    ] {
        println!(
            "| {label} | {} | {} | {} | {} |",
            thousands(latencies.len()),
            micros(latencies.percentile(50.0)),
            micros(latencies.percentile(90.0)),
            micros(latencies.percentile(99.0)),
        );
    }
    let added = |p: f64| {
        let (via, direct) = (runs.via_apiserver.percentile(p), runs.direct.percentile(p));
        if via >= direct {
            format!("+{}", micros(via - direct))
        } else {
            format!("−{}", micros(direct - via))
        }
    };
    println!(
        "| *added by the hop* | | {} | {} | {} |\n",
        added(50.0),
        added(90.0),
        added(99.0)
    );
    print_object_checks(runs, baseline);
}

/// The object checks: the same reconciles as a caller kplug checks, and
/// the build before them when it ran.
fn print_object_checks(runs: &ReconcileRuns, baseline: Option<&str>) {
    println!("## Reconcile: the object checks, cache warm\n");
    println!(
        "The same reconciles, straight to kplug, in the same rounds as `{OPERATOR}` (front-proxy \
         headers, group `system:authenticated`), bound to `kplug:operator` and `update \
         greetings/status` (the Greeting CRD is installed): kplug checks the URL and the object \
         with SubjectAccessReviews, cached (10 s), so after the untimed warm-up every check is a \
         cache hit. `admin` (system:masters) is checked for nothing.\n"
    );
    println!("| Route | p50 | p90 | p99 |");
    println!("|---|---:|---:|---:|");
    let row = |label: &str, latencies: &Latencies| {
        println!(
            "| {label} | {} | {} | {} |",
            micros(latencies.percentile(50.0)),
            micros(latencies.percentile(90.0)),
            micros(latencies.percentile(99.0)),
        );
    };
    row(&format!("as {OPERATOR} (checked)"), &runs.checked);
    if let (Some(before), Some(rev)) = (&runs.checked_before, baseline) {
        row(&format!("as {OPERATOR}, kplug at `{rev}`"), before);
    }
    row("as admin (nothing checked)", &runs.direct);
    println!();
    let ratio = |after: &Latencies, before: &Latencies, p: f64| {
        after.percentile(p).as_secs_f64() / before.percentile(p).as_secs_f64()
    };
    if let (Some(before), Some(rev)) = (&runs.checked_before, baseline) {
        println!(
            "**As {OPERATOR}, this build / kplug at `{rev}`: p50 {:.3}, p99 {:.3}** (the cost of \
             the object checks, and of anything else that changed since).\n",
            ratio(&runs.checked, before, 50.0),
            ratio(&runs.checked, before, 99.0),
        );
    }
    println!(
        "As {OPERATOR} / as admin, this build: p50 {:.3} (every check, URL and object, from the \
         cache).\n",
        ratio(&runs.checked, &runs.direct, 50.0),
    );
}
