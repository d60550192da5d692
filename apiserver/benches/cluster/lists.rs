//! Lists: the SubjectAccessReview cache, warm versus cold.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kplug_test_support::AggregatedKplug;
use kplug_test_support::measure::{Latencies, process_cpu_time};
use kplug_test_support::report::{micros, size, thousands};
use serde_json::Value;
use tokio::task::JoinSet;

use super::clients::{Endpoints, wait_for};
use super::{CLUSTER_TIMEOUT, Counts, IN_FLIGHT, PHASE_TIMEOUT, PLUGIN, PLUGINS_PATH, READER};
use crate::support::{ApiClient, join_all};

pub(super) struct ListRun {
    label: &'static str,
    requests: usize,
    elapsed: Duration,
    latencies: Latencies,
    kplug_cpu: Duration,
    apiserver_cpu: Duration,
    /// SubjectAccessReviews kube-apiserver answered during the timed runs.
    reviews: f64,
    bytes: usize,
}

impl ListRun {
    fn per_second(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }
}

pub(super) async fn list_runs(
    env: &Endpoints,
    warm: &AggregatedKplug,
    cold: &AggregatedKplug,
    apiserver_pid: u32,
    counts: Counts,
) -> Result<Vec<ListRun>> {
    let servers = [
        (
            "warm (TTLs 10 s)",
            warm,
            env.front_proxy(warm, READER, "system:authenticated")
                .await?,
        ),
        (
            "cold (TTLs 0 s)",
            cold,
            env.front_proxy(cold, READER, "system:authenticated")
                .await?,
        ),
    ];
    let mut bytes = Vec::new();
    for (label, _, client) in &servers {
        let mut client = client.clone();
        wait_for(
            &format!("{READER} listing {PLUGIN} on kplug {label}"),
            CLUSTER_TIMEOUT,
            || {
                let mut client = client.clone();
                async move {
                    let body = client.get(PLUGINS_PATH, "application/json").await?;
                    let list: Value = serde_json::from_slice(&body)?;
                    let items = list["items"].as_array().context("no items")?;
                    ensure!(
                        items.len() == 1 && items[0]["metadata"]["name"] == PLUGIN,
                        "listed {} plugins",
                        items.len()
                    );
                    Ok(())
                }
            },
        )
        .await?;
        bytes.push(client.get(PLUGINS_PATH, "application/json").await?.len());
        eprintln!("warming up kplug {label}");
        list_load(&client, counts.list_warmup).await?;
    }

    let mut metrics = env.apiserver_admin().await?;
    let mut reviews = [0.0; 2];
    let mut samples: [Vec<Duration>; 2] = Default::default();
    let mut elapsed = [Duration::ZERO; 2];
    let mut kplug_cpu = [Duration::ZERO; 2];
    let mut apiserver_cpu = [Duration::ZERO; 2];
    for round in 0..counts.list_rounds {
        for (index, (label, kplug, client)) in servers.iter().enumerate() {
            eprintln!(
                "round {}: {} lists on kplug {label}",
                round + 1,
                counts.lists_per_round,
            );
            let reviews_before = subject_access_reviews(&mut metrics).await?;
            let (kplug_before, apiserver_before) = (
                process_cpu_time(kplug.pid())?,
                process_cpu_time(apiserver_pid)?,
            );
            let started = Instant::now();
            let run = list_load(client, counts.lists_per_round).await?;
            elapsed[index] += started.elapsed();
            kplug_cpu[index] += process_cpu_time(kplug.pid())? - kplug_before;
            apiserver_cpu[index] += process_cpu_time(apiserver_pid)? - apiserver_before;
            reviews[index] += subject_access_reviews(&mut metrics).await? - reviews_before;
            samples[index].extend(run);
        }
    }
    Ok(servers
        .iter()
        .enumerate()
        .map(|(index, (label, _, _))| ListRun {
            label,
            requests: samples[index].len(),
            elapsed: elapsed[index],
            latencies: Latencies::new(std::mem::take(&mut samples[index])),
            kplug_cpu: kplug_cpu[index],
            apiserver_cpu: apiserver_cpu[index],
            reviews: reviews[index],
            bytes: bytes[index],
        })
        .collect())
}

/// SubjectAccessReviews kube-apiserver has answered so far, from its
/// `apiserver_request_total` metric.
async fn subject_access_reviews(metrics: &mut ApiClient) -> Result<f64> {
    let body = metrics.get("/metrics", "text/plain").await?;
    Ok(String::from_utf8_lossy(&body)
        .lines()
        .filter(|line| {
            line.starts_with("apiserver_request_total{")
                && line.contains("resource=\"subjectaccessreviews\"")
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum())
}

/// `total` lists with `IN_FLIGHT` in flight on the client's connection.
async fn list_load(client: &ApiClient, total: usize) -> Result<Vec<Duration>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let mut client = client.clone();
        let next = Arc::clone(&next);
        tasks.spawn(async move {
            let mut samples = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < total {
                let started = Instant::now();
                client.get(PLUGINS_PATH, "application/json").await?;
                samples.push(started.elapsed());
            }
            Ok(samples)
        });
    }
    let samples = tokio::time::timeout(PHASE_TIMEOUT, join_all(tasks))
        .await
        .with_context(|| format!("{total} lists took longer than {PHASE_TIMEOUT:?}"))??;
    Ok(samples.concat())
}

pub(super) fn print_lists(runs: &[ListRun], counts: Counts) {
    println!("## Authorized lists: SubjectAccessReview cache warm versus cold\n");
    println!(
        "`GET {PLUGINS_PATH}` (1 plugin registered, the real hello-plugin; a {} JSON body) straight \
         to kplug over one HTTP/2 TLS connection with the front-proxy client certificate, as \
         `X-Remote-User: {READER}` (bound to `kplug:reader`), `X-Remote-Group: system:authenticated`, \
         {IN_FLIGHT} requests in flight; {} rounds of {} lists per kplug, alternating, \
         after {} untimed. Cold: every request is one SubjectAccessReview to kube-apiserver.\n",
        size(runs.first().map_or(0, |run| run.bytes)),
        counts.list_rounds,
        thousands(counts.lists_per_round),
        thousands(counts.list_warmup),
    );
    println!(
        "| kplug auth caches | Lists | Lists/s | p50 | p99 | SubjectAccessReviews | kplug CPU per list | kube-apiserver CPU per list |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for run in runs {
        let per = |cpu: Duration| micros(cpu / u32::try_from(run.requests.max(1)).unwrap_or(1));
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            run.label,
            thousands(run.requests),
            thousands(run.per_second().round() as usize),
            micros(run.latencies.percentile(50.0)),
            micros(run.latencies.percentile(99.0)),
            thousands(run.reviews.round() as usize),
            per(run.kplug_cpu),
            per(run.apiserver_cpu),
        );
    }
    if let [warm, cold] = runs {
        println!(
            "\nWarm serves {:.1}× the lists per second of cold; cold's p50 is {:.1}× warm's.",
            warm.per_second() / cold.per_second().max(f64::EPSILON),
            cold.latencies.percentile(50.0).as_secs_f64()
                / warm
                    .latencies
                    .percentile(50.0)
                    .as_secs_f64()
                    .max(f64::EPSILON),
        );
    }
    println!();
}
