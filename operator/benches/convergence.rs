//! The zero-code operator end to end: how long from creating an object to
//! `Ready=True`, and how fast 1,000 objects converge, each next to what the
//! same kube-apiserver does without the operator in the same run.
//!
//! One real control plane (etcd and kube-apiserver from
//! `hack/control-plane.sh`), kplug behind its APIService
//! (`--min-heartbeat-interval 1s`), the CRD `widgets.bench.kplug.io`, the
//! fast hello plugin (examples/hello-rust) heartbeating every second with a
//! ServiceAccount token, and `kplug-operator --resource
//! widgets.bench.kplug.io --namespace bench --concurrency 32
//! --leader-elect=false` as the admin. Everything is a separate process on
//! 127.0.0.1; the bench talks to kube-apiserver with a kube `Client` as the
//! admin. It measures, in one run:
//!
//! 1. **Apply → Ready, one object at a time**: create a Widget in `bench`
//!    and wait until a watch on the namespace (opened before the first
//!    create) shows `Ready=True` with `observedGeneration` equal to its
//!    generation, `LATENCY_OBJECTS` times after `WARMUP_OBJECTS` untimed.
//!    Next to it, one at a time in the namespace `baseline` (which the
//!    operator does not watch), the calls the operator makes for an object:
//!    a create, a merge patch of `/status` and a server-side apply of
//!    `/status`, each timed to its answer and until a watch sees it, and
//!    one `create reconciles` through kube-apiserver and kplug to the
//!    plugin.
//! 2. **The raw rates of the same kube-apiserver**, `IN_FLIGHT` requests in
//!    flight, on `OBJECTS` Widgets in `baseline`: creates, merge patches of
//!    `/status` (`{"status":{"greeting":"x"}}`), server-side applies of
//!    `/status`, and `create reconciles`.
//! 3. **`OBJECTS` objects through the operator**: `OBJECTS` Widgets created
//!    in `bench` with `IN_FLIGHT` in flight, timed from the first create
//!    until the watch has seen every one Ready. The requests kube-apiserver
//!    served meanwhile (its `apiserver_request_total`) show what one object
//!    costs.
//!
//! Per phase it reads the CPU time of every process from `/proc`, and the
//! machine's, to tell how much other processes took.
//!
//! Results go to stdout as Markdown (for BENCHMARKS.md), progress to
//! stderr; the operator's log to `target/tmp/kplug-operator-convergence.log`
//! (`KPLUG_BENCH_OPERATOR_LOG=info,kplug_operator=debug` for more). Run with
//! `cargo build --release -p kplug-apiserver -p kplug-operator -p
//! kplug-example-hello && cargo bench -p kplug-operator --bench convergence`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::{StreamExt, TryStreamExt};
use kplug_api::v1alpha1::{ApiSelector, Operation};
use kplug_operator::delegate::{Delegation, delegate};
use kplug_test_support::{
    AggregatedKplug, ControlPlane, KUBECTL, Process, hello_plugin_command, plugin_identity,
    target_binary, wait_until,
};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

/// Builds the three binaries measured here.
const BUILD: &str =
    "cargo build --release -p kplug-apiserver -p kplug-operator -p kplug-example-hello";
/// The command that produces these numbers, as printed in the report.
const COMMAND: &str = "cargo build --release -p kplug-apiserver -p kplug-operator -p kplug-example-hello && \
                       cargo bench -p kplug-operator --bench convergence";

const GROUP: &str = "bench.kplug.io";
const VERSION: &str = "v1";
const KIND: &str = "Widget";
const PLURAL: &str = "widgets";
const RESOURCE: &str = "widgets.bench.kplug.io";
/// The namespace the operator watches.
const NAMESPACE: &str = "bench";
/// The raw API runs' namespace, which the operator does not watch.
const BASELINE_NAMESPACE: &str = "baseline";
const PLUGIN: &str = "bench-hello";
const CRD: &str = r"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.bench.kplug.io}
spec:
  group: bench.kplug.io
  scope: Namespaced
  names: {kind: Widget, listKind: WidgetList, plural: widgets, singular: widget}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: v1
