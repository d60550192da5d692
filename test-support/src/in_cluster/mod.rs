//! kplug, the hello plugin and the zero-code operator as pods on the real
//! single-node cluster of `hack/cluster.sh` (Kubernetes v1.20.2 on this
//! machine), for the benches' in-cluster mode (`KPLUG_BENCH_IN_CLUSTER=1`).
//!
//! [`prepare`] installs what the benches measure, once per cluster: the
//! images built from the tree by `hack/images.sh`, kplug by README.md's
//! steps and the hello plugin by examples/hello-rust/deploy/README.md's
//! (both through `hack/tests/install.py --example hello`), the hello plugin
//! serving the benches' Widgets, and `kplug-operator` for Widgets as a pod.
//! [`Pod`] reads a pod's process and cgroups from the node, which is this
//! machine; [`client_pod`] starts the pod a bench calls from.
//!
//! The cluster outlives the bench (`hack/cluster.sh down` ends it), so
//! nothing here is undone on drop; like [`crate::measure`], everything
//! returns errors instead of panicking.

mod client;
mod operator;

pub use operator::OperatorRoute;
mod pods;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;

pub use client::{CLIENT, CLIENT_NAMESPACE, client_pod};
pub use pods::{MemoryRun, MemoryWatch, Pod, PodMemory};

use crate::kubectl::KUBECTL;
use crate::process::output_text;
use crate::widgets::widget_crd;
use crate::workspace::repo_root;
pub use crate::workspace::tree;

/// Set (to anything but empty or 0), the benches that know it measure the
/// cluster of `hack/cluster.sh env` instead of starting processes.
pub const VARIABLE: &str = "KPLUG_BENCH_IN_CLUSTER";
/// The images the pods run, built from the tree before a run.
pub const IMAGES: [&str; 3] = ["kplug-apiserver", "kplug-operator", "hello-plugin"];
/// The hello plugin's name (its ClusterRole allows no other).
pub const PLUGIN: &str = "hello";
/// The names kplug's and the plugin's serving certificates carry.
pub const KPLUG_SERVER_NAME: &str = "kplug.kplug-system.svc";
pub const PLUGIN_SERVER_NAME: &str = "hello-plugin.plugins.svc";
/// The ports kplug's API and the plugin's gRPC listen on in their pods.
pub const KPLUG_PORT: u16 = 8443;
pub const PLUGIN_PORT: u16 = 50051;

const APISERVICE: &str = "v1alpha1.plugins.kplug.io";
const PLUGINS_NS: &str = "plugins";
const KPLUG_NS: &str = "kplug-system";
/// Upper bound of each wait for the cluster.
const WAIT: Duration = Duration::from_secs(300);

/// Set, the folder kplug is installed from (a work folder of
/// `hack/tests/install.py`, such as the cluster tests' installation): the
/// benches measure that installation, adding what is missing, instead of
/// making their own.
pub const INSTALLATION_VARIABLE: &str = "KPLUG_BENCH_INSTALLATION";

/// The folder of the installation the benches measure: [`INSTALLATION_VARIABLE`]'s,
/// else `kplug-in-cluster` in `target_tmpdir` (the bench's `CARGO_TARGET_TMPDIR`).
pub fn installation_dir(target_tmpdir: &str) -> PathBuf {
    named_installation_dir().unwrap_or_else(|| Path::new(target_tmpdir).join("kplug-in-cluster"))
}

fn named_installation_dir() -> Option<PathBuf> {
    std::env::var_os(INSTALLATION_VARIABLE)
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
}

/// Whether [`VARIABLE`] asks for the in-cluster mode.
pub fn requested() -> bool {
    std::env::var(VARIABLE).is_ok_and(|value| !value.is_empty() && value != "0")
}

/// The running cluster, from `hack/cluster.sh env`.
pub struct Node {
    env: HashMap<String, String>,
}

