//! The walkthrough made real: kplug in standalone mode, the PostgreSQL
//! plugin (Python) and the MariaDB plugin (Rust) against real databases,
//! driven with kubectl, checked with the databases' own catalogs.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kplug_test_support::mariadb;
use kplug_test_support::postgres::{Postgres, venv_python};
use kplug_test_support::{Process, StandaloneKplug, free_port, workspace_binary};
use serde_json::{Value, json};

const RECONCILES: &str = "/apis/plugins.kplug.io/v1alpha1/reconciles";
const PG_PLUGIN: &str = "database-table-postgresql-plugin";
const MARIADB_PLUGIN: &str = "database-table-mariadb-plugin";

fn mariadb_query(sql: &str) -> String {
    mariadb::shared().query(sql)
}

fn start_pg_plugin(kplug: &StandaloneKplug, dsn: &str, listen: &str) -> Process {
    let child = Command::new(venv_python())
        .args([
            "-m",
            "postgresql_plugin",
            "--registry",
            &kplug.grpc,
            "--listen",
            listen,
            "--heartbeat-interval",
            "1s",
            "--dsn",
            dsn,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the PostgreSQL plugin (run hack/python-env.sh first)");
    Process {
        child,
        name: PG_PLUGIN.to_owned(),
    }
}

fn start_mariadb_plugin(kplug: &StandaloneKplug) -> Process {
    let child = Command::new(workspace_binary("mariadb-plugin"))
        .args([
            "--registry",
            &kplug.grpc,
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--heartbeat-interval",
            "1s",
        ])
        .env("MARIADB_URL", mariadb::shared().tcp_url())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the MariaDB plugin");
    Process {
        child,
        name: MARIADB_PLUGIN.to_owned(),
    }
}

fn ready(object: &Value) -> bool {
    object["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn table(name: &str, columns: &[(&str, &str)]) -> Value {
    json!({
        "apiVersion": "myorg.org/v1alpha1",
        "kind": "DatabaseTable",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "serverName": "authorization-cluster",
            "columns": columns.iter().map(|(n, t)| json!({"name": n, "type": t})).collect::<Vec<_>>(),
            "extensions": [
                {"apiVersion": "myorg.org/v1alpha1", "kind": "DatabaseTableMariaDbExtension", "name": name},
                {"apiVersion": "myorg.org/v1alpha1", "kind": "DatabaseTablePostgreSqlExtension", "name": name},
            ],
        },
    })
}

fn extensions(name: &str, engine: &str) -> Value {
    json!([
        {"apiVersion": "myorg.org/v1alpha1", "kind": "DatabaseTableMariaDbExtension", "metadata": {"name": name, "namespace": "default"}, "spec": {"storageEngine": engine}},
        {"apiVersion": "myorg.org/v1alpha1", "kind": "DatabaseTablePostgreSqlExtension", "metadata": {"name": name, "namespace": "default"}, "spec": {"partitionBy": "hash"}},
    ])
}

/// `kubectl create -f` a Reconcile for the databasetables API (in the
/// namespace `default`, the kubeconfig's).
fn reconcile(
    kplug: &StandaloneKplug,
    preferred: &str,
    operation: &str,
    object: &Value,
    extensions: &Value,
) -> Value {
    let request = json!({
        "apiVersion": "plugins.kplug.io/v1alpha1",
        "kind": "Reconcile",
        "spec": {
            "api": {"group": "myorg.org", "resource": "databasetables"},
            "preferredImplementation": preferred,
            "operation": operation,
            "object": object,
            "extensions": extensions,
        },
    });
    let file = kplug.state.path().join("reconcile.json");
    std::fs::write(&file, request.to_string()).expect("write the request");
    let out = kplug.kubectl_ok(&["create", "-f", &file.to_string_lossy(), "-o", "json"]);
    serde_json::from_str(&out).expect("JSON answer")
}

fn reasons(answer: &Value) -> Vec<String> {
    answer["status"]["results"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|r| r["reason"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn pg_columns(pg: &Postgres, table: &str) -> String {
    pg.query(&format!(
        "select string_agg(column_name || ' ' || data_type, ', ' order by column_name) \
         from information_schema.columns where table_schema = 'public' and table_name = '{table}'"
    ))
}

fn mariadb_columns(table: &str) -> String {
    mariadb_query(&format!(
        "select group_concat(concat(column_name, ' ', column_type) order by column_name separator ', ') \
         from information_schema.columns where table_schema = '{}' and table_name = '{table}'",
        mariadb::DATABASE
    ))
}

#[test]
fn the_walkthrough_reconciles_real_tables_in_postgresql_and_mariadb() {
    let pg = Postgres::start();
    let kplug = StandaloneKplug::start();
    let pg_listen = format!("127.0.0.1:{}", free_port());
    let mut pg_plugin = start_pg_plugin(&kplug, &pg.dsn, &pg_listen);
    let _maria_plugin = start_mariadb_plugin(&kplug);
    kplug.wait_for_plugin(PG_PLUGIN, ready);
    kplug.wait_for_plugin(MARIADB_PLUGIN, ready);
    let listed = kplug.kubectl_ok(&[
        "get",
        "plugins",
        "-l",
        "kplug.io/api=databasetables.myorg.org",
        "-o",
        "name",
    ]);
    assert_eq!(listed.lines().count(), 2, "{listed}");

    // Create, in both databases.
    let users = table(
        "users",
        &[("id", "uint64"), ("name", "string"), ("age", "int32")],
    );
    let answer = reconcile(
        &kplug,
        "PostgreSQL",
        "Reconcile",
        &users,
        &extensions("users", "InnoDB"),
    );
    assert_eq!(answer["status"]["success"], true, "{answer:#}");
    assert_eq!(answer["status"]["plugin"]["name"], PG_PLUGIN);
    assert_eq!(
        answer["status"]["selection"]["reason"],
        "PreferredImplementation"
    );
    assert!(
        reasons(&answer).contains(&"TableCreated".to_owned()),
        "{answer:#}"
    );
    assert_eq!(
        pg_columns(&pg, "users"),
        "age integer, id numeric, name character varying"
    );
    // The extension option: hash partitioning, with its status reported.
    assert_eq!(
        pg.query("select partstrat from pg_partitioned_table where partrelid = 'users'::regclass"),
        "h"
    );
    let partitions: u64 = pg
        .query("select count(*) from pg_inherits where inhparent = 'users'::regclass")
        .parse()
        .unwrap_or(0);
    assert!(partitions > 1, "{partitions} partitions");
    let extension_status = &answer["status"]["extensionStatuses"]
        .as_array()
        .and_then(|s| {
            s.iter()
                .find(|s| s["ref"]["kind"] == "DatabaseTablePostgreSqlExtension")
                .cloned()
        })
        .unwrap_or_default();
    assert_eq!(
        extension_status["status"]["partitions"], partitions,
        "{answer:#}"
    );

    let answer = reconcile(
        &kplug,
        "MariaDB",
        "Reconcile",
        &users,
        &extensions("users", "InnoDB"),
    );
    assert_eq!(
        answer["status"]["plugin"]["name"], MARIADB_PLUGIN,
        "{answer:#}"
    );
    assert_eq!(answer["status"]["success"], true, "{answer:#}");
    assert_eq!(
        mariadb_columns("users"),
        "age int(11), id bigint(20) unsigned, name varchar(255)"
    );

    // Add a column, drop one, change a type (not the partition key's: that
    // PostgreSQL refuses).
    let changed = table(
        "users",
        &[("id", "uint64"), ("name", "text"), ("email", "string")],
    );
    let answer = reconcile(
        &kplug,
        "PostgreSQL",
        "Reconcile",
        &changed,
        &extensions("users", "InnoDB"),
    );
    let done = reasons(&answer);
    for reason in ["ColumnAdded", "ColumnDropped", "ColumnTypeChanged"] {
        assert!(
            done.contains(&reason.to_owned()),
            "{reason} missing: {answer:#}"
        );
    }
    assert_eq!(
        pg_columns(&pg, "users"),
        "email character varying, id numeric, name text"
    );
    let answer = reconcile(
        &kplug,
        "MariaDB",
        "Reconcile",
        &changed,
        &extensions("users", "Aria"),
    );
    assert_eq!(answer["status"]["success"], true, "{answer:#}");
    assert_eq!(
        mariadb_columns("users"),
        "email varchar(255), id bigint(20) unsigned, name text"
    );
    // The MariaDB extension option: the storage engine.
    assert_eq!(
        mariadb_query(&format!(
            "select engine from information_schema.tables where table_schema = '{}' and table_name = 'users'",
            mariadb::DATABASE
        )),
        "Aria"
    );

    // An unknown column type is a reported failure (201), and changes nothing.
    let bad = table(
        "users",
        &[("id", "uint64"), ("name", "text"), ("blob", "hologram")],
    );
    let answer = reconcile(
        &kplug,
        "PostgreSQL",
        "Reconcile",
        &bad,
        &extensions("users", "Aria"),
    );
    assert_eq!(answer["status"]["success"], false, "{answer:#}");
    assert!(
        reasons(&answer).contains(&"UnknownColumnType".to_owned()),
        "{answer:#}"
    );
    assert_eq!(
        pg_columns(&pg, "users"),
        "email character varying, id numeric, name text"
    );

    // The preferred implementation has no live plugin: the other is chosen.
    pg_plugin.terminate(Duration::from_secs(10));
    kplug.wait_for_absent(PG_PLUGIN, Duration::from_secs(10));
    let answer = reconcile(
        &kplug,
        "PostgreSQL",
        "Reconcile",
        &table("orders", &[("id", "uint64")]),
        &extensions("orders", "InnoDB"),
    );
    assert_eq!(
        answer["status"]["plugin"]["name"], MARIADB_PLUGIN,
        "{answer:#}"
    );
    assert_eq!(answer["status"]["selection"]["reason"], "Fallback");
    assert_eq!(mariadb_columns("orders"), "id bigint(20) unsigned");

    // The plugin is killed (no deregistration) while still listed: 503,
    // then it comes back at the same address and the call succeeds.
    let mut pg_plugin = start_pg_plugin(&kplug, &pg.dsn, &pg_listen);
    kplug.wait_for_plugin(PG_PLUGIN, ready);
    pg_plugin.kill();
    let path = format!("/apis/plugins.kplug.io/v1alpha1/plugins/{PG_PLUGIN}/reconcile");
    let body =
        json!({"spec": {"object": users, "extensions": extensions("users", "Aria")}}).to_string();
    let (code, status) = kplug.curl(
        "POST",
        &path,
        &["Content-Type: application/json"],
        Some(&body),
    );
    assert_eq!(code, 503, "{status}");
    let _pg_plugin = start_pg_plugin(&kplug, &pg.dsn, &pg_listen);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, answer) = kplug.curl(
            "POST",
            &path,
            &["Content-Type: application/json"],
            Some(&body),
        );
        if code == 201 {
            break;
        }
        assert!(Instant::now() < deadline, "no recovery: {code} {answer}");
        std::thread::sleep(Duration::from_millis(250));
    }

    // A malformed request never reaches a plugin.
    let (code, status) = kplug.curl(
        "POST",
        RECONCILES,
        &["Content-Type: application/json"],
        Some(r#"{"spec": {"api": {"group": "myorg.org", "resource": "databasetables"}}}"#),
    );
    assert_eq!(code, 422, "{status}");

    // Finalize drops the tables.
    let answer = reconcile(
        &kplug,
        "PostgreSQL",
        "Finalize",
        &changed,
        &extensions("users", "Aria"),
    );
    assert!(
        reasons(&answer).contains(&"TableDropped".to_owned()),
        "{answer:#}"
    );
    assert_eq!(
        pg.query("select count(*) from pg_class where relname = 'users'"),
        "0"
    );
    let answer = reconcile(
        &kplug,
        "MariaDB",
        "Finalize",
        &changed,
        &extensions("users", "Aria"),
    );
    assert!(
        reasons(&answer).contains(&"TableDropped".to_owned()),
        "{answer:#}"
    );
    assert_eq!(mariadb_columns("users"), "NULL");
}