kind: Namespace
metadata: {name: bench}
---
apiVersion: v1
kind: Namespace
metadata: {name: baseline}
---
apiVersion: v1
kind: Namespace
metadata: {name: plugins}
";

/// Untimed objects before the timed ones (connections, caches).
const WARMUP_OBJECTS: usize = 3;
/// Objects created one at a time for the latency figures.
const LATENCY_OBJECTS: usize = 20;
/// Objects of the throughput runs.
const OBJECTS: usize = 1_000;
/// Requests in flight in the throughput runs, and the operator's concurrency.
const IN_FLIGHT: usize = 32;
/// The issue's target: `OBJECTS` objects Ready within this long.
const TARGET: Duration = Duration::from_secs(20);

/// Upper bounds, so that a wedged process fails the run instead of hanging it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const OBJECT_TIMEOUT: Duration = Duration::from_secs(60);
const PHASE_TIMEOUT: Duration = Duration::from_secs(300);
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long after the last object turned Ready the request counts are read.
const SETTLE: Duration = Duration::from_secs(1);
/// Before a measured run, kube-apiserver must have used under this share
/// of one CPU in a window of this long; the bench waits at most so long.
const QUIET_SHARE: f64 = 0.05;
const QUIET_WINDOW: Duration = Duration::from_secs(1);
const QUIET_TIMEOUT: Duration = Duration::from_secs(60);

/// Linux reports CPU time in ticks of this many per second (USER_HZ).
const TICKS_PER_SECOND: u64 = 100;

