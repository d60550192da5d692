//! Cluster-mode benchmark: kplug as an aggregated API server of a REAL
//! kube-apiserver v1.20.2 and etcd (`hack/control-plane.sh`), with the
//! shipped RBAC (`deploy/`) and APIService (`apiservice/render.sh`), kplug
//! running `serve` as its own ServiceAccount. Everything is a separate
//! process on 127.0.0.1. It measures, in one run:
//!
//! 1. **The SubjectAccessReview cache, warm versus cold.** Two kplug
//!    processes share the control plane: one with the default cache TTLs
//!    (10 s), one with every TTL 0 s (no caching: one SubjectAccessReview
//!    to kube-apiserver per request). Each has the same plugin registered
//!    (the real `hello-plugin`, heartbeating over gRPC/TLS with a
//!    ServiceAccount token). `GET .../plugins` goes straight to kplug over
//!    one HTTP/2 TLS connection with the front-proxy client certificate and
//!    `X-Remote-User: bench-reader` (bound to the shipped `kplug:reader`),
//!    `X-Remote-Group: system:authenticated`, with `IN_FLIGHT` requests in
//!    flight, alternating the two servers in rounds.
//! 2. **The kube-apiserver hop.** The same ~1 KiB Reconcile POSTed, one at
//!    a time, (a) to kube-apiserver with the admin client certificate, which
//!    proxies it to kplug through the APIService, and (b) straight to kplug
//!    with the front-proxy certificate as `admin` in `system:masters` (as
//!    the aggregator does). kplug skips the SubjectAccessReview for
//!    `system:masters`, so the difference is the hop.
//! 3. **The object checks, cache warm.** The same Reconcile straight to
//!    kplug as `bench-operator`, who holds `kplug:operator` and `update
//!    greetings/status` (a Greeting CRD is installed), so kplug checks the
//!    URL and the object with SubjectAccessReviews, cached. With
//!    `KPLUG_BASELINE=REV`, a kplug built at REV (before the object checks)
//!    serves beside on the same control plane, with its own hello plugin,
//!    and the same requests alternate between the two: the ratio is what
//!    the object checks cost.
//!
//! Results go to stdout as Markdown (for BENCHMARKS.md), progress to stderr.
//! Run with `cargo build --release -p kplug-apiserver -p kplug-example-hello
//! && cargo bench -p kplug-apiserver --bench cluster`.
//!
//! `clients` dials kplug and kube-apiserver; `lists` and `reconciles`
//! measure and report one part each. With `KPLUG_BENCH_IN_CLUSTER=1` it
//! measures kplug and the plugin as pods on the real cluster of
//! `hack/cluster.sh` instead (`in_cluster`).

mod clients;
mod in_cluster;
mod lists;
mod reconciles;
#[path = "../support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use kplug_test_support::bench_mode::BenchMode;
use kplug_test_support::measure::CpuSnapshot;
use kplug_test_support::{
    AggregatedKplug, ControlPlane, Installation, KUBECTL, Process, hello_plugin_command,
    plugin_identity, target_binary,
};

use clients::Endpoints;
use lists::{list_runs, print_lists};
use reconciles::{print_reconciles, reconcile_runs};
use support::{BASELINE_VARIABLE, STARTUP_TIMEOUT, baseline_from_env, print_machine};

/// Builds both binaries measured here.
const BUILD: &str = "cargo build --release -p kplug-apiserver -p kplug-example-hello";
/// The command that produces these numbers, as printed in the report.
const COMMAND: &str = "cargo build --release -p kplug-apiserver -p kplug-example-hello && \
                       cargo bench -p kplug-apiserver --bench cluster";

const PLUGINS_PATH: &str = "/apis/plugins.kplug.io/v1alpha1/plugins";
/// The plugin registered with both kplug processes.
const PLUGIN: &str = "bench-hello";
const RECONCILE_PATH: &str = "/apis/plugins.kplug.io/v1alpha1/plugins/bench-hello/reconcile";
/// The user bound to `kplug:reader` for the list runs.
const READER: &str = "bench-reader";
/// The user bound to `kplug:operator` and [`GREETINGS_CONTROLLER`] for
/// the reconciles whose objects kplug checks.
const OPERATOR: &str = "bench-operator";
/// The reconciled object's kind, served, and a controller's rights on it.
const GREETINGS_CONTROLLER: &str = r"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: greetings.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {kind: Greeting, listKind: GreetingList, plural: greetings, singular: greeting}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: greetings-controller}
rules:
- {apiGroups: [example.com], resources: [greetings/status], verbs: [update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: bench-operator-greetings}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: greetings-controller}
subjects: [{kind: User, name: bench-operator}]
";

