//! The measured phases: apply → Ready one object at a time, the raw calls
//! and rates of kube-apiserver, and `counts.objects` objects through the operator,
//! with the CPU each phase used.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use futures::{StreamExt, TryStreamExt};
use kplug_api::v1alpha1::{ApiSelector, Operation};
use kplug_operator::delegate::{Delegation, Delegator};
use kplug_test_support::measure::{CpuSnapshot, CpuUsage, Latencies};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use kplug_test_support::audit::{AuditLog, Writes};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::watch::{
    Seen, admin_client, call, check_greeted, next_seen, ready_now, wait_ready, wait_seen, watch,
    widget, widget_resource,
};
use crate::{
    BASELINE_NAMESPACE, Counts, GROUP, HELLO, IN_FLIGHT, KIND, NAMESPACE, PHASE_TIMEOUT, PLURAL,
    QUIET_SHARE, QUIET_TIMEOUT, QUIET_WINDOW, REQUEST_TIMEOUT, SETTLE, VERSION,
};

/// Runs `request(i)` for i in 0..count with `IN_FLIGHT` in flight; returns
/// the elapsed time and each one's result.
pub async fn in_flight<T, F, Fut>(
    what: &str,
    count: usize,
    request: F,
) -> Result<(Duration, Vec<T>)>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    eprintln!("{what}: {count} with {IN_FLIGHT} in flight");
    let started = Instant::now();
    let results = tokio::time::timeout(
        PHASE_TIMEOUT,
        futures::stream::iter(0..count)
            .map(request)
            .buffer_unordered(IN_FLIGHT)
            .try_collect::<Vec<T>>(),
    )
    .await
    .with_context(|| format!("{what} took longer than {PHASE_TIMEOUT:?}"))??;
    Ok((started.elapsed(), results))
}

// ---------------------------------------------------------------------------
// The measurements

