//! The operator's end-to-end world: a real kube-apiserver and etcd, kplug
//! behind its APIService, the DatabaseTable CRDs, real PostgreSQL and
//! MariaDB, the real plugins with their ServiceAccounts, and `kplug-operator`
//! processes running as the example's ServiceAccount with only the RBAC of
//! `examples/database-table/deploy/operator-rbac.yaml`.
#![allow(dead_code)] // each test binary uses a part

pub mod widgets;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use kplug_test_support::database_table;
pub use kplug_test_support::database_table::{MARIADB_PLUGIN, PG_PLUGIN};
use kplug_test_support::mariadb;
use kplug_test_support::postgres::Postgres;
use kplug_test_support::{
    AggregatedKplug, ControlPlane, Lines, Process, plugin_identity, repo_root, wait_until,
    workspace_binary,
};
use serde_json::Value;
pub const OPERATOR_SA: &str = "database-table-operator";

/// Fields drop in order: the processes stop before `work`, which holds the
/// control plane's state, is deleted.
pub struct World {
    pub kplug: AggregatedKplug,
    pub pg: Postgres,
    pub cluster: ControlPlane,
    pg_token: PathBuf,
    mariadb_token: PathBuf,
    /// A kubeconfig with the operator's ServiceAccount token.
    pub operator_kubeconfig: PathBuf,
    pub work: tempfile::TempDir,
}

impl World {
    pub fn start() -> Self {
        let work = tempfile::Builder::new()
            .prefix("kplug-operator-")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let cluster = ControlPlane::start(work.path().join("cp"));
        let kplug =
            AggregatedKplug::start(&cluster, work.path(), &["--min-heartbeat-interval", "1s"]);
        database_table::install(&cluster);
        let pg_token = plugin_identity(&cluster, PG_PLUGIN, Some(PG_PLUGIN), work.path());
        let mariadb_token =
            plugin_identity(&cluster, MARIADB_PLUGIN, Some(MARIADB_PLUGIN), work.path());
        // The operator's identity and rights exactly as the example ships them.
        cluster.kubectl_ok(&[
            "apply",
            "-f",
            &repo_root()
                .join("examples/database-table/deploy/operator-rbac.yaml")
                .to_string_lossy(),
        ]);
        let operator_kubeconfig = work.path().join("operator.kubeconfig");
        cluster.kubeconfig_for_token(&operator_kubeconfig, &cluster.token("plugins", OPERATOR_SA));
        Self {
            pg: Postgres::start(),
            work,
            cluster,
            kplug,
            pg_token,
            mariadb_token,
            operator_kubeconfig,
        }
    }

    pub fn pg_plugin(&self) -> Process {
        database_table::postgresql_plugin(&self.cluster, &self.kplug, &self.pg.dsn, &self.pg_token)
    }

    pub fn mariadb_plugin(&self) -> Process {
        database_table::mariadb_plugin(&self.cluster, &self.kplug, &self.mariadb_token)
    }

    pub fn wait_plugin_ready(&self, name: &str) {
        kplug_test_support::wait_plugin_ready(&self.cluster, name);
    }

    /// SIGTERMs a plugin (it deregisters) and waits until kplug no longer lists it.
    pub fn stop_plugin(&self, plugin: &mut Process, name: &str) {
        assert!(
            plugin.terminate(Duration::from_secs(30)),
            "{name} stopped cleanly"
        );
        wait_until(
            &format!("plugin {name} gone"),
            Duration::from_secs(30),
            || match self.get_json(&["plugin", name]) {
                Err(e) if e.contains("NotFound") => Ok(()),
                other => Err(format!("{other:?}")),
            },
        );
    }

    /// The operator's container arguments from the example's Deployment,
    /// so that the test runs what the manifest deploys.
    pub fn manifest_args(&self) -> Vec<String> {
        let manifest = repo_root().join("examples/database-table/deploy/operator.yaml");
        let json = self.cluster.kubectl_ok(&[
            "create",
            "--dry-run=client",
            "-o",
            "json",
            "-f",
            &manifest.to_string_lossy(),
        ]);
        let deployment: Value = serde_json::from_str(&json).expect("the Deployment as JSON");
        deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .expect("container args")
            .iter()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect()
    }

    /// `kplug-operator` with the manifest's arguments as the operator's
    /// ServiceAccount, plus `extra`; its log lines are returned.
    pub fn operator(&self, identity: &str, kubeconfig: &Path, extra: &[&str]) -> (Process, Lines) {
        self.run_operator(
            "kplug-operator",
            self.manifest_args(),
            identity,
            kubeconfig,
            extra,
        )
    }

    /// The typed operator of `examples/database-table/operator`, with the
    /// manifest's field manager and finalizer (it knows its resource and
    /// extensions itself).
    pub fn typed_operator(&self, identity: &str, extra: &[&str]) -> (Process, Lines) {
        let shared = self
            .manifest_args()
            .into_iter()
            .filter(|a| a.starts_with("--field-manager") || a.starts_with("--finalizer"))
            .collect();
        self.run_operator(
            "database-table-operator",
            shared,
            identity,
            &self.operator_kubeconfig,
            extra,
        )
    }