/// Requests in flight on the one HTTP/2 connection during the list runs.
const IN_FLIGHT: usize = 32;
/// Size of the reconciled object's compact JSON.
const OBJECT_BYTES: usize = 1024;

/// How many requests a run makes.
#[derive(Clone, Copy)]
struct Counts {
    /// Untimed lists per server before the timed ones.
    list_warmup: usize,
    /// Timed rounds, alternating warm and cold, and lists per server per round.
    list_rounds: usize,
    lists_per_round: usize,
    /// Untimed and timed reconciles per route (one in flight).
    reconcile_warmup: usize,
    reconciles: usize,
}

impl Counts {
    fn of(mode: BenchMode) -> Self {
        mode.pick(
            Self {
                list_warmup: 1_000,
                list_rounds: 3,
                lists_per_round: 20_000,
                reconcile_warmup: 100,
                reconciles: 2_000,
            },
            Self {
                list_warmup: 10,
                list_rounds: 1,
                lists_per_round: 4 * IN_FLIGHT,
                reconcile_warmup: 2,
                reconciles: 20,
            },
        )
    }
}

/// Upper bound of a phase and of a wait for the cluster, so that a wedged
/// process fails the run instead of hanging it.
const PHASE_TIMEOUT: Duration = Duration::from_secs(180);
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(60);

