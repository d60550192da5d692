//! What an object costs in writes, from kube-apiserver's audit log, in the
//! same run as `phases`: objects whose plugin declares no Finalize (no
//! finalizer), and parents whose plugin asks for three ConfigMaps each
//! (children), with the raw rate of the same applies and, one at a time,
//! apply → children Ready against `kubectl apply --server-side` of the
//! same ConfigMaps.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kplug_test_support::KUBECTL;
use kplug_test_support::audit::{AuditLog, Writes};
use kplug_test_support::measure::{CpuSnapshot, CpuUsage, Latencies};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::phases::{Convergence, converge, in_flight, quiet};
use crate::watch::{admin_client, call, wait_ready, watch, widget, widget_resource};
use crate::{BASELINE_NAMESPACE, CHILDREN, Counts, LEAN, NAMESPACE, SETTLE};

/// The ConfigMaps the children plugin asks for, per object.
pub const CHILDREN_PER_OBJECT: usize = 3;

pub struct WriteResults {
    /// Objects whose plugin declares no Finalize.
    pub lean: Convergence,
    pub lean_writes: Writes,
    /// Objects whose plugin asks for [`CHILDREN_PER_OBJECT`] ConfigMaps.
    pub parents: Convergence,
    pub parent_writes: Writes,
    /// The same ConfigMaps server-side applied straight, `IN_FLIGHT` in
    /// flight, in the baseline namespace.
    pub raw_child_applies: Duration,
    /// One at a time: create a parent → Ready (its children applied).
    pub children_ready: Latencies,
    /// One at a time: `kubectl apply --server-side` of the same ConfigMaps.
    pub kubectl_applies: Latencies,
    pub phases: Vec<(&'static str, usize, CpuUsage)>,
}

/// The greeting ConfigMaps of the object `name`, as the children plugin
/// asks for them, in `namespace`.
fn greeting_config_maps(name: &str, namespace: &str) -> Vec<serde_json::Value> {
    (0..CHILDREN_PER_OBJECT)
        .map(|i| {
            json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": format!("{name}-greeting-{i}"), "namespace": namespace},
                "data": {"greeting": format!("hello, {name}")},
            })
        })
        .collect()
}

/// `kubectl apply --server-side` of `objects`, timed until it returns.
fn kubectl_apply(kubeconfig: &Path, objects: &[serde_json::Value]) -> Result<Duration> {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    let started = Instant::now();
    let mut kubectl = Command::new(KUBECTL)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["apply", "--server-side", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting kubectl")?;
    kubectl
        .stdin
        .take()
        .context("kubectl's stdin")?
        .write_all(list.to_string().as_bytes())?;
    let output = kubectl.wait_with_output()?;
    ensure!(
        output.status.success(),
        "kubectl apply --server-side: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(started.elapsed())
}

pub async fn measure(
    kubeconfig: &Path,
    processes: &[(&'static str, u32)],
    counts: Counts,
    audit: &AuditLog,
) -> Result<WriteResults> {
    let client = admin_client(kubeconfig).await?;
    let bench =
        Api::<DynamicObject>::namespaced_with(client.clone(), NAMESPACE, &widget_resource());
    let config_maps = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        BASELINE_NAMESPACE,
        &ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
    );
    let (mut ready, _watching) = watch(bench.clone()).await?;
    let pids: Vec<u32> = processes.iter().map(|(_, pid)| *pid).collect();
    let mut phases = Vec::new();
    let objects = counts.objects;

    // Apply → children Ready, one at a time, beside kubectl applying the
    // same ConfigMaps by hand.
    let (mut children_ready, mut kubectl_applies) = (Vec::new(), Vec::new());
    for i in 0..counts.warmup_objects + counts.latency_objects {
        let name = format!("kid-{i:02}");
        let started = Instant::now();
        let object = widget(&name, CHILDREN);
        call("create", bench.create(&PostParams::default(), &object)).await?;
        let took = wait_ready(&mut ready, &name).await? - started;
        let by_hand = greeting_config_maps(&name, BASELINE_NAMESPACE);
        let kubeconfig = kubeconfig.to_owned();
        let kubectl_took =
            tokio::task::spawn_blocking(move || kubectl_apply(&kubeconfig, &by_hand)).await??;
        if i >= counts.warmup_objects {
            children_ready.push(took);
            kubectl_applies.push(kubectl_took);
        }
    }

    // Objects whose plugin declares no Finalize.
    quiet(processes).await?;
    let before = CpuSnapshot::now(&pids)?;
    let mark = audit.mark()?;
    let lean = converge(&bench, &mut ready, "lean", LEAN, objects).await?;
    phases.push((
        "objects, plugin without Finalize (per object)",
        objects,
        before.usage()?,
    ));
    tokio::time::sleep(SETTLE).await;
    let lean_writes = audit.writes_since(mark)?;

    // The raw applies of the ConfigMaps the parents below ask for.
    quiet(processes).await?;
    let before = CpuSnapshot::now(&pids)?;
    let params = PatchParams::apply("bench").force();
    let (raw_child_applies, _) = in_flight(
        "raw server-side applies of ConfigMaps",
        objects * CHILDREN_PER_OBJECT,
        |i| {
            let (config_maps, params) = (config_maps.clone(), &params);
            let parent = format!("raw-parent-{:04}", i / CHILDREN_PER_OBJECT);
            let body = greeting_config_maps(&parent, BASELINE_NAMESPACE)
                .swap_remove(i % CHILDREN_PER_OBJECT);
            async move {
                let name = body["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                call(
                    "apply a ConfigMap",
                    config_maps.patch(&name, params, &Patch::Apply(&body)),
                )
                .await
            }
        },
    )
    .await?;
    phases.push((
        "raw server-side applies of ConfigMaps (per request)",
        objects * CHILDREN_PER_OBJECT,
        before.usage()?,
    ));

    // Parents with three children each.
    quiet(processes).await?;
    let before = CpuSnapshot::now(&pids)?;
    let mark = audit.mark()?;
    let parents = converge(&bench, &mut ready, "parent", CHILDREN, objects).await?;
    phases.push((
        "parents with 3 children (per parent)",
        objects,
        before.usage()?,
    ));
    tokio::time::sleep(SETTLE).await;
    let parent_writes = audit.writes_since(mark)?;

    Ok(WriteResults {
        lean,
        lean_writes,
        parents,
        parent_writes,
        raw_child_applies,
        children_ready: Latencies::new(children_ready),
        kubectl_applies: Latencies::new(kubectl_applies),
        phases,
    })
}
