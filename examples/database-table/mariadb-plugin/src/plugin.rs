//! The kplug side: turns Reconcile and Finalize calls into schema changes.

use kplug_sdk::{Condition, ObjectRef, Outcome, Plugin, Request, Severity};
use serde::Deserialize as _;
use serde_json::{Value, json};

use crate::mariadb::{Connection, DbError, Server, Servers, TableInfo};
use crate::schema::{self, DatabaseTable, EXTENSION_KIND, GROUP, MariaDbExtension, SpecError};

/// The `DatabaseTable` plugin for MariaDB.
#[derive(Clone, Debug)]
pub struct MariaDbPlugin {
    servers: Servers,
}

impl MariaDbPlugin {
    /// A plugin that manages tables on `servers`.
    pub fn new(servers: Servers) -> Self {
        Self { servers }
    }
}

/// Why a call failed; each becomes a failure outcome with `Synced` False.
enum Failure {
    Spec(SpecError),
    Database(DbError),
}

impl From<SpecError> for Failure {
    fn from(error: SpecError) -> Self {
        Self::Spec(error)
    }
}

impl From<DbError> for Failure {
    fn from(error: DbError) -> Self {
        Self::Database(error)
    }
}

impl Failure {
    fn spec(reason: &'static str, message: impl Into<String>) -> Self {
        Self::Spec(SpecError {
            reason,
            message: message.into(),
        })
    }

    fn into_outcome(self) -> Outcome {
        let (reason, message) = match self {
            Self::Spec(error) => (error.reason, error.message),
            Self::Database(error) => ("DatabaseError", error.to_string()),
        };
        Outcome::failure(reason, &message)
            .condition(Condition::new("Synced", false, reason, message))
    }
}

impl Plugin for MariaDbPlugin {
    async fn reconcile(&self, request: Request) -> Outcome {
        self.try_reconcile(&request)
            .await
            .unwrap_or_else(Failure::into_outcome)
    }

    async fn finalize(&self, request: Request) -> Outcome {
        self.try_finalize(&request)
            .await
            .unwrap_or_else(Failure::into_outcome)
    }
}

impl MariaDbPlugin {
    async fn try_reconcile(&self, request: &Request) -> Result<Outcome, Failure> {
        let object: DatabaseTable = request.object_as().map_err(|error| {
            Failure::spec("InvalidSpec", format!("not a DatabaseTable: {error}"))
        })?;
        let table = object.metadata.name.as_str();
        schema::check_identifier("table", table)?;
        // Every column is checked before the database is even contacted.
        let columns = schema::desired_columns(&object.spec.columns)?;
        let extension = request.extension(GROUP, EXTENSION_KIND);
        let wanted_engine = match extension {
            Some(extension) => MariaDbExtension::deserialize(extension)
                .map_err(|error| {
                    Failure::spec("InvalidSpec", format!("invalid {EXTENSION_KIND}: {error}"))
                })?
                .spec
                .storage_engine
                .filter(|engine| !engine.is_empty()),
            None => None,
        };
        if let Some(engine) = &wanted_engine {
            schema::check_engine(engine)?;
        }
        let server = self.server(object.spec.server_name.as_deref())?;
        let mut conn = server.connect().await?;

        let engine = match &wanted_engine {
            Some(wanted) => Some(canonical_engine(&mut conn, wanted).await?),
            None => None,
        };
        let before = existing_table(&mut conn, table).await?;
        let changes = schema::plan(
            &columns,
            engine.as_deref(),
            before
                .as_ref()
                .map(|info| (info.columns.as_slice(), info.engine.as_deref())),
        );
        let after = if request.dry_run {
            before
        } else {
            if let Some(statement) = schema::statement(table, &changes) {
                conn.execute(&statement).await?;
            }
            existing_table(&mut conn, table).await?
        };

        let mut outcome = Outcome::success();
        for change in &changes {
            outcome = outcome.result(
                Severity::Normal,
                change.reason(),
                change.describe(table, request.dry_run),
            );
        }
        outcome = if changes.is_empty() {
            outcome
                .result(
                    Severity::Normal,
                    "UpToDate",
                    format!("table {table} matches the spec"),
                )
                .condition(Condition::new("Synced", true, "UpToDate", ""))
        } else if request.dry_run {
            let message = format!("dry run: {} changes pending, none made", changes.len());
            outcome.condition(Condition::new("Synced", false, "ChangesPending", message))
        } else {
            outcome.condition(Condition::new("Synced", true, "Reconciled", ""))
        };
        outcome = outcome.object_status(json!({
            "server": server.name(),
            "database": server.database(),
            "table": table,
            "columns": after.as_ref().map_or(0, |info| info.columns.len()),
        }));
        if let (Some(extension), Some(info)) = (extension.and_then(ObjectRef::of), &after) {
            outcome = outcome.extension_status(extension, extension_status(info));
        }
        Ok(outcome)
    }