fn main() -> Result<()> {
    let mode = BenchMode::from_args();
    if kplug_test_support::in_cluster::requested() {
        return in_cluster::main(mode);
    }
    let counts = Counts::of(mode);
    let kplug_binary = target_binary("kplug-apiserver", BUILD)?;
    let baseline = baseline_from_env()?;
    let hello_binary = target_binary("hello-plugin", BUILD)?;
    ensure!(Path::new(KUBECTL).exists(), "{KUBECTL} is missing");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let usage_before = CpuSnapshot::now(&[])?;

    // Dropped in reverse order: plugins, kplugs, the control plane, the directory.
    let work = tempfile::Builder::new()
        .prefix("kplug-bench-cluster-")
        .tempdir_in("/tmp")
        .context("creating a work directory")?;
    eprintln!("starting the control plane (etcd + kube-apiserver)");
    let cluster = ControlPlane::start(work.path().join("cp"));
    let kube_apiserver_pid: u32 = cluster.var("KPLUG_APISERVER_PID").parse()?;

    // The shipped RBAC, kplug's identity and serving certificate; two kplugs,
    // the warm one behind the APIService.
    let installation = Installation::install(&cluster, work.path());
    let warm = start_kplug(&kplug_binary, &installation, "warm", "10s");
    let cold = start_kplug(&kplug_binary, &installation, "cold", "0s");
    let before = baseline
        .as_ref()
        .map(|(binary, rev)| start_kplug(binary, &installation, &format!("at {rev}"), "10s"));
    warm.register(&cluster);

    // The plugin, registered with both kplug processes under one name.
    cluster.kubectl_ok(&["create", "namespace", "plugins"]);
    let plugin_token = plugin_identity(&cluster, PLUGIN, Some(PLUGIN), work.path());
    let _hello_warm = hello_plugin(&warm, &plugin_token);
    let _hello_cold = hello_plugin(&cold, &plugin_token);
    let _hello_before = before
        .as_ref()
        .map(|kplug| hello_plugin(kplug, &plugin_token));

    cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        READER,
        "--clusterrole=kplug:reader",
        &format!("--user={READER}"),
    ]);
    cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        OPERATOR,
        "--clusterrole=kplug:operator",
        &format!("--user={OPERATOR}"),
    ]);
    cluster.apply(GREETINGS_CONTROLLER);
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "crd/greetings.example.com",
        "--timeout=60s",
    ]);

    let env = Endpoints {
        kplug_ca: std::fs::read(installation.certs.join("ca.crt"))?,
        front_proxy_cert: std::fs::read(cluster.var("KPLUG_FRONT_PROXY_CLIENT_CERT"))?,
        front_proxy_key: std::fs::read(cluster.var("KPLUG_FRONT_PROXY_CLIENT_KEY"))?,
        cluster_ca: std::fs::read(cluster.var("KPLUG_CA_CERT"))?,
        admin_cert: std::fs::read(cluster.var("KPLUG_ADMIN_CERT"))?,
        admin_key: std::fs::read(cluster.var("KPLUG_ADMIN_KEY"))?,
        apiserver: SocketAddr::new(
            cluster.var("KPLUG_APISERVER_HOST").parse()?,
            cluster.var("KPLUG_APISERVER_PORT").parse()?,
        ),
    };
    let (lists, reconciles) = runtime.block_on(async {
        let lists = list_runs(&env, &warm, &cold, kube_apiserver_pid, counts).await?;
        let reconciles = reconcile_runs(&env, &warm, before.as_ref(), counts).await?;
        anyhow::Ok((lists, reconciles))
    })?;
    for (name, kplug) in [("warm", &warm), ("cold", &cold)]
        .into_iter()
        .chain(before.as_ref().map(|kplug| ("baseline", kplug)))
    {
        report_errors(name, kplug);
    }

    let others = usage_before.usage()?.other_load();
    let apiserver_binary = PathBuf::from(cluster.var("KPLUG_APISERVER_BIN"));
    let command = match &baseline {
        Some((_, rev)) => format!("{BASELINE_VARIABLE}={rev} {COMMAND}"),
        None => COMMAND.to_owned(),
    };
    let mut binaries = vec![
        ("kplug", kplug_binary.as_path()),
        ("Plugin", hello_binary.as_path()),
        ("kube-apiserver", apiserver_binary.as_path()),
    ];
    if let Some((binary, _)) = &baseline {
        binaries.push(("kplug (baseline)", binary.as_path()));
    }
    print_machine(&binaries, &command, others)?;
    println!(
        "kube-apiserver {} and etcd from `hack/control-plane.sh` run on the same machine; they are \
         not children of the bench, so their CPU time counts as \"other processes\" above.\n",
        cluster.var("KPLUG_APISERVER_VERSION")
    );
    if let Some(warning) = mode.warning() {
        println!("{warning}");
    }
    print_lists(&lists, counts);
    print_reconciles(
        &reconciles,
        counts,
        baseline.as_ref().map(|(_, rev)| rev.as_str()),
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Processes

/// `kplug-apiserver serve` with every auth cache TTL set to `cache_ttl`,
/// waited for until it serves and trusts the front proxy.
fn start_kplug(
    binary: &Path,
    installation: &Installation,
    name: &str,
    cache_ttl: &str,
) -> AggregatedKplug {
    let kplug = AggregatedKplug::serve_binary(
        binary,
        installation,
        &[
            "--authentication-cache-ttl",
            cache_ttl,
            "--authorization-allowed-cache-ttl",
            cache_ttl,
            "--authorization-denied-cache-ttl",
            cache_ttl,
            "--log",
            "info",
        ],
    );
    // The line may come before kplug serves: wait_for_log reads those too.
    kplug.wait_for_log(
        STARTUP_TIMEOUT,
        &format!("kplug ({name}) trusting the front-proxy CA"),
        |line| {
            line.contains("loaded kube-system/extension-apiserver-authentication")
                && line.contains("front_proxy=true")
        },
    );
    eprintln!(
        "started kplug {name} (pid {}, cache TTLs {cache_ttl}): https {}, grpc {}",
        kplug.pid(),
        kplug.https,
        kplug.grpc
    );
    kplug
}

/// The hello plugin heartbeating to `kplug` as `PLUGIN` every 5 s, quietly.
fn hello_plugin(kplug: &AggregatedKplug, token: &Path) -> Process {
    Process::spawn(
        hello_plugin_command(kplug, PLUGIN, token)
            .args(["--heartbeat-interval", "5"])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "hello-plugin",
    )
}

/// Echoes the errors kplug logged during the run (its log is only read here).
fn report_errors(name: &str, kplug: &AggregatedKplug) {
    for line in kplug.log.drain() {
        if line.contains("ERROR") {
            eprintln!("kplug {name}: {line}");
        }
    }
}