fn main() -> Result<()> {
    let kplug_binary = target_binary("kplug-apiserver", BUILD)?;
    let operator_binary = target_binary("kplug-operator", BUILD)?;
    let hello_binary = target_binary("hello-plugin", BUILD)?;
    ensure!(Path::new(KUBECTL).exists(), "{KUBECTL} is missing");
    let load_at_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    // Dropped in reverse order: operator, plugin, kplug, the control plane,
    // the directory.
    let work = tempfile::Builder::new()
        .prefix("kplug-bench-operator-")
        .tempdir_in("/tmp")
        .context("creating a work directory")?;
    eprintln!("starting the control plane (etcd + kube-apiserver)");
    let cluster = ControlPlane::start(work.path().join("cp"));
    let kplug = AggregatedKplug::start(
        &cluster,
        work.path(),
        &["--min-heartbeat-interval", "1s", "--log", "info"],
    );
    eprintln!("kplug (pid {}) serves behind its APIService", kplug.pid());
    cluster.apply(CRD);
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        &format!("crd/{RESOURCE}"),
        "--timeout=60s",
    ]);

    let token = plugin_identity(&cluster, PLUGIN, Some(PLUGIN), work.path());
    let plugin = Process::spawn(
        hello_plugin_command(&kplug, PLUGIN, &token)
            .args(["--api", &format!("{RESOURCE}/{VERSION}"), "--interval", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "hello-plugin",
    );
    wait_until("the plugin Ready", STARTUP_TIMEOUT, || {
        let output = cluster.kubectl(&["get", "plugin", PLUGIN, "-o", "json"]);
        let plugin: Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        let ready = plugin["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        ready
            .then_some(())
            .ok_or_else(|| String::from_utf8_lossy(&output.stderr).into_owned())
    });
    eprintln!("plugin {PLUGIN} (pid {}) is Ready", plugin.pid());

    let log_path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kplug-operator-convergence.log");
    let operator = start_operator(&operator_binary, &cluster.kubeconfig(), &log_path)?;
    eprintln!(
        "kplug-operator (pid {}) started; its log: {}",
        operator.pid(),
        log_path.display()
    );

    let processes = vec![
        (
            "kube-apiserver",
            cluster.var("KPLUG_APISERVER_PID").parse()?,
        ),
        ("etcd", cluster.var("KPLUG_ETCD_PID").parse()?),
        ("kplug", kplug.pid()),
        ("operator", operator.pid()),
        ("plugin", plugin.pid()),
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let results = runtime.block_on(measure(&cluster.kubeconfig(), &processes))?;
    let log = OperatorLog::read(&log_path)?;

    print_report(&Report {
        results: &results,
        log: &log,
        processes: &processes,
        load_at_start: load_at_start.trim(),
        binaries: &[
            ("kplug", &kplug_binary),
            ("Operator", &operator_binary),
            ("Plugin", &hello_binary),
            (
                "kube-apiserver",
                &PathBuf::from(cluster.var("KPLUG_APISERVER_BIN")),
            ),
        ],
        apiserver_version: cluster.var("KPLUG_APISERVER_VERSION"),
    })?;
    Ok(())
}

/// `kplug-operator` as the admin, its log (stderr) into `log_path`; waits
/// until its controller has started.
fn start_operator(binary: &Path, kubeconfig: &Path, log_path: &Path) -> Result<Process> {
    let log = std::fs::File::create(log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let level = std::env::var("KPLUG_BENCH_OPERATOR_LOG").unwrap_or_else(|_| "info".to_owned());
    let operator = Process::spawn(
        Command::new(binary)
            .args(["--resource", RESOURCE, "--kubeconfig"])
            .arg(kubeconfig)
            .args([
                "--leader-elect=false",
                "--namespace",
                NAMESPACE,
                "--concurrency",
                &IN_FLIGHT.to_string(),
                "--log",
                &level,
            ])
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log),
        "kplug-operator",
    );
    wait_until("the operator's controller started", STARTUP_TIMEOUT, || {
        let log = std::fs::read_to_string(log_path).unwrap_or_default();
        if log.contains("controller started") {
            Ok(())
        } else {
            Err(log)
        }
    });
    Ok(operator)
}

// ---------------------------------------------------------------------------
// Widgets and the kube client

fn widget_resource() -> ApiResource {
    ApiResource {
        group: GROUP.to_owned(),
        version: VERSION.to_owned(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.to_owned(),
        plural: PLURAL.to_owned(),
    }
}

fn widget(name: &str) -> DynamicObject {
    DynamicObject::new(name, &widget_resource()).data(json!({"spec": {"color": "blue"}}))
}

async fn admin_client(kubeconfig: &Path) -> Result<Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Awaits one API call, at most `REQUEST_TIMEOUT`.
async fn call<T, E>(what: &str, request: impl Future<Output = Result<T, E>>) -> Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .with_context(|| format!("{what} took longer than {REQUEST_TIMEOUT:?}"))?
        .with_context(|| what.to_owned())
}

/// Ready=True for the object's current generation, as the operator writes it.
fn ready_now(object: &DynamicObject) -> bool {
    let Some(generation) = object.metadata.generation else {
        return false;
    };
    let status = &object.data["status"];
    status["observedGeneration"] == generation
        && status["conditions"].as_array().is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c["type"] == "Ready"
                    && c["status"] == "True"
                    && c["observedGeneration"] == generation
            })
        })
}

/// An object as a watch saw it, and when.
type Seen = (DynamicObject, Instant);

/// Watches `api` and sends every object version it sees; returns once the
/// watch has listed the namespace, with the task to abort when done.
async fn watch(
    api: Api<DynamicObject>,
) -> Result<(mpsc::UnboundedReceiver<Seen>, tokio::task::JoinHandle<()>)> {
    let (sender, receiver) = mpsc::unbounded_channel();
    let (listed, on_listed) = oneshot::channel();
    let task = tokio::spawn(async move {
        let mut listed = Some(listed);
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                    if sender.send((object, Instant::now())).is_err() {
                        return;
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(listed) = listed.take() {
                        let _ = listed.send(());
                    }
                }
                Ok(_) => {}
                Err(error) => eprintln!("the bench's watch: {error}"),
            }
        }
    });
    tokio::time::timeout(STARTUP_TIMEOUT, on_listed)
        .await
        .context("the bench's watch did not list the namespace in time")?
        .context("the bench's watch ended")?;
    Ok((receiver, task))
}

