//! A small world for the zero-code operator on a generic resource: a real
//! control plane, kplug behind its APIService, the CRDs `widgets` (with a
//! status subresource) and `gadgets` (without) in `test.kplug.io`, and
//! hello plugins serving widgets.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use kplug_test_support::audit::AuditLog;
use kplug_test_support::postgres::venv_python;
use kplug_test_support::{
    AggregatedKplug, ControlPlane, Lines, Process, free_port, hello_plugin_command, output_text,
    plugin_identity, plugin_tls, repo_root, widget_crd, workspace_binary,
};
use serde_json::Value;

/// A resource without a status subresource, which the operator refuses.
const GADGETS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.test.kplug.io}
spec:
  group: test.kplug.io
  scope: Namespaced
  names: {kind: Gadget, plural: gadgets, singular: gadget, listKind: GadgetList}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"#;

/// Where a world keeps its files.
fn work_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("kplug-operator-widgets-")
        .tempdir_in("/tmp")
        .expect("temp dir")
}

/// What the hello plugins serve here.
const WIDGETS_API: &str = "widgets.test.kplug.io/v1";

/// The Widget `default/NAME` asking for `preferred`, with the trace to
/// continue in its `kplug.io/traceparent` annotation when given.
pub fn widget(name: &str, preferred: &str, traceparent: Option<&str>) -> String {
    let annotations = traceparent.map_or(String::new(), |t| {
        format!(", annotations: {{kplug.io/traceparent: '{t}'}}")
    });
    format!(
        "apiVersion: test.kplug.io/v1\nkind: Widget\nmetadata: {{name: {name}, namespace: default{annotations}}}\nspec: {{size: 1, preferredImplementation: {preferred}}}\n"
    )
}

/// Fields drop in order: the processes stop before `work` is deleted.
pub struct Widgets {
    pub kplug: AggregatedKplug,
    pub cluster: ControlPlane,
    pub work: tempfile::TempDir,
}

impl Widgets {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// As [`Widgets::start`], with `kplug_flags` for kplug (e.g. `--log`).
    pub fn start_with(kplug_flags: &[&str]) -> Self {
        let work = work_dir();
        let cluster = ControlPlane::start(work.path().join("cp"));
        Self::start_on(work, cluster, kplug_flags)
    }

    /// As [`Widgets::start`], with kube-apiserver logging the writes in
    /// `namespace` (among them the reconciles it passes on to kplug).
    pub fn start_audited(namespace: &str) -> (Self, AuditLog) {
        let work = work_dir();
        let audit = AuditLog::new(work.path(), namespace).expect("the audit policy");
        let cluster = ControlPlane::start_with(work.path().join("cp"), &audit.apiserver_args());
        (Self::start_on(work, cluster, &[]), audit)
    }

    fn start_on(work: tempfile::TempDir, cluster: ControlPlane, kplug_flags: &[&str]) -> Self {
        let kplug = AggregatedKplug::start(
            &cluster,
            work.path(),
            &[&["--min-heartbeat-interval", "1s"], kplug_flags].concat(),
        );
        cluster.apply(&widget_crd("test.kplug.io"));
        cluster.apply(GADGETS);
        for crd in ["widgets", "gadgets"] {
            cluster.kubectl_ok(&[
                "wait",
                "--for=condition=Established",
                &format!("crd/{crd}.test.kplug.io"),
                "--timeout=30s",
            ]);
        }
        cluster.kubectl_ok(&["create", "namespace", "plugins"]);
        Self {
            kplug,
            cluster,
            work,
        }
    }

    /// A hello plugin named `name` serving widgets as `implementation`.
    pub fn plugin(&self, name: &str, implementation: &str) -> Process {
        let token = plugin_identity(&self.cluster, name, Some(name), self.work.path());
        Process::spawn(
            hello_plugin_command(&self.kplug, name, &token)
                .args(["--api", WIDGETS_API, "--heartbeat-interval", "1"])
                .args(["--implementation", implementation])
                .stdout(Stdio::null())
                .stderr(Stdio::inherit()),
            name,
        )
    }

    /// A hello plugin as [`Widgets::plugin`] starts it, with `extra`
    /// flags, its log read.
    pub fn plugin_logged(
        &self,
        name: &str,
        implementation: &str,
        extra: &[&str],
    ) -> (Process, Lines) {
        let token = plugin_identity(&self.cluster, name, Some(name), self.work.path());
        Process::spawn_with_stderr(
            hello_plugin_command(&self.kplug, name, &token)
                .args(["--api", WIDGETS_API, "--heartbeat-interval", "1"])
                .args(["--implementation", implementation])
                .args(extra)
                .env("NO_COLOR", "1")
                .stdout(Stdio::null()),
            name,
        )
    }

    /// The Python hello plugin (examples/hello-python) named `name`
    /// serving widgets as `implementation` with `extra` flags, its log read.
    pub fn python_plugin(
        &self,
        name: &str,
        implementation: &str,
        extra: &[&str],
    ) -> (Process, Lines) {
        let mut args = vec!["--api", WIDGETS_API, "--implementation", implementation];
        args.extend_from_slice(extra);
        self.python_example("examples/hello-python/hello.py", name, &args)
    }

