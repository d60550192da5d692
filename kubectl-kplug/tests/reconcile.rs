//! `kubectl kplug` end to end, through the real kubectl, against a real
//! kube-apiserver and etcd, kplug behind its APIService, a real PostgreSQL
//! and the PostgreSQL plugin: a reconcile creates the table, a dry run
//! changes nothing, and every way it can fail says why and exits non-zero.

mod support;

use std::time::Duration;

use kplug_test_support::database_table::{self, PG_PLUGIN};
use kplug_test_support::postgres::Postgres;
use kplug_test_support::{
    AggregatedKplug, ControlPlane, output_text, plugin_identity, repo_root, wait_until,
};
use serde_json::Value;
use support::{Plugin, fails, ok};

/// A DatabaseTable in `default` with one column of `column_type` and a
/// reference to a PostgreSQL extension of the same name that may not exist.
fn table(name: &str, column_type: &str, with_extension: bool) -> String {
    let extensions = if with_extension {
        format!(
            "  extensions:\n  - {{apiVersion: myorg.org/v1alpha1, kind: DatabaseTablePostgreSqlExtension, name: {name}}}\n"
        )
    } else {
        String::new()
    };
    format!(
        "apiVersion: myorg.org/v1alpha1\nkind: DatabaseTable\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  serverName: main\n  columns:\n  - {{name: id, type: {column_type}}}\n{extensions}"
    )
}

