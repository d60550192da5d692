//! The DatabaseTable walkthrough end to end, steps 1 to 6, with the
//! zero-code operator: `kubectl apply` a DatabaseTable and the table appears
//! in a real database, chosen, bound, kept, finalized, on a real control
//! plane, with the operator holding only the example's RBAC.

mod support;

use std::time::{Duration, Instant};

use kplug_test_support::wait_until;
use serde_json::Value;
use support::*;

const RECONCILED: &str = "kplug_operator::reconciler: reconciled";
const NOT_RECONCILED: &str = "kplug_operator::reconciler: not reconciled";

fn table_yaml(name: &str, preferred: &str, columns: &[(&str, &str)], partition_by: &str) -> String {
    let columns: String = columns
        .iter()
        .map(|(n, t)| format!("  - {{name: {n}, type: {t}}}\n"))
        .collect();
    format!(
        "apiVersion: myorg.org/v1alpha1\nkind: DatabaseTable\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  serverName: main\n  preferredImplementation: {preferred}\n  columns:\n{columns}  extensions:\n  - {{apiVersion: myorg.org/v1alpha1, kind: DatabaseTableMariaDbExtension, name: {name}}}\n  - {{apiVersion: myorg.org/v1alpha1, kind: DatabaseTablePostgreSqlExtension, name: {name}}}\n---\napiVersion: myorg.org/v1alpha1\nkind: DatabaseTableMariaDbExtension\nmetadata: {{name: {name}, namespace: default}}\nspec: {{storageEngine: InnoDB}}\n---\napiVersion: myorg.org/v1alpha1\nkind: DatabaseTablePostgreSqlExtension\nmetadata: {{name: {name}, namespace: default}}\nspec: {{partitionBy: {partition_by}}}\n"
    )
}

fn text<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