/// The next object version the watch saw for which `wanted` holds, within
/// `within` (the ones before it are dropped).
async fn next_seen(
    seen: &mut mpsc::UnboundedReceiver<Seen>,
    within: tokio::time::Instant,
    what: impl Fn() -> String,
    wanted: impl Fn(&DynamicObject) -> bool,
) -> Result<Seen> {
    loop {
        match tokio::time::timeout_at(within, seen.recv()).await {
            Ok(Some((object, at))) if wanted(&object) => return Ok((object, at)),
            Ok(Some(_)) => {}
            Ok(None) => bail!("the bench's watch ended"),
            Err(_) => bail!("{} not seen in time", what()),
        }
    }
}

/// Whether a Ready object carries the plugin's greeting.
fn check_greeted(object: &DynamicObject) -> Result<()> {
    let name = object.name_any();
    ensure!(
        object.data["status"]["greeting"] == format!("hello, {name}"),
        "{name} is Ready without the greeting: {}",
        object.data["status"]
    );
    Ok(())
}

/// Waits until the watch shows `name` Ready; returns when it saw it.
async fn wait_ready(seen: &mut mpsc::UnboundedReceiver<Seen>, name: &str) -> Result<Instant> {
    let within = tokio::time::Instant::now() + OBJECT_TIMEOUT;
    let (object, at) = next_seen(
        seen,
        within,
        || format!("{name} Ready"),
        |o| o.name_any() == name && ready_now(o),
    )
    .await?;
    check_greeted(&object)?;
    Ok(at)
}

/// Waits until the watch saw `written` (its name at its resourceVersion);
/// returns when it did.
async fn wait_seen(
    seen: &mut mpsc::UnboundedReceiver<Seen>,
    written: &DynamicObject,
) -> Result<Instant> {
    let (name, version) = (written.name_any(), written.resource_version());
    let within = tokio::time::Instant::now() + OBJECT_TIMEOUT;
    let (_, at) = next_seen(
        seen,
        within,
        || format!("{name} at {version:?}"),
        |o| o.name_any() == name && o.resource_version() == version,
    )
    .await?;
    Ok(at)
}

/// Runs `request(i)` for i in 0..count with `IN_FLIGHT` in flight; returns
/// the elapsed time and each one's result.
async fn in_flight<T, F, Fut>(what: &str, count: usize, request: F) -> Result<(Duration, Vec<T>)>
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

