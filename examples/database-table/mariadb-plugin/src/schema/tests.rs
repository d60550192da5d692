//! The type map and the planner, checked without a database.

use super::*;

fn desired(columns: &[(&str, &str)]) -> Vec<DesiredColumn> {
    let spec: Vec<_> = columns
        .iter()
        .map(|(name, column_type)| ColumnSpec {
            name: (*name).to_owned(),
            column_type: (*column_type).to_owned(),
        })
        .collect();
    desired_columns(&spec).unwrap()
}

fn actual(columns: &[(&str, &str)]) -> Vec<ActualColumn> {
    columns
        .iter()
        .map(|(name, column_type)| ActualColumn {
            name: (*name).to_owned(),
            column_type: (*column_type).to_owned(),
        })
        .collect()
}

#[test]
fn every_type_is_reported_as_mapped() {
    // What MariaDB 10.11 reports for each declared type.
    let reported_by_mariadb = [
        ("bool", "tinyint(1)"),
        ("int8", "tinyint(4)"),
        ("uint8", "tinyint(3) unsigned"),
        ("int16", "smallint(6)"),
        ("uint16", "smallint(5) unsigned"),
        ("int32", "int(11)"),
        ("uint32", "int(10) unsigned"),
        ("int64", "bigint(20)"),
        ("uint64", "bigint(20) unsigned"),
        ("float32", "float"),
        ("float64", "double"),
        ("decimal", "decimal(65,30)"),
        ("string", "varchar(255)"),
        ("text", "text"),
        ("bytes", "blob"),
        ("date", "date"),
        ("timestamp", "datetime(6)"),
        ("uuid", "uuid"),
        ("json", "longtext"),
    ];
    assert_eq!(reported_by_mariadb.len(), TYPES.len());
    for (name, reported) in reported_by_mariadb {
        let sql = sql_type(name).unwrap();
        assert_eq!(normalize(reported), sql.reported, "{name}");
        // And as MySQL 8 reports them, without display widths.
        assert_eq!(normalize(&sql.reported.to_uppercase()), sql.reported);
    }
    assert_eq!(sql_type("uint128"), None);
    assert_eq!(sql_type("UINT64"), None, "types are case-sensitive");
}

#[test]
fn normalizes_column_types() {
    assert_eq!(normalize(" BIGINT(20)   UNSIGNED "), "bigint unsigned");
    assert_eq!(normalize("int(11)"), "int");
    assert_eq!(normalize("tinyint(1)"), "tinyint(1)");
    assert_eq!(normalize("tinyint(4)"), "tinyint");
    assert_eq!(
        normalize("int(10) unsigned zerofill"),
        "int unsigned zerofill"
    );
    assert_eq!(normalize("varchar(255)"), "varchar(255)");
    assert_eq!(normalize("decimal(10,2)"), "decimal(10,2)");
    assert_eq!(normalize("datetime(6)"), "datetime(6)");
    assert_eq!(normalize("enum('a','b')"), "enum('a','b')");
}

#[test]
fn identifiers() {
    for good in ["users", "users-v2", "t_1", "1st", &"a".repeat(64)] {
        assert!(check_identifier("table", good).is_ok(), "{good:?}");
    }
    for bad in [
        "",
        "-x",
        "a.b",
        "a`b",
        "a b",
        "x;DROP TABLE y",
        "tablé",
        &"a".repeat(65),
    ] {
        let error = check_identifier("table", bad).unwrap_err();
        assert_eq!(error.reason, "InvalidName", "{bad:?}");
    }
    assert_eq!(quote("users"), "`users`");
    assert_eq!(quote("a`b"), "`a``b`");
    assert!(check_engine("InnoDB").is_ok());
    assert!(check_engine("MEMORY").is_ok());
    for bad in ["", "Inno DB", "InnoDB;", "1x", "`x`"] {
        assert!(check_engine(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn spec_columns_are_checked_before_anything_changes() {
    let spec = |columns: &[(&str, &str)]| {
        let columns: Vec<_> = columns
            .iter()
            .map(|(name, column_type)| ColumnSpec {
                name: (*name).to_owned(),
                column_type: (*column_type).to_owned(),
            })
            .collect();
        desired_columns(&columns)
    };
    let error = spec(&[("id", "uint64"), ("blob", "hologram")]).unwrap_err();
    assert_eq!(error.reason, "UnknownColumnType");
    assert!(error.message.contains("\"blob\""), "{}", error.message);
    assert!(error.message.contains("\"hologram\""), "{}", error.message);
    assert!(error.message.contains("uint64"), "lists the known types");
    assert_eq!(spec(&[]).unwrap_err().reason, "InvalidSpec");
    assert_eq!(
        spec(&[("id", "uint64"), ("ID", "int32")])
            .unwrap_err()
            .reason,
        "InvalidSpec"
    );
    assert_eq!(
        spec(&[("bad name", "int32")]).unwrap_err().reason,
        "InvalidName"
    );
}

#[test]
fn plans_a_new_table() {
    let columns = desired(&[("id", "uint64"), ("name", "string")]);
    let changes = plan(&columns, Some("InnoDB"), None);
    assert_eq!(
        statement("users", &changes).unwrap(),
        "CREATE TABLE `users` (`id` BIGINT UNSIGNED, `name` VARCHAR(255)) ENGINE=`InnoDB`"
    );
    assert_eq!(changes[0].reason(), "TableCreated");
    assert_eq!(
        changes[0].describe("users", false),
        "created table users with 2 columns (id BIGINT UNSIGNED, name VARCHAR(255)) using InnoDB"
    );
    let changes = plan(&columns, None, None);
    assert_eq!(
        statement("users", &changes).unwrap(),
        "CREATE TABLE `users` (`id` BIGINT UNSIGNED, `name` VARCHAR(255))"
    );
}

#[test]
fn plans_column_and_engine_changes_as_one_statement() {
    let columns = desired(&[("id", "uint64"), ("email", "string"), ("Age", "int32")]);
    let current = actual(&[("id", "int(11)"), ("legacy", "text"), ("age", "int(11)")]);
    let changes = plan(&columns, Some("Aria"), Some((&current, Some("InnoDB"))));
    let reasons: Vec<_> = changes.iter().map(Change::reason).collect();
    assert_eq!(
        reasons,
        [
            "ColumnTypeChanged",
            "ColumnAdded",
            "ColumnDropped",
            "StorageEngineChanged"
        ]
    );
    assert_eq!(
        statement("users", &changes).unwrap(),
        "ALTER TABLE `users` MODIFY COLUMN `id` BIGINT UNSIGNED, ADD COLUMN `email` \
         VARCHAR(255), DROP COLUMN `legacy`, ENGINE=`Aria`"
    );
    assert_eq!(
        changes[0].describe("users", true),
        "would change column id from int(11) to BIGINT UNSIGNED"
    );
    assert_eq!(
        changes[3].describe("users", false),
        "changed storage engine from InnoDB to Aria"
    );
}

#[test]
fn an_up_to_date_table_needs_nothing() {
    let columns = desired(&[("id", "uint64"), ("ok", "bool"), ("at", "timestamp")]);
    let current = actual(&[
        ("ID", "bigint(20) unsigned"),
        ("ok", "tinyint(1)"),
        ("at", "datetime(6)"),
    ]);
    // Engine names compare case-insensitively; no engine means any.
    for engine in [Some("innodb"), None] {
        let changes = plan(&columns, engine, Some((&current, Some("InnoDB"))));
        assert!(changes.is_empty(), "{changes:?}");
        assert_eq!(statement("users", &changes), None);
    }
}