#[test]
fn the_operator_delegates_database_tables_on_a_real_control_plane() {
    let world = World::start();
    let mut pg_plugin = world.pg_plugin();
    let mut mariadb_plugin = world.mariadb_plugin();
    let only_default = ["--namespace", "default"];
    let (mut leader, leader_log) =
        world.operator("op-a", &world.operator_kubeconfig, &only_default);
    leader_log.wait_for(Duration::from_secs(30), "op-a leads", |l| {
        l.contains("became the leader")
    });
    let (mut standby, standby_log) =
        world.operator("op-b", &world.operator_kubeconfig, &only_default);
    standby_log.wait_for(Duration::from_secs(30), "op-b waits", |l| {
        l.contains("waiting to lead")
    });

    // Steps 1-6 of the walkthrough: users.yaml with both plugins Ready goes
    // to MariaDB, the preferred implementation.
    let examples = kplug_test_support::repo_root().join("examples/database-table");
    world.cluster.kubectl_ok(&[
        "apply",
        "-n",
        "default",
        "-f",
        &examples.join("users.yaml").to_string_lossy(),
    ]);
    let users = world.wait_table(
        "default",
        "users",
        "Ready",
        Duration::from_secs(60),
        ready_now,
    );
    assert_eq!(
        text(&users, "/status/implementation"),
        "MariaDB",
        "{users:#}"
    );
    assert_eq!(text(&users, "/status/plugin/name"), MARIADB_PLUGIN);
    assert_eq!(
        text(&users, "/status/selection/reason"),
        "PreferredImplementation"
    );
    assert!(!text(&users, "/status/plugin/version").is_empty());
    assert_eq!(
        mariadb_columns("users"),
        "id bigint(20) unsigned, name varchar(255)"
    );
    assert_eq!(
        world.pg_columns("users"),
        "NULL",
        "only the chosen implementation"
    );
    world.wait_event("default", "users", "Normal", "TableCreated");
    let extension = world
        .get_json(&["databasetablemariadbextension", "users", "-n", "default"])
        .expect("the MariaDB extension");
    assert_eq!(
        text(&extension, "/status/storageEngine"),
        "InnoDB",
        "{extension:#}"
    );

    // MariaDB absent: PostgreSQL serves (Fallback) and reports partitions
    // in its extension's status.
    world.stop_plugin(&mut mariadb_plugin, MARIADB_PLUGIN);
    world.cluster.apply(&table_yaml(
        "orders",
        "MariaDB",
        &[("id", "uint64"), ("note", "text")],
        "hash",
    ));
    let orders = world.wait_table(
        "default",
        "orders",
        "Ready",
        Duration::from_secs(60),
        ready_now,
    );
    assert_eq!(
        text(&orders, "/status/implementation"),
        "PostgreSQL",
        "{orders:#}"
    );
    assert_eq!(text(&orders, "/status/selection/reason"), "Fallback");
    assert!(
        world.pg_columns("orders").starts_with("id "),
        "{}",
        world.pg_columns("orders")
    );
    let pg_extension = world
        .get_json(&[
            "databasetablepostgresqlextension",
            "orders",
            "-n",
            "default",
        ])
        .expect("the PostgreSQL extension");
    assert_eq!(
        text(&pg_extension, "/status/partitionBy"),
        "hash",
        "{pg_extension:#}"
    );
    assert!(
        pg_extension["status"]["partitions"].as_u64().unwrap_or(0) > 0,
        "{pg_extension:#}"
    );

    // Bound: MariaDB returning does not move the table; edits go to PostgreSQL.
    mariadb_plugin = world.mariadb_plugin();
    world.cluster.kubectl_ok(&[
        "patch", "databasetable", "orders", "-n", "default", "--type=json",
        "-p", r#"[{"op": "add", "path": "/spec/columns/-", "value": {"name": "total", "type": "int64"}}]"#,
    ]);
    let orders = world.wait_table(
        "default",
        "orders",
        "generation 2 Ready",
        Duration::from_secs(60),
        |o| o["metadata"]["generation"] == 2 && ready_now(o),
    );
    assert_eq!(text(&orders, "/status/implementation"), "PostgreSQL");
    assert_eq!(
        text(&orders, "/status/selection/reason"),
        "Fallback",
        "why it is bound there, not how the last call was routed"
    );
    assert!(
        world.pg_columns("orders").ends_with("total bigint"),
        "{}",
        world.pg_columns("orders")
    );
    assert_eq!(mariadb_columns("orders"), "NULL", "the data did not move");
    // A changed extension re-reconciles its table: un-partitioning is
    // refused by the plugin, and reverting it makes the table Ready again.
    let partition_by = |strategy: &str| {
        world.cluster.kubectl_ok(&[
            "patch",
            "databasetablepostgresqlextension",
            "orders",
            "-n",
            "default",
            "--type=merge",
            "-p",
            &format!(r#"{{"spec": {{"partitionBy": "{strategy}"}}}}"#),
        ]);
    };
    partition_by("none");
    world.wait_table(
        "default",
        "orders",
        "the extension change refused",
        Duration::from_secs(30),
        |o| condition(o, "Ready").is_some_and(|c| c["reason"] == "PartitioningChangeUnsupported"),
    );
    partition_by("hash");
    world.wait_table(
        "default",
        "orders",
        "Ready again",
        Duration::from_secs(30),
        ready_now,
    );

    // A plugin failure: Ready=False with the plugin's reason, a Warning, backoff.
    world.cluster.apply(&table_yaml(
        "broken",
        "PostgreSQL",
        &[("id", "uint64"), ("blob", "blob9")],
        "none",
    ));
    let broken = world.wait_table(
        "default",
        "broken",
        "failed",
        Duration::from_secs(60),
        |o| {
            condition(o, "Ready")
                .is_some_and(|c| c["status"] == "False" && c["reason"] == "UnknownColumnType")
        },
    );
    assert!(
        text(&broken, "/status/implementation").eq_ignore_ascii_case("PostgreSQL"),
        "{broken:#}"
    );
    world.wait_event("default", "broken", "Warning", "UnknownColumnType");
    // Exponential backoff: each retry is scheduled later than the one before.
    let mut delays = Vec::new();
    wait_until("three retries of broken", Duration::from_secs(60), || {
        delays = requeue_delays(&world.operator_log("op-a"), "/broken.");
        (delays.len() >= 3).then_some(()).ok_or(delays.len())
    });
    println!("failing object: retries scheduled after {delays:.1?} s");
    assert!(
        delays.windows(2).all(|w| w[1] > w[0]),
        "backoff grows: {delays:?}"
    );
    assert!(
        delays[0] >= 1.0,
        "no retry sooner than --min-backoff: {delays:?}"
    );

    // Its retries repeated one Warning, counted in that Event's series; a
    // changed message for the same reason is a new Event beside it.
    wait_until(
        "the retries counted in the series of broken's Warning",
        Duration::from_secs(30),
        || {
            let list = world.get_json(&["events.v1.events.k8s.io", "-n", "default"])?;
            let counts: Vec<i64> = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| {
                    e["regarding"]["name"] == "broken" && e["reason"] == "UnknownColumnType"
                })
                .map(|e| e["series"]["count"].as_i64().unwrap_or(1))
                .collect();
            (counts.len() == 1 && counts[0] >= 2)
                .then_some(())
                .ok_or_else(|| format!("series counts {counts:?}"))
        },
    );
    world.cluster.apply(&table_yaml(
        "broken",
        "PostgreSQL",
        &[("id", "uint64"), ("blob", "blob7")],
        "none",
    ));
    wait_until(
        "an UnknownColumnType Event about blob7 beside the one about blob9",
        Duration::from_secs(60),
        || {
            let notes: Vec<String> = world
                .events("default", "broken")
                .into_iter()
                .filter(|(t, r, _)| t == "Warning" && r == "UnknownColumnType")
                .map(|(_, _, note)| note)
                .collect();
            let about =
                |column_type: &str| notes.iter().filter(|n| n.contains(column_type)).count();
            (notes.len() == 2 && about("blob9") == 1 && about("blob7") == 1)
                .then_some(())
                .ok_or_else(|| format!("{notes:?}"))
        },
    );

    // No plugin Ready: a condition, no hot loop, and a wake-up on the first plugin.
    world.stop_plugin(&mut pg_plugin, PG_PLUGIN);
    world.stop_plugin(&mut mariadb_plugin, MARIADB_PLUGIN);
    world.cluster.apply(&table_yaml(
        "waiting",
        "PostgreSQL",
        &[("id", "uint64")],
        "none",
    ));
    let waiting = world.wait_table(
        "default",
        "waiting",
        "waiting",
        Duration::from_secs(60),
        |o| condition(o, "Ready").is_some_and(|c| c["reason"] == "PluginUnavailable"),
    );
    assert!(
        text(&waiting, "/status/conditions/0/message").contains("no Ready plugin"),
        "{waiting:#}"
    );
    world.wait_event("default", "waiting", "Warning", "PluginUnavailable");
    let version = text(&waiting, "/metadata/resourceVersion").to_owned();
    leader_log.drain();
    std::thread::sleep(Duration::from_secs(30)); // the window the calls are counted in
    let waiting_log = leader_log.drain();
    let attempts = count(&waiting_log, "/waiting.", NOT_RECONCILED);
    // kplug's 503s are expected here: the operator's own lines say so, and
    // nothing logs them as errors (kube-client did, for every one).
    let errors: Vec<_> = waiting_log.iter().filter(|l| l.contains("ERROR")).collect();
    assert!(
        errors.is_empty(),
        "expected 503s logged as errors: {errors:#?}"
    );
    let after = world.table("default", "waiting");
    println!("no plugin: {attempts} delegation attempts and 0 status writes in 30 s");
    assert!(attempts <= 8, "{attempts} attempts in 30 s: a hot loop");
    assert_eq!(
        text(&after, "/metadata/resourceVersion"),
        version,
        "no status write while nothing changes"
    );
    let started = Instant::now();
    pg_plugin = world.pg_plugin();
    let plugin_ready = started.elapsed();
    world.wait_table(
        "default",
        "waiting",
        "Ready",
        Duration::from_secs(60),
        ready_now,
    );
    let converged = started.elapsed();
    println!(
        "waiting object converged {:.1} s after the plugin started ({:.1} s after it was Ready)",
        converged.as_secs_f64(),
        (converged - plugin_ready).as_secs_f64()
    );
    assert!(
        leader_log
            .drain()
            .iter()
            .any(|l| l.contains("waking the objects waiting for one")),
        "the Ready plugin woke the waiting object"
    );
    assert!(
        converged - plugin_ready < Duration::from_secs(10),
        "woken, not polled: {converged:?}"
    );

    // Deleting with its implementation's plugin down: the object stays,
    // saying why, until that plugin is back and finalizes it; another
    // implementation's Ready plugin is never asked.
    mariadb_plugin = world.mariadb_plugin();
    world.stop_plugin(&mut pg_plugin, PG_PLUGIN);
    world.cluster.kubectl_ok(&[
        "delete",
        "databasetable",
        "orders",
        "-n",
        "default",
        "--wait=false",
    ]);
    let deleting = world.wait_table(
        "default",
        "orders",
        "waiting to finalize",
        Duration::from_secs(60),
        |o| {
            !o["metadata"]["deletionTimestamp"].is_null()
                && condition(o, "Ready").is_some_and(|c| c["reason"] == "PluginUnavailable")
        },
    );
    let message = text(&deleting, "/status/conditions/0/message");
    assert!(
        message.contains("finalizer") && message.contains("of implementation PostgreSQL"),
        "{deleting:#}"
    );
    assert!(
        world.pg_columns("orders").starts_with("id "),
        "not dropped without a plugin"
    );
    pg_plugin = world.pg_plugin();
    world.wait_gone("default", "orders", Duration::from_secs(60));
    assert_eq!(
        world.pg_columns("orders"),
        "NULL",
        "Finalize dropped the table"
    );

    // Deleting with the plugin up: MariaDB drops users.
    world.cluster.kubectl_ok(&[
        "delete",
        "databasetable",
        "users",
        "-n",
        "default",
        "--wait=false",
    ]);
    world.wait_gone("default", "users", Duration::from_secs(60));
    assert_eq!(
        mariadb_columns("users"),
        "NULL",
        "Finalize dropped the table"
    );

    // Only the leader reconciled; the standby takes over when it stops.
    assert_eq!(
        count(&standby_log.drain(), "", RECONCILED),
        0,
        "the standby wrote nothing"
    );
    let settled = world.table("default", "broken");
    assert!(
        leader.terminate(Duration::from_secs(30)),
        "op-a shut down cleanly"
    );
    standby_log.wait_for(Duration::from_secs(30), "op-b leads", |l| {
        l.contains("became the leader")
    });
    // The new leader reconciles what it finds, and writes nothing that
    // did not change (the failing table gets the same answer again).
    standby_log.wait_for(Duration::from_secs(30), "op-b reconciled broken", |l| {
        l.contains(RECONCILED) && l.contains("/broken.")
    });
    let after = world.table("default", "broken");
    assert_eq!(
        after["metadata"]["resourceVersion"], settled["metadata"]["resourceVersion"],
        "no duplicate write after the failover: the status was {:#}, then {:#}",
        settled["status"], after["status"]
    );
    world.cluster.apply(&table_yaml(
        "accounts",
        "MariaDB",
        &[("id", "uint64")],
        "none",
    ));
    let accounts = world.wait_table(
        "default",
        "accounts",
        "Ready",
        Duration::from_secs(60),
        ready_now,
    );
    assert_eq!(text(&accounts, "/status/implementation"), "MariaDB");
    assert_eq!(mariadb_columns("accounts"), "id bigint(20) unsigned");

    // The operator written with the library (examples/database-table/operator)
    // takes over the same objects: same field manager, finalizer and Lease.
    assert!(
        standby.terminate(Duration::from_secs(30)),
        "op-b shut down cleanly"
    );
    let (_typed, typed_log) = world.typed_operator("op-typed", &only_default);
    typed_log.wait_for(Duration::from_secs(30), "the typed operator leads", |l| {
        l.contains("became the leader")
    });
    world.cluster.kubectl_ok(&[
        "patch", "databasetable", "accounts", "-n", "default", "--type=json",
        "-p", r#"[{"op": "add", "path": "/spec/columns/-", "value": {"name": "owner", "type": "string"}}]"#,
    ]);
    world.wait_table(
        "default",
        "accounts",
        "generation 2 Ready",
        Duration::from_secs(60),
        |o| o["metadata"]["generation"] == 2 && ready_now(o),
    );
    assert_eq!(
        mariadb_columns("accounts"),
        "id bigint(20) unsigned, owner varchar(255)"
    );
    drop((pg_plugin, mariadb_plugin));
}