struct Results {
    /// Apply → Ready, one object at a time.
    apply_to_ready: Latencies,
    /// Round trips one at a time: create, merge patch and apply of /status,
    /// create reconciles.
    create_rtt: Latencies,
    merge_status_rtt: Latencies,
    apply_status_rtt: Latencies,
    reconcile_rtt: Latencies,
    /// From the start of a write until a watch saw it.
    create_seen: Latencies,
    merge_status_seen: Latencies,
    apply_status_seen: Latencies,
    /// With `IN_FLIGHT` in flight.
    creates: Duration,
    merge_status_writes: Duration,
    apply_status_writes: Duration,
    reconciles: Duration,
    convergence: Convergence,
    /// kube-apiserver's requests during the convergence run.
    requests: Vec<(String, f64)>,
    /// Each phase's name, how many objects or requests it had, and its CPU.
    phases: Vec<(&'static str, usize, Usage)>,
    /// How long the bench waited for a quiet kube-apiserver before the
    /// latency and the operator runs.
    quiet_waits: Vec<Duration>,
}

struct Convergence {
    /// From the first create until every object was seen Ready.
    elapsed: Duration,
    /// From the first create until the last create returned.
    creates_done: Duration,
    /// When each object was seen Ready, after the first create, sorted.
    ready_after: Vec<Duration>,
    /// Each object's create → Ready.
    per_object: Latencies,
}

async fn measure(kubeconfig: &Path, processes: &[(&'static str, u32)]) -> Result<Results> {
    let client = admin_client(kubeconfig).await?;
    let resource = widget_resource();
    let bench = Api::<DynamicObject>::namespaced_with(client.clone(), NAMESPACE, &resource);
    let baseline =
        Api::<DynamicObject>::namespaced_with(client.clone(), BASELINE_NAMESPACE, &resource);
    let (mut ready, _watching) = watch(bench.clone()).await?;
    let mut phases = Vec::new();
    let post = PostParams::default();

    // 1. Apply → Ready, one object at a time.
    eprintln!("{WARMUP_OBJECTS} untimed objects, then {LATENCY_OBJECTS} timed, one at a time");
    for i in 0..WARMUP_OBJECTS {
        let name = format!("warmup-{i}");
        call("create", bench.create(&post, &widget(&name))).await?;
        wait_ready(&mut ready, &name).await?;
    }
    let mut quiet_waits = vec![quiet(processes).await?];
    let before = Snapshot::now(processes)?;
    let mut samples = Vec::new();
    for i in 0..LATENCY_OBJECTS {
        let name = format!("latency-{i:02}");
        let started = Instant::now();
        call("create", bench.create(&post, &widget(&name))).await?;
        samples.push(wait_ready(&mut ready, &name).await? - started);
    }
    phases.push((
        "apply → Ready, one at a time (per object)",
        LATENCY_OBJECTS,
        before.usage(processes)?,
    ));
    let apply_to_ready = Latencies::new(samples);

    // 2a. The operator's calls, one at a time, without the operator.
    let api_selector = ApiSelector {
        group: GROUP.to_owned(),
        resource: PLURAL.to_owned(),
        version: String::new(),
    };
    let reconcile_once = |object: DynamicObject| {
        let (client, api_selector) = (client.clone(), &api_selector);
        async move {
            let answer = call(
                "create reconciles",
                delegate(
                    &client,
                    &Delegation {
                        operation: Operation::Reconcile,
                        api: api_selector,
                        object: &object,
                        extensions: &[],
                        preferred_implementation: None,
                        required_implementation: None,
                        timeout: REQUEST_TIMEOUT,
                    },
                ),
            )
            .await?;
            ensure!(
                answer.success,
                "the plugin failed {}: {answer:?}",
                object.name_any()
            );
            Ok(())
        }
    };
    let merge = json!({"status": {"greeting": "x"}});
    let apply = json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": KIND,
        "status": {"greeting": "y"},
    });
    let apply_params = PatchParams::apply("bench").force();
    eprintln!("{LATENCY_OBJECTS} of each raw call, one at a time, in {BASELINE_NAMESPACE}");
    let (mut changes, watching) = watch(baseline.clone()).await?;
    let before = Snapshot::now(processes)?;
    let mut samples: [Vec<Duration>; 7] = Default::default();
    for i in 0..WARMUP_OBJECTS + LATENCY_OBJECTS {
        let name = format!("single-{i:02}");
        // Round trip and until the watch saw the change, per write.
        let mut timings = Vec::with_capacity(7);
        let started = Instant::now();
        let created = call("create", baseline.create(&post, &widget(&name))).await?;
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
        if i >= WARMUP_OBJECTS {
            for (samples, timing) in samples.iter_mut().zip(timings) {
                samples.push(timing);
            }
        }
    }
    // Its events would be measured with the raw rates.
    watching.abort();
    phases.push((
        "raw calls, one at a time (per request)",
        4 * (WARMUP_OBJECTS + LATENCY_OBJECTS),
        before.usage(processes)?,
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
    let before = Snapshot::now(processes)?;
    let (creates, objects) = in_flight("raw creates", OBJECTS, |i| {
        let baseline = baseline.clone();
        async move {
            call(
                "create",
                baseline.create(&PostParams::default(), &widget(&name(i))),
            )
            .await
        }
    })
    .await?;
    phases.push(("raw creates", OBJECTS, before.usage(processes)?));
    let before = Snapshot::now(processes)?;
    let (merge_status_writes, _) = in_flight("raw merge patches of /status", OBJECTS, |i| {
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
        OBJECTS,
        before.usage(processes)?,
    ));
    let before = Snapshot::now(processes)?;
    let (apply_status_writes, _) = in_flight("raw applies of /status", OBJECTS, |i| {
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
    phases.push(("raw applies of /status", OBJECTS, before.usage(processes)?));
    let before = Snapshot::now(processes)?;
    let (reconciles, _) = in_flight("raw create reconciles", OBJECTS, |i| {
        reconcile_once(objects[i].clone())
    })
    .await?;
    phases.push(("raw create reconciles", OBJECTS, before.usage(processes)?));

    // 3. `OBJECTS` objects through the operator.
    quiet_waits.push(quiet(processes).await?);
    let requests_before = request_counts(&client).await?;
    let before = Snapshot::now(processes)?;
    let started = Instant::now();
    let creating = tokio::spawn({
        let bench = bench.clone();
        async move {
            in_flight("objects for the operator", OBJECTS, |i| {
                let bench = bench.clone();
                async move {
                    let name = format!("widget-{i:04}");
                    let created_at = Instant::now();
                    call(
                        "create",
                        bench.create(&PostParams::default(), &widget(&name)),
                    )
                    .await?;
                    Ok((name, created_at))
                }
            })
            .await
        }
    });
    let deadline = tokio::time::Instant::from_std(started + PHASE_TIMEOUT);
    // When each object was first seen Ready.
    let mut seen: BTreeMap<String, Instant> = BTreeMap::new();
    while seen.len() < OBJECTS {
        let (object, at) = next_seen(
            &mut ready,
            deadline,
            || format!("all {OBJECTS} objects Ready ({} were)", seen.len()),
            |o| {
                o.name_any().starts_with("widget-")
                    && ready_now(o)
                    && !seen.contains_key(&o.name_any())
            },
        )
        .await?;
        check_greeted(&object)?;
        seen.insert(object.name_any(), at);
        if seen.len().is_multiple_of(100) {
            eprintln!(
                "{} of {OBJECTS} Ready after {:.1} s",
                seen.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let elapsed = started.elapsed();
    let usage = before.usage(processes)?;
    let (creates_done, created) = creating.await.context("the creating task")??;
    phases.push((
        "1,000 objects through the operator (per object)",
        OBJECTS,
        usage,
    ));
    // The operator records the Event after the status write that made the
    // object Ready: give the last ones a moment.
    tokio::time::sleep(SETTLE).await;
    let requests_after = request_counts(&client).await?;
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
        convergence: Convergence {
            elapsed,
            creates_done,
            ready_after,
            per_object: Latencies::new(per_object),
        },
        requests,
        phases,
        quiet_waits,
    })
}

/// Waits until kube-apiserver has been quiet for `QUIET_WINDOW`, using
/// under `QUIET_SHARE` of one CPU (after start-up and CRD changes it
/// rebuilds its OpenAPI for a while), at most `QUIET_TIMEOUT`; returns how
/// long it waited.
async fn quiet(processes: &[(&str, u32)]) -> Result<Duration> {
    let started = Instant::now();
    let apiserver = &processes[..1];
    loop {
        let before = Snapshot::now(apiserver)?;
        tokio::time::sleep(QUIET_WINDOW).await;
        let used = before.usage(apiserver)?.processes[0];
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

// ---------------------------------------------------------------------------
// CPU time from /proc

fn ticks(ticks: u64) -> Duration {
    Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND)
}

/// utime + stime of a process (all its threads), from `/proc/.../stat`.
fn cpu_time(stat_path: &str) -> Result<Duration> {
    let stat =
        std::fs::read_to_string(stat_path).with_context(|| format!("reading {stat_path}"))?;
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of proc(5); the first after the name is field 3.
    let field = |index: usize| -> Result<u64> {
        fields
            .get(index)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("malformed {stat_path}"))
    };
    Ok(ticks(field(11)? + field(12)?))
}

/// Busy time of all CPUs (everything but idle and iowait).
fn machine_busy() -> Result<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let totals: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("cpu "))
        .context("no cpu line in /proc/stat")?
        .split_whitespace()
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .context("malformed /proc/stat")?;
    ensure!(totals.len() == 8, "malformed /proc/stat");
    // user nice system idle iowait irq softirq steal
    Ok(ticks(
        totals[0] + totals[1] + totals[2] + totals[5] + totals[6] + totals[7],
    ))
}

fn cpus() -> u32 {
    std::thread::available_parallelism()
        .ok()
        .and_then(|n| u32::try_from(n.get()).ok())
        .unwrap_or(1)
}

/// CPU times at one moment.
struct Snapshot {
    at: Instant,
    machine: Duration,
    /// Of the processes, in the order given.
    processes: Vec<Duration>,
    bench: Duration,
}

/// CPU used during a phase.
struct Usage {
    elapsed: Duration,
    /// Per process, in the order given.
    processes: Vec<Duration>,
    bench: Duration,
    /// Everything else on the machine.
    others: Duration,
}

impl Snapshot {
    fn now(processes: &[(&str, u32)]) -> Result<Self> {
        Ok(Self {
            at: Instant::now(),
            machine: machine_busy()?,
            processes: processes
                .iter()
                .map(|(_, pid)| cpu_time(&format!("/proc/{pid}/stat")))
                .collect::<Result<_>>()?,
            bench: cpu_time("/proc/self/stat")?,
        })
    }

    fn usage(&self, processes: &[(&str, u32)]) -> Result<Usage> {
        let now = Self::now(processes)?;
        let used: Vec<Duration> = now
            .processes
            .iter()
            .zip(&self.processes)
            .map(|(after, before)| after.saturating_sub(*before))
            .collect();
        let bench = now.bench.saturating_sub(self.bench);
        let ours = used.iter().sum::<Duration>() + bench;
        Ok(Usage {
            elapsed: now.at - self.at,
            others: now
                .machine
                .saturating_sub(self.machine)
                .saturating_sub(ours),
            processes: used,
            bench,
        })
    }
}

// ---------------------------------------------------------------------------
// The operator's log

struct OperatorLog {
    /// Delegated reconciles it logged ("reconciled" with an operation id).
    reconciled: usize,
    warnings: Vec<String>,
    errors: Vec<String>,
}

impl OperatorLog {
    fn read(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
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

// ---------------------------------------------------------------------------
// Statistics and the report

/// Latency samples, sorted.
struct Latencies(Vec<Duration>);

impl Latencies {
    fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        Self(samples)
    }

    /// Nearest-rank percentile, `p` in 0..=100.
    fn percentile(&self, p: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let rank = (p / 100.0 * self.0.len() as f64).ceil() as usize;
        self.0[rank.clamp(1, self.0.len()) - 1]
    }

    fn max(&self) -> Duration {
        self.0.last().copied().unwrap_or_default()
    }
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}

fn seconds(duration: Duration) -> String {
    format!("{:.2} s", duration.as_secs_f64())
}

fn rate(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(f64::EPSILON)
}

/// 12345 → "12,345".
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

struct Report<'a> {
    results: &'a Results,
    log: &'a OperatorLog,
    processes: &'a [(&'static str, u32)],
    load_at_start: &'a str,
    binaries: &'a [(&'a str, &'a Path)],
    apiserver_version: String,
}

fn print_report(report: &Report<'_>) -> Result<()> {
    let r = report.results;
    println!("## Operator: apply → Ready, and 1,000 objects\n");
    print_machine(report)?;

    println!("### Apply → Ready, one object at a time\n");
    println!(
        "Create a Widget in `{NAMESPACE}`, then wait until the bench's watch on the namespace \
         shows `Ready=True` for its generation; {LATENCY_OBJECTS} objects after {WARMUP_OBJECTS} \
         untimed. Below it, from the same run, one at a time on Widgets in `{BASELINE_NAMESPACE}` \
         (not watched by the operator), the calls the operator makes per object, without the \
         operator ({LATENCY_OBJECTS} each): each write's round trip, and the time from its start \
         until a watch on that namespace (the bench's, open only for this) sees the new \
         resourceVersion.\n"
    );
    println!("| Measure | Samples | p50 | p90 | max |");
    println!("|---|---:|---:|---:|---:|");
    let row = |what: &str, latencies: &Latencies| {
        println!(
            "| {what} | {} | {} | {} | {} |",
            latencies.0.len(),
            ms(latencies.percentile(50.0)),
            ms(latencies.percentile(90.0)),
            ms(latencies.max()),
        );
    };
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
        ms(sequential)
    );

    println!(
        "### {} objects, {IN_FLIGHT} in flight\n",
        thousands(OBJECTS)
    );
    println!(
        "The raw rows are the same kube-apiserver without the operator, on {} Widgets in \
         `{BASELINE_NAMESPACE}`: creates, then one merge patch of each one's `/status` \
         (`{{\"status\":{{\"greeting\":\"x\"}}}}`), then one server-side apply of it, then one \
         `create reconciles` for each. The operator row creates {} Widgets in `{NAMESPACE}` with \
         {IN_FLIGHT} in flight and is timed from the first create until the watch has seen all of \
         them `Ready=True` (operator `--concurrency {IN_FLIGHT}`). The ratio is each rate over the \
         raw merge-patch status writes per second.\n",
        thousands(OBJECTS),
        thousands(OBJECTS),
    );
    let merge_rate = rate(OBJECTS, r.merge_status_writes);
    // Per object: its create, the finalizer patch, the status apply and the
    // Event (a create), and one reconcile call.
    let bound = r.creates * 2 + r.merge_status_writes + r.apply_status_writes + r.reconciles;
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
        let per_second = rate(OBJECTS, elapsed);
        println!(
            "| {what} | {} | {} | {} | {:.2} |",
            thousands(OBJECTS),
            seconds(elapsed),
            thousands(per_second.round() as usize),
            per_second / merge_rate,
        );
    }
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
        thousands(OBJECTS),
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
        thousands(OBJECTS)
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
            count / OBJECTS as f64
        );
    }
    println!(
        "\nThe operator logged {} delegated reconciles in the whole run ({} objects), {} warnings \
         and {} errors.\n",
        thousands(report.log.reconciled),
        thousands(WARMUP_OBJECTS + LATENCY_OBJECTS + OBJECTS),
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
        let total: Duration = usage.processes.iter().sum::<Duration>() + usage.bench + usage.others;
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
            usage.bench.as_secs_f64(),
            usage.others.as_secs_f64(),
            100.0 * total.as_secs_f64() / available.as_secs_f64().max(f64::EPSILON),
            ms(apiserver / u32::try_from((*items).max(1)).unwrap_or(u32::MAX)),
        );
    }
    println!();
    Ok(())
}

