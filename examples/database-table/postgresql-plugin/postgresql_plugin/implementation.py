"""The DatabaseTable plugin for PostgreSQL: keeps a table in line with its DatabaseTable.

Reconcile creates the table if it is missing (partitioned as the linked
DatabaseTablePostgreSqlExtension says), drops columns the spec lacks,
converts wrongly typed ones and adds missing ones, all in one transaction:
a failure leaves the table as it was. A dry run does the same work and rolls
it back, so it reports exactly what would change. Finalize drops the table
with its partitions.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import kplug
import psycopg
from kplug.config import parse_duration
from psycopg import sql

from postgresql_plugin import catalog
from postgresql_plugin._version import __version__
from postgresql_plugin.plan import plan
from postgresql_plugin.spec import EXTENSION_KIND, SpecError, TableSpec, table_name, table_spec

#: How often to reconcile a table that is in sync, to catch drift and refresh the partition metrics.
DEFAULT_RESYNC_PERIOD = 300.0
#: How soon to retry when the database cannot be reached.
UNAVAILABLE_RETRY = 30.0
#: Kept back from the caller's deadline, to answer in time after a timeout.
DEADLINE_MARGIN = 0.5
#: How long to wait for a connection, at most.
CONNECT_TIMEOUT = 10


class PostgreSqlPlugin(kplug.Plugin):
    """Reconciles DatabaseTables (databasetables.myorg.org) into PostgreSQL tables."""

    name = "database-table-postgresql-plugin"
    api = "databasetables.myorg.org/v1alpha1"
    implementation = "PostgreSQL"
    version = __version__
    extensions = (kplug.Extension("myorg.org", EXTENSION_KIND),)

    def __init__(
        self,
        dsn: str | None = None,
        servers: Mapping[str, str] | None = None,
        resync_period: float = DEFAULT_RESYNC_PERIOD,
    ) -> None:
        #: libpq connection string for tables whose spec.serverName is not in ``servers``.
        self.dsn = dsn
        #: spec.serverName to connection string.
        self.servers = dict(servers or {})
        self.resync_period = resync_period

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("PostgreSQL")
        group.add_argument(
            "--dsn",
            default=os.environ.get("POSTGRES_DSN"),
            help="libpq connection string or URI for tables on servers not named by --server "
            "(env POSTGRES_DSN; passwords are better kept in PGPASSWORD or ~/.pgpass)",
        )
        group.add_argument(
            "--server",
            dest="servers",
            action="append",
            default=[],
            metavar="NAME=DSN",
            help="the database for tables whose spec.serverName is NAME; repeatable",
        )
        group.add_argument(
            "--resync-period",
            default=os.environ.get("RESYNC_PERIOD", "5m"),
            metavar="DURATION",
            help="how soon kplug should reconcile a synced table again (env RESYNC_PERIOD; default: %(default)s)",
        )

    def configure(self, args: argparse.Namespace) -> None:
        self.dsn = args.dsn
        for mapping in args.servers:
            server, equals, dsn = mapping.partition("=")
            if not equals or not server or not dsn:
                raise ValueError(f"--server {mapping!r} is not NAME=DSN")
            self.servers[server] = dsn
        if not self.dsn and not self.servers:
            raise ValueError("no database: set --dsn (or POSTGRES_DSN) or --server NAME=DSN")
        self.resync_period = parse_duration(args.resync_period)

    def reconcile(self, request: kplug.Request) -> kplug.Outcome:
        try:
            spec = table_spec(request)
            dsn = self._dsn(spec.server)
        except SpecError as error:
            return _failure(error.reason, error.message)
        try:
            with _transaction(dsn, request, spec.name) as cursor:
                schema = catalog.current_schema(cursor)
                changes = plan(spec, schema, catalog.find_table(cursor, schema, spec.name))
                for change in changes:
                    for statement in change.statements:
                        cursor.execute(statement)
                table = catalog.find_table(cursor, schema, spec.name)
                assert table is not None  # it exists now, at least within this transaction
                partitions = catalog.partitions(cursor, table, count_rows=True)
        except SpecError as error:
            return _failure(error.reason, error.message)
        except _UnavailableError as error:
            return _failure("DatabaseUnavailable", str(error), requeue_after=UNAVAILABLE_RETRY)
        except psycopg.Error as error:
            return _failure("DatabaseError", _describe(error))

        outcome = kplug.Outcome.success(
            object_status={"schema": schema, "table": spec.name, "columns": len(table.columns)},
            requeue_after=None if request.dry_run else self.resync_period,
        )
        for change in changes:
            outcome.add_result(change.reason, f"would {change.action}" if request.dry_run else change.done)
        if not changes:
            outcome.add_result("UpToDate", f"table {spec.name} matches the spec")
            outcome.add_condition("Synced", True, "UpToDate", f"table {spec.name} matches the spec")
        elif request.dry_run:
            outcome.add_condition("Synced", False, "ChangesPending", f"{len(changes)} change(s) would be made")
        else:
            outcome.add_condition("Synced", True, "Reconciled", f"table {spec.name} matches the spec")
        extension = request.extension(EXTENSION_KIND)
        if extension is not None:
            outcome.set_extension_status(extension, _partition_status(spec, partitions))
        return outcome

    def finalize(self, request: kplug.Request) -> kplug.Outcome:
        try:
            name = table_name(request)
            dsn = self._dsn(request.spec.get("serverName"))
        except SpecError as error:
            return _failure(error.reason, error.message)
        partitions = 0
        try:
            with _transaction(dsn, request, name) as cursor:
                schema = catalog.current_schema(cursor)
                table = catalog.find_table(cursor, schema, name)
                if table is not None:
                    partitions = len(catalog.partitions(cursor, table))
                    # No CASCADE: a view or foreign key of someone else's
                    # keeps the table, and the failure says why.
                    cursor.execute(sql.SQL("DROP TABLE {}").format(table.identifier()))
        except SpecError as error:
            return _failure(error.reason, error.message)
        except _UnavailableError as error:
            return _failure("DatabaseUnavailable", str(error), requeue_after=UNAVAILABLE_RETRY)
        except psycopg.Error as error:
            return _failure("DatabaseError", _describe(error))
        if table is None:
            return kplug.Outcome.success("TableAbsent", f"table {name} does not exist")
        with_partitions = f" and its {partitions} partitions" if partitions else ""
        if request.dry_run:
            return kplug.Outcome.success("TableDropped", f"would drop table {name}{with_partitions}")
        return kplug.Outcome.success("TableDropped", f"dropped table {name}{with_partitions}")

    def _dsn(self, server: object) -> str:
        if isinstance(server, str) and server in self.servers:
            return self.servers[server]
        if self.dsn:
            return self.dsn
        raise SpecError(
            "UnknownServer",
            f"no PostgreSQL server named {server!r} is configured (--server NAME=DSN), and there is no default --dsn",
        )


class _UnavailableError(Exception):
    """The database could not be reached."""


@contextmanager
def _transaction(dsn: str, request: kplug.Request, table: str) -> Iterator[psycopg.Cursor]:
    """A cursor in a transaction that commits on success, or rolls back for a dry run or on error.

    Statements are limited to the time the caller waits, and reconciles of
    the same table are serialized with an advisory lock.
    """
    remaining = request.time_remaining()
    budget = None if remaining is None else max(1.0, remaining - DEADLINE_MARGIN)
    try:
        connection = psycopg.connect(
            dsn,
            autocommit=True,
            connect_timeout=max(2, min(CONNECT_TIMEOUT, int(budget or CONNECT_TIMEOUT))),
            application_name="kplug-database-table",
        )
    except psycopg.OperationalError as error:
        raise _UnavailableError(_describe(error)) from error
    with connection, connection.transaction(force_rollback=request.dry_run), connection.cursor() as cursor:
        if budget is not None:
            timeout = f"{int(budget * 1000)}ms"
            cursor.execute(
                "SELECT set_config('statement_timeout', %s, true), set_config('lock_timeout', %s, true)",
                (timeout, timeout),
            )
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"kplug/databasetable/{table}",))
        yield cursor


def _partition_status(spec: TableSpec, partitions: list[catalog.Partition]) -> dict[str, object]:
    return {
        "partitionBy": str(spec.partitioning.strategy),
        "partitions": len(partitions),
        "partitionRows": [p.rows for p in partitions],
        "partitionSizes": [p.size for p in partitions],
    }


def _failure(reason: str, message: str, *, requeue_after: float | None = None) -> kplug.Outcome:
    outcome = kplug.Outcome.failure(reason, message, requeue_after=requeue_after)
    return outcome.add_condition("Synced", False, reason, message)


def _describe(error: psycopg.Error) -> str:
    """The database's own words: its primary message and detail, else the error's text, on one line."""
    diagnostic = error.diag
    if diagnostic.message_primary:
        detail = f" ({diagnostic.message_detail})" if diagnostic.message_detail else ""
        return f"{diagnostic.message_primary}{detail}"
    return " ".join(str(error).split())
