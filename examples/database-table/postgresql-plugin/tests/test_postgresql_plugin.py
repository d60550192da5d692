"""The PostgreSQL plugin against a real PostgreSQL, driven over real gRPC.

What the plugin did is checked in the database itself, through
information_schema and pg_catalog, not through the plugin's own answers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kplug
import psycopg
import pytest
from kplug.testing import FakeRegistry, PluginClient, PluginProcess

from postgresql_plugin import PostgreSqlPlugin

SERVER = "authorization-cluster"
PG_REF = kplug.ObjectRef("myorg.org/v1alpha1", "DatabaseTablePostgreSqlExtension", "users")


def database_table(*columns: tuple[str, str], name: str = "users", server: str = SERVER) -> dict[str, Any]:
    return {
        "apiVersion": "myorg.org/v1alpha1",
        "kind": "DatabaseTable",
        "metadata": {"name": name},
        "spec": {"serverName": server, "columns": [{"name": n, "type": t} for n, t in columns]},
    }


def postgres_extension(partition_by: str, partitions: int | None = None, name: str = "users") -> dict[str, Any]:
    spec: dict[str, Any] = {"partitionBy": partition_by}
    if partitions is not None:
        spec["partitions"] = partitions
    return {
        "apiVersion": "myorg.org/v1alpha1",
        "kind": "DatabaseTablePostgreSqlExtension",
        "metadata": {"name": name},
        "spec": spec,
    }


def columns(db: psycopg.Connection, table: str) -> dict[str, str]:
    """The table's columns and types per information_schema, e.g. ``{"id": "numeric(20,0)"}``."""
    rows = db.execute(
        """
        SELECT column_name, data_type, character_maximum_length, numeric_precision, numeric_scale
        FROM information_schema.columns
        WHERE table_schema = 'public' AND table_name = %s
        ORDER BY ordinal_position
        """,
        (table,),
    ).fetchall()
    described = {}
    for name, data_type, length, precision, scale in rows:
        if data_type == "character varying":
            described[name] = f"varchar({length})"
        elif data_type == "numeric" and precision is not None:
            described[name] = f"numeric({precision},{scale})"
        else:
            described[name] = data_type
    return described


def relation_kind(db: psycopg.Connection, name: str) -> str | None:
    """``r`` for a table, ``p`` for a partitioned one, ``None`` when absent."""
    row = db.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", (f"public.{name}",)).fetchone()
    return row[0] if row else None


def partitions(db: psycopg.Connection, table: str) -> list[tuple[str, str]]:
    """The table's partitions and their bounds, by name."""
    return db.execute(
        """
        SELECT c.relname, pg_get_expr(c.relpartbound, c.oid)
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = to_regclass(%s)
        ORDER BY c.relname
        """,
        (f"public.{table}",),
    ).fetchall()


def partition_strategy(db: psycopg.Connection, table: str) -> tuple[str, list[str]] | None:
    row = db.execute(
        """
        SELECT p.partstrat, array(SELECT attname FROM pg_attribute a
                                  WHERE a.attrelid = p.partrelid AND a.attnum = ANY (p.partattrs))
        FROM pg_partitioned_table p WHERE p.partrelid = to_regclass(%s)
        """,
        (f"public.{table}",),
    ).fetchone()
    return (row[0], row[1]) if row else None


def scalar(db: psycopg.Connection, query: str) -> Any:
    row = db.execute(query).fetchone()  # type: ignore[call-overload]  # a test's own literal SQL
    assert row is not None
    return row[0]


def reasons(outcome: kplug.Outcome) -> list[str]:
    return [result.reason for result in outcome.results]


def test_declares_itself_to_kplug(dsn: str) -> None:
    with (
        FakeRegistry() as registry,
        kplug.serve(PostgreSqlPlugin(dsn=dsn), kplug.Config(registry=registry.address, listen="127.0.0.1:0")),
    ):
        heartbeat = registry.wait_for_heartbeats(1)[0].request
    assert heartbeat.name == "database-table-postgresql-plugin"
    assert (heartbeat.api.group, heartbeat.api.resource, heartbeat.api.version) == (
        "myorg.org",
        "databasetables",
        "v1alpha1",
    )
    assert heartbeat.implementation == "PostgreSQL"
    assert [(e.group, e.kind) for e in heartbeat.extensions] == [("myorg.org", "DatabaseTablePostgreSqlExtension")]


