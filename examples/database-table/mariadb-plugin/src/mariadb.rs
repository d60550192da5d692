//! Everything that talks to MariaDB: connection pools, catalog queries and
//! the statements [`schema`](crate::schema) plans.
//!
//! Values only ever travel as statement parameters. The statements that
//! cannot take parameters (DDL) are built from checked, quoted names and
//! from fixed type names; see [`schema::statement`](crate::schema::statement).

use std::collections::BTreeMap;
use std::fmt;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Pool};

use crate::schema::{ActualColumn, quote};

/// A database error, with what the plugin was doing.
///
/// The server's message is part of the text (not a separate source), since
/// it goes to the operator as one failure message.
#[derive(Debug, thiserror::Error)]
#[error("{doing}: {cause}")]
pub struct DbError {
    doing: String,
    cause: mysql_async::Error,
}

fn doing(what: impl Into<String>) -> impl FnOnce(mysql_async::Error) -> DbError {
    let doing = what.into();
    move |cause| DbError { doing, cause }
}

/// Why a connection URL is not usable.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    /// The URL does not parse; the message never contains the URL, which
    /// may hold a password.
    #[error("invalid MariaDB URL for server {server}: {source}")]
    Invalid {
        /// The server's name.
        server: String,
        /// What is wrong.
        #[source]
        source: mysql_async::UrlError,
    },
    /// The URL names no database, so tables would have nowhere to go.
    #[error("the MariaDB URL for server {server} names no database; add /DATABASE to its path")]
    NoDatabase {
        /// The server's name.
        server: String,
    },
}

/// One MariaDB server (and database) tables can live on.
#[derive(Clone)]
pub struct Server {
    name: String,
    database: String,
    pool: Pool,
}

impl fmt::Debug for Server {
    // The pool's options hold the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.name)
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// A server called `name` at `url`, e.g.
    /// `mysql://user:password@host:3306/database` or, over a unix socket,
    /// `mysql://user:password@localhost/database?socket=/run/mysqld/mysqld.sock`.
    /// Connects lazily.
    ///
    /// # Errors
    ///
    /// When the URL does not parse or names no database.
    pub fn new(name: impl Into<String>, url: &str) -> Result<Self, UrlError> {
        let name = name.into();
        let opts = Opts::from_url(url).map_err(|source| UrlError::Invalid {
            server: name.clone(),
            source,
        })?;
        let database = opts
            .db_name()
            .filter(|db| !db.is_empty())
            .ok_or_else(|| UrlError::NoDatabase {
                server: name.clone(),
            })?
            .to_owned();
        Ok(Self {
            name,
            database,
            pool: Pool::new(opts),
        })
    }

    /// The server's name, as `spec.serverName` refers to it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database tables are created in.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// A connection from the pool.
    ///
    /// # Errors
    ///
    /// When the server cannot be reached or refuses the login.
    pub async fn connect(&self) -> Result<Connection, DbError> {
        let conn = self
            .pool
            .get_conn()
            .await
            .map_err(doing(format!("connecting to server {}", self.name)))?;
        Ok(Connection(conn))
    }

    /// Closes the pool's connections.
    pub async fn disconnect(self) {
        if let Err(error) = self.pool.disconnect().await {
            tracing::warn!(server = %self.name, %error, "closing connections failed");
        }
    }
}

/// The servers a plugin knows: `--database-url` and `--server NAME=URL`.
#[derive(Clone, Debug, Default)]
pub struct Servers {
    default: Option<Server>,
    named: BTreeMap<String, Server>,
}

impl Servers {
    /// The server for objects that name none, or for all objects when no
    /// named servers are configured.
    #[must_use]
    pub fn with_default(mut self, server: Server) -> Self {
        self.default = Some(server);
        self
    }

    /// A server for objects whose `spec.serverName` is its name.
    #[must_use]
    pub fn with_named(mut self, server: Server) -> Self {
        self.named.insert(server.name.clone(), server);
        self
    }

    /// Whether no server is configured at all.
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.named.is_empty()
    }

    /// The server for `spec.serverName`:
    /// - with named servers, the one of that name (unknown names fail, so a
    ///   typo cannot put a table on the wrong server); without a name, the
    ///   default;
    /// - with only a default server, that one whatever the name.
    ///
    /// # Errors
    ///
    /// A message naming the known servers.
    pub fn pick(&self, server_name: Option<&str>) -> Result<&Server, String> {
        let server_name = server_name.filter(|name| !name.is_empty());
        let known = || self.named.keys().cloned().collect::<Vec<_>>().join(", ");
        match server_name {
            Some(name) if !self.named.is_empty() => self.named.get(name).ok_or_else(|| {
                format!(
                    "spec.serverName {name:?} is not a server this plugin knows; known: {}",
                    known()
                )
            }),
            _ => self.default.as_ref().ok_or_else(|| {
                format!(
                    "spec.serverName is required: this plugin knows the servers {}",
                    known()
                )
            }),
        }
    }

    /// Every configured server, for shutdown.
    pub fn into_all(self) -> Vec<Server> {
        self.default
            .into_iter()
            .chain(self.named.into_values())
            .collect()
    }
}