pub struct Results {
    pub counts: Counts,
    /// Apply → Ready, one object at a time.
    pub apply_to_ready: Latencies,
    /// Round trips one at a time: create, merge patch and apply of /status,
    /// create reconciles.
    pub create_rtt: Latencies,
    pub merge_status_rtt: Latencies,
    pub apply_status_rtt: Latencies,
    pub reconcile_rtt: Latencies,
    /// From the start of a write until a watch saw it.
    pub create_seen: Latencies,
    pub merge_status_seen: Latencies,
    pub apply_status_seen: Latencies,
    /// With `IN_FLIGHT` in flight.
    pub creates: Duration,
    pub merge_status_writes: Duration,
    pub apply_status_writes: Duration,
    pub reconciles: Duration,
    pub convergence: Convergence,
    /// kube-apiserver's requests during the convergence run.
    pub requests: Vec<(String, f64)>,
    /// The writes in the operator's namespace during it, from the audit
    /// log (when the control plane keeps one).
    pub writes: Option<Writes>,
    /// Each phase's name, how many objects or requests it had, and its CPU.
    pub phases: Vec<(&'static str, usize, CpuUsage)>,
    /// How long the bench waited for a quiet kube-apiserver before the
    /// latency and the operator runs.
    pub quiet_waits: Vec<Duration>,
}

impl Results {
    /// The time the writes and the reconcile of `counts.objects` objects
    /// take at the raw rates: two creates (the object and its Event), a
    /// patch (the finalizer, at the merge patches' rate), a status apply and
    /// a reconcile each.
    pub fn bound(&self) -> Duration {
        self.creates * 2 + self.merge_status_writes + self.apply_status_writes + self.reconciles
    }
}

pub struct Convergence {
    /// From the first create until every object was seen Ready.
    pub elapsed: Duration,
    /// From the first create until the last create returned.
    pub creates_done: Duration,
    /// When each object was seen Ready, after the first create, sorted.
    pub ready_after: Vec<Duration>,
    /// Each object's create → Ready.
    pub per_object: Latencies,
}

pub async fn measure(
    kubeconfig: &Path,
    processes: &[(&'static str, u32)],
    counts: Counts,
    audit: Option<&AuditLog>,
) -> Result<Results> {
    let Counts {
        warmup_objects,
        latency_objects,
        objects: object_count,
    } = counts;
    let client = admin_client(kubeconfig).await?;
    let resource = widget_resource();
    let bench = Api::<DynamicObject>::namespaced_with(client.clone(), NAMESPACE, &resource);
    let baseline =
        Api::<DynamicObject>::namespaced_with(client.clone(), BASELINE_NAMESPACE, &resource);
    let (mut ready, _watching) = watch(bench.clone()).await?;
    let pids: Vec<u32> = processes.iter().map(|(_, pid)| *pid).collect();
    let mut phases = Vec::new();
    let post = PostParams::default();

    // 1. Apply → Ready, one object at a time.
    eprintln!("{warmup_objects} untimed objects, then {latency_objects} timed, one at a time");
    for i in 0..warmup_objects {
        let name = format!("warmup-{i}");
        call("create", bench.create(&post, &widget(&name, HELLO))).await?;
        wait_ready(&mut ready, &name).await?;
    }
    let mut quiet_waits = vec![quiet(processes).await?];
    let before = CpuSnapshot::now(&pids)?;
    let mut samples = Vec::new();
    for i in 0..latency_objects {
        let name = format!("latency-{i:02}");
        let started = Instant::now();
        call("create", bench.create(&post, &widget(&name, HELLO))).await?;
        samples.push(wait_ready(&mut ready, &name).await? - started);
    }
    phases.push((
        "apply → Ready, one at a time (per object)",
        latency_objects,
        before.usage()?,
    ));
    let apply_to_ready = Latencies::new(samples);

    // 2a. The operator's calls, one at a time, without the operator.
    let reconcile_once = |object| reconcile_once(&client, object);
    let merge = json!({"status": {"greeting": "x"}});
    let apply = json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": KIND,
        "status": {"greeting": "y"},
    });
    let apply_params = PatchParams::apply("bench").force();
    eprintln!("{latency_objects} of each raw call, one at a time, in {BASELINE_NAMESPACE}");
    let (mut changes, watching) = watch(baseline.clone()).await?;
    let before = CpuSnapshot::now(&pids)?;
    let mut samples: [Vec<Duration>; 7] = Default::default();
    for i in 0..warmup_objects + latency_objects {
        let name = format!("single-{i:02}");
        // Round trip and until the watch saw the change, per write.
        let mut timings = Vec::with_capacity(7);
        let started = Instant::now();
        let created = call("create", baseline.create(&post, &widget(&name, HELLO))).await?;
        timings.push(started.elapsed());
        timings.push(wait_seen(&mut changes, &created).await? - started);
        let started = Instant::now();
        let patched = call(
            "merge patch /status",
            baseline.patch_status(&name, &PatchParams::default(), &Patch::Merge(&merge)),
        )
        .await?;
        timings.push(started.elapsed());
        timings.push(wait_seen(&mut changes, &patched).await? - started);
        let started = Instant::now();
        let applied = call(
            "apply /status",
            baseline.patch_status(&name, &apply_params, &Patch::Apply(&apply)),
        )
        .await?;
        timings.push(started.elapsed());
        timings.push(wait_seen(&mut changes, &applied).await? - started);
        let started = Instant::now();
        reconcile_once(created).await?;
        timings.push(started.elapsed());
        if i >= warmup_objects {
            for (samples, timing) in samples.iter_mut().zip(timings) {
                samples.push(timing);
            }
        }
    }
    // Its events would be measured with the raw rates.
    watching.abort();
    phases.push((
        "raw calls, one at a time (per request)",
        4 * (warmup_objects + latency_objects),
        before.usage()?,
    ));
    let [
        create_rtt,
        create_seen,
        merge_status_rtt,
        merge_status_seen,
        apply_status_rtt,
        apply_status_seen,
        reconcile_rtt,
    ] = samples.map(Latencies::new);

    // 2b. The raw rates, `IN_FLIGHT` in flight.
    let name = |i: usize| format!("raw-{i:04}");
    let before = CpuSnapshot::now(&pids)?;
    let (creates, objects) = in_flight("raw creates", object_count, |i| {
        let baseline = baseline.clone();
        async move {
            call(
                "create",
                baseline.create(&PostParams::default(), &widget(&name(i), HELLO)),
            )
            .await
        }
    })
    .await?;
    phases.push(("raw creates", object_count, before.usage()?));
    let before = CpuSnapshot::now(&pids)?;
    let (merge_status_writes, _) = in_flight("raw merge patches of /status", object_count, |i| {
        let (baseline, merge) = (baseline.clone(), &merge);
        async move {
            call(
                "merge patch /status",
                baseline.patch_status(&name(i), &PatchParams::default(), &Patch::Merge(merge)),
            )
            .await
        }
    })
    .await?;
    phases.push((
        "raw merge patches of /status",
        object_count,
        before.usage()?,
    ));
    let before = CpuSnapshot::now(&pids)?;
    let (apply_status_writes, _) = in_flight("raw applies of /status", object_count, |i| {
        let (baseline, apply, params) = (baseline.clone(), &apply, &apply_params);
        async move {
            call(
                "apply /status",
                baseline.patch_status(&name(i), params, &Patch::Apply(apply)),
            )
            .await
        }
    })
    .await?;
    phases.push(("raw applies of /status", object_count, before.usage()?));
    let before = CpuSnapshot::now(&pids)?;
    let (reconciles, _) = in_flight("raw create reconciles", object_count, |i| {
        reconcile_once(objects[i].clone())
    })
    .await?;
    phases.push(("raw create reconciles", object_count, before.usage()?));

    // 3. `object_count` objects through the operator.
    quiet_waits.push(quiet(processes).await?);
    let requests_before = request_counts(&client).await?;
    let before = CpuSnapshot::now(&pids)?;
    let marked = audit.map(AuditLog::mark).transpose()?;
    let convergence = converge(&bench, &mut ready, "widget", HELLO, object_count).await?;
    phases.push((
        "objects through the operator (per object)",
        object_count,
        before.usage()?,
    ));
    // The operator records the Event after the status write that made the
    // object Ready: give the last ones a moment.
    tokio::time::sleep(SETTLE).await;
    let requests_after = request_counts(&client).await?;
    let writes = match (audit, marked) {
        (Some(audit), Some(mark)) => Some(audit.writes_since(mark)?),
        _ => None,
    };
    let mut requests: Vec<(String, f64)> = requests_after
        .iter()
        .map(|(key, after)| {
            let delta = after - requests_before.get(key).copied().unwrap_or_default();
            (key.clone(), delta)
        })
        .filter(|(_, delta)| *delta >= 1.0)
        .collect();
    requests.sort_by(|a, b| b.1.total_cmp(&a.1));

    Ok(Results {
        counts,
        apply_to_ready,
        create_rtt,
        merge_status_rtt,
        apply_status_rtt,
        reconcile_rtt,
        create_seen,
        merge_status_seen,
        apply_status_seen,
        creates,
        merge_status_writes,
        apply_status_writes,
        reconciles,
        convergence,
        requests,
        writes,
        phases,
        quiet_waits,
    })
}

/// Creates `count` objects named `PREFIX-NNNN` asking for `implementation`
/// in `bench`, `IN_FLIGHT` in flight, and times them from the first create
/// until `ready` (the watch on `bench`) has seen every one Ready.
pub async fn converge(
    bench: &Api<DynamicObject>,
    ready: &mut UnboundedReceiver<Seen>,
    prefix: &str,
    implementation: &'static str,
    count: usize,
) -> Result<Convergence> {
    let started = Instant::now();
    let named = |name: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|n| n.starts_with('-'))
    };
    let creating = tokio::spawn({
        let (bench, prefix) = (bench.clone(), prefix.to_owned());
        async move {
            in_flight(&format!("{prefix} objects for the operator"), count, |i| {
                let (bench, name) = (bench.clone(), format!("{prefix}-{i:04}"));
                async move {
                    let created_at = Instant::now();
                    let object = widget(&name, implementation);
                    call("create", bench.create(&PostParams::default(), &object)).await?;
                    Ok((name, created_at))
                }
            })
            .await
        }
    });
    let deadline = tokio::time::Instant::from_std(started + PHASE_TIMEOUT);
    // When each object was first seen Ready.
    let mut seen: BTreeMap<String, Instant> = BTreeMap::new();
    while seen.len() < count {
        let (object, at) = next_seen(
            ready,
            deadline,
            || format!("all {count} {prefix} objects Ready ({} were)", seen.len()),
            |o| named(&o.name_any()) && ready_now(o) && !seen.contains_key(&o.name_any()),
        )
        .await?;
        check_greeted(&object)?;
        seen.insert(object.name_any(), at);
        if seen.len().is_multiple_of(100) {
            eprintln!(
                "{} of {count} Ready after {:.1} s",
                seen.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let elapsed = started.elapsed();
    let (creates_done, created) = creating.await.context("the creating task")??;
    let created: BTreeMap<String, Instant> = created.into_iter().collect();
    let per_object = seen
        .iter()
        .map(|(name, at)| {
            let created_at = created
                .get(name)
                .with_context(|| format!("{name} Ready but not created"))?;
            Ok(at.saturating_duration_since(*created_at))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut ready_after: Vec<Duration> = seen.values().map(|at| *at - started).collect();
    ready_after.sort_unstable();
    Ok(Convergence {
        elapsed,
        creates_done,
        ready_after,
        per_object: Latencies::new(per_object),
    })
}

/// One `create reconciles` of `object` through kube-apiserver and kplug, as
/// the operator sends it (the hello plugin preferred); fails unless the
/// plugin succeeded.
pub async fn reconcile_once(client: &Client, object: DynamicObject) -> Result<()> {
    let api = ApiSelector {
        group: GROUP.to_owned(),
        resource: PLURAL.to_owned(),
        version: String::new(),
    };
    let answer = call(
        "create reconciles",
        Delegator::through_kube_apiserver(client.clone()).delegate(&Delegation {
            operation: Operation::Reconcile,
            api: &api,
            object: &object,
            extensions: &[],
            preferred_implementation: Some(HELLO.to_owned()),
            required_implementation: None,
            version_constraint: None,
            timeout: REQUEST_TIMEOUT,
            traceparent: None,
            observed_children: &[],
            child_scope: Default::default(),
        }),
    )
    .await?;
    ensure!(
        answer.success,
        "the plugin failed {}: {answer:?}",
        object.name_any()
    );
    Ok(())
}

/// Waits until kube-apiserver has been quiet for `QUIET_WINDOW`, using
/// under `QUIET_SHARE` of one CPU (after start-up and CRD changes it
/// rebuilds its OpenAPI for a while), at most `QUIET_TIMEOUT`; returns how
/// long it waited.
pub async fn quiet(processes: &[(&str, u32)]) -> Result<Duration> {
    let started = Instant::now();
    let apiserver = [processes[0].1];
    loop {
        let before = CpuSnapshot::now(&apiserver)?;
        tokio::time::sleep(QUIET_WINDOW).await;
        let used = before.usage()?.processes[0];
        if used.as_secs_f64() < QUIET_SHARE * QUIET_WINDOW.as_secs_f64() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > QUIET_TIMEOUT {
            eprintln!("kube-apiserver still busy after {QUIET_TIMEOUT:?}: measuring anyway");
            return Ok(started.elapsed());
        }
    }
}

/// kube-apiserver's `apiserver_request_total` by verb and resource, summed
/// over response codes, scopes and content types.
async fn request_counts(client: &Client) -> Result<BTreeMap<String, f64>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = call("GET /metrics", client.request_text(request)).await?;
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let label = |name: &str| {
            let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
            let end = labels[start..].find('"')?;
            Some(&labels[start..start + end])
        };
        let (Some(verb), Some(resource)) = (label("verb"), label("resource")) else {
            continue;
        };
        if resource.is_empty() {
            continue;
        }
        let mut key = format!("{verb} {resource}");
        if let Some(group) = label("group").filter(|g| !g.is_empty()) {
            let _ = write!(key, ".{group}");
        }
        if let Some(subresource) = label("subresource").filter(|s| !s.is_empty()) {
            let _ = write!(key, "/{subresource}");
        }
        *counts.entry(key).or_insert(0.0) += value;
    }
    Ok(counts)
}