#[test]
fn kubectl_kplug_on_a_real_control_plane() {
    // Declared first, dropped last: the processes stop before their files go.
    let work = tempfile::Builder::new()
        .prefix("kubectl-kplug-")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let cluster = ControlPlane::start(work.path().join("cp"));
    let kplug = AggregatedKplug::start(&cluster, work.path(), &["--min-heartbeat-interval", "1s"]);
    database_table::install(&cluster);
    let pg = Postgres::start();
    let token = plugin_identity(&cluster, PG_PLUGIN, Some(PG_PLUGIN), work.path());
    let mut pg_plugin = database_table::postgresql_plugin(&cluster, &kplug, &pg.dsn, &token);
    let cli = Plugin::install(work.path());
    let admin = cluster.kubeconfig();
    let users = repo_root().join("examples/database-table/users.yaml");
    cluster.kubectl_ok(&["apply", "-n", "default", "-f", &users.to_string_lossy()]);

    // Which plugin would get a DatabaseTable, and why.
    let plugins = ok(&cli.run(&admin, &["plugins"]));
    assert!(
        plugins.starts_with("NAME ") && plugins.contains(PG_PLUGIN),
        "{plugins}"
    );
    let explained = ok(&cli.run(&admin, &["plugins", "databasetables"]));
    assert!(
        explained.contains(&format!(
            "A reconcile of databasetables.myorg.org goes to:\n  {PG_PLUGIN} (implementation PostgreSQL"
        )),
        "{explained}"
    );
    assert!(explained.contains("Reason: Fallback: chose"), "{explained}");
    let preferred = ok(&cli.run(
        &admin,
        &["plugins", "dbtable", "--implementation", "postgresql"],
    ));
    assert!(
        preferred.contains("Reason: PreferredImplementation"),
        "{preferred}"
    );

    // A dry run (KUBECONFIG honoured): the plugin plans, the database stays empty.
    let planned = ok(&cli.run_with_env(
        &admin,
        &["reconcile", "databasetable/users", "--dry-run=server"],
    ));
    assert!(
        planned
            .starts_with("databasetable.myorg.org/users reconciled (dry run: nothing was changed)"),
        "{planned}"
    );
    assert!(planned.contains(PG_PLUGIN), "{planned}");
    // users.yaml prefers MariaDB, which has no plugin here.
    assert!(
        planned.contains("Fallback: no Ready plugin implements MariaDB"),
        "{planned}"
    );
    assert!(
        planned.contains("TableCreated") && planned.contains("would create"),
        "{planned}"
    );
    assert_eq!(pg.columns("users"), "NULL", "a dry run changes nothing");

    // The real reconcile creates the table and reports the statuses.
    let done = ok(&cli.run(
        &admin,
        &["reconcile", "databasetable", "users", "-n", "default"],
    ));
    assert!(
        done.starts_with("databasetable.myorg.org/users reconciled\n"),
        "{done}"
    );
    assert!(
        done.contains("Normal") && done.contains("TableCreated"),
        "{done}"
    );
    assert!(
        done.contains("DatabaseTablePostgreSqlExtension users"),
        "{done}"
    );
    assert!(done.contains("Operation ID:"), "{done}");
    let columns = pg.columns("users");
    assert!(
        columns.starts_with("id ") && columns.contains("name "),
        "{columns}"
    );
    let object: Value = serde_json::from_str(&cluster.kubectl_ok(&[
        "get",
        "databasetable",
        "users",
        "-n",
        "default",
        "-o",
        "json",
    ]))
    .expect("the DatabaseTable as JSON");
    assert!(
        object.get("status").is_none(),
        "the CLI never writes status: {object:#}"
    );

    // -o json prints kplug's whole answer.
    let answer: Value = serde_json::from_str(&ok(&cli.run(
        &admin,
        &["reconcile", "databasetables.myorg.org/users", "-o", "json"],
    )))
    .expect("-o json is JSON");
    assert_eq!(answer["kind"], "Reconcile");
    assert_eq!(answer["status"]["success"], true);
    assert_eq!(answer["status"]["plugin"]["name"], PG_PLUGIN);
    assert_eq!(answer["status"]["results"][0]["reason"], "UpToDate");

    // By reference: kplug reads the object and its extensions with its own
    // identity, once `create plugin`'s read role grants it.
    let by_reference = ["reconcile", "dbtable/users", "--by-reference", "-o", "json"];
    let refused = fails(&cli.run(&admin, &by_reference));
    assert!(
        refused.contains("kplug may not read databasetables.myorg.org \"users\""),
        "{refused}"
    );
    let manifests = ok(&cli.run(
        &admin,
        &[
            "create",
            "plugin",
            PG_PLUGIN,
            "--image",
            "unused",
            "--api",
            "databasetables.myorg.org/v1alpha1",
            "--extension-resource",
            "databasetablemariadbextensions.myorg.org",
            "--extension-resource",
            "databasetablepostgresqlextensions.myorg.org",
        ],
    ));
    let read_role: Vec<&str> = manifests
        .split("\n---\n")
        .filter(|document| document.contains("name: kplug:read:"))
        .collect();
    assert_eq!(read_role.len(), 2, "{manifests}");
    cluster.apply(&read_role.join("\n---\n"));
    let mut answer = Value::Null;
    wait_until("a reconcile by reference", Duration::from_secs(30), || {
        let output = cli.run(&admin, &by_reference);
        answer = serde_json::from_slice(&output.stdout).map_err(|_| output_text(&output))?;
        Ok::<(), String>(())
    });
    assert_eq!(answer["status"]["success"], true, "{answer:#}");
    assert_eq!(answer["spec"]["objectRef"]["name"], "users");
    assert_eq!(
        answer["spec"]["object"]["metadata"]["resourceVersion"],
        object["metadata"]["resourceVersion"]
    );
    let kinds: Vec<&str> = answer["spec"]["extensions"]
        .as_array()
        .map(|all| all.iter().filter_map(|e| e["kind"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        kinds,
        [
            "DatabaseTableMariaDbExtension",
            "DatabaseTablePostgreSqlExtension"
        ]
    );

    let yaml = ok(&cli.run(
        &admin,
        &[
            "reconcile",
            "dbtable/users",
            "--dry-run=server",
            "-o",
            "yaml",
        ],
    ));
    assert!(
        yaml.starts_with("apiVersion: plugins.kplug.io/v1alpha1\n")
            && yaml.contains("kind: Reconcile\n"),
        "{yaml}"
    );
    let ghost = fails(&cli.run(
        &admin,
        &["reconcile", "databasetable/users", "--plugin", "ghost"],
    ));
    assert!(ghost.contains("plugin \"ghost\" not found"), "{ghost}");

    // A plugin's own failure: the outcome is printed, and the exit code is 1.
    cluster.apply(&table("broken", "quantum", false));
    let broken = cli.run(&admin, &["reconcile", "databasetable/broken"]);
    let stderr = fails(&broken);
    assert!(
        String::from_utf8_lossy(&broken.stdout)
            .contains("NOT reconciled: the plugin reported a failure"),
        "{}",
        output_text(&broken)
    );
    assert!(
        stderr.contains("the plugin reported a failure: UnknownColumnType"),
        "{stderr}"
    );

    // Missing object, unknown type, missing extension.
    let missing = fails(&cli.run(&admin, &["reconcile", "databasetable/ghost"]));
    assert!(
        missing.contains("databasetables.myorg.org \"ghost\" not found in namespace \"default\""),
        "{missing}"
    );
    let unknown = fails(&cli.run(&admin, &["reconcile", "gizmo/users"]));
    assert!(
        unknown.contains("the server doesn't have a resource type \"gizmo\""),
        "{unknown}"
    );
    cluster.apply(&table("orphan", "uint64", true));
    let orphan = fails(&cli.run(&admin, &["reconcile", "databasetable/orphan"]));
    assert!(
        orphan.contains("DatabaseTablePostgreSqlExtension orphan: not found")
            && orphan.contains("create the extension object orphan"),
        "{orphan}"
    );
    assert_eq!(pg.columns("orphan"), "NULL");

    // No rights at all (an impersonated user): reading the object is refused.
    let nobody = fails(&cli.run(&admin, &["reconcile", "databasetable/users", "--as=nobody"]));
    assert!(
        nobody.contains("you may not get databasetables.myorg.org in namespace \"default\""),
        "{nobody}"
    );
    // A ServiceAccount that may read the objects but not delegate them.
    cluster.kubectl_ok(&["create", "serviceaccount", "reader", "-n", "default"]);
    cluster.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: table-reader, namespace: default}\nrules:\n- {apiGroups: [myorg.org], resources: [databasetables, databasetablemariadbextensions, databasetablepostgresqlextensions], verbs: [get]}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: table-reader, namespace: default}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: table-reader}\nsubjects:\n- {kind: ServiceAccount, name: reader, namespace: default}\n",
    );
    let reader = work.path().join("reader.kubeconfig");
    cluster.kubeconfig_for_token(&reader, &cluster.token("default", "reader"));
    let denied = fails(&cli.run(
        &reader,
        &["reconcile", "databasetable/users", "-n", "default"],
    ));
    assert!(
        denied.contains("you may not create reconciles.plugins.kplug.io in namespace \"default\": ")
            && denied.contains("bind the ClusterRole kplug:operator (or edit) to you with a RoleBinding in the namespace \"default\""),
        "{denied}"
    );
    let unlisted = fails(&cli.run(&reader, &["plugins"]));
    assert!(
        unlisted.contains("you may not list plugins.kplug.io"),
        "{unlisted}"
    );

    // No Ready plugin: kplug's 503, said as such.
    assert!(
        pg_plugin.terminate(Duration::from_secs(30)),
        "the plugin stops cleanly"
    );
    wait_until("the plugin deregistered", Duration::from_secs(30), || {
        let output = cluster.kubectl(&["get", "plugin", PG_PLUGIN]);
        let text = output_text(&output);
        (!output.status.success() && text.contains("NotFound"))
            .then_some(())
            .ok_or(text)
    });
    let waiting = fails(&cli.run(&admin, &["reconcile", "databasetable/users"]));
    assert!(
        waiting.contains("no Ready plugin can take it: no Ready plugin")
            && waiting.contains("kubectl kplug plugins databasetables.myorg.org"),
        "{waiting}"
    );
    let nobody_ready = ok(&cli.run(&admin, &["plugins", "databasetables"]));
    assert!(
        nobody_ready.contains("No plugins serve databasetables.myorg.org.")
            && nobody_ready
                .contains("would be refused: no Ready plugin serves databasetables.myorg.org"),
        "{nobody_ready}"
    );

    // kplug down behind its APIService, then not installed at all.
    drop(kplug);
    wait_until("kplug unavailable", Duration::from_secs(60), || {
        let output = cli.run(&admin, &["reconcile", "databasetable/users"]);
        let text = output_text(&output);
        (output.status.code() == Some(1) && text.contains("kplug's API is unavailable"))
            .then_some(())
            .ok_or(text)
    });
    cluster.kubectl_ok(&["delete", "apiservice", "v1alpha1.plugins.kplug.io"]);
    wait_until("kplug not installed", Duration::from_secs(60), || {
        let output = cli.run(&admin, &["reconcile", "databasetable/users"]);
        let text = output_text(&output);
        (output.status.code() == Some(1) && text.contains("error: kplug is not installed"))
            .then_some(())
            .ok_or(text)
    });
}