#[test]
fn an_operator_without_the_right_to_delegate_says_so() {
    let world = World::start();
    let _pg_plugin = world.pg_plugin();
    // The example's rights on DatabaseTables and a Lease, but not kplug:operator.
    world
        .cluster
        .kubectl_ok(&["create", "serviceaccount", "no-delegation", "-n", "plugins"]);
    world.cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "no-delegation",
        "--clusterrole=database-table-operator",
        "--serviceaccount=plugins:no-delegation",
    ]);
    world.cluster.kubectl_ok(&[
        "create",
        "rolebinding",
        "no-delegation",
        "-n",
        "plugins",
        "--role=database-table-operator-leader-election",
        "--serviceaccount=plugins:no-delegation",
    ]);
    let kubeconfig = world.work.path().join("no-delegation.kubeconfig");
    world.cluster.kubeconfig_for_token(
        &kubeconfig,
        &world.cluster.token("plugins", "no-delegation"),
    );
    let (mut operator, _log) = world.operator("restricted", &kubeconfig, &[]);
    world.cluster.apply(&table_yaml(
        "secrets",
        "PostgreSQL",
        &[("id", "uint64")],
        "none",
    ));
    let table = world.wait_table(
        "default",
        "secrets",
        "Forbidden",
        Duration::from_secs(60),
        |o| {
            condition(o, "Ready")
                .is_some_and(|c| c["status"] == "False" && c["reason"] == "Forbidden")
        },
    );
    assert!(
        text(&table, "/status/conditions/0/message").contains("reconciles"),
        "{table:#}"
    );
    world.wait_event("default", "secrets", "Warning", "Forbidden");
    assert_eq!(world.pg_columns("secrets"), "NULL");
    assert!(
        operator.child.try_wait().ok().flatten().is_none(),
        "the operator keeps running"
    );
}