def test_walkthrough_table_is_hash_partitioned_into_four(
    client: PluginClient, db: psycopg.Connection, walkthrough: dict[str, dict[str, Any]]
) -> None:
    extensions = [walkthrough["DatabaseTableMariaDbExtension"], walkthrough["DatabaseTablePostgreSqlExtension"]]
    outcome = client.reconcile(walkthrough["DatabaseTable"], extensions)

    assert outcome.succeeded, outcome.results
    assert reasons(outcome) == ["TableCreated"]
    assert "partitioned by hash (id) into 4 partitions" in outcome.results[0].message
    assert columns(db, "users") == {"id": "numeric(20,0)", "name": "varchar(255)"}
    assert relation_kind(db, "users") == "p"
    assert partition_strategy(db, "users") == ("h", ["id"])
    assert partitions(db, "users") == [(f"users_p{i}", f"FOR VALUES WITH (modulus 4, remainder {i})") for i in range(4)]
    assert outcome.object_status == {"schema": "public", "table": "users", "columns": 2}
    status = outcome.extension_status(PG_REF)
    assert status is not None
    assert (status["partitionBy"], status["partitions"], status["partitionRows"]) == ("hash", 4, [0, 0, 0, 0])
    assert len(status["partitionSizes"]) == 4
    assert all(isinstance(size, int) for size in status["partitionSizes"])
    # The MariaDB extension is none of this plugin's business.
    assert [ref.kind for ref, _ in outcome.extension_statuses] == ["DatabaseTablePostgreSqlExtension"]
    assert outcome.condition("Synced") == kplug.Condition(
        "Synced", "True", "Reconciled", "table users matches the spec"
    )
    assert outcome.requeue_after == 300


def test_partition_status_reports_rows_and_sizes(
    client: PluginClient, db: psycopg.Connection, walkthrough: dict[str, dict[str, Any]]
) -> None:
    extensions = [walkthrough["DatabaseTablePostgreSqlExtension"]]
    client.reconcile(walkthrough["DatabaseTable"], extensions)
    db.execute("INSERT INTO users (id, name) SELECT n, 'user ' || n FROM generate_series(1, 200) AS n")

    outcome = client.reconcile(walkthrough["DatabaseTable"], extensions)
    assert reasons(outcome) == ["UpToDate"]
    status = outcome.extension_status(PG_REF)
    assert status is not None
    expected_rows = [scalar(db, f"SELECT count(*) FROM users_p{i}") for i in range(4)]
    expected_sizes = [scalar(db, f"SELECT pg_total_relation_size('users_p{i}')") for i in range(4)]
    assert status["partitionRows"] == expected_rows
    assert sum(status["partitionRows"]) == 200
    assert all(rows > 0 for rows in status["partitionRows"])  # hashing spreads 200 ids over all four
    assert status["partitionSizes"] == expected_sizes


def test_hash_partition_count_comes_from_the_extension(client: PluginClient, db: psycopg.Connection) -> None:
    outcome = client.reconcile(database_table(("id", "int64")), [postgres_extension("hash", 3)])
    assert outcome.succeeded
    assert [name for name, _ in partitions(db, "users")] == ["users_p0", "users_p1", "users_p2"]
    assert outcome.extension_status(PG_REF)["partitions"] == 3  # type: ignore[index]


def test_range_partitioning_gets_a_default_partition(client: PluginClient, db: psycopg.Connection) -> None:
    outcome = client.reconcile(database_table(("created", "timestamp"), ("id", "int64")), [postgres_extension("range")])
    assert outcome.succeeded
    assert partition_strategy(db, "users") == ("r", ["created"])
    assert partitions(db, "users") == [("users_default", "DEFAULT")]
    db.execute("INSERT INTO users VALUES (now(), 1)")  # the default partition takes it
    assert outcome.extension_status(PG_REF)["partitionBy"] == "range"  # type: ignore[index]


def test_without_the_extension_the_table_is_not_partitioned(client: PluginClient, db: psycopg.Connection) -> None:
    outcome = client.reconcile(database_table(("id", "uint64"), ("name", "string")))
    assert reasons(outcome) == ["TableCreated"]
    assert relation_kind(db, "users") == "r"
    assert outcome.extension_statuses == []


def test_adds_missing_columns(client: PluginClient, db: psycopg.Connection) -> None:
    client.reconcile(database_table(("id", "int64")))
    db.execute("INSERT INTO users VALUES (7)")
    outcome = client.reconcile(database_table(("id", "int64"), ("email", "string"), ("active", "bool")))

    assert outcome.succeeded
    assert [(r.reason, r.message) for r in outcome.results] == [
        ("ColumnAdded", "added column email (string)"),
        ("ColumnAdded", "added column active (bool)"),
    ]
    assert columns(db, "users") == {"id": "bigint", "email": "varchar(255)", "active": "boolean"}
    assert db.execute("SELECT id FROM users").fetchall() == [(7,)]


