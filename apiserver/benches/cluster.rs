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
//!
//! Results go to stdout as Markdown (for BENCHMARKS.md), progress to stderr.
//! Run with `cargo build --release -p kplug-apiserver -p kplug-example-hello
//! && cargo bench -p kplug-apiserver --bench cluster`.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use kplug_test_support::{
    AggregatedKplug, ControlPlane, Installation, KUBECTL, Process, hello_plugin_command,
    plugin_identity, target_binary,
};
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use kplug_test_support::measure::{CpuSnapshot, Latencies, process_cpu_time};
use kplug_test_support::report::{micros, size, thousands};
use support::{ApiClient, STARTUP_TIMEOUT, join_all, print_machine, tls_config};

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

/// Requests in flight on the one HTTP/2 connection during the list runs.
const IN_FLIGHT: usize = 32;
/// Untimed lists per server before the timed ones.
const LIST_WARMUP: usize = 1_000;
/// Timed rounds, alternating warm and cold, and lists per server per round.
const LIST_ROUNDS: usize = 3;
const LISTS_PER_ROUND: usize = 20_000;
/// Size of the reconciled object's compact JSON.
const OBJECT_BYTES: usize = 1024;
/// Untimed and timed reconciles per route (one in flight).
const RECONCILE_WARMUP: usize = 100;
const RECONCILES: usize = 2_000;

/// Upper bound of a phase and of a wait for the cluster, so that a wedged
/// process fails the run instead of hanging it.
const PHASE_TIMEOUT: Duration = Duration::from_secs(180);
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(60);

fn main() -> Result<()> {
    let kplug_binary = target_binary("kplug-apiserver", BUILD)?;
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
    let warm = start_kplug(&installation, "warm", "10s");
    let cold = start_kplug(&installation, "cold", "0s");
    warm.register(&cluster);

    // The plugin, registered with both kplug processes under one name.
    cluster.kubectl_ok(&["create", "namespace", "plugins"]);
    let plugin_token = plugin_identity(&cluster, PLUGIN, Some(PLUGIN), work.path());
    let _hello_warm = hello_plugin(&warm, &plugin_token);
    let _hello_cold = hello_plugin(&cold, &plugin_token);

    cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        READER,
        "--clusterrole=kplug:reader",
        &format!("--user={READER}"),
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
        let lists = list_runs(&env, &warm, &cold, kube_apiserver_pid).await?;
        let reconciles = reconcile_runs(&env, &warm).await?;
        anyhow::Ok((lists, reconciles))
    })?;
    for (name, kplug) in [("warm", &warm), ("cold", &cold)] {
        report_errors(name, kplug);
    }

    let others = usage_before.usage()?.other_load();
    let apiserver_binary = PathBuf::from(cluster.var("KPLUG_APISERVER_BIN"));
    print_machine(
        &[
            ("kplug", &kplug_binary),
            ("Plugin", &hello_binary),
            ("kube-apiserver", &apiserver_binary),
        ],
        COMMAND,
        others,
    )?;
    println!(
        "kube-apiserver {} and etcd from `hack/control-plane.sh` run on the same machine; they are \
         not children of the bench, so their CPU time counts as \"other processes\" above.\n",
        cluster.var("KPLUG_APISERVER_VERSION")
    );
    print_lists(&lists);
    print_reconciles(&reconciles);
    Ok(())
}

// ---------------------------------------------------------------------------
// Processes