fn print_machine(report: &Report<'_>) -> Result<()> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").context("reading /proc/cpuinfo")?;
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name")?.split_once(':'))
        .map_or("unknown", |(_, model)| model.trim());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .context("reading the kernel release")?;
    let others: Duration = report.results.phases.iter().map(|(_, _, u)| u.others).sum();
    let elapsed: Duration = report
        .results
        .phases
        .iter()
        .map(|(_, _, u)| u.elapsed)
        .sum();
    println!("### Machine\n");
    println!(
        "- CPU: {model}, {} CPUs (`nproc`), shared by kube-apiserver, etcd, kplug, the operator, \
         the plugin and the bench",
        cpus()
    );
    println!("- Kernel: Linux {}", kernel.trim());
    println!("- Load average before the run: {}", report.load_at_start);
    let waits: Vec<String> = report
        .results
        .quiet_waits
        .iter()
        .map(|w| seconds(*w))
        .collect();
    println!(
        "- Before the latency run and the operator run, the bench waited {} for kube-apiserver to \
         use under {:.0} % of a CPU for {}",
        waits.join(" and "),
        QUIET_SHARE * 100.0,
        seconds(QUIET_WINDOW),
    );
    println!(
        "- Other processes used {:.1} of the {:.1} CPU-seconds there were during the measured \
         phases ({:.0} %)",
        others.as_secs_f64(),
        (elapsed * cpus()).as_secs_f64(),
        100.0 * others.as_secs_f64() / (elapsed * cpus()).as_secs_f64().max(f64::EPSILON),
    );
    println!(
        "- kube-apiserver {} and etcd from `hack/control-plane.sh`",
        report.apiserver_version
    );
    for (role, binary) in report.binaries {
        println!("- {role}: `{}`", binary.display());
    }
    println!("- Command: `{COMMAND}`");
    println!();
    Ok(())
}
