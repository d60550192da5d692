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

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use support::{
    ApiClient, CpuUsage, Latencies, STARTUP_TIMEOUT, join_all, micros, print_machine,
    process_cpu_time, size, thousands, tls_config,
};

/// Builds both binaries measured here.
const BUILD: &str = "cargo build --release -p kplug-apiserver -p kplug-example-hello";
/// The command that produces these numbers, as printed in the report.
const COMMAND: &str = "cargo build --release -p kplug-apiserver -p kplug-example-hello && \
                       cargo bench -p kplug-apiserver --bench cluster";
const KUBECTL: &str = "/usr/bin/kubectl";

const GROUP_VERSION: &str = "/apis/plugins.kplug.io/v1alpha1";
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
    let kplug_binary = support::release_binary("kplug-apiserver", BUILD)?;
    let hello_binary = support::release_binary("hello-plugin", BUILD)?;
    ensure!(Path::new(KUBECTL).exists(), "{KUBECTL} is missing");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let usage_before = CpuUsage::now()?;

    // Dropped in reverse order: plugins, kplugs, the control plane, the directory.
    let work = tempfile::Builder::new()
        .prefix("kplug-bench-cluster-")
        .tempdir_in("/tmp")
        .context("creating a work directory")?;
    eprintln!("starting the control plane (etcd + kube-apiserver)");
    let cluster = ControlPlane::start(work.path().join("cp"))?;
    let kube_apiserver_pid: u32 = cluster.var("KPLUG_APISERVER_PID")?.parse()?;

    // The shipped RBAC, kplug's identity and serving certificate.
    let deploy = repo_root().join("deploy");
    cluster.kubectl_ok(&["apply", "-k", &deploy.to_string_lossy()])?;
    let kplug_token = cluster.token("kplug-system", "kplug")?;
    let kubeconfig = work.path().join("kplug.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: '{}', certificate-authority: '{}'}}\nusers:\n- name: kplug\n  user: {{token: '{kplug_token}'}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: kplug}}\ncurrent-context: c\n",
            cluster.var("KPLUG_APISERVER_URL")?,
            cluster.var("KPLUG_CA_CERT")?,
        ),
    )?;
    let certs = work.path().join("kplug-certs");
    let output = Command::new(&kplug_binary)
        .args([
            "certs",
            "--service",
            "kplug",
            "--namespace",
            "kplug-system",
            "--out-dir",
        ])
        .arg(&certs)
        .output()
        .context("kplug-apiserver certs")?;
    ensure!(output.status.success(), "certs: {}", text(&output));

    let warm = Kplug::start(&kplug_binary, &kubeconfig, &certs, "warm", "10s")?;
    let cold = Kplug::start(&kplug_binary, &kubeconfig, &certs, "cold", "0s")?;
    register_apiservice(&cluster, &certs, warm.https.port())?;

    // The plugin, registered with both kplug processes under one name.
    cluster.kubectl_ok(&["create", "namespace", "plugins"])?;
    cluster.kubectl_ok(&["create", "serviceaccount", PLUGIN, "-n", "plugins"])?;
    cluster.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: 'kplug:plugin:{PLUGIN}'}}\nrules:\n- {{apiGroups: [plugins.kplug.io], resources: [plugins/heartbeat], verbs: [create], resourceNames: [{PLUGIN}]}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: 'kplug:plugin:{PLUGIN}'}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'kplug:plugin:{PLUGIN}'}}\nsubjects:\n- {{kind: ServiceAccount, name: {PLUGIN}, namespace: plugins}}\n"
    ))?;
    let plugin_token = work.path().join("plugin.token");
    std::fs::write(&plugin_token, cluster.token("plugins", PLUGIN)?)?;
    let _hello_warm = hello_plugin(&hello_binary, &warm, &certs, &plugin_token)?;
    let _hello_cold = hello_plugin(&hello_binary, &cold, &certs, &plugin_token)?;

    cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        READER,
        "--clusterrole=kplug:reader",
        &format!("--user={READER}"),
    ])?;

    let env = Endpoints {
        kplug_ca: std::fs::read(certs.join("ca.crt"))?,
        front_proxy_cert: std::fs::read(cluster.var("KPLUG_FRONT_PROXY_CLIENT_CERT")?)?,
        front_proxy_key: std::fs::read(cluster.var("KPLUG_FRONT_PROXY_CLIENT_KEY")?)?,
        cluster_ca: std::fs::read(cluster.var("KPLUG_CA_CERT")?)?,
        admin_cert: std::fs::read(cluster.var("KPLUG_ADMIN_CERT")?)?,
        admin_key: std::fs::read(cluster.var("KPLUG_ADMIN_KEY")?)?,
        apiserver: SocketAddr::new(
            cluster.var("KPLUG_APISERVER_HOST")?.parse()?,
            cluster.var("KPLUG_APISERVER_PORT")?.parse()?,
        ),
    };
    let (lists, reconciles) = runtime.block_on(async {
        let lists = list_runs(&env, &warm, &cold, kube_apiserver_pid).await?;
        let reconciles = reconcile_runs(&env, &warm).await?;
        anyhow::Ok((lists, reconciles))
    })?;

    let others = CpuUsage::now()?.others_since(&usage_before);
    let apiserver_binary = PathBuf::from(cluster.var("KPLUG_APISERVER_BIN")?);
    print_machine(
        &[
            ("kplug", &kplug_binary),
            ("Plugin", &hello_binary),
            ("kube-apiserver", &apiserver_binary),
        ],
        COMMAND,
        &others,
    )?;
    println!(
        "kube-apiserver {} and etcd from `hack/control-plane.sh` run on the same machine; they are \
         not children of the bench, so their CPU time counts as \"other processes\" above.\n",
        cluster.var("KPLUG_APISERVER_VERSION")?
    );
    print_lists(&lists);
    print_reconciles(&reconciles);
    Ok(())
}

