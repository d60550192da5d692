//! The in-cluster mode (`KPLUG_BENCH_IN_CLUSTER=1`): the same phases
//! against the real single-node cluster of `hack/cluster.sh` (Kubernetes
//! v1.20.2 on this machine), with kplug (2 replicas), the hello plugin (2
//! replicas) and `kplug-operator` as pods, instead of processes on
//! 127.0.0.1. `kplug_test_support::in_cluster::prepare` builds the images
//! and installs what is missing; the operator is its `WIDGETS` operator,
//! which is this bench's (the same group, namespace and concurrency).
//!
//! The pods' processes are read from `/proc` like the processes of the
//! other mode, and their memory around the run (at rest, the peak, after).
//! The namespaces `bench` and `baseline` are made anew for every run.
//!
//! It runs twice, each with its own report and baselines: with the
//! operator's reconciles through kube-apiserver, then straight to kplug
//! (`--kplug-url`, issue 29's direct path), the operator redeployed between.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use kplug_test_support::bench_mode::BenchMode;
use kplug_test_support::in_cluster::{
    self, MemoryRun, MemoryWatch, Node, OperatorRoute, Pod, WIDGETS,
};
use kplug_test_support::target_binary;

use crate::phases::measure;
use crate::report::{OperatorLog, Report, Setting, print_report};
use crate::{BASELINE_NAMESPACE, BUILD, Counts, GROUP, IN_FLIGHT, NAMESPACE, NAMESPACES};

/// The command that produces these numbers, as printed in the report.
const COMMAND: &str = "hack/cluster.sh up && \
                       KPLUG_BENCH_IN_CLUSTER=1 cargo bench -p kplug-operator --bench convergence";
/// How long the pods idle before their memory at rest is read, and how
/// often it is sampled during the run.
const SETTLE: Duration = Duration::from_secs(5);
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

pub fn main(mode: BenchMode, counts: Counts) -> Result<()> {
    ensure!(
        WIDGETS.group == GROUP
            && WIDGETS.namespace == NAMESPACE
            && WIDGETS.concurrency == IN_FLIGHT,
        "test-support's in_cluster::WIDGETS must be this bench's Widgets, namespace and concurrency"
    );
    // It makes the installation's certificates.
    let kplug_binary = target_binary("kplug-apiserver", BUILD)?;
    let node = Node::connect()?;
    let work = in_cluster::installation_dir(env!("CARGO_TARGET_TMPDIR"));
    let installation = in_cluster::prepare(&node, &kplug_binary, &work)?;
    let load_at_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    // Through kube-apiserver, then straight to kplug (`--kplug-url`): the
    // same phases, each with its own baseline, one report each.
    for route in [
        OperatorRoute::ThroughKubeApiserver,
        OperatorRoute::StraightToKplug,
    ] {
        // The objects of an earlier run go first, finalized by the operator
        // running now, before this route's operator is deployed: its log
        // holds this run's reconciles (the first route's pod may be the one
        // that finalized them, when prepare left it unchanged).
        eprintln!("making the namespaces {NAMESPACE} and {BASELINE_NAMESPACE} anew");
        node.kubectl(&[
            "delete",
            "namespace",
            NAMESPACE,
            BASELINE_NAMESPACE,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=5m",
        ])?;
        let operator = in_cluster::deploy_operator(&node, route)?;
        node.apply(NAMESPACES)?;
        run(
            &node,
            &installation,
            &operator,
            route,
            mode,
            counts,
            load_at_start.trim(),
        )?;
    }
    Ok(())
}

/// What a report on `route` is called, and its picture's name.
fn title(route: OperatorRoute) -> (&'static str, &'static str) {
    match route {
        OperatorRoute::ThroughKubeApiserver => (
            "In the cluster: the operator as a pod, apply → Ready and 1,000 objects",
            "convergence-in-cluster",
        ),
        OperatorRoute::StraightToKplug => (
            "In the cluster: the operator as a pod straight to kplug (`--kplug-url`), apply → Ready \
             and 1,000 objects",
            "convergence-in-cluster-straight-to-kplug",
        ),
    }
}