def test_drops_superfluous_columns(client: PluginClient, db: psycopg.Connection) -> None:
    client.reconcile(database_table(("id", "int64"), ("nickname", "text"), ("name", "text")))
    outcome = client.reconcile(database_table(("id", "int64"), ("name", "text")))

    assert [(r.reason, r.message) for r in outcome.results] == [("ColumnDropped", "dropped column nickname")]
    assert columns(db, "users") == {"id": "bigint", "name": "text"}


def test_changes_wrongly_typed_columns_keeping_the_data(client: PluginClient, db: psycopg.Connection) -> None:
    client.reconcile(database_table(("id", "int32"), ("score", "text"), ("name", "string")))
    db.execute("INSERT INTO users VALUES (1, '42', 'ada')")
    outcome = client.reconcile(database_table(("id", "int64"), ("score", "int64"), ("name", "text")))

    assert outcome.succeeded
    assert [(r.reason, r.message) for r in outcome.results] == [
        ("ColumnTypeChanged", "changed column id from integer to bigint (int64)"),
        ("ColumnTypeChanged", "changed column score from text to bigint (int64)"),
        ("ColumnTypeChanged", "changed column name from character varying(255) to text (text)"),
    ]
    assert columns(db, "users") == {"id": "bigint", "score": "bigint", "name": "text"}
    assert db.execute("SELECT id, score, name FROM users").fetchall() == [(1, 42, "ada")]


def test_every_kind_of_change_in_one_reconcile(client: PluginClient, db: psycopg.Connection) -> None:
    client.reconcile(database_table(("id", "int32"), ("old", "text")))
    outcome = client.reconcile(database_table(("id", "uint64"), ("new", "json")))
    assert reasons(outcome) == ["ColumnDropped", "ColumnTypeChanged", "ColumnAdded"]
    assert columns(db, "users") == {"id": "numeric(20,0)", "new": "jsonb"}


def test_up_to_date_changes_nothing(client: PluginClient, db: psycopg.Connection) -> None:
    table = database_table(("id", "uint64"), ("name", "string"))
    client.reconcile(table)
    before = db.execute("SELECT oid, xmin FROM pg_class WHERE relname = 'users'").fetchone()
    outcome = client.reconcile(table)
    assert [(r.reason, r.message) for r in outcome.results] == [("UpToDate", "table users matches the spec")]
    assert outcome.condition("Synced") == kplug.Condition("Synced", "True", "UpToDate", "table users matches the spec")
    assert db.execute("SELECT oid, xmin FROM pg_class WHERE relname = 'users'").fetchone() == before


def test_unknown_column_type_fails_and_changes_nothing(client: PluginClient, db: psycopg.Connection) -> None:
    outcome = client.reconcile(database_table(("id", "uint128"), ("name", "string")))
    assert not outcome.succeeded
    assert reasons(outcome) == ["UnknownColumnType"]
    assert outcome.results[0].severity is kplug.Severity.ERROR
    assert "column 'id' has type 'uint128'" in outcome.results[0].message
    assert relation_kind(db, "users") is None

    client.reconcile(database_table(("id", "int64"), ("name", "string")))
    outcome = client.reconcile(database_table(("id", "int64"), ("avatar", "picture")))
    assert reasons(outcome) == ["UnknownColumnType"]
    assert "column 'avatar' has type 'picture'" in outcome.results[0].message
    assert outcome.condition("Synced") is not None and outcome.condition("Synced").status == "False"  # type: ignore[union-attr]
    assert columns(db, "users") == {"id": "bigint", "name": "varchar(255)"}


def test_dry_run_reports_and_changes_nothing(client: PluginClient, db: psycopg.Connection) -> None:
    extension = postgres_extension("hash")
    outcome = client.reconcile(database_table(("id", "uint64")), [extension], dry_run=True)
    assert outcome.succeeded
    assert [r.reason for r in outcome.results] == ["TableCreated"]
    assert outcome.results[0].message.startswith("would create table users")
    assert outcome.condition("Synced").reason == "ChangesPending"  # type: ignore[union-attr]
    assert outcome.extension_status(extension)["partitions"] == 4  # type: ignore[index]
    assert outcome.requeue_after is None
    assert relation_kind(db, "users") is None
    assert db.execute("SELECT count(*) FROM pg_class WHERE relname LIKE 'users%'").fetchone() == (0,)

    client.reconcile(database_table(("id", "uint64"), ("old", "text")), [extension])
    outcome = client.reconcile(database_table(("id", "uint64"), ("new", "text")), [extension], dry_run=True)
    assert [r.message for r in outcome.results] == [
        "would drop column old",
        "would add column new (text)",
    ]
    assert columns(db, "users") == {"id": "numeric(20,0)", "old": "text"}


