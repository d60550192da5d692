"""What a DatabaseTable asks for, checked and put in PostgreSQL's terms.

Everything here is pure: a spec that cannot be honoured is refused with a
:class:`SpecError` before the database is touched.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kplug

#: The extension kind with this plugin's settings.
EXTENSION_KIND = "DatabaseTablePostgreSqlExtension"
#: Hash partitions created when the extension does not say.
DEFAULT_HASH_PARTITIONS = 4
MAX_HASH_PARTITIONS = 1024
#: PostgreSQL truncates longer identifiers.
MAX_IDENTIFIER_LENGTH = 63
#: Lower-case unquoted SQL identifiers, so the names in the database are the
#: ones in the spec, without quoting surprises.
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


class SpecError(Exception):
    """The spec cannot be honoured; ``reason`` is the result's CamelCase reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class ColumnType:
    """A portable column type and the PostgreSQL type that stores it."""

    #: As written in a DatabaseTable, e.g. ``uint64``.
    name: str
    #: As written in DDL, e.g. ``NUMERIC(20,0)``. Fixed strings only: it is put in SQL verbatim.
    ddl: str
    #: As ``format_type()`` reports it, to compare with existing columns.
    catalog: str


#: The portable types and what they become. Unsigned types take the next wider
#: signed type (``uint64``: ``NUMERIC(20,0)``, which holds all 20 digits of
#: 2^64 - 1); negative values are not prevented. ``string`` is a short string,
#: ``VARCHAR(255)`` as in MySQL/MariaDB schemas; ``text`` is unbounded.
COLUMN_TYPES: Mapping[str, ColumnType] = {
    t.name: t
    for t in [
        ColumnType("bool", "BOOLEAN", "boolean"),
        ColumnType("int16", "SMALLINT", "smallint"),
        ColumnType("int32", "INTEGER", "integer"),
        ColumnType("int64", "BIGINT", "bigint"),
        ColumnType("uint16", "INTEGER", "integer"),
        ColumnType("uint32", "BIGINT", "bigint"),
        ColumnType("uint64", "NUMERIC(20,0)", "numeric(20,0)"),
        ColumnType("float32", "REAL", "real"),
        ColumnType("float64", "DOUBLE PRECISION", "double precision"),
        ColumnType("decimal", "NUMERIC", "numeric"),
        ColumnType("string", "VARCHAR(255)", "character varying(255)"),
        ColumnType("text", "TEXT", "text"),
        ColumnType("bytes", "BYTEA", "bytea"),
        ColumnType("date", "DATE", "date"),
        ColumnType("timestamp", "TIMESTAMPTZ", "timestamp with time zone"),
        ColumnType("uuid", "UUID", "uuid"),
        ColumnType("json", "JSONB", "jsonb"),
    ]
}


class Strategy(enum.StrEnum):
    """How a table is partitioned: the extension's ``spec.partitionBy``."""

    NONE = "none"
    HASH = "hash"
    RANGE = "range"
    LIST = "list"


@dataclass(frozen=True, slots=True)
class Partitioning:
    """The partitioning a table should have.

    Tables are partitioned by their first column. ``hash`` gets ``partitions``
    partitions, ``<table>_p0`` … ``<table>_p<N-1>``; ``range`` and ``list``
    need bounds the spec cannot express, so they get one DEFAULT partition,
    ``<table>_default``, that takes every row until partitions with bounds
    are attached by hand.
    """

    strategy: Strategy = Strategy.NONE
    column: str | None = None
    partitions: int = 0

    def describe(self) -> str:
        if self.strategy is Strategy.NONE:
            return "not partitioned"
        described = f"partitioned by {self.strategy} ({self.column})"
        if self.strategy is Strategy.HASH:
            described += f" into {self.partitions} partitions"
        return described


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: ColumnType


@dataclass(frozen=True, slots=True)
class TableSpec:
    """A DatabaseTable, checked."""

    name: str
    #: ``spec.serverName``: which PostgreSQL server holds the table.
    server: str
    columns: tuple[Column, ...]
    partitioning: Partitioning

    def partition_names(self) -> list[str]:
        """The partitions this plugin creates for the table."""
        if self.partitioning.strategy is Strategy.HASH:
            return [f"{self.name}_p{i}" for i in range(self.partitioning.partitions)]
        if self.partitioning.strategy is Strategy.NONE:
            return []
        return [f"{self.name}_default"]