/// Any language, one API call: the Python operator of
/// `examples/python-operator` (the official `kubernetes` client, nothing
/// kplug-specific) runs as the same ServiceAccount with the same RBAC.
#[test]
fn the_python_operator_delegates_with_one_api_call() {
    let world = World::start();
    let _pg_plugin = world.pg_plugin();
    world.cluster.kubectl_ok(&["create", "namespace", "python"]);
    let mut child = std::process::Command::new(kplug_test_support::postgres::venv_python())
        .args([
            "-m",
            "python_operator",
            "--group",
            "myorg.org",
            "--version",
            "v1alpha1",
        ])
        .args([
            "--plural",
            "databasetables",
            "--namespace",
            "python",
            "--kubeconfig",
        ])
        .arg(&world.operator_kubeconfig)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the Python operator (run hack/python-env.sh first)");
    let log = kplug_test_support::Lines::new(child.stderr.take().expect("stderr"));
    let mut operator = kplug_test_support::Process::new(child, "python-operator");
    log.wait_for(
        Duration::from_secs(60),
        "the Python operator watching",
        |l| l.contains("watching databasetables.myorg.org"),
    );
    world.cluster.apply(
        &table_yaml(
            "items",
            "MariaDB",
            &[("id", "uint64"), ("label", "string")],
            "none",
        )
        .replace("namespace: default", "namespace: python"),
    );
    let table = world.wait_table("python", "items", "Ready", Duration::from_secs(90), |o| {
        is_true(o, "Ready") && o["status"]["observedGeneration"] == o["metadata"]["generation"]
    });
    assert_eq!(
        text(&table, "/status/implementation"),
        "PostgreSQL",
        "{table:#}"
    );
    assert_eq!(text(&table, "/status/selection/reason"), "Fallback");
    assert!(
        world.pg_columns("items").starts_with("id "),
        "{}",
        world.pg_columns("items")
    );
    world.cluster.kubectl_ok(&[
        "delete",
        "databasetable",
        "items",
        "-n",
        "python",
        "--wait=false",
    ]);
    world.wait_gone("python", "items", Duration::from_secs(60));
    assert_eq!(
        world.pg_columns("items"),
        "NULL",
        "Finalize dropped the table"
    );
    assert!(
        operator.terminate(Duration::from_secs(30)),
        "a clean exit on SIGTERM"
    );
}
