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
//!    generation, 20 times after 3 untimed.
//!    Next to it, one at a time in the namespace `baseline` (which the
//!    operator does not watch), the calls the operator makes for an object:
//!    a create, a merge patch of `/status` and a server-side apply of
//!    `/status`, each timed to its answer and until a watch sees it, and
//!    one `create reconciles` through kube-apiserver and kplug to the
//!    plugin.
//! 2. **The raw rates of the same kube-apiserver**, `IN_FLIGHT` requests in
//!    flight, on 1,000 Widgets in `baseline`: creates, merge patches of
//!    `/status` (`{"status":{"greeting":"x"}}`), server-side applies of
//!    `/status`, and `create reconciles`.
//! 3. **1,000 objects through the operator**: 1,000 Widgets created
//!    in `bench` with `IN_FLIGHT` in flight, timed from the first create
//!    until the watch has seen every one Ready. The requests kube-apiserver
//!    served meanwhile (its `apiserver_request_total`) show what one object
//!    costs.
//!
//! Then what an object writes, from the audit log (`writes`), and the
//! operator's own requests for an object replayed by the bench without the
//! operator, with and without the watches of its run (`replay`).
//!
//! Per phase it reads the CPU time of every process from `/proc`, and the
//! machine's, to tell how much other processes took.
//!
//! Results go to stdout as Markdown (for BENCHMARKS.md), progress to
//! stderr; the operator's log to `target/tmp/kplug-operator-convergence.log`
//! (`KPLUG_BENCH_OPERATOR_LOG=info,kplug_operator=debug` for more). Run with
//! `cargo build --release -p kplug-apiserver -p kplug-operator -p
//! kplug-example-hello && cargo bench -p kplug-operator --bench convergence`.
//!
//! With `KPLUG_BENCH_IN_CLUSTER=1` it measures the same against kplug, the
//! plugin and the operator as pods on the real cluster of `hack/cluster.sh`
//! (`in_cluster`).

mod in_cluster;
mod phases;
mod replay;
mod report;
mod watch;
mod writes;
mod writes_report;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use kplug_test_support::audit::AuditLog;
use kplug_test_support::bench_mode::BenchMode;
use kplug_test_support::{
    AggregatedKplug, ControlPlane, KUBECTL, Process, hello_plugin_command, plugin_identity,
    target_binary, wait_until,
};
use serde_json::Value;

use phases::measure;
use report::{OperatorLog, Report, Setting, print_report};

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
/// The plugins, by implementation: hello, declaring Finalize; hello
/// without it; hello without it asking for three ConfigMaps per object.
const PLUGINS: [(&str, &str, &[&str]); 3] = [
    ("bench-hello", HELLO, &[]),
    ("bench-lean", LEAN, &["--without-finalize"]),
    (
        "bench-children",
        CHILDREN,
        &["--without-finalize", "--greeting-config-maps", "3"],
    ),
];
pub const HELLO: &str = "Hello";
pub const LEAN: &str = "Lean";
pub const CHILDREN: &str = "Children";
/// The namespaces of the run, beside the CRD `widget_crd(GROUP)`.
const NAMESPACES: &str = r"apiVersion: v1
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

/// How many objects a run makes.
#[derive(Clone, Copy)]
pub struct Counts {
    /// Untimed objects before the timed ones (connections, caches).
    pub warmup_objects: usize,
    /// Objects created one at a time for the latency figures.
    pub latency_objects: usize,
    /// Objects of the throughput runs.
    pub objects: usize,
}

impl Counts {
    fn of(mode: BenchMode) -> Self {
        mode.pick(
            Self {
                warmup_objects: 3,
                latency_objects: 20,
                objects: 1_000,
            },
            Self {
                warmup_objects: 1,
                latency_objects: 3,
                objects: 2 * IN_FLIGHT,
            },
        )
    }
}
/// Requests in flight in the throughput runs, and the operator's concurrency.
const IN_FLIGHT: usize = 32;
/// The issue's target: 1,000 objects Ready within this long.
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

fn main() -> Result<()> {
    let mode = BenchMode::from_args();
    let counts = Counts::of(mode);
    if kplug_test_support::in_cluster::requested() {
        return in_cluster::main(mode, counts);
    }
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
    eprintln!("starting the control plane (etcd + kube-apiserver, its audit log on)");
    let audit = AuditLog::new(work.path(), NAMESPACE)?;
    let cluster = ControlPlane::start_with(work.path().join("cp"), &audit.apiserver_args());
    let kplug = AggregatedKplug::start(
        &cluster,
        work.path(),
        &["--min-heartbeat-interval", "1s", "--log", "info"],
    );
    eprintln!("kplug (pid {}) serves behind its APIService", kplug.pid());
    cluster.apply(&kplug_test_support::widget_crd(GROUP));
    cluster.apply(NAMESPACES);
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        &format!("crd/{RESOURCE}"),
        "--timeout=60s",
    ]);

    let plugins = PLUGINS
        .into_iter()
        .map(|(name, implementation, extra)| {
            let plugin = start_plugin(&cluster, &kplug, work.path(), name, implementation, extra);
            eprintln!("plugin {name} (pid {}) is Ready", plugin.pid());
            plugin
        })
        .collect::<Vec<_>>();

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
        ("plugin", plugins[0].pid()),
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let mut results = runtime.block_on(measure(
        &cluster.kubeconfig(),
        &processes,
        counts,
        Some(&audit),
    ))?;
    let mut writes = runtime.block_on(writes::measure(
        &cluster.kubeconfig(),
        &processes,
        counts,
        &audit,
    ))?;
    results.phases.append(&mut writes.phases);
    let mut replays =
        runtime.block_on(replay::measure(&cluster.kubeconfig(), &processes, counts))?;
    results.phases.append(&mut replays.phases);
    let log = OperatorLog::read(&log_path)?;

    print_report(&Report {
        mode,
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
        setting: Setting {
            title: "Operator: apply → Ready, and 1,000 objects",
            plot: "convergence",
            shared_by: "kube-apiserver, etcd, kplug, the operator, the plugin and the bench",
            cluster: format!(
                "kube-apiserver {} and etcd from `hack/control-plane.sh`",
                cluster.var("KPLUG_APISERVER_VERSION")
            ),
            command: COMMAND,
        },
    })?;
    writes_report::print(&results, &writes);
    writes_report::print_replays(&results, &replays);
    Ok(())
}

/// The hello plugin `name` serving Widgets as `implementation` with
/// `extra` flags, heartbeating every second, once it is Ready.
fn start_plugin(
    cluster: &ControlPlane,
    kplug: &AggregatedKplug,
    work: &Path,
    name: &str,
    implementation: &str,
    extra: &[&str],
) -> Process {
    let token = plugin_identity(cluster, name, Some(name), work);
    let plugin = Process::spawn(
        hello_plugin_command(kplug, name, &token)
            .args(["--api", &format!("{RESOURCE}/{VERSION}")])
            .args([
                "--implementation",
                implementation,
                "--heartbeat-interval",
                "1",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "hello-plugin",
    );
    wait_until(&format!("the plugin {name} Ready"), STARTUP_TIMEOUT, || {
        let output = cluster.kubectl(&["get", "plugin", name, "-o", "json"]);
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
    plugin
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
                // Metrics on a port of its own: no clash with anything on :8443.
                "--metrics-bind-address=127.0.0.1:0",
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