    fn run_operator(
        &self,
        binary: &str,
        args: Vec<String>,
        identity: &str,
        kubeconfig: &Path,
        extra: &[&str],
    ) -> (Process, Lines) {
        let mut child = Command::new(workspace_binary(binary))
            .args(args)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args([
                "--leader-election-namespace",
                "plugins",
                "--leader-election-identity",
                identity,
                "--lease-duration",
                "4s",
                // Never :8443: operators run side by side; the log names the port.
                "--metrics-bind-address",
                "127.0.0.1:0",
            ])
            .args(extra)
            .env("NO_COLOR", "1")
            .env("KPLUG_LOG", "info,kplug_operator=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
        let file =
            std::fs::File::create(operator_log_path(identity)).expect("the operator's log file");
        let lines = Lines::new(Tee(child.stderr.take().expect("stderr"), file));
        (Process::new(child, identity), lines)
    }

    /// Everything the operator `identity` logged so far.
    pub fn operator_log(&self, identity: &str) -> Vec<String> {
        std::fs::read_to_string(operator_log_path(identity))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// `kubectl get ARGS -o json`, or kubectl's error text.
    pub fn get_json(&self, args: &[&str]) -> Result<Value, String> {
        let mut full = vec!["get"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["-o", "json"]);
        let output = self.cluster.kubectl(&full);
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        serde_json::from_slice(&output.stdout).map_err(|e| e.to_string())
    }

    pub fn table(&self, namespace: &str, name: &str) -> Value {
        self.get_json(&["databasetable", name, "-n", namespace])
            .unwrap_or_else(|e| panic!("databasetable {namespace}/{name}: {e}"))
    }

    /// Waits until `check` holds for the DatabaseTable and returns it.
    pub fn wait_table(
        &self,
        namespace: &str,
        name: &str,
        what: &str,
        within: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        let mut last = Value::Null;
        wait_until(&format!("{namespace}/{name}: {what}"), within, || {
            last = self.get_json(&["databasetable", name, "-n", namespace])?;
            check(&last)
                .then_some(())
                .ok_or_else(|| last["status"].to_string())
        });
        last
    }

    pub fn wait_gone(&self, namespace: &str, name: &str, within: Duration) {
        wait_until(
            &format!("{namespace}/{name} deleted"),
            within,
            || match self.get_json(&["databasetable", name, "-n", namespace]) {
                Err(e) if e.contains("NotFound") => Ok(()),
                Err(e) => Err(e),
                Ok(object) => Err(object["status"].to_string()),
            },
        );
    }

    /// Events about an object (events.k8s.io/v1) as (type, reason, note).
    pub fn events(&self, namespace: &str, name: &str) -> Vec<(String, String, String)> {
        let list = self
            .get_json(&["events.v1.events.k8s.io", "-n", namespace])
            .unwrap_or_else(|e| panic!("events: {e}"));
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["regarding"]["name"] == name)
            .map(|e| {
                let text = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
                (text("type"), text("reason"), text("note"))
            })
            .collect()
    }

    pub fn wait_event(&self, namespace: &str, name: &str, type_: &str, reason: &str) {
        wait_until(
            &format!("a {type_} {reason} Event on {name}"),
            Duration::from_secs(30),
            || {
                let events = self.events(namespace, name);
                events
                    .iter()
                    .any(|(t, r, _)| t == type_ && r == reason)
                    .then_some(())
                    .ok_or_else(|| format!("{events:?}"))
            },
        );
    }

    pub fn pg_columns(&self, table: &str) -> String {
        self.pg.columns(table)
    }
}

pub fn operator_log_path(identity: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("kplug-operator-{identity}.log"))
}

/// The URL of `/metrics` from an operator's "serving metrics" log line.
pub fn metrics_url(line: &str) -> String {
    line.split("url=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no url= in {line:?}"))
        .to_owned()
}

/// The delays (seconds) after which the operator scheduled the next call
/// for `object`, from its "reconciled" lines with `success=false`.
pub fn requeue_delays(lines: &[String], object: &str) -> Vec<f64> {
    lines
        .iter()
        .filter(|l| l.contains("reconciled") && l.contains(object) && l.contains("success=false"))
        .filter_map(|l| {
            l.split("requeue_in_seconds=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Copies what is read into a file: the operators' logs stay in
/// `target/tmp/` after a failed run.
pub struct Tee<R>(pub R, pub std::fs::File);

impl<R: std::io::Read> std::io::Read for Tee<R> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let read = self.0.read(buffer)?;
        std::io::Write::write_all(&mut self.1, &buffer[..read])?;
        Ok(read)
    }
}

/// The condition `type_` of an object is "True".
pub fn is_true(object: &Value, type_: &str) -> bool {
    condition(object, type_).is_some_and(|c| c["status"] == "True")
}

pub fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Ready=True for the object's current generation.
pub fn ready_now(object: &Value) -> bool {
    let generation = &object["metadata"]["generation"];
    is_true(object, "Ready")
        && object["status"]["observedGeneration"] == *generation
        && condition(object, "Ready").is_some_and(|c| c["observedGeneration"] == *generation)
}

/// The MariaDB columns of `table`, as "name type, ...", or "NULL".
pub fn mariadb_columns(table: &str) -> String {
    mariadb::shared().query(&format!(
        "select coalesce(group_concat(concat(column_name, ' ', column_type) order by ordinal_position separator ', '), 'NULL') \
         from information_schema.columns where table_schema = '{}' and table_name = '{table}'",
        mariadb::DATABASE
    ))
}

/// Lines of `log` read so far that mention `object` and `needle`.
pub fn count(lines: &[String], object: &str, needle: &str) -> usize {
    lines
        .iter()
        .filter(|l| l.contains(needle) && l.contains(object))
        .count()
}
