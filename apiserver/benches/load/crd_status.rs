//! The way kplug replaces, measured beside it in the same run: each
//! heartbeat written as the status of a custom resource, through a real
//! kube-apiserver and etcd (`hack/control-plane.sh`), as a Plugin CRD and
//! its controller would (seed 003). `OBJECTS` objects of a CRD with a
//! status subresource, and `WRITERS` concurrent merge patches of
//! `status.lastHeartbeatTime`, the write a heartbeat would be.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use kplug_test_support::measure::{Latencies, process_cpu_time};
use kplug_test_support::{ControlPlane, kube_client, widget_crd};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::runtime::Runtime;
use tokio::task::JoinSet;

use crate::PHASE_TIMEOUT;
use crate::support::join_all;

/// The CRD's group: Widgets with a status subresource.
const GROUP: &str = "heartbeats.bench.kplug.io";
const NAMESPACE: &str = "default";
/// Objects, one per plugin, as the Plugin CRD way keeps them.
pub const OBJECTS: usize = 1_000;
/// Status writes in flight at once.
pub const WRITERS: usize = 64;
/// Status writes timed. Fewer than kplug's unchanged heartbeats: at about
/// two thousand writes a second the same count would take minutes, and
/// rates are what is compared.
pub const WRITES: usize = 20_000;

/// What the status writes measured.
pub struct CrdStatusRun {
    pub writes: usize,
    pub elapsed: Duration,
    pub latencies: Latencies,
    /// kube-apiserver's and etcd's CPU time over the timed writes.
    pub server_cpu: Duration,
}

impl CrdStatusRun {
    pub fn per_second(&self) -> f64 {
        self.writes as f64 / self.elapsed.as_secs_f64()
    }
}

/// Starts a control plane in `work`, creates the objects, and times
/// `writes` status writes (after one warm-up write per object).
pub fn run(runtime: &Runtime, work: &Path, writes: usize) -> Result<CrdStatusRun> {
    eprintln!("starting a control plane for the CRD-status baseline");
    let cluster = ControlPlane::start(work.join("control-plane"));
    cluster.apply(&widget_crd(GROUP));
    cluster
        .kubectl_check(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            &format!("crd/widgets.{GROUP}"),
        ])
        .map_err(anyhow::Error::msg)?;
    let pids = ["KPLUG_APISERVER_PID", "KPLUG_ETCD_PID"].map(|name| cluster.var(name));
    let pids: Vec<u32> = pids
        .iter()
        .map(|pid| pid.parse().with_context(|| format!("pid {pid:?}")))
        .collect::<Result<_>>()?;
    let server_cpu = || -> Result<Duration> { pids.iter().map(|pid| process_cpu_time(*pid)).sum() };
    runtime.block_on(async {
        let client = kube_client(&cluster.kubeconfig(), None).await;
        let resource = ApiResource {
            group: GROUP.to_owned(),
            version: "v1".to_owned(),
            api_version: format!("{GROUP}/v1"),
            kind: "Widget".to_owned(),
            plural: "widgets".to_owned(),
        };
        let api = Api::<DynamicObject>::namespaced_with(client, NAMESPACE, &resource);
        eprintln!("creating {OBJECTS} objects");
        create(&api, &resource).await?;
        eprintln!("{OBJECTS} warm-up status writes, then {writes} timed");
        write_statuses(&api, OBJECTS).await?;
        let cpu_before = server_cpu()?;
        let started = Instant::now();
        let latencies = write_statuses(&api, writes).await?;
        let elapsed = started.elapsed();
        Ok(CrdStatusRun {
            writes,
            elapsed,
            latencies,
            server_cpu: server_cpu()? - cpu_before,
        })
    })
}

fn name(index: usize) -> String {
    format!("plugin-{index:05}")
}

async fn create(api: &Api<DynamicObject>, resource: &ApiResource) -> Result<()> {
    let post = PostParams::default();
    futures::stream::iter(0..OBJECTS)
        .map(|index| {
            let object = DynamicObject::new(&name(index), resource).data(json!({"spec": {}}));
            let post = &post;
            async move {
                api.create(post, &object)
                    .await
                    .with_context(|| format!("creating {}", name(index)))
            }
        })
        .buffer_unordered(WRITERS)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// `total` merge patches of `status.lastHeartbeatTime`, object after
/// object, `WRITERS` at once; returns their latencies.
async fn write_statuses(api: &Api<DynamicObject>, total: usize) -> Result<Latencies> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut writers = JoinSet::new();
    for _ in 0..WRITERS {
        let (api, next) = (api.clone(), next.clone());
        writers.spawn(async move {
            let params = PatchParams::default();
            let mut latencies = Vec::new();
            loop {
                let number = next.fetch_add(1, Ordering::Relaxed);
                if number >= total {
                    return Ok::<_, anyhow::Error>(latencies);
                }
                let now = jiff::Timestamp::now().to_string();
                let patch = json!({"status": {"lastHeartbeatTime": now}});
                let sent = Instant::now();
                api.patch_status(&name(number % OBJECTS), &params, &Patch::Merge(&patch))
                    .await
                    .with_context(|| format!("status write {number}"))?;
                latencies.push(sent.elapsed());
            }
        });
    }
    let done = tokio::time::timeout(PHASE_TIMEOUT, join_all(writers))
        .await
        .with_context(|| {
            format!("{total} status writes did not finish within {PHASE_TIMEOUT:?}")
        })??;
    Ok(Latencies::new(done.into_iter().flatten().collect()))
}