/// `kplug-apiserver serve` with every auth cache TTL set to `cache_ttl`,
/// waited for until it serves and trusts the front proxy.
fn start_kplug(installation: &Installation, name: &str, cache_ttl: &str) -> AggregatedKplug {
    let kplug = AggregatedKplug::serve(
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
    kplug.log.wait_for(
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

// ---------------------------------------------------------------------------
// Clients

/// Certificates and addresses the clients need.
struct Endpoints {
    kplug_ca: Vec<u8>,
    front_proxy_cert: Vec<u8>,
    front_proxy_key: Vec<u8>,
    cluster_ca: Vec<u8>,
    admin_cert: Vec<u8>,
    admin_key: Vec<u8>,
    apiserver: SocketAddr,
}

impl Endpoints {
    /// Straight to kplug as the front proxy asserting `user` in `group`.
    async fn front_proxy(
        &self,
        kplug: &AggregatedKplug,
        user: &str,
        group: &str,
    ) -> Result<ApiClient> {
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static("x-remote-user"),
            HeaderValue::from_str(user)?,
        );
        headers.insert(
            HeaderName::from_static("x-remote-group"),
            HeaderValue::from_str(group)?,
        );
        let config = tls_config(
            &self.kplug_ca,
            &self.front_proxy_cert,
            &self.front_proxy_key,
        )?;
        let address = SocketAddr::from(([127, 0, 0, 1], kplug.https));
        ApiClient::connect_with(address, localhost()?, config, headers).await
    }

    /// To kube-apiserver with the admin (system:masters) client certificate.
    async fn apiserver_admin(&self) -> Result<ApiClient> {
        let config = tls_config(&self.cluster_ca, &self.admin_cert, &self.admin_key)?;
        ApiClient::connect_with(self.apiserver, localhost()?, config, HeaderMap::new()).await
    }
}

fn localhost() -> Result<ServerName<'static>> {
    ServerName::try_from("localhost").context("the server name localhost")
}

/// Waits (asynchronously) until `check` succeeds.
async fn wait_for<F, Fut>(what: &str, within: Duration, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let deadline = Instant::now() + within;
    loop {
        match check().await {
            Ok(()) => return Ok(()),
            Err(last) if Instant::now() > deadline => {
                bail!("{what} not reached within {within:?}: {last:#}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

// ---------------------------------------------------------------------------
// Lists: the SubjectAccessReview cache

struct ListRun {
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

async fn list_runs(
    env: &Endpoints,
    warm: &AggregatedKplug,
    cold: &AggregatedKplug,
    apiserver_pid: u32,
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
        list_load(&client, LIST_WARMUP).await?;
    }

    let mut metrics = env.apiserver_admin().await?;
    let mut reviews = [0.0; 2];
    let mut samples: [Vec<Duration>; 2] = Default::default();
    let mut elapsed = [Duration::ZERO; 2];
    let mut kplug_cpu = [Duration::ZERO; 2];
    let mut apiserver_cpu = [Duration::ZERO; 2];
    for round in 0..LIST_ROUNDS {
        for (index, (label, kplug, client)) in servers.iter().enumerate() {
            eprintln!(
                "round {}: {LISTS_PER_ROUND} lists on kplug {label}",
                round + 1
            );
            let reviews_before = subject_access_reviews(&mut metrics).await?;
            let (kplug_before, apiserver_before) = (
                process_cpu_time(kplug.pid())?,
                process_cpu_time(apiserver_pid)?,
            );
            let started = Instant::now();
            let run = list_load(client, LISTS_PER_ROUND).await?;
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

// ---------------------------------------------------------------------------
// Reconciles: the kube-apiserver hop

struct ReconcileRuns {
    request_bytes: usize,
    via_apiserver: Latencies,
    direct: Latencies,
}

/// A Greeting whose compact JSON is exactly `bytes` long.
fn object_of_size(bytes: usize) -> Result<Value> {
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

async fn reconcile_runs(env: &Endpoints, warm: &AggregatedKplug) -> Result<ReconcileRuns> {
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
        for _ in 0..RECONCILE_WARMUP {
            reconcile(route, &body).await?;
        }
    }
    eprintln!("{RECONCILES} reconciles per route, alternating");
    let mut samples: [Vec<Duration>; 2] = Default::default();
    let deadline = Instant::now() + PHASE_TIMEOUT;
    for round in 0..RECONCILES {
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

// ---------------------------------------------------------------------------
// The report

fn print_lists(runs: &[ListRun]) {
    println!("## Authorized lists: SubjectAccessReview cache warm versus cold\n");
    println!(
        "`GET {PLUGINS_PATH}` (1 plugin registered, the real hello-plugin; a {} JSON body) straight \
         to kplug over one HTTP/2 TLS connection with the front-proxy client certificate, as \
         `X-Remote-User: {READER}` (bound to `kplug:reader`), `X-Remote-Group: system:authenticated`, \
         {IN_FLIGHT} requests in flight; {LIST_ROUNDS} rounds of {} lists per kplug, alternating, \
         after {} untimed. Cold: every request is one SubjectAccessReview to kube-apiserver.\n",
        size(runs.first().map_or(0, |run| run.bytes)),
        thousands(LISTS_PER_ROUND),
        thousands(LIST_WARMUP),
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

fn print_reconciles(runs: &ReconcileRuns) {
    println!("## Reconcile: through kube-apiserver versus straight to kplug\n");
    println!(
        "`POST {RECONCILE_PATH}` with a {} Reconcile (a {OBJECT_BYTES}-byte object), one at a time, \
         {} per route alternating, after {RECONCILE_WARMUP} untimed; kplug calls the hello-plugin \
         over gRPC. Through kube-apiserver: the admin client certificate, proxied by the aggregator. \
         Straight: the front-proxy certificate as `admin` in `system:masters` (no SubjectAccessReview \
         on either route).\n",
        size(runs.request_bytes),
        thousands(RECONCILES),
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