def test_changing_partitioning_is_refused(client: PluginClient, db: psycopg.Connection) -> None:
    table = database_table(("id", "int64"), ("name", "text"))
    client.reconcile(table)
    outcome = client.reconcile(table, [postgres_extension("hash")])
    assert not outcome.succeeded
    assert reasons(outcome) == ["PartitioningChangeUnsupported"]
    assert "not partitioned" in outcome.results[0].message
    assert relation_kind(db, "users") == "r"

    client.reconcile(table, [postgres_extension("hash")], dry_run=False)  # still refused
    other = database_table(("id", "int64"), name="orders")
    client.reconcile(other, [postgres_extension("hash", 4, name="orders")])
    outcome = client.reconcile(other, [postgres_extension("hash", 8, name="orders")])
    assert reasons(outcome) == ["PartitioningChangeUnsupported"]
    assert "into 4 partitions" in outcome.results[0].message and "into 8 partitions" in outcome.results[0].message
    assert len(partitions(db, "orders")) == 4


def test_partition_key_cannot_change_type(client: PluginClient, db: psycopg.Connection) -> None:
    client.reconcile(database_table(("id", "int32"), ("name", "text")), [postgres_extension("hash")])
    outcome = client.reconcile(
        database_table(("id", "int64"), ("name", "text"), ("email", "text")), [postgres_extension("hash")]
    )
    assert reasons(outcome) == ["PartitionKeyChangeUnsupported"]
    assert columns(db, "users") == {"id": "integer", "name": "text"}


def test_database_errors_fail_and_roll_everything_back(client: PluginClient, db: psycopg.Connection) -> None:
    client.reconcile(database_table(("id", "int64"), ("score", "text")))
    db.execute("INSERT INTO users VALUES (1, 'not a number')")
    outcome = client.reconcile(database_table(("id", "int64"), ("score", "int64"), ("email", "text")))

    assert not outcome.succeeded
    assert reasons(outcome) == ["DatabaseError"]
    assert 'invalid input syntax for type bigint: "not a number"' in outcome.results[0].message
    assert columns(db, "users") == {"id": "bigint", "score": "text"}  # no email: one transaction


def test_finalize_drops_the_table_and_its_partitions(client: PluginClient, db: psycopg.Connection) -> None:
    table = database_table(("id", "uint64"))
    extension = postgres_extension("hash")
    client.reconcile(table, [extension])

    dry = client.finalize(table, [extension], dry_run=True)
    assert [(r.reason, r.message) for r in dry.results] == [
        ("TableDropped", "would drop table users and its 4 partitions")
    ]
    assert relation_kind(db, "users") == "p"

    outcome = client.finalize(table, [extension])
    assert outcome.succeeded
    assert [(r.reason, r.message) for r in outcome.results] == [
        ("TableDropped", "dropped table users and its 4 partitions")
    ]
    assert db.execute("SELECT count(*) FROM pg_class WHERE relname LIKE 'users%'").fetchone() == (0,)

    again = client.finalize(table, [extension])
    assert again.succeeded and reasons(again) == ["TableAbsent"]


def test_finalize_works_even_when_the_spec_is_invalid(client: PluginClient, db: psycopg.Connection) -> None:
    client.reconcile(database_table(("id", "int64")))
    outcome = client.finalize(database_table(("id", "no-such-type")))
    assert reasons(outcome) == ["TableDropped"]
    assert relation_kind(db, "users") is None


@pytest.mark.parametrize(
    ("table", "extensions", "reason", "fragment"),
    [
        (database_table(("id", "int64"), name="Users"), [], "InvalidTableName", "'Users'"),
        (database_table(("id", "int64"), name="user-accounts"), [], "InvalidTableName", "SQL identifier"),
        (database_table(("drop table x", "int64")), [], "InvalidColumnName", "'drop table x'"),
        (database_table(("id", "int64"), ("id", "text")), [], "DuplicateColumn", "'id'"),
        (database_table(), [], "InvalidSpec", "spec.columns"),
        (database_table(("id", "int64"), server=""), [], "InvalidSpec", "serverName"),
        (database_table(("id", "int64")), [postgres_extension("circular")], "InvalidPartitioning", "'circular'"),
        (database_table(("id", "int64")), [postgres_extension("hash", 0)], "InvalidPartitioning", "from 1 to 1024"),
    ],
)
def test_invalid_specs_fail_before_touching_the_database(
    client: PluginClient,
    db: psycopg.Connection,
    table: dict[str, Any],
    extensions: list[dict[str, Any]],
    reason: str,
    fragment: str,
) -> None:
    outcome = client.reconcile(table, extensions)
    assert not outcome.succeeded
    assert reasons(outcome) == [reason]
    assert fragment in outcome.results[0].message
    assert outcome.condition("Synced") == kplug.Condition("Synced", "False", reason, outcome.results[0].message)
    assert db.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)