/// A table as `information_schema` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableInfo {
    /// `TABLE_TYPE`: `BASE TABLE`, `VIEW`, ...
    pub table_type: String,
    /// `ENGINE`; `None` for views.
    pub engine: Option<String>,
    /// `TABLE_ROWS`: exact for some engines, an estimate for InnoDB.
    pub rows: Option<u64>,
    /// `DATA_LENGTH` in bytes.
    pub data_length: Option<u64>,
    /// The columns in order.
    pub columns: Vec<ActualColumn>,
}

impl TableInfo {
    /// Whether it is an ordinary table this plugin may alter.
    pub fn is_base_table(&self) -> bool {
        self.table_type == "BASE TABLE"
    }
}

/// A pooled connection; returned to the pool when dropped.
pub struct Connection(Conn);

impl Connection {
    /// Describes `table` in the connection's database; `None` when absent.
    ///
    /// # Errors
    ///
    /// When a catalog query fails.
    pub async fn table(&mut self, table: &str) -> Result<Option<TableInfo>, DbError> {
        // TABLE_TYPE, ENGINE, TABLE_ROWS, DATA_LENGTH
        type Row = (String, Option<String>, Option<u64>, Option<u64>);
        let row: Option<Row> = self
            .0
            .exec_first(
                "SELECT TABLE_TYPE, ENGINE, TABLE_ROWS, DATA_LENGTH FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
                (table,),
            )
            .await
            .map_err(doing(format!("looking up table {table}")))?;
        let Some((table_type, engine, rows, data_length)) = row else {
            return Ok(None);
        };
        let columns: Vec<(String, String)> = self
            .0
            .exec(
                "SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
                (table,),
            )
            .await
            .map_err(doing(format!("listing the columns of {table}")))?;
        Ok(Some(TableInfo {
            table_type,
            engine,
            rows,
            data_length,
            columns: columns
                .into_iter()
                .map(|(name, column_type)| ActualColumn { name, column_type })
                .collect(),
        }))
    }

    /// The server's own spelling of storage engine `engine` if the server
    /// supports it, e.g. `innodb` → `InnoDB`; `None` otherwise.
    ///
    /// # Errors
    ///
    /// When the catalog query fails.
    pub async fn engine(&mut self, engine: &str) -> Result<Option<String>, DbError> {
        self.0
            .exec_first(
                "SELECT ENGINE FROM information_schema.ENGINES \
                 WHERE UPPER(ENGINE) = UPPER(?) AND SUPPORT IN ('YES', 'DEFAULT')",
                (engine,),
            )
            .await
            .map_err(doing("looking up storage engines"))
    }

    /// The storage engines the server supports, for error messages.
    ///
    /// # Errors
    ///
    /// When the catalog query fails.
    pub async fn engines(&mut self) -> Result<Vec<String>, DbError> {
        self.0
            .query(
                "SELECT ENGINE FROM information_schema.ENGINES \
                 WHERE SUPPORT IN ('YES', 'DEFAULT') ORDER BY ENGINE",
            )
            .await
            .map_err(doing("listing storage engines"))
    }

    /// Runs a statement built by [`schema::statement`](crate::schema::statement).
    ///
    /// # Errors
    ///
    /// The server's error, e.g. when data cannot be converted to a new type.
    pub async fn execute(&mut self, statement: &str) -> Result<(), DbError> {
        tracing::info!(statement, "executing");
        self.0
            .query_drop(statement)
            .await
            .map_err(doing("changing the table"))
    }

    /// Drops `table` if it exists.
    ///
    /// # Errors
    ///
    /// The server's error.
    pub async fn drop_table(&mut self, table: &str) -> Result<(), DbError> {
        let statement = format!("DROP TABLE IF EXISTS {}", quote(table));
        tracing::info!(statement, "executing");
        self.0
            .query_drop(statement)
            .await
            .map_err(doing(format!("dropping table {table}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Pools need a runtime, even unused.
    #[tokio::test]
    async fn urls() {
        let server = Server::new("main", "mysql://u:secret@db:3306/tables").unwrap();
        assert_eq!(server.database(), "tables");
        assert!(!format!("{server:?}").contains("secret"));
        let socket = Server::new(
            "local",
            "mysql://u@localhost/tables?socket=/run/mysqld.sock",
        );
        assert!(socket.is_ok());
        let error = Server::new("main", "mysql://u:secret@db:3306").unwrap_err();
        assert!(matches!(error, UrlError::NoDatabase { .. }), "{error}");
        let error = Server::new("main", "postgres://u:secret@db/x").unwrap_err();
        assert!(!error.to_string().contains("secret"), "{error}");
    }

    #[tokio::test]
    async fn picking_servers() {
        let server = |name| Server::new(name, "mysql://u@db/x").unwrap();
        let single = Servers::default().with_default(server("default"));
        assert_eq!(single.pick(Some("anything")).unwrap().name(), "default");
        assert_eq!(single.pick(None).unwrap().name(), "default");

        let named = Servers::default()
            .with_named(server("a"))
            .with_named(server("b"));
        assert_eq!(named.pick(Some("b")).unwrap().name(), "b");
        let error = named.pick(Some("c")).unwrap_err();
        assert!(error.contains("\"c\"") && error.contains("a, b"), "{error}");
        assert!(named.pick(None).unwrap_err().contains("required"));
        assert!(named.pick(Some("")).is_err());

        let both = named.with_default(server("default"));
        assert_eq!(both.pick(None).unwrap().name(), "default");
        assert!(both.pick(Some("c")).is_err());
        assert!(!both.is_empty());
        assert!(Servers::default().is_empty());
    }
}
