//! A real Kubernetes control plane (etcd and kube-apiserver) from
//! `hack/control-plane.sh`, and what tests do with it as its admin.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use kplug_proto::v1alpha1::TOKEN_AUDIENCE;

use crate::kubectl::{self, KUBECTL};
use crate::process::{Lines, Process, output_text};
use crate::workspace::repo_root;

/// etcd and kube-apiserver from `hack/control-plane.sh start DIR`, stopped
/// on drop (also when a test panics).
pub struct ControlPlane {
    dir: PathBuf,
    /// `DIR/env`: addresses, PIDs, certificates and keys (the script's
    /// header lists them).
    env: HashMap<String, String>,
    /// Numbers the manifests [`ControlPlane::apply`] writes.
    applied: AtomicUsize,
}

impl ControlPlane {
    /// Starts the control plane with its files in `dir` and waits until
    /// kube-apiserver is ready (the script waits for `/readyz`).
    pub fn start(dir: PathBuf) -> Self {
        Self::start_with(dir, &[])
    }

    /// As [`ControlPlane::start`], with `apiserver_args` added to
    /// kube-apiserver's flags (e.g. an audit log).
    pub fn start_with(dir: PathBuf, apiserver_args: &[String]) -> Self {
        // Own the directory before anything can fail, so that Drop stops
        // whatever the script started before failing.
        let mut cluster = Self {
            dir,
            env: HashMap::new(),
            applied: AtomicUsize::new(0),
        };
        let mut script = Command::new(repo_root().join("hack/control-plane.sh"));
        // Flags from the environment (hack/profile-convergence.sh's) stay.
        let extra = std::env::var("KPLUG_CP_APISERVER_EXTRA_ARGS")
            .into_iter()
            .chain(apiserver_args.iter().cloned())
            .collect::<Vec<_>>();
        if !extra.is_empty() {
            script.env("KPLUG_CP_APISERVER_EXTRA_ARGS", extra.join(" "));
        }
        let status = script
            .arg("start")
            .arg(&cluster.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .expect("run hack/control-plane.sh");
        assert!(
            status.success(),
            "the control plane did not start (hack/control-plane.sh start {}); \
             hack/setup.sh builds the kube-apiserver it needs",
            cluster.dir.display()
        );
        cluster.env = std::fs::read_to_string(cluster.dir.join("env"))
            .expect("the control plane's env file")
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
        cluster
    }

    /// The directory the control plane keeps its files in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A value from the control plane's env file, e.g. `KPLUG_CA_CERT`.
    pub fn var(&self, name: &str) -> String {
        self.env
            .get(name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} missing from the control plane's env"))
    }

    /// The admin's (system:masters) kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        PathBuf::from(self.var("KPLUG_KUBECONFIG"))
    }

    /// Runs kubectl as the admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        kubectl::run(Path::new(KUBECTL), &self.kubeconfig(), args)
    }

    /// Runs kubectl as the admin, failing the test on a non-zero exit;
    /// returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        kubectl::run_ok(&self.kubeconfig(), args)
    }

    /// Runs kubectl as the admin: `Ok` when it succeeds, else `Err` with its
    /// output; what [`crate::wait_until`] polls for.
    pub fn kubectl_check(&self, args: &[&str]) -> Result<(), String> {
        let output = self.kubectl(args);
        if output.status.success() {
            Ok(())
        } else {
            Err(output_text(&output))
        }
    }

    /// Starts a kubectl that keeps running (e.g. `get -w`) as the admin.
    pub fn kubectl_spawn(&self, args: &[&str]) -> (Process, Lines) {
        kubectl::spawn(&self.kubeconfig(), args)
    }

    /// `kubectl apply` of a manifest (one or more YAML documents).
    pub fn apply(&self, yaml: &str) {
        let number = self.applied.fetch_add(1, Ordering::Relaxed);
        let file = self.dir.join(format!("apply-{number}.yaml"));
        std::fs::write(&file, yaml).expect("write the manifest to apply");
        self.kubectl_ok(&["apply", "-f", &file.to_string_lossy()]);
    }

    /// A one-hour token of a ServiceAccount for kube-apiserver, from the
    /// TokenRequest API (no controller-manager runs, so there are no token
    /// Secrets).
    pub fn token(&self, namespace: &str, service_account: &str) -> String {
        self.token_for(namespace, service_account, &[])
    }

    /// A one-hour token of a ServiceAccount for kplug's registry: issued for
    /// its audience, as a plugin's projected token is.
    pub fn plugin_token(&self, namespace: &str, service_account: &str) -> String {
        self.token_for(namespace, service_account, &[TOKEN_AUDIENCE])
    }

    /// A one-hour token for `audiences` (none: kube-apiserver's own).
    fn token_for(&self, namespace: &str, service_account: &str, audiences: &[&str]) -> String {
        kubectl::service_account_token(&self.dir, namespace, service_account, audiences, |args| {
            Ok(self.kubectl_ok(args))
        })
        .unwrap_or_else(|e| panic!("a token of {namespace}/{service_account}: {e:#}"))
    }

    /// Creates the ServiceAccount `plugins/NAME` and, with `heartbeat_as`,
    /// a ClusterRole (and binding) that lets it heartbeat as that plugin
    /// only (`resourceNames`), as a plugin's chart would.
    pub fn service_account_with_role(&self, name: &str, heartbeat_as: Option<&str>) {
        self.kubectl_ok(&["create", "serviceaccount", name, "-n", "plugins"]);
        if let Some(plugin) = heartbeat_as {
            self.apply(&format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: 'kplug:plugin:{name}'}}\nrules:\n- {{apiGroups: [plugins.kplug.io], resources: [plugins/heartbeat], verbs: [create], resourceNames: [{plugin}]}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: 'kplug:plugin:{name}'}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: 'kplug:plugin:{name}'}}\nsubjects:\n- {{kind: ServiceAccount, name: {name}, namespace: plugins}}\n"
            ));
        }
    }

    /// Writes to `path` a kubeconfig for this cluster that authenticates
    /// with the bearer `token` (e.g. from [`ControlPlane::token`]), the way
    /// a pod's in-cluster config would.
    pub fn kubeconfig_for_token(&self, path: &Path, token: &str) {
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: '{}', certificate-authority: '{}'}}\nusers:\n- name: u\n  user: {{token: '{token}'}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
                self.var("KPLUG_APISERVER_URL"),
                self.var("KPLUG_CA_CERT"),
            ),
        )
        .unwrap_or_else(|e| panic!("cannot write the kubeconfig {}: {e}", path.display()));
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("hack/control-plane.sh"))
            .arg("stop")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status();
    }
}
