//! The DatabaseTable spec, the type map, and the diff between the spec and
//! a table as MariaDB describes it. Pure: no database needed to test it.

use std::collections::HashSet;
use std::fmt::Write as _;

use serde::Deserialize;

/// The API group of `DatabaseTable` and its extensions.
pub const GROUP: &str = "myorg.org";
/// The extension kind this plugin reads.
pub const EXTENSION_KIND: &str = "DatabaseTableMariaDbExtension";
/// MariaDB's limit on identifier length.
const MAX_IDENTIFIER_LEN: usize = 64;

/// Why a spec cannot be reconciled; becomes a failure outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    /// CamelCase, e.g. `UnknownColumnType`.
    pub reason: &'static str,
    /// For people.
    pub message: String,
}

impl SpecError {
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// The parts of a `DatabaseTable` this plugin reads. Other fields, such as
/// `preferredImplementation`, are ignored.
#[derive(Clone, Debug, Deserialize)]
pub struct DatabaseTable {
    /// The object's metadata.
    pub metadata: Metadata,
    /// The object's spec.
    #[serde(default)]
    pub spec: TableSpec,
}

/// Object metadata; the name is the table's name.
#[derive(Clone, Debug, Deserialize)]
pub struct Metadata {
    /// The object's name.
    pub name: String,
}

/// `DatabaseTable.spec`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TableSpec {
    /// Which database server the table lives on.
    #[serde(default)]
    pub server_name: Option<String>,
    /// The table's columns, in order.
    #[serde(default)]
    pub columns: Vec<ColumnSpec>,
}

/// One column of the spec.
#[derive(Clone, Debug, Deserialize)]
pub struct ColumnSpec {
    /// The column's name.
    pub name: String,
    /// An abstract type from [`TYPES`], e.g. `uint64`.
    #[serde(rename = "type")]
    pub column_type: String,
}

/// The parts of a `DatabaseTableMariaDbExtension` this plugin reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct MariaDbExtension {
    /// The extension's spec.
    #[serde(default)]
    pub spec: MariaDbExtensionSpec,
}

/// `DatabaseTableMariaDbExtension.spec`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MariaDbExtensionSpec {
    /// e.g. `InnoDB`, `Aria`, `MyISAM`, `MEMORY`; unset leaves the engine
    /// alone (new tables get the server's default).
    #[serde(default)]
    pub storage_engine: Option<String>,
}

/// A MariaDB column type: how to declare it, and how MariaDB then reports
/// it in `information_schema.COLUMNS.COLUMN_TYPE` after [`normalize`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqlType {
    /// For DDL, e.g. `BIGINT UNSIGNED`.
    pub ddl: &'static str,
    /// As reported, normalized, e.g. `bigint unsigned`.
    pub reported: &'static str,
}

const fn sql(ddl: &'static str, reported: &'static str) -> SqlType {
    SqlType { ddl, reported }
}

/// The spec's abstract column types (those the DatabaseTable CRD lists,
/// plus `int8` and `uint8`) and their MariaDB types.
///
/// - `string` is `VARCHAR(255)`: indexable and enough for names, e-mail
///   addresses and identifiers; longer text is `text`.
/// - `decimal` is `DECIMAL(65,30)`, the widest MariaDB has, as the spec
///   gives no precision.
/// - `uuid` is MariaDB's native `UUID` (10.7 and later).
/// - `json` is MariaDB's `JSON`: a `LONGTEXT` that must hold valid JSON,
///   reported as `longtext`; a plain `LONGTEXT` column therefore counts as
///   `json` too.
///
/// Every column is nullable, as the spec has no notion of constraints.
pub const TYPES: &[(&str, SqlType)] = &[
    ("bool", sql("BOOLEAN", "tinyint(1)")),
    ("int8", sql("TINYINT", "tinyint")),
    ("uint8", sql("TINYINT UNSIGNED", "tinyint unsigned")),
    ("int16", sql("SMALLINT", "smallint")),
    ("uint16", sql("SMALLINT UNSIGNED", "smallint unsigned")),
    ("int32", sql("INT", "int")),
    ("uint32", sql("INT UNSIGNED", "int unsigned")),
    ("int64", sql("BIGINT", "bigint")),
    ("uint64", sql("BIGINT UNSIGNED", "bigint unsigned")),
    ("float32", sql("FLOAT", "float")),
    ("float64", sql("DOUBLE", "double")),
    ("decimal", sql("DECIMAL(65,30)", "decimal(65,30)")),
    ("string", sql("VARCHAR(255)", "varchar(255)")),
    ("text", sql("TEXT", "text")),
    ("bytes", sql("BLOB", "blob")),
    ("date", sql("DATE", "date")),
    ("timestamp", sql("DATETIME(6)", "datetime(6)")),
    ("uuid", sql("UUID", "uuid")),
    ("json", sql("JSON", "longtext")),
];