def test_name_taken_by_a_view(client: PluginClient, db: psycopg.Connection) -> None:
    db.execute("CREATE VIEW users AS SELECT 1 AS id")
    outcome = client.reconcile(database_table(("id", "int64")))
    assert reasons(outcome) == ["NameConflict"]
    assert "is a view" in outcome.results[0].message


def test_servers_are_chosen_by_server_name(
    dsn: str, db: psycopg.Connection, serve_plugin: Callable[[PostgreSqlPlugin], PluginClient]
) -> None:
    client = serve_plugin(PostgreSqlPlugin(servers={SERVER: dsn}))
    assert client.reconcile(database_table(("id", "int64"))).succeeded
    assert relation_kind(db, "users") == "r"

    outcome = client.reconcile(database_table(("id", "int64"), name="orders", server="billing-cluster"))
    assert reasons(outcome) == ["UnknownServer"]
    assert "'billing-cluster'" in outcome.results[0].message


def test_an_unreachable_database_is_a_failure_not_a_crash(
    serve_plugin: Callable[[PostgreSqlPlugin], PluginClient],
) -> None:
    with FakeRegistry() as closed:  # a port that was just free, and is again
        port = closed.address.rpartition(":")[2]
    client = serve_plugin(PostgreSqlPlugin(dsn=f"postgresql://postgres@127.0.0.1:{port}/postgres"))
    outcome = client.reconcile(database_table(("id", "int64")))
    assert not outcome.succeeded
    assert reasons(outcome) == ["DatabaseUnavailable"]
    assert "127.0.0.1" in outcome.results[0].message
    assert outcome.requeue_after == 30
    assert reasons(client.finalize(database_table(("id", "int64")))) == ["DatabaseUnavailable"]


def test_concurrent_reconciles_of_one_table_are_serialized(client: PluginClient, db: psycopg.Connection) -> None:
    table = database_table(("id", "int64"), ("name", "text"))
    extension = postgres_extension("hash", 16)
    outcomes: list[kplug.Outcome] = []
    threads = [threading.Thread(target=lambda: outcomes.append(client.reconcile(table, [extension]))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(reasons(o)[0] for o in outcomes) == ["TableCreated", "UpToDate", "UpToDate", "UpToDate"]
    assert len(partitions(db, "users")) == 16


def test_statements_are_bounded_by_the_callers_deadline(client: PluginClient, db: psycopg.Connection) -> None:
    client.reconcile(database_table(("id", "int64")))
    with psycopg.connect(db.info.dsn) as blocker:
        blocker.execute("LOCK TABLE users IN ACCESS EXCLUSIVE MODE")  # held until the block ends
        outcome = client.reconcile(database_table(("id", "int64"), ("email", "text")), timeout=3)
    assert reasons(outcome) == ["DatabaseError"]
    assert "timeout" in outcome.results[0].message
    assert columns(db, "users") == {"id": "bigint"}


def test_runs_as_a_process(dsn: str, tmp_path: Path) -> None:
    with FakeRegistry() as registry, PluginProcess(
        ["-m", "postgresql_plugin", "--registry", registry.address, "--listen", "127.0.0.1:0"],
        tmp_path / "plugin.log",
        env={"POSTGRES_DSN": dsn},
    ) as process:
        address = registry.wait_for_heartbeats(1)[0].request.address
        with PluginClient(address) as client:
            assert reasons(client.reconcile(database_table(("id", "int64")))) == ["TableCreated"]
        process.send_signal(signal.SIGTERM)
        assert process.wait() == 0, process.stderr
    assert registry.deregistrations


def test_configuration_errors_are_usage_errors() -> None:
    environ = {k: v for k, v in os.environ.items() if k not in ("POSTGRES_DSN",) and not k.startswith("KPLUG_")}
    for args, message in [([], "no database"), (["--server", "nodsn"], "is not NAME=DSN")]:
        result = subprocess.run(
            [sys.executable, "-m", "postgresql_plugin", "--listen", "127.0.0.1:0", *args],
            capture_output=True,
            text=True,
            env=environ,
            timeout=30,
            check=False,
        )
        assert result.returncode == 2
        assert message in result.stderr