    async fn try_finalize(&self, request: &Request) -> Result<Outcome, Failure> {
        // Only what finding the table needs: an object whose columns no
        // longer check out must still be deletable.
        let table = request
            .name()
            .ok_or_else(|| Failure::spec("InvalidSpec", "metadata.name is missing"))?;
        schema::check_identifier("table", table)?;
        let server_name = request
            .object
            .pointer("/spec/serverName")
            .and_then(Value::as_str);
        let server = self.server(server_name)?;
        let mut conn = server.connect().await?;
        if existing_table(&mut conn, table).await?.is_none() {
            return Ok(Outcome::success().result(
                Severity::Normal,
                "TableAbsent",
                format!("table {table} does not exist; nothing to drop"),
            ));
        }
        let verb = if request.dry_run {
            "would drop"
        } else {
            conn.drop_table(table).await?;
            "dropped"
        };
        Ok(Outcome::success().result(
            Severity::Normal,
            "TableDropped",
            format!("{verb} table {table} in {}", server.database()),
        ))
    }

    fn server(&self, server_name: Option<&str>) -> Result<&Server, Failure> {
        self.servers
            .pick(server_name)
            .map_err(|message| Failure::spec("UnknownServer", message))
    }
}

/// The server's spelling of `wanted`, or a failure listing what it offers.
async fn canonical_engine(conn: &mut Connection, wanted: &str) -> Result<String, Failure> {
    if let Some(engine) = conn.engine(wanted).await? {
        return Ok(engine);
    }
    let supported = conn.engines().await?;
    Err(Failure::spec(
        "UnknownStorageEngine",
        format!(
            "storage engine {wanted:?} is not supported by this server; supported: {}",
            supported.join(", ")
        ),
    ))
}

/// `table`, if it exists and is an ordinary table.
async fn existing_table(conn: &mut Connection, table: &str) -> Result<Option<TableInfo>, Failure> {
    match conn.table(table).await? {
        Some(info) if !info.is_base_table() => Err(Failure::spec(
            "NotATable",
            format!(
                "{table} is a {}, not a table; leaving it alone",
                info.table_type
            ),
        )),
        info => Ok(info),
    }
}

/// The status of the `DatabaseTableMariaDbExtension`.
fn extension_status(info: &TableInfo) -> Value {
    json!({
        "storageEngine": info.engine,
        "rows": info.rows,
        "dataLength": info.data_length,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin() -> MariaDbPlugin {
        // Unreachable on purpose: these calls must fail before connecting.
        let server = Server::new("main", "mysql://u@127.0.0.1:1/x").unwrap();
        MariaDbPlugin::new(Servers::default().with_named(server))
    }

    fn table(columns: Value, server: &str) -> Request {
        Request::new(json!({
            "apiVersion": "myorg.org/v1alpha1",
            "kind": "DatabaseTable",
            "metadata": {"name": "users"},
            "spec": {"serverName": server, "columns": columns},
        }))
    }

    fn failure(outcome: &Outcome) -> (&str, &str) {
        assert!(!outcome.success, "{outcome:?}");
        let condition = &outcome.conditions[0];
        assert_eq!(condition.condition_type, "Synced");
        assert_eq!(condition.reason, outcome.results[0].reason);
        (&outcome.results[0].reason, &outcome.results[0].message)
    }

    #[tokio::test]
    async fn bad_specs_fail_without_touching_the_database() {
        let plugin = plugin();
        let outcome = plugin
            .reconcile(table(
                json!([{"name": "id", "type": "uint64"}, {"name": "x", "type": "vector"}]),
                "main",
            ))
            .await;
        let (reason, message) = failure(&outcome);
        assert_eq!(reason, "UnknownColumnType");
        assert!(
            message.contains("\"x\"") && message.contains("\"vector\""),
            "{message}"
        );

        let outcome = plugin
            .reconcile(table(json!([{"name": "id", "type": "uint64"}]), "other"))
            .await;
        let (reason, message) = failure(&outcome);
        assert_eq!(reason, "UnknownServer");
        assert!(message.contains("main"), "{message}");

        let outcome = plugin.reconcile(table(json!("not a list"), "main")).await;
        assert_eq!(failure(&outcome).0, "InvalidSpec");

        let request =
            table(json!([{"name": "id", "type": "uint64"}]), "main").with_extension(json!({
                "apiVersion": "myorg.org/v1alpha1",
                "kind": EXTENSION_KIND,
                "metadata": {"name": "users"},
                "spec": {"storageEngine": "Inno DB; DROP"},
            }));
        let outcome = plugin.reconcile(request).await;
        assert_eq!(failure(&outcome).0, "UnknownStorageEngine");

        let mut request = table(json!([{"name": "id", "type": "uint64"}]), "main");
        request.object["metadata"]["name"] = json!("users; DROP TABLE x");
        assert_eq!(failure(&plugin.finalize(request).await).0, "InvalidName");
    }

    #[tokio::test]
    async fn an_unreachable_database_is_a_failure_outcome() {
        let outcome = plugin().finalize(table(json!([]), "main")).await;
        let (reason, message) = failure(&outcome);
        assert_eq!(reason, "DatabaseError");
        assert!(
            message.starts_with("connecting to server main: "),
            "{message}"
        );
    }
}