/// The MariaDB type of an abstract `column_type`; `None` when unknown.
pub fn sql_type(column_type: &str) -> Option<SqlType> {
    TYPES
        .iter()
        .find(|(name, _)| *name == column_type)
        .map(|(_, sql)| *sql)
}

/// Puts a `COLUMN_TYPE` in the form of [`SqlType::reported`]: lowercase,
/// single spaces, and no integer display width (`int(11)` → `int`), which
/// MariaDB reports but MySQL 8 omits and which changes nothing stored.
/// `tinyint(1)` keeps its width: it is how `BOOLEAN` is reported.
pub fn normalize(column_type: &str) -> String {
    let lower = column_type.trim().to_ascii_lowercase();
    let words = lower.split_whitespace().collect::<Vec<_>>().join(" ");
    let base_end = words
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(words.len());
    let (base, rest) = words.split_at(base_end);
    let integer = matches!(
        base,
        "tinyint" | "smallint" | "mediumint" | "int" | "bigint"
    );
    if let Some(after) = rest.strip_prefix('(')
        && let Some((width, tail)) = after.split_once(')')
        && integer
        && width.bytes().all(|b| b.is_ascii_digit())
        && !(base == "tinyint" && width == "1")
    {
        return format!("{base}{tail}");
    }
    words
}

/// Checks that `name` is safe to use as a quoted identifier: 1 to 64 ASCII
/// letters, digits, `_` or `-`, not starting with `-`. Kubernetes object
/// names that are DNS labels pass; dots do not, as `a.b` reads as
/// database `a`, table `b` to anyone who forgets the quotes.
pub fn check_identifier(what: &str, name: &str) -> Result<(), SpecError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_IDENTIFIER_LEN
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(SpecError::new(
            "InvalidName",
            format!(
                "{what} {name:?} is not a valid table or column name: use 1 to \
                 {MAX_IDENTIFIER_LEN} letters, digits, '_' or '-', not starting with '-'"
            ),
        ))
    }
}

/// `name` quoted as a MariaDB identifier. Backticks inside are doubled, so
/// even an unchecked name cannot end the quote.
pub fn quote(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// Checks a storage engine's name before it is looked up; its canonical
/// spelling then comes from the server.
pub fn check_engine(engine: &str) -> Result<(), SpecError> {
    let valid = engine.len() <= MAX_IDENTIFIER_LEN
        && engine.starts_with(|c: char| c.is_ascii_alphabetic())
        && engine
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(SpecError::new(
            "UnknownStorageEngine",
            format!("storage engine {engine:?} is not a valid engine name"),
        ))
    }
}

/// A column as the spec wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredColumn {
    /// The column's name.
    pub name: String,
    /// Its MariaDB type.
    pub sql: SqlType,
}

/// Checks the spec's columns and maps their types, before anything is
/// changed: one bad column fails the whole call.
pub fn desired_columns(columns: &[ColumnSpec]) -> Result<Vec<DesiredColumn>, SpecError> {
    if columns.is_empty() {
        return Err(SpecError::new(
            "InvalidSpec",
            "spec.columns is empty: a table needs at least one column",
        ));
    }
    let mut seen = HashSet::new();
    columns
        .iter()
        .map(|column| {
            check_identifier("column", &column.name)?;
            // MariaDB column names are case-insensitive.
            if !seen.insert(column.name.to_ascii_lowercase()) {
                return Err(SpecError::new(
                    "InvalidSpec",
                    format!("column {:?} appears more than once", column.name),
                ));
            }
            let sql = sql_type(&column.column_type).ok_or_else(|| {
                let known: Vec<_> = TYPES.iter().map(|(name, _)| *name).collect();
                SpecError::new(
                    "UnknownColumnType",
                    format!(
                        "column {:?} has unknown type {:?}; known types: {}",
                        column.name,
                        column.column_type,
                        known.join(", ")
                    ),
                )
            })?;
            Ok(DesiredColumn {
                name: column.name.clone(),
                sql,
            })
        })
        .collect()
}

/// A column as MariaDB reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActualColumn {
    /// `COLUMN_NAME`.
    pub name: String,
    /// `COLUMN_TYPE`, as reported.
    pub column_type: String,
}

/// One change that brings a table in line with its spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The table does not exist.
    CreateTable {
        /// All its columns.
        columns: Vec<DesiredColumn>,
        /// The engine to create it with; `None` for the server's default.
        engine: Option<String>,
    },
    /// A column of the spec is missing.
    AddColumn(DesiredColumn),
    /// A column is not in the spec.
    DropColumn {
        /// The column's name as MariaDB reports it.
        name: String,
    },
    /// A column has another type than the spec says.
    ChangeColumnType {
        /// The column's name as MariaDB reports it.
        name: String,
        /// Its type as reported.
        from: String,
        /// The type it gets.
        to: SqlType,
    },
    /// The table uses another storage engine than the extension says.
    ChangeStorageEngine {
        /// The current engine.
        from: String,
        /// The engine it gets, spelled as the server spells it.
        to: String,
    },
}