impl Node {
    /// The cluster `hack/cluster.sh up` started; an error when none is up.
    pub fn connect() -> Result<Self> {
        let output = Command::new(repo_root().join("hack/cluster.sh"))
            .arg("env")
            .stdin(Stdio::null())
            .output()
            .context("running hack/cluster.sh env")?;
        ensure!(
            output.status.success(),
            "no cluster is up (hack/cluster.sh up first): {}",
            output_text(&output).trim()
        );
        let env = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|line| !line.starts_with('#') && !line.starts_with("export "))
            .filter_map(|line| {
                let (key, value) = line.split_once('=')?;
                Some((key.to_owned(), value.trim_matches('\'').to_owned()))
            })
            .collect();
        Ok(Self { env })
    }

    /// A setting of `hack/cluster.sh env`, e.g. `KPLUG_CLUSTER_PKI_DIR`.
    pub fn var(&self, name: &str) -> Result<&str> {
        self.env
            .get(name)
            .map(String::as_str)
            .with_context(|| format!("{name} missing from hack/cluster.sh env"))
    }

    /// The admin's (system:masters) kubeconfig.
    pub fn kubeconfig(&self) -> Result<PathBuf> {
        Ok(PathBuf::from(self.var("KUBECONFIG")?))
    }

    /// A file of the cluster's PKI, e.g. `admin.crt` or `front-proxy-client.key`.
    pub fn pki(&self, file: &str) -> Result<PathBuf> {
        Ok(Path::new(self.var("KPLUG_CLUSTER_PKI_DIR")?).join(file))
    }

    /// kube-apiserver's address.
    pub fn apiserver(&self) -> Result<SocketAddr> {
        let url = self.var("KPLUG_CLUSTER_API_URL")?;
        url.trim_start_matches("https://")
            .parse()
            .with_context(|| format!("KPLUG_CLUSTER_API_URL {url} is not https://IP:PORT"))
    }

    /// The PID of one of the cluster's daemons (`etcd`, `kube-apiserver`,
    /// `kubelet`, ...), as `hack/cluster.sh` recorded it.
    pub fn daemon_pid(&self, daemon: &str) -> Result<u32> {
        let file = Path::new(self.var("KPLUG_CLUSTER_DIR")?)
            .join("pids")
            .join(daemon);
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        text.trim()
            .parse()
            .with_context(|| format!("{} holds no PID", file.display()))
    }

    /// kubectl as the admin; its stdout, or an error with its output.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let output = Command::new(KUBECTL)
            .arg("--kubeconfig")
            .arg(self.kubeconfig()?)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running kubectl {args:?}"))?;
        ensure!(
            output.status.success(),
            "kubectl {args:?}: {}",
            output_text(&output).trim()
        );
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// kubectl's `-o json` of `args`.
    pub fn kubectl_json(&self, args: &[&str]) -> Result<Value> {
        let text = self.kubectl(&[args, &["-o", "json"]].concat())?;
        serde_json::from_str(&text).with_context(|| format!("kubectl {args:?}: not JSON"))
    }

    /// `kubectl apply` of a manifest.
    pub fn apply(&self, yaml: &str) -> Result<()> {
        let file = tempfile::NamedTempFile::new().context("a file for the manifest")?;
        std::fs::write(file.path(), yaml).context("writing the manifest")?;
        self.kubectl(&["apply", "-f", &file.path().to_string_lossy()])?;
        Ok(())
    }

    /// A one-hour token of the ServiceAccount `namespace/name`, for
    /// kube-apiserver's own audience, from the TokenRequest API.
    pub fn token(&self, namespace: &str, name: &str) -> Result<String> {
        let dir = tempfile::tempdir().context("a directory for the TokenRequest")?;
        crate::kubectl::service_account_token(dir.path(), namespace, name, &[], |args| {
            self.kubectl(args)
        })
    }

    /// The Running, Ready pods of `selector` in `namespace`, with their
    /// processes and cgroups on this node, by name.
    pub fn pods(&self, namespace: &str, selector: &str) -> Result<Vec<Pod>> {
        let list = self.kubectl_json(&["-n", namespace, "get", "pods", "-l", selector])?;
        let mut pods = list["items"]
            .as_array()
            .context("a pod list without items")?
            .iter()
            .filter(|pod| pod["metadata"]["deletionTimestamp"].is_null())
            .filter(|pod| {
                pod["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|s| !s.is_empty() && s.iter().all(|c| c["ready"] == true))
            })
            .map(Pod::from_json)
            .collect::<Result<Vec<_>>>()?;
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(pods)
    }

    /// Waits until `check` is true, polling every 500 ms, at most `WAIT`.
    fn wait(&self, what: &str, mut check: impl FnMut() -> Result<bool>) -> Result<()> {
        let deadline = Instant::now() + WAIT;
        loop {
            let last = match check() {
                Ok(true) => return Ok(()),
                Ok(false) => String::new(),
                Err(error) => format!(": {error:#}"),
            };
            if Instant::now() > deadline {
                bail!("{what}: not within {WAIT:?}{last}");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// What [`prepare`] installed, as the benches measure it.
pub struct Installation {
    /// The copy of the repository's files the READMEs' commands ran in:
    /// `certs/out/` (kplug's CA) and `certs/plugins/` (kplug's client
    /// certificate for the plugins, and their CA).
    pub work: PathBuf,
    /// The kplug replicas, the hello plugin's and the operator's pods.
    pub kplug: Vec<Pod>,
    pub plugins: Vec<Pod>,
    pub operator: Pod,
}

impl Installation {
    /// The CA of kplug's serving certificate.
    pub fn kplug_ca(&self) -> PathBuf {
        self.work.join("certs/out/ca.crt")
    }

    /// The plugin CA: it signed the plugins' serving certificates and
    /// kplug's client certificate.
    pub fn plugin_ca(&self) -> PathBuf {
        self.work.join("certs/plugins/ca.crt")
    }

    /// A client certificate and key of the plugin CA, as kplug's own: the
    /// only kind of caller the plugins take.
    pub fn kplug_client(&self) -> (PathBuf, PathBuf) {
        Self::client_files(&self.work)
    }

    /// Where `certs/plugin-certs.sh client` writes them in `work`.
    fn client_files(work: &Path) -> (PathBuf, PathBuf) {
        let dir = work.join("certs/plugins");
        (dir.join("kplug-client.crt"), dir.join("kplug-client.key"))
    }
}

/// What the Widgets' operator is told.
pub struct WidgetsOperator {
    /// The Widgets' API group (`widget_crd(group)`).
    pub group: &'static str,
    /// The namespace it watches.
    pub namespace: &'static str,
    /// Objects it reconciles at once.
    pub concurrency: usize,
}

/// The operator every in-cluster bench finds running: the convergence
/// bench's Widgets, namespace and concurrency.
pub const WIDGETS: WidgetsOperator = WidgetsOperator {
    group: "bench.kplug.io",
    namespace: "bench",
    concurrency: 32,
};

/// Makes the cluster what the benches measure, doing only what is not done
/// yet: builds [`IMAGES`] from the tree; installs kplug and the hello
/// plugin with `hack/tests/install.py --example hello` in `work` (with
/// `kplug_binary` making the certificates) unless kplug is installed from
/// `work` already; has the plugin serve the Widgets of [`WIDGETS`] and log
/// only warnings; applies their CRD and operator; restarts the Deployments
/// whose pods run another build than the tree's (`roll_stale_pods`); and
/// waits until every kplug replica has the plugin Ready with both of its
/// current pods.
pub fn prepare(node: &Node, kplug_binary: &Path, work: &Path) -> Result<Installation> {
    let operator = &WIDGETS;
    let images = Command::new(repo_root().join("hack/images.sh"))
        .arg("build")
        .args(IMAGES)
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .status()
        .context("running hack/images.sh build")?;
    ensure!(images.success(), "hack/images.sh build {IMAGES:?} failed");
    install(node, kplug_binary, work)?;

    let api = format!("KPLUG_API=widgets.{}/v1", operator.group);
    node.kubectl(&[
        "-n",
        PLUGINS_NS,
        "set",
        "env",
        "deployment/hello-plugin",
        &api,
        "RUST_LOG=warn",
    ])?;
    node.apply(&widget_crd(operator.group))?;
    node.kubectl(&[
        "wait",
        "--for=condition=Established",
        &format!("crd/widgets.{}", operator.group),
        "--timeout=60s",
    ])?;
    node.apply(&operator::manifest(
        operator,
        OperatorRoute::ThroughKubeApiserver,
    ))?;
    for deployment in ["hello-plugin", operator::NAME] {
        node.kubectl(&[
            "-n",
            PLUGINS_NS,
            "rollout",
            "status",
            &format!("deployment/{deployment}"),
            "--timeout=5m",
        ])?;
    }
    roll_stale_pods(node)?;

    let installation = Installation {
        work: work.to_owned(),
        kplug: node.pods(KPLUG_NS, "app.kubernetes.io/name=kplug")?,
        plugins: node.pods(PLUGINS_NS, "app.kubernetes.io/name=hello-plugin")?,
        operator: operator_pod(node)?,
    };
    ensure!(
        installation.kplug.len() == 2 && installation.plugins.len() == 2,
        "expected 2 kplug and 2 plugin pods, found {} and {}",
        installation.kplug.len(),
        installation.plugins.len()
    );
    let instances: Vec<&str> = installation
        .plugins
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    for kplug in &installation.kplug {
        node.wait(
            &format!("{PLUGIN} Ready with {instances:?} on {}", kplug.name),
            || plugin_ready_on(node, &installation, kplug, operator.group, &instances),
        )?;
    }
    Ok(installation)
}

/// Each image the benches build, and the Deployment (namespace, name, the
/// `app.kubernetes.io/name` of its pods) that runs it.
const DEPLOYED: [(&str, &str, &str); 3] = [
    ("kplug-apiserver", KPLUG_NS, "kplug"),
    ("hello-plugin", PLUGINS_NS, "hello-plugin"),
    ("kplug-operator", PLUGINS_NS, operator::NAME),
];

/// Loads the images just built into the node's containerd (nothing for one
/// it holds) and restarts each Deployment with a pod that runs another
/// image: on a cluster kept between runs the benches would otherwise
/// measure pods of an older tree, as a new image under the same tag does
/// not restart the pods.
fn roll_stale_pods(node: &Node) -> Result<()> {
    let images = repo_root().join("hack/images.sh");
    let loaded = Command::new(&images)
        .arg("load")
        .args(IMAGES)
        .env("CONTAINERD_ADDRESS", node.var("CONTAINERD_ADDRESS")?)
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .status()
        .context("running hack/images.sh load")?;
    ensure!(loaded.success(), "hack/images.sh load {IMAGES:?} failed");
    for (image, namespace, name) in DEPLOYED {
        let built = Command::new(&images)
            .args(["id", image])
            .stdin(Stdio::null())
            .output()
            .context("running hack/images.sh id")?;
        ensure!(built.status.success(), "hack/images.sh id {image} failed");
        let built = String::from_utf8_lossy(&built.stdout).trim().to_owned();
        let selector = format!("app.kubernetes.io/name={name}");
        let pods = node.kubectl_json(&["-n", namespace, "get", "pods", "-l", &selector])?;
        let stale = pods["items"].as_array().into_iter().flatten().any(|pod| {
            pod["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|container| container["imageID"].as_str() != Some(&built))
        });
        if stale {
            eprintln!("{namespace}/{name} runs another build than {image} {built}: restarting it");
            let deployment = format!("deployment/{name}");
            node.kubectl(&["-n", namespace, "rollout", "restart", &deployment])?;
            node.kubectl(&[
                "-n",
                namespace,
                "rollout",
                "status",
                &deployment,
                "--timeout=5m",
            ])?;
        }
    }
    Ok(())
}

/// The Widgets' operator, redeployed to send its reconciles by `route`
/// (the old pod gone first), once its new pod is Ready.
pub fn deploy_operator(node: &Node, route: OperatorRoute) -> Result<Pod> {
    node.apply(&operator::manifest(&WIDGETS, route))?;
    node.kubectl(&[
        "-n",
        PLUGINS_NS,
        "rollout",
        "status",
        &format!("deployment/{}", operator::NAME),
        "--timeout=5m",
    ])?;
    operator_pod(node)
}

/// The Widgets' operator's Ready pod.
fn operator_pod(node: &Node) -> Result<Pod> {
    node.pods(
        PLUGINS_NS,
        &format!("app.kubernetes.io/name={}", operator::NAME),
    )?
    .pop()
    .context("no Ready operator pod")
}

/// Installs kplug and the hello plugin from `work`: only the plugin when
/// kplug is installed from `work` already (its APIService trusts `work`'s
/// CA), nothing when both are; refuses a kplug installed from elsewhere.
fn install(node: &Node, kplug_binary: &Path, work: &Path) -> Result<()> {
    let kplug_installed = match node.kubectl_json(&["get", "apiservice", APISERVICE]) {
        Ok(apiservice) => {
            let bundle = apiservice["spec"]["caBundle"].as_str().unwrap_or_default();
            let ours = std::fs::read(work.join("certs/out/ca.crt")).map(|pem| STANDARD.encode(pem));
            ensure!(
                ours.is_ok_and(|ours| ours == bundle),
                "kplug is installed on this cluster, but not from {} (another install, or an \
                 earlier cluster's files): measure on a fresh cluster (hack/cluster.sh down; \
                 hack/cluster.sh up), or name its folder in {INSTALLATION_VARIABLE}",
                work.display()
            );
            true
        }
        Err(error) if format!("{error:#}").contains("NotFound") => false,
        Err(error) => return Err(error),
    };
    let plugin_installed = node
        .kubectl(&[
            "-n",
            PLUGINS_NS,
            "get",
            "deployment",
            "hello-plugin",
            "--ignore-not-found",
            "-o",
            "name",
        ])?
        .contains("hello-plugin");
    if kplug_installed && plugin_installed {
        eprintln!(
            "kplug and the hello plugin are installed already (from {})",
            work.display()
        );
    } else {
        if !kplug_installed {
            // A folder someone named is theirs: never emptied here.
            ensure!(
                named_installation_dir().is_none(),
                "{INSTALLATION_VARIABLE} names {}, but kplug is not installed on this cluster: \
                 install it from there first, or unset {INSTALLATION_VARIABLE} to have the \
                 benches install their own",
                work.display()
            );
            if work.exists() {
                std::fs::remove_dir_all(work)
                    .with_context(|| format!("removing {}", work.display()))?;
            }
            std::fs::create_dir_all(work)
                .with_context(|| format!("creating {}", work.display()))?;
        }
        eprintln!(
            "installing {} by the READMEs (hack/tests/install.py --example hello {})",
            if kplug_installed {
                "the hello plugin"
            } else {
                "kplug and the hello plugin"
            },
            work.display()
        );
        let status = Command::new("python3")
            .arg(repo_root().join("hack/tests/install.py"))
            .arg(work)
            .args(["--example", "hello"])
            .env("KPLUG_APISERVER", kplug_binary)
            .stdin(Stdio::null())
            .stdout(std::io::stderr())
            .status()
            .context("running hack/tests/install.py")?;
        ensure!(
            status.success(),
            "hack/tests/install.py failed; the commands' output is in {}",
            work.join(".install-logs").display()
        );
    }
    // The direct baseline calls the plugin as kplug would: with a client
    // certificate of the plugin CA (kplug issues its own in memory).
    let (client_cert, _) = Installation::client_files(work);
    if client_cert.exists() {
        return Ok(());
    }
    let status = Command::new(repo_root().join("certs/plugin-certs.sh"))
        .arg("--out-dir")
        .arg(work.join("certs/plugins"))
        .arg("client")
        .env("KPLUG_APISERVER", kplug_binary)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .context("running certs/plugin-certs.sh client")?;
    ensure!(status.success(), "certs/plugin-certs.sh client failed");
    Ok(())
}

/// Whether `kplug` lists the plugin Ready, serving Widgets of `group`,
/// with exactly `instances` Ready (asked of that replica directly, as the
/// admin).
fn plugin_ready_on(
    node: &Node,
    installation: &Installation,
    kplug: &Pod,
    group: &str,
    instances: &[&str],
) -> Result<bool> {
    let output = Command::new("curl")
        .args(["-sS", "--fail-with-body", "-m", "5", "--resolve"])
        .arg(format!("{KPLUG_SERVER_NAME}:{KPLUG_PORT}:{}", kplug.ip))
        .arg("--cacert")
        .arg(installation.kplug_ca())
        .arg("--cert")
        .arg(node.pki("admin.crt")?)
        .arg("--key")
        .arg(node.pki("admin.key")?)
        .arg(format!(
            "https://{KPLUG_SERVER_NAME}:{KPLUG_PORT}/apis/plugins.kplug.io/v1alpha1/plugins/{PLUGIN}"
        ))
        .stdin(Stdio::null())
        .output()
        .context("running curl")?;
    if !output.status.success() {
        bail!("{}", output_text(&output).trim());
    }
    let plugin: Value = serde_json::from_slice(&output.stdout).context("a Plugin as JSON")?;
    let mut ready: Vec<&str> = plugin["status"]["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["ready"] == true)
        .filter_map(|i| i["name"].as_str())
        .collect();
    ready.sort_unstable();
    Ok(plugin["spec"]["api"]["group"] == group && ready == instances)
}
