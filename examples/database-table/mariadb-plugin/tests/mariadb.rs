//! The MariaDB plugin against a real, private MariaDB server, called
//! through real gRPC the way kplug calls it. Every check of the outcome is
//! backed by a check of the database's own catalog.
//!
//! Tests share one server and use distinct table names.

use std::time::Duration;

use kplug_sdk::proto::v1alpha1::plugin_client::PluginClient;
use kplug_sdk::proto::v1alpha1::{ReconcileRequest, ReconcileResponse};
use kplug_sdk::{Config, Server};
use kplug_test_support::mariadb::{self, MariaDb};
use mariadb_plugin::MariaDbPlugin;
use mariadb_plugin::mariadb::{Server as DbServer, Servers};
use mysql_async::prelude::Queryable;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// The plugin served on a free port, plus a direct line to the database.
struct Harness {
    client: PluginClient<Channel>,
    db: mysql_async::Conn,
    stop: Option<oneshot::Sender<()>>,
}

impl Harness {
    /// The plugin with `MARIADB_URL` (TCP) as its only server.
    async fn start() -> Self {
        let server = mariadb::shared();
        let servers =
            Servers::default().with_default(DbServer::new("default", &server.tcp_url()).unwrap());
        Self::with_servers(server, servers).await
    }

    async fn with_servers(server: &MariaDb, servers: Servers) -> Self {
        // No registry listens there: heartbeats fail and are retried, which
        // does not affect serving.
        let config = Config::default()
            .registry("http://127.0.0.1:1")
            .listen("127.0.0.1:0".parse().unwrap())
            .drain_timeout(Duration::from_secs(5));
        let plugin = Server::bind(
            MariaDbPlugin::new(servers),
            mariadb_plugin::plugin_info(),
            config,
        )
        .await
        .unwrap();
        let address = plugin.local_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(plugin.run(async {
            let _ = stopped.await;
        }));
        let client = PluginClient::connect(format!("http://{address}"))
            .await
            .unwrap();
        let db = mysql_async::Conn::from_url(server.tcp_url()).await.unwrap();
        Self {
            client,
            db,
            stop: Some(stop),
        }
    }

    async fn reconcile(
        &mut self,
        object: &Value,
        extension: Option<&Value>,
        dry_run: bool,
    ) -> ReconcileResponse {
        let request = request(object, extension, dry_run);
        self.client
            .reconcile(request)
            .await
            .expect("a gRPC answer")
            .into_inner()
    }

    async fn finalize(&mut self, object: &Value, dry_run: bool) -> ReconcileResponse {
        let request = request(object, None, dry_run);
        self.client
            .finalize(request)
            .await
            .expect("a gRPC answer")
            .into_inner()
    }

    /// (COLUMN_NAME, COLUMN_TYPE) in order, from the catalog.
    async fn columns(&mut self, table: &str) -> Vec<(String, String)> {
        self.db
            .exec(
                "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
                (table,),
            )
            .await
            .unwrap()
    }

    /// information_schema.TABLES.ENGINE; `None` when the table is absent.
    async fn engine(&mut self, table: &str) -> Option<String> {
        self.db
            .exec_first(
                "SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
                (table,),
            )
            .await
            .unwrap()
    }

    async fn sql(&mut self, statement: &str) {
        self.db.query_drop(statement).await.unwrap();
    }

    async fn stop(mut self) {
        let _ = self.stop.take().map(|stop| stop.send(()));
        let _ = self.db.disconnect().await;
    }
}

fn request(object: &Value, extension: Option<&Value>, dry_run: bool) -> ReconcileRequest {
    ReconcileRequest {
        operation_id: "test".into(),
        dry_run,
        object: serde_json::to_vec(object).unwrap().into(),
        extensions: extension
            .map(|e| serde_json::to_vec(e).unwrap().into())
            .into_iter()
            .collect(),
        timeout: Some(Duration::from_secs(30).try_into().unwrap()),
        caller: None,
        ..ReconcileRequest::default()
    }
}

fn table(name: &str, columns: &[(&str, &str)]) -> Value {
    let columns: Vec<Value> = columns
        .iter()
        .map(|(name, t)| json!({"name": name, "type": t}))
        .collect();
    json!({
        "apiVersion": "myorg.org/v1alpha1",
        "kind": "DatabaseTable",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "serverName": "authorization-cluster",
            "preferredImplementation": "MariaDB",
            "columns": columns,
            "extensions": [{"apiVersion": "myorg.org/v1alpha1", "kind": "DatabaseTableMariaDbExtension", "name": name}],
        },
    })
}

fn engine_extension(name: &str, engine: &str) -> Value {
    json!({
        "apiVersion": "myorg.org/v1alpha1",
        "kind": "DatabaseTableMariaDbExtension",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"storageEngine": engine},
    })
}