def table_name(request: kplug.Request) -> str:
    """The table's name: the object's ``metadata.name``, which must be a plain SQL identifier."""
    name = request.name
    if not _is_identifier(name):
        raise SpecError(
            "InvalidTableName",
            f"the table name comes from metadata.name, and {name!r} is not a lower-case SQL identifier "
            f"(letters, digits and underscores, at most {MAX_IDENTIFIER_LENGTH} characters, not starting with a digit)",
        )
    return name


def table_spec(request: kplug.Request) -> TableSpec:
    """Checks the DatabaseTable in ``request`` and its PostgreSQL extension, if linked."""
    name = table_name(request)
    spec = request.spec
    server = spec.get("serverName")
    if not isinstance(server, str) or not server:
        raise SpecError("InvalidSpec", "spec.serverName must name the database server")
    columns = _columns(spec.get("columns"))
    partitioning = _partitioning(request.extension(EXTENSION_KIND), columns[0].name)
    table = TableSpec(name, server, columns, partitioning)
    for partition in table.partition_names():
        if len(partition) > MAX_IDENTIFIER_LENGTH:
            raise SpecError(
                "InvalidTableName",
                f"partition name {partition!r} would be longer than {MAX_IDENTIFIER_LENGTH} characters: "
                "shorten the table name",
            )
    return table


def _columns(value: Any) -> tuple[Column, ...]:
    if not isinstance(value, list) or not value:
        raise SpecError("InvalidSpec", "spec.columns must list at least one column")
    columns: list[Column] = []
    unknown: list[str] = []
    seen: set[str] = set()
    for index, column in enumerate(value):
        if not isinstance(column, Mapping):
            raise SpecError("InvalidSpec", f"spec.columns[{index}] must be an object with a name and a type")
        name, type_name = column.get("name"), column.get("type")
        if not isinstance(name, str) or not _is_identifier(name):
            raise SpecError(
                "InvalidColumnName",
                f"column name {name!r} (spec.columns[{index}]) is not a lower-case SQL identifier",
            )
        if name in seen:
            raise SpecError("DuplicateColumn", f"column {name!r} is listed more than once")
        seen.add(name)
        column_type = COLUMN_TYPES.get(type_name) if isinstance(type_name, str) else None
        if column_type is None:
            unknown.append(f"column {name!r} has type {type_name!r}")
            continue
        columns.append(Column(name, column_type))
    if unknown:
        raise SpecError(
            "UnknownColumnType",
            f"{'; '.join(unknown)}, which this plugin does not know; known types: {', '.join(COLUMN_TYPES)}",
        )
    return tuple(columns)


def _partitioning(extension: Mapping[str, Any] | None, first_column: str) -> Partitioning:
    spec = (extension or {}).get("spec") or {}
    by = spec.get("partitionBy") or "none"
    try:
        strategy = Strategy(by.lower() if isinstance(by, str) else by)
    except ValueError:
        raise SpecError(
            "InvalidPartitioning",
            f"{EXTENSION_KIND} spec.partitionBy is {by!r}; expected one of {', '.join(Strategy)}",
        ) from None
    if strategy is Strategy.NONE:
        return Partitioning()
    if strategy is not Strategy.HASH:
        return Partitioning(strategy, first_column, 1)
    partitions = spec.get("partitions", DEFAULT_HASH_PARTITIONS)
    if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= MAX_HASH_PARTITIONS:
        raise SpecError(
            "InvalidPartitioning",
            f"{EXTENSION_KIND} spec.partitions is {partitions!r}; expected a whole number from 1 to {MAX_HASH_PARTITIONS}",
        )
    return Partitioning(strategy, first_column, partitions)


def _is_identifier(name: str) -> bool:
    return len(name) <= MAX_IDENTIFIER_LENGTH and _IDENTIFIER.fullmatch(name) is not None
