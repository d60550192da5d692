//! The DatabaseTable example (`examples/database-table`) on a real
//! [`ControlPlane`] with an [`AggregatedKplug`]: its CRDs and namespace,
//! and its plugins heartbeating over TLS with their own ServiceAccount
//! tokens, as the example deploys them.

use std::path::Path;
use std::process::Command;

use crate::control_plane::ControlPlane;
use crate::kplug::AggregatedKplug;
use crate::mariadb;
use crate::plugins::{plugin_tls, wait_plugin_ready};
use crate::postgres::venv_python;
use crate::process::{Process, free_port};
use crate::workspace::{repo_root, workspace_binary};

pub const PG_PLUGIN: &str = "database-table-postgresql-plugin";
pub const MARIADB_PLUGIN: &str = "database-table-mariadb-plugin";

/// Applies the example's CRDs and its namespace `plugins`, and waits until
/// the CRDs are Established (served).
pub fn install(cluster: &ControlPlane) {
    let examples = repo_root().join("examples/database-table");
    cluster.kubectl_ok(&["apply", "-f", &examples.join("crds").to_string_lossy()]);
    cluster.kubectl_ok(&[
        "apply",
        "-f",
        &examples.join("deploy/namespace.yaml").to_string_lossy(),
    ]);
    for crd in [
        "databasetables",
        "databasetablemariadbextensions",
        "databasetablepostgresqlextensions",
    ] {
        cluster.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            &format!("crd/{crd}.myorg.org"),
            "--timeout=30s",
        ]);
    }
}

/// The PostgreSQL plugin (Python, from the virtualenv of
/// `hack/python-env.sh`) on the database `dsn`, once it is Ready.
pub fn postgresql_plugin(
    cluster: &ControlPlane,
    kplug: &AggregatedKplug,
    dsn: &str,
    token: &Path,
) -> Process {
    let mut command = Command::new(venv_python());
    command
        .args(["-m", "postgresql_plugin", "--dsn", dsn])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())]);
    plugin_tls(&mut command, kplug, token);
    let process = Process::spawn(&mut command, PG_PLUGIN);
    wait_plugin_ready(cluster, PG_PLUGIN);
    process
}

/// The MariaDB plugin on the shared MariaDB ([`mariadb::shared`]), once it
/// is Ready.
pub fn mariadb_plugin(cluster: &ControlPlane, kplug: &AggregatedKplug, token: &Path) -> Process {
    let mut command = Command::new(workspace_binary("mariadb-plugin"));
    command
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .env("MARIADB_URL", mariadb::shared().tcp_url());
    plugin_tls(&mut command, kplug, token);
    let process = Process::spawn(&mut command, MARIADB_PLUGIN);
    wait_plugin_ready(cluster, MARIADB_PLUGIN);
    process
}

/// The path of `create reconciles` (kplug selects the plugin).
pub const RECONCILES: &str = "/apis/plugins.kplug.io/v1alpha1/reconciles";

/// A Reconcile of the DatabaseTable `shop/NAME` (no spec) for whichever
/// plugin serves databasetables.myorg.org, with `spec` merged into its
/// spec (e.g. `timeoutSeconds`, `versionConstraint`).
pub fn reconcile_body(name: &str, spec: serde_json::Value) -> serde_json::Value {
    let mut body = serde_json::json!({
        "apiVersion": "plugins.kplug.io/v1alpha1",
        "kind": "Reconcile",
        "spec": {
            "api": {"group": "myorg.org", "resource": "databasetables"},
            "object": {
                "apiVersion": "myorg.org/v1alpha1",
                "kind": "DatabaseTable",
                "metadata": {"name": name, "namespace": "shop"},
            },
        },
    });
    if let (Some(into), serde_json::Value::Object(fields)) = (body["spec"].as_object_mut(), spec) {
        into.extend(fields);
    }
    body
}