fn reasons(answer: &ReconcileResponse) -> Vec<&str> {
    answer.results.iter().map(|r| r.reason.as_str()).collect()
}

fn object_status(answer: &ReconcileResponse) -> Value {
    serde_json::from_slice(&answer.object_status).expect("objectStatus is JSON")
}

fn synced(answer: &ReconcileResponse) -> (&str, &str) {
    let condition = answer
        .conditions
        .iter()
        .find(|c| c.r#type == "Synced")
        .expect("a Synced condition");
    (condition.status.as_str(), condition.reason.as_str())
}

fn owned(columns: &[(&str, &str)]) -> Vec<(String, String)> {
    columns
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[tokio::test]
async fn creates_the_table_then_reports_it_up_to_date() {
    let mut h = Harness::start().await;
    let users = table(
        "users",
        &[
            ("id", "uint64"),
            ("name", "string"),
            ("active", "bool"),
            ("seen", "timestamp"),
        ],
    );
    let extension = engine_extension("users", "InnoDB");

    let answer = h.reconcile(&users, Some(&extension), false).await;
    assert!(answer.success, "{answer:?}");
    assert_eq!(reasons(&answer), ["TableCreated"]);
    assert!(
        answer.results[0]
            .message
            .contains("created table users with 4 columns"),
        "{answer:?}"
    );
    assert_eq!(synced(&answer), ("True", "Reconciled"));
    assert_eq!(
        h.columns("users").await,
        owned(&[
            ("id", "bigint(20) unsigned"),
            ("name", "varchar(255)"),
            ("active", "tinyint(1)"),
            ("seen", "datetime(6)")
        ])
    );
    assert_eq!(h.engine("users").await.as_deref(), Some("InnoDB"));
    let status = object_status(&answer);
    assert_eq!(status["table"], "users");
    assert_eq!(status["columns"], 4);
    assert_eq!(status["database"], mariadb::DATABASE);
    let [extension_status] = answer.extension_statuses.as_slice() else {
        panic!("one extension status: {answer:?}");
    };
    let reference = extension_status.r#ref.as_ref().unwrap();
    assert_eq!(
        (reference.kind.as_str(), reference.name.as_str()),
        ("DatabaseTableMariaDbExtension", "users")
    );
    let status: Value = serde_json::from_slice(&extension_status.status).unwrap();
    assert_eq!(status["storageEngine"], "InnoDB");
    assert!(
        status["rows"].is_u64() && status["dataLength"].is_u64(),
        "{status}"
    );

    let again = h.reconcile(&users, Some(&extension), false).await;
    assert!(again.success, "{again:?}");
    assert_eq!(reasons(&again), ["UpToDate"]);
    assert_eq!(synced(&again), ("True", "UpToDate"));
    h.stop().await;
}

#[tokio::test]
async fn every_type_is_created_and_then_recognised() {
    let mut h = Harness::start().await;
    let columns: Vec<(String, &str)> = mariadb_plugin::schema::TYPES
        .iter()
        .map(|(name, _)| (format!("c_{name}"), *name))
        .collect();
    let columns: Vec<(&str, &str)> = columns.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    let everything = table("everything", &columns);
    let answer = h.reconcile(&everything, None, false).await;
    assert!(answer.success, "{answer:?}");
    assert_eq!(object_status(&answer)["columns"], columns.len());
    // What MariaDB reports for each type reads back as that type.
    let again = h.reconcile(&everything, None, false).await;
    assert_eq!(reasons(&again), ["UpToDate"], "{again:?}");
    // JSON columns only take JSON.
    h.sql("INSERT INTO everything (c_json) VALUES ('{\"a\": 1}')")
        .await;
    assert!(
        h.db.query_drop("INSERT INTO everything (c_json) VALUES ('nope')")
            .await
            .is_err()
    );
    h.stop().await;
}

#[tokio::test]
async fn adds_drops_and_retypes_columns_keeping_the_data() {
    let mut h = Harness::start().await;
    let before = table(
        "accounts",
        &[("id", "int32"), ("legacy", "text"), ("balance", "float32")],
    );
    assert!(h.reconcile(&before, None, false).await.success);
    h.sql("INSERT INTO accounts (id, legacy, balance) VALUES (7, 'old', 1.5)")
        .await;

    let after = table(
        "accounts",
        &[
            ("id", "uint64"),
            ("email", "string"),
            ("balance", "float64"),
        ],
    );
    let answer = h.reconcile(&after, None, false).await;
    assert!(answer.success, "{answer:?}");
    assert_eq!(
        reasons(&answer),
        [
            "ColumnTypeChanged",
            "ColumnAdded",
            "ColumnTypeChanged",
            "ColumnDropped"
        ]
    );
    assert_eq!(
        answer.results[0].message,
        "changed column id from int(11) to BIGINT UNSIGNED"
    );
    assert_eq!(
        h.columns("accounts").await,
        owned(&[
            ("id", "bigint(20) unsigned"),
            ("balance", "double"),
            ("email", "varchar(255)")
        ])
    );
    assert_eq!(object_status(&answer)["columns"], 3);
    // Nothing changed without a storage engine in the spec.
    assert!(answer.extension_statuses.is_empty());
    let row: Option<(u64, f64, Option<String>)> =
        h.db.query_first("SELECT id, balance, email FROM accounts")
            .await
            .unwrap();
    assert_eq!(row, Some((7, 1.5, None)));
    h.stop().await;
}

#[tokio::test]
async fn changes_the_storage_engine() {
    let mut h = Harness::start().await;
    let logs = table("logs", &[("id", "uint64"), ("line", "text")]);
    assert!(
        h.reconcile(&logs, Some(&engine_extension("logs", "InnoDB")), false)
            .await
            .success
    );
    assert_eq!(h.engine("logs").await.as_deref(), Some("InnoDB"));

    for (asked, engine) in [("Aria", "Aria"), ("myisam", "MyISAM")] {
        let answer = h
            .reconcile(&logs, Some(&engine_extension("logs", asked)), false)
            .await;
        assert!(answer.success, "{answer:?}");
        assert_eq!(reasons(&answer), ["StorageEngineChanged"]);
        assert_eq!(h.engine("logs").await.as_deref(), Some(engine));
        let status: Value = serde_json::from_slice(&answer.extension_statuses[0].status).unwrap();
        assert_eq!(status["storageEngine"], engine);
    }

    let answer = h
        .reconcile(&logs, Some(&engine_extension("logs", "Bogus")), false)
        .await;
    assert!(!answer.success, "{answer:?}");
    assert_eq!(reasons(&answer), ["UnknownStorageEngine"]);
    assert!(
        answer.results[0].message.contains("InnoDB"),
        "lists supported engines: {answer:?}"
    );
    assert_eq!(synced(&answer), ("False", "UnknownStorageEngine"));
    assert_eq!(h.engine("logs").await.as_deref(), Some("MyISAM"));
    h.stop().await;
}

#[tokio::test]
async fn an_unknown_type_fails_and_changes_nothing() {
    let mut h = Harness::start().await;
    let orders = table("orders", &[("id", "uint64")]);
    assert!(h.reconcile(&orders, None, false).await.success);

    let bad = table(
        "orders",
        &[("id", "int32"), ("total", "money"), ("note", "text")],
    );
    let answer = h.reconcile(&bad, None, false).await;
    assert!(!answer.success, "{answer:?}");
    assert_eq!(reasons(&answer), ["UnknownColumnType"]);
    assert!(
        answer.results[0]
            .message
            .contains("column \"total\" has unknown type \"money\""),
        "{answer:?}"
    );
    assert_eq!(synced(&answer), ("False", "UnknownColumnType"));
    assert_eq!(
        h.columns("orders").await,
        owned(&[("id", "bigint(20) unsigned")])
    );

    // Nor is a missing table created.
    let answer = h
        .reconcile(&table("never", &[("x", "money")]), None, false)
        .await;
    assert!(!answer.success);
    assert_eq!(h.engine("never").await, None);
    h.stop().await;
}

#[tokio::test]
async fn dry_runs_report_and_change_nothing() {
    let mut h = Harness::start().await;
    let drafts = table("drafts", &[("id", "uint64"), ("body", "text")]);
    let answer = h
        .reconcile(&drafts, Some(&engine_extension("drafts", "Aria")), true)
        .await;
    assert!(answer.success, "{answer:?}");
    assert_eq!(reasons(&answer), ["TableCreated"]);
    assert!(
        answer.results[0]
            .message
            .starts_with("would create table drafts"),
        "{answer:?}"
    );
    assert_eq!(synced(&answer), ("False", "ChangesPending"));
    assert_eq!(
        h.engine("drafts").await,
        None,
        "the dry run created the table"
    );

    assert!(h.reconcile(&drafts, None, false).await.success);
    let changed = table("drafts", &[("id", "int64"), ("title", "string")]);
    let answer = h
        .reconcile(&changed, Some(&engine_extension("drafts", "Aria")), true)
        .await;
    assert!(answer.success, "{answer:?}");
    assert_eq!(
        reasons(&answer),
        [
            "ColumnTypeChanged",
            "ColumnAdded",
            "ColumnDropped",
            "StorageEngineChanged"
        ]
    );
    assert!(
        answer
            .results
            .iter()
            .all(|r| r.message.starts_with("would ")),
        "{answer:?}"
    );
    assert_eq!(
        h.columns("drafts").await,
        owned(&[("id", "bigint(20) unsigned"), ("body", "text")])
    );
    assert_eq!(h.engine("drafts").await.as_deref(), Some("InnoDB"));

    let answer = h.finalize(&drafts, true).await;
    assert_eq!(
        answer.results[0].message,
        format!("would drop table drafts in {}", mariadb::DATABASE)
    );
    assert!(
        h.engine("drafts").await.is_some(),
        "the dry run dropped the table"
    );
    h.stop().await;
}

#[tokio::test]
async fn finalize_drops_the_table() {
    let mut h = Harness::start().await;
    let sessions = table("sessions", &[("id", "uint64")]);
    assert!(h.reconcile(&sessions, None, false).await.success);
    assert!(h.engine("sessions").await.is_some());

    let answer = h.finalize(&sessions, false).await;
    assert!(answer.success, "{answer:?}");
    assert_eq!(reasons(&answer), ["TableDropped"]);
    assert_eq!(h.engine("sessions").await, None);

    // Again: nothing left, still a success, so retries are harmless.
    let answer = h.finalize(&sessions, false).await;
    assert!(answer.success, "{answer:?}");
    assert_eq!(reasons(&answer), ["TableAbsent"]);

    // A spec that no longer checks out does not block deletion.
    h.sql("CREATE TABLE broken (x INT)").await;
    let answer = h
        .finalize(&table("broken", &[("x", "hologram")]), false)
        .await;
    assert_eq!(reasons(&answer), ["TableDropped"]);
    assert_eq!(h.engine("broken").await, None);
    h.stop().await;
}

#[tokio::test]
async fn database_errors_are_failure_outcomes_not_crashes() {
    let mut h = Harness::start().await;
    let notes = table("notes", &[("id", "uint64"), ("body", "text")]);
    assert!(h.reconcile(&notes, None, false).await.success);
    h.sql("INSERT INTO notes (id, body) VALUES (1, 'not a number')")
        .await;

    // Strict mode refuses to turn the text into numbers; the single ALTER
    // means the column added alongside is not left behind either.
    let retyped = table(
        "notes",
        &[("id", "uint64"), ("body", "int64"), ("extra", "bool")],
    );
    let answer = h.reconcile(&retyped, None, false).await;
    assert!(!answer.success, "{answer:?}");
    assert_eq!(reasons(&answer), ["DatabaseError"]);
    let message = &answer.results[0].message;
    assert!(message.starts_with("changing the table: "), "{message}");
    assert!(
        message.contains("ERROR 1292") && message.contains("'not a number'"),
        "the server's own message: {message}"
    );
    assert_eq!(synced(&answer), ("False", "DatabaseError"));
    assert_eq!(
        h.columns("notes").await,
        owned(&[("id", "bigint(20) unsigned"), ("body", "text")])
    );

    // A view of the same name is not ours to alter.
    h.sql("CREATE VIEW looks_like_a_table AS SELECT 1 AS x")
        .await;
    let answer = h
        .reconcile(&table("looks_like_a_table", &[("x", "int32")]), None, false)
        .await;
    assert_eq!(reasons(&answer), ["NotATable"]);

    // And the plugin still serves.
    assert!(h.reconcile(&notes, None, false).await.success);
    h.stop().await;
}

#[tokio::test]
async fn server_names_choose_the_connection() {
    let server = mariadb::shared();
    // Two names for the same database: one over the unix socket, one over TCP.
    let servers = Servers::default()
        .with_named(DbServer::new("authorization-cluster", &server.socket_url()).unwrap())
        .with_named(DbServer::new("reporting", &server.tcp_url()).unwrap());
    let mut h = Harness::with_servers(server, servers).await;

    let answer = h
        .reconcile(&table("grants", &[("id", "uint64")]), None, false)
        .await;
    assert!(answer.success, "{answer:?}");
    assert_eq!(object_status(&answer)["server"], "authorization-cluster");
    assert_eq!(
        h.columns("grants").await,
        owned(&[("id", "bigint(20) unsigned")])
    );

    let mut elsewhere = table("nowhere", &[("id", "uint64")]);
    elsewhere["spec"]["serverName"] = json!("billing");
    let answer = h.reconcile(&elsewhere, None, false).await;
    assert!(!answer.success);
    assert_eq!(reasons(&answer), ["UnknownServer"]);
    assert!(
        answer.results[0]
            .message
            .contains("authorization-cluster, reporting"),
        "{answer:?}"
    );
    assert_eq!(h.engine("nowhere").await, None);
    assert_eq!(
        reasons(&h.finalize(&elsewhere, false).await),
        ["UnknownServer"]
    );
    h.stop().await;
}
