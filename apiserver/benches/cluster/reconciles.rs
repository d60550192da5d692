//! Reconciles: the kube-apiserver hop, through it versus straight to kplug.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use bytes::Bytes;
use kplug_test_support::AggregatedKplug;
use kplug_test_support::measure::Latencies;
use kplug_test_support::report::{micros, size, thousands};
use serde_json::{Value, json};

use super::clients::Endpoints;
use super::{Counts, OBJECT_BYTES, PHASE_TIMEOUT, RECONCILE_PATH};
use crate::support::ApiClient;

pub(super) struct ReconcileRuns {
    request_bytes: usize,
    via_apiserver: Latencies,
    direct: Latencies,
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
    counts: Counts,
) -> Result<ReconcileRuns> {
    let body = Bytes::from(serde_json::to_vec(&json!({
        "apiVersion": "plugins.kplug.io/v1alpha1",
        "kind": "Reconcile",
        "spec": {"object": object_of_size(OBJECT_BYTES)?},
    }))?);
    let mut routes = [
        env.apiserver_admin().await?,
        env.front_proxy(warm, "admin", "system:masters").await?,
    ];
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
    let mut samples: [Vec<Duration>; 2] = Default::default();
    let deadline = Instant::now() + PHASE_TIMEOUT;
    for round in 0..counts.reconciles {
        ensure!(
            Instant::now() < deadline,
            "reconciles took longer than {PHASE_TIMEOUT:?}"
        );
        // Alternate which route goes first.
        for step in 0..2 {
            let index = (round + step) % 2;
            samples[index].push(reconcile(&mut routes[index], &body).await?);
        }
    }
    let [via_apiserver, direct] = samples.map(Latencies::new);
    Ok(ReconcileRuns {
        request_bytes: body.len(),
        via_apiserver,
        direct,
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

pub(super) fn print_reconciles(runs: &ReconcileRuns, counts: Counts) {
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
}