    /// The Python plugin `script` (relative to the repository) as `name`,
    /// with `args`, heartbeating to this world's kplug.
    pub fn python_example(&self, script: &str, name: &str, args: &[&str]) -> (Process, Lines) {
        let token = plugin_identity(&self.cluster, name, Some(name), self.work.path());
        let mut command = Command::new(venv_python());
        command
            .arg(repo_root().join(script))
            .args(["--name", name])
            .args(args)
            .args(["--listen", &format!("127.0.0.1:{}", free_port())]);
        plugin_tls(&mut command, &self.kplug, &token);
        Process::spawn_with_stderr(&mut command, name)
    }

    /// `kplug-operator` for `resource` in the namespace `default`, as the
    /// admin, without leader election; add flags and where output goes.
    pub fn operator(&self, resource: &str) -> Command {
        self.operator_as(resource, &self.cluster.kubeconfig())
    }

    /// As [`Widgets::operator`], as the identity in `kubeconfig`.
    pub fn operator_as(&self, resource: &str, kubeconfig: &Path) -> Command {
        self.operator_in("default", resource, kubeconfig)
    }

    /// As [`Widgets::operator_as`], for the objects of `namespace`.
    pub fn operator_in(&self, namespace: &str, resource: &str, kubeconfig: &Path) -> Command {
        let mut command = Command::new(workspace_binary("kplug-operator"));
        command
            .args([
                "--resource",
                resource,
                "--leader-elect=false",
                "--namespace",
                namespace,
                "--metrics-bind-address",
                "127.0.0.1:0",
            ])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null());
        command
    }

    /// Runs `kplug-operator` for widgets with `extra` flags until dropped,
    /// once its controller has started.
    pub fn run_operator(&self, extra: &[&str]) -> (Process, Lines) {
        self.run_operator_as(&self.cluster.kubeconfig(), extra)
    }

    /// As [`Widgets::run_operator`], as the identity in `kubeconfig`.
    pub fn run_operator_as(&self, kubeconfig: &Path, extra: &[&str]) -> (Process, Lines) {
        self.run_operator_in("default", kubeconfig, extra)
    }

    /// As [`Widgets::run_operator_as`], for the widgets of `namespace`.
    pub fn run_operator_in(
        &self,
        namespace: &str,
        kubeconfig: &Path,
        extra: &[&str],
    ) -> (Process, Lines) {
        self.run_operator_for("widgets.test.kplug.io", namespace, kubeconfig, extra)
    }

    /// As [`Widgets::run_operator_in`], for `resource`.
    pub fn run_operator_for(
        &self,
        resource: &str,
        namespace: &str,
        kubeconfig: &Path,
        extra: &[&str],
    ) -> (Process, Lines) {
        let mut child = self
            .operator_in(namespace, resource, kubeconfig)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kplug-operator");
        let log = Lines::new(child.stderr.take().expect("stderr"));
        let operator = Process::new(child, "kplug-operator");
        log.wait_for(Duration::from_secs(30), "the controller", |l| {
            l.contains("controller started")
        });
        (operator, log)
    }

    /// Whether `kubectl get WHAT` (`kind/name`, in `namespace` unless it is
    /// cluster-scoped) answers NotFound.
    pub fn gone(&self, namespace: Option<&str>, what: &str) -> bool {
        let mut args = vec!["get", what];
        if let Some(namespace) = namespace {
            args.extend(["-n", namespace]);
        }
        output_text(&self.cluster.kubectl(&args)).contains("NotFound")
    }

    /// `kubectl apply` of the Widget `default/NAME` with `spec`, a YAML flow mapping's content.
    pub fn apply(&self, name: &str, spec: &str) {
        self.cluster.apply(&format!(
            "apiVersion: test.kplug.io/v1\nkind: Widget\nmetadata: {{name: {name}, namespace: default}}\nspec: {{{spec}}}\n"
        ));
    }

    /// Clears the Widget's binding, as the README says to rebind it.
    pub fn clear_binding(&self, name: &str) {
        self.cluster.kubectl_ok(&[
            "patch",
            "widget",
            name,
            "-n",
            "default",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"implementation":null}}"#,
        ]);
    }

    /// Asks for a reconcile of the Widget now (the README's annotation),
    /// with `value`, which must differ from the last one.
    pub fn request_reconcile(&self, name: &str, value: &str) {
        self.cluster.kubectl_ok(&[
            "annotate",
            "widget",
            name,
            "-n",
            "default",
            "--overwrite",
            &format!("kplug.io/reconcile-requested-at={value}"),
        ]);
    }

    pub fn get(&self, name: &str) -> Result<Value, String> {
        self.get_in("default", name)
    }

    /// The Widget `namespace/name`.
    pub fn get_in(&self, namespace: &str, name: &str) -> Result<Value, String> {
        let output = self
            .cluster
            .kubectl(&["get", "widget", name, "-n", namespace, "-o", "json"]);
        serde_json::from_slice(&output.stdout).map_err(|_| output_text(&output))
    }

    /// The Widget's Ready condition, once it has one.
    pub fn ready(&self, name: &str) -> Result<Value, String> {
        self.ready_in("default", name)
    }

    /// The Ready condition of the Widget `namespace/name`, once it has one.
    pub fn ready_in(&self, namespace: &str, name: &str) -> Result<Value, String> {
        let object = self.get_in(namespace, name)?;
        let conditions = object["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conditions
            .into_iter()
            .find(|c| c["type"] == "Ready")
            .ok_or_else(|| format!("no Ready condition yet: {}", object["status"]))
    }
}