impl Change {
    /// The result's reason, e.g. `ColumnAdded`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::CreateTable { .. } => "TableCreated",
            Self::AddColumn(_) => "ColumnAdded",
            Self::DropColumn { .. } => "ColumnDropped",
            Self::ChangeColumnType { .. } => "ColumnTypeChanged",
            Self::ChangeStorageEngine { .. } => "StorageEngineChanged",
        }
    }

    /// What the change does to `table`, in the past tense, or as what it
    /// would do for a dry run.
    pub fn describe(&self, table: &str, dry_run: bool) -> String {
        let (create, add, drop, change) = if dry_run {
            ("would create", "would add", "would drop", "would change")
        } else {
            ("created", "added", "dropped", "changed")
        };
        match self {
            Self::CreateTable { columns, engine } => {
                let mut text = format!(
                    "{create} table {table} with {} columns ({})",
                    columns.len(),
                    column_list(columns)
                );
                if let Some(engine) = engine {
                    let _ = write!(text, " using {engine}");
                }
                text
            }
            Self::AddColumn(column) => format!("{add} column {} {}", column.name, column.sql.ddl),
            Self::DropColumn { name } => format!("{drop} column {name}"),
            Self::ChangeColumnType { name, from, to } => {
                format!("{change} column {name} from {from} to {}", to.ddl)
            }
            Self::ChangeStorageEngine { from, to } => {
                format!("{change} storage engine from {from} to {to}")
            }
        }
    }
}

fn column_list(columns: &[DesiredColumn]) -> String {
    columns
        .iter()
        .map(|column| format!("{} {}", column.name, column.sql.ddl))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The changes that turn the table as it is (`None`: missing) into the
/// table as desired. Column order is not reconciled: new columns go last.
pub fn plan(
    columns: &[DesiredColumn],
    engine: Option<&str>,
    actual: Option<(&[ActualColumn], Option<&str>)>,
) -> Vec<Change> {
    let Some((actual_columns, actual_engine)) = actual else {
        return vec![Change::CreateTable {
            columns: columns.to_vec(),
            engine: engine.map(str::to_owned),
        }];
    };
    let find = |name: &str| {
        actual_columns
            .iter()
            .find(|actual| actual.name.eq_ignore_ascii_case(name))
    };
    let mut changes = Vec::new();
    for column in columns {
        match find(&column.name) {
            None => changes.push(Change::AddColumn(column.clone())),
            Some(actual) if normalize(&actual.column_type) != column.sql.reported => {
                changes.push(Change::ChangeColumnType {
                    name: actual.name.clone(),
                    from: actual.column_type.clone(),
                    to: column.sql,
                });
            }
            Some(_) => {}
        }
    }
    for actual in actual_columns {
        if !columns
            .iter()
            .any(|column| column.name.eq_ignore_ascii_case(&actual.name))
        {
            changes.push(Change::DropColumn {
                name: actual.name.clone(),
            });
        }
    }
    if let Some(engine) = engine {
        let current = actual_engine.unwrap_or_default();
        if !current.eq_ignore_ascii_case(engine) {
            changes.push(Change::ChangeStorageEngine {
                from: current.to_owned(),
                to: engine.to_owned(),
            });
        }
    }
    changes
}

/// The one statement that makes `changes` to `table`: a `CREATE TABLE`, or
/// a single `ALTER TABLE`, so that MariaDB applies all of them or none.
/// `None` when there is nothing to do.
///
/// Names are quoted; types and engines come from [`TYPES`] and the server.
pub fn statement(table: &str, changes: &[Change]) -> Option<String> {
    let engine_option = |engine: &str| format!("ENGINE={}", quote(engine));
    if let [Change::CreateTable { columns, engine }] = changes {
        let columns: Vec<_> = columns
            .iter()
            .map(|column| format!("{} {}", quote(&column.name), column.sql.ddl))
            .collect();
        let mut sql = format!("CREATE TABLE {} ({})", quote(table), columns.join(", "));
        if let Some(engine) = engine {
            let _ = write!(sql, " {}", engine_option(engine));
        }
        return Some(sql);
    }
    let clauses: Vec<String> = changes
        .iter()
        .filter_map(|change| match change {
            // Only ever planned alone, and handled above.
            Change::CreateTable { .. } => None,
            Change::AddColumn(column) => Some(format!(
                "ADD COLUMN {} {}",
                quote(&column.name),
                column.sql.ddl
            )),
            Change::DropColumn { name } => Some(format!("DROP COLUMN {}", quote(name))),
            Change::ChangeColumnType { name, to, .. } => {
                Some(format!("MODIFY COLUMN {} {}", quote(name), to.ddl))
            }
            Change::ChangeStorageEngine { to, .. } => Some(engine_option(to)),
        })
        .collect();
    (!clauses.is_empty()).then(|| format!("ALTER TABLE {} {}", quote(table), clauses.join(", ")))
}

#[cfg(test)]
mod tests;