// ---------------------------------------------------------------------------
// Processes

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A loopback port nothing listens on right now.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Polls `check` every 250 ms until it succeeds or `within` passes.
fn wait_until(what: &str, within: Duration, mut check: impl FnMut() -> Result<()>) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(last) if Instant::now() > deadline => {
                bail!("{what} not reached within {within:?}: {last:#}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// A child process, killed when dropped (also on a panic or an error).
struct Process {
    child: Child,
    name: &'static str,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        eprintln!("stopped {} (pid {})", self.name, self.child.id());
    }
}

/// etcd and kube-apiserver from `hack/control-plane.sh`, stopped on drop.
struct ControlPlane {
    dir: PathBuf,
    env: HashMap<String, String>,
}

impl ControlPlane {
    fn start(dir: PathBuf) -> Result<Self> {
        // Own the directory before anything can fail, so Drop stops whatever started.
        let mut cluster = Self {
            dir,
            env: HashMap::new(),
        };
        let status = Command::new(repo_root().join("hack/control-plane.sh"))
            .arg("start")
            .arg(&cluster.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .context("running hack/control-plane.sh")?;
        ensure!(status.success(), "the control plane did not start");
        cluster.env = std::fs::read_to_string(cluster.dir.join("env"))
            .context("reading the control plane's env")?
            .lines()
            .filter_map(|l| {
                let l = l.strip_prefix("export ").unwrap_or(l);
                let (k, v) = l.split_once('=')?;
                Some((
                    k.to_owned(),
                    v.trim_matches(|c| c == '"' || c == '\'').to_owned(),
                ))
            })
            .collect();
        Ok(cluster)
    }

    fn var(&self, name: &str) -> Result<String> {
        self.env
            .get(name)
            .cloned()
            .with_context(|| format!("{name} missing from the control plane's env"))
    }

    fn kubectl(&self, args: &[&str]) -> Result<Output> {
        Command::new(KUBECTL)
            .arg("--kubeconfig")
            .arg(self.var("KPLUG_KUBECONFIG")?)
            .args(["--request-timeout", "20s"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running kubectl")
    }

    fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        let output = self.kubectl(args)?;
        ensure!(
            output.status.success(),
            "kubectl {args:?}: {}",
            text(&output)
        );
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    fn apply(&self, yaml: &str) -> Result<()> {
        let file = self.dir.join(format!("apply-{}.yaml", free_port()?));
        std::fs::write(&file, yaml)?;
        self.kubectl_ok(&["apply", "-f", &file.to_string_lossy()])?;
        Ok(())
    }

    /// A ServiceAccount token (1 h) from the TokenRequest API.
    fn token(&self, namespace: &str, service_account: &str) -> Result<String> {
        let request = self.dir.join("token-request.json");
        std::fs::write(
            &request,
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}).to_string(),
        )?;
        let path =
            format!("/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token");
        let answer: Value = serde_json::from_str(&self.kubectl_ok(&[
            "create",
            "--raw",
            &path,
            "-f",
            &request.to_string_lossy(),
        ])?)?;
        answer["status"]["token"]
            .as_str()
            .map(str::to_owned)
            .context("no token in the TokenRequest answer")
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        eprintln!("stopping the control plane");
        let _ = Command::new(repo_root().join("hack/control-plane.sh"))
            .arg("stop")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status();
    }
}

/// `kplug-apiserver serve` in cluster mode.
struct Kplug {
    process: Process,
    https: SocketAddr,
    grpc: SocketAddr,
}

impl Kplug {
    /// Starts kplug with every auth cache TTL set to `cache_ttl`, and waits
    /// until it serves and trusts the front proxy.
    fn start(
        binary: &Path,
        kubeconfig: &Path,
        certs: &Path,
        name: &'static str,
        cache_ttl: &str,
    ) -> Result<Self> {
        let https = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let grpc = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let mut child = Command::new(binary)
            .arg("serve")
            .args(["--listen", &https.to_string()])
            .args(["--grpc-listen", &grpc.to_string()])
            .arg("--tls-cert-file")
            .arg(certs.join("tls.crt"))
            .arg("--tls-private-key-file")
            .arg(certs.join("tls.key"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--authentication-cache-ttl", cache_ttl])
            .args(["--authorization-allowed-cache-ttl", cache_ttl])
            .args(["--authorization-denied-cache-ttl", cache_ttl])
            .args(["--log", "info"])
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let stderr = child.stderr.take().context("kplug's stderr")?;
        let kplug = Self {
            process: Process { child, name },
            https,
            grpc,
        };
        // Drain stderr for the whole run; report the two lines waited for.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let (mut serving, mut trusted) = (false, false);
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                serving |= line.contains("kplug is serving");
                trusted |= line.contains("loaded kube-system/extension-apiserver-authentication")
                    && line.contains("front_proxy=true");
                if line.contains("ERROR") {
                    eprintln!("kplug {name}: {line}");
                }
                if serving && trusted {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(STARTUP_TIMEOUT).with_context(|| {
            format!(
                "kplug ({name}) did not serve with the front-proxy CA within {STARTUP_TIMEOUT:?}"
            )
        })?;
        eprintln!(
            "started kplug {name} (pid {}, cache TTLs {cache_ttl}): https {https}, grpc {grpc}",
            kplug.process.child.id()
        );
        Ok(kplug)
    }

    fn pid(&self) -> u32 {
        self.process.child.id()
    }
}

fn hello_plugin(binary: &Path, kplug: &Kplug, certs: &Path, token: &Path) -> Result<Process> {
    let child = Command::new(binary)
        .args([
            "--registry",
            &format!("https://localhost:{}", kplug.grpc.port()),
        ])
        .args(["--name", PLUGIN])
        .args(["--address", &format!("127.0.0.1:{}", free_port()?)])
        .args(["--interval", "5"])
        .arg("--registry-ca-file")
        .arg(certs.join("ca.crt"))
        .arg("--token-file")
        .arg(token)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting hello-plugin")?;
    Ok(Process {
        child,
        name: "hello-plugin",
    })
}

/// The shipped APIService, pointing through an ExternalName Service at
/// kplug on localhost:`port`; waits until kube-apiserver proxies the group.
fn register_apiservice(cluster: &ControlPlane, certs: &Path, port: u16) -> Result<()> {
    cluster.kubectl_ok(&["-n", "kplug-system", "delete", "service", "kplug"])?;
    cluster.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: kplug, namespace: kplug-system}}\nspec:\n  type: ExternalName\n  externalName: localhost\n  ports:\n  - {{name: https, port: {port}}}\n"
    ))?;
    let rendered = Command::new(repo_root().join("apiservice/render.sh"))
        .arg(certs.join("ca.crt"))
        .args(["kplug", "kplug-system", &port.to_string()])
        .output()
        .context("apiservice/render.sh")?;
    ensure!(rendered.status.success(), "{}", text(&rendered));
    cluster.apply(&String::from_utf8_lossy(&rendered.stdout))?;
    wait_until("APIService Available=True", CLUSTER_TIMEOUT, || {
        let out = cluster.kubectl_ok(&[
            "get",
            "apiservice",
            "v1alpha1.plugins.kplug.io",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
        ])?;
        ensure!(out.trim() == "True", "Available={out}");
        Ok(())
    })?;
    wait_until(
        "the group served through kube-apiserver",
        CLUSTER_TIMEOUT,
        || {
            cluster.kubectl_ok(&["get", "--raw", GROUP_VERSION])?;
            Ok(())
        },
    )
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
    async fn front_proxy(&self, kplug: &Kplug, user: &str, group: &str) -> Result<ApiClient> {
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
        ApiClient::connect_with(kplug.https, localhost()?, config, headers).await
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
    warm: &Kplug,
    cold: &Kplug,
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

async fn reconcile_runs(env: &Endpoints, warm: &Kplug) -> Result<ReconcileRuns> {
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