/// The phases with the operator pod `operator` sending its reconciles by
/// `route`, and their report.
fn run(
    node: &Node,
    installation: &in_cluster::Installation,
    operator: &Pod,
    route: OperatorRoute,
    mode: BenchMode,
    counts: Counts,
    load_at_start: &str,
) -> Result<()> {
    let named = |names: [&'static str; 2], pods: &[Pod]| -> Result<Vec<(&'static str, Pod)>> {
        ensure!(pods.len() == names.len(), "expected {} pods", names.len());
        Ok(names.into_iter().zip(pods.iter().cloned()).collect())
    };
    let kplug = named(["kplug-1", "kplug-2"], &installation.kplug)?;
    let plugins = named(["plugin-1", "plugin-2"], &installation.plugins)?;
    let operator_name = operator.name.clone();
    let operator = ("operator", operator.clone());
    let mut processes = vec![
        ("kube-apiserver", node.daemon_pid("kube-apiserver")?),
        ("etcd", node.daemon_pid("etcd")?),
    ];
    for (name, pod) in kplug.iter().chain([&operator]).chain(&plugins) {
        processes.push((name, pod.pid));
    }
    let pods: Vec<(&'static str, Pod)> = kplug
        .iter()
        .map(|(_, pod)| ("kplug", pod.clone()))
        .chain(plugins.iter().map(|(_, pod)| ("plugin", pod.clone())))
        .chain([operator])
        .collect();
    let plain: Vec<Pod> = pods.iter().map(|(_, pod)| pod.clone()).collect();

    eprintln!("letting the pods idle for {SETTLE:?}, then reading their memory at rest");
    std::thread::sleep(SETTLE);
    let at_rest = plain.iter().map(Pod::memory).collect::<Result<Vec<_>>>()?;
    let watch = MemoryWatch::start(&plain, SAMPLE_EVERY);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let results = runtime.block_on(measure(&node.kubeconfig()?, &processes, counts, None))?;
    let peak = watch.finish()?;
    let after = plain.iter().map(Pod::memory).collect::<Result<Vec<_>>>()?;

    let (title, plot) = title(route);
    let log_path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{plot}.log"));
    let log = node.kubectl(&["-n", "plugins", "logs", &operator_name])?;
    std::fs::write(&log_path, log).with_context(|| format!("writing {}", log_path.display()))?;
    eprintln!("the operator's log: {}", log_path.display());

    print_report(&Report {
        mode,
        results: &results,
        log: &OperatorLog::read(&log_path)?,
        processes: &processes,
        load_at_start,
        binaries: &[],
        setting: Setting {
            title,
            plot,
            shared_by: "the cluster (kube-apiserver, etcd, kubelet, containerd, the pods) and the \
                        bench",
            cluster: format!(
                "Kubernetes v1.20.2 of `hack/cluster.sh` (one node, this machine); images built \
                 from the tree at {} by `hack/images.sh build {}`; kplug and the plugin as README.md \
                 and examples/hello-rust/deploy/README.md install them; kplug-operator as one pod \
                 (`--concurrency {IN_FLIGHT}`, the shipped CPU limit 500m{})",
                in_cluster::tree()?,
                in_cluster::IMAGES.join(" "),
                match route {
                    OperatorRoute::ThroughKubeApiserver => "",
                    OperatorRoute::StraightToKplug =>
                        ", `--kplug-url https://kplug.kplug-system.svc`: its reconciles go to \
                         kplug's Service, as its ServiceAccount, not through kube-apiserver",
                }
            ),
            command: COMMAND,
        },
    })?;
    println!("### Memory of the pods\n");
    MemoryRun {
        pods,
        settle: SETTLE,
        every: SAMPLE_EVERY,
        at_rest,
        peak,
        after,
    }
    .print("the whole run above");
    Ok(())
}
