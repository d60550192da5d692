"""What a table looks like in the database, read from pg_catalog.

Tables live in the connection's current schema (the first existing schema
on its ``search_path``, usually ``public``); all names are schema-qualified
so that, say, a temporary table of the same name cannot get in the way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from psycopg import Cursor, sql

from postgresql_plugin.spec import Partitioning, SpecError, Strategy

_STRATEGIES = {"h": Strategy.HASH, "r": Strategy.RANGE, "l": Strategy.LIST}
_RELATION_KINDS = {
    "v": "view",
    "m": "materialized view",
    "f": "foreign table",
    "S": "sequence",
    "i": "index",
    "I": "partitioned index",
    "c": "composite type",
}
_REMAINDER = re.compile(r"remainder (\d+)")


@dataclass(frozen=True, slots=True)
class Partition:
    name: str
    #: ``pg_get_expr`` of its bound, e.g. ``FOR VALUES WITH (modulus 4, remainder 0)``.
    bound: str
    #: ``pg_total_relation_size``: the table, its indexes and TOAST, in bytes.
    size: int
    #: An exact ``count(*)``; ``None`` until counted.
    rows: int | None = None


@dataclass(frozen=True, slots=True)
class Table:
    """An existing table."""

    oid: int
    schema: str
    name: str
    #: Column name to ``format_type()``, in column order.
    columns: dict[str, str]
    #: Its partitioning; ``partitions`` counts the partitions it has.
    partitioning: Partitioning

    def identifier(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)


def current_schema(cursor: Cursor) -> str:
    """The schema new tables go to; :class:`SpecError` when the search_path names none that exists."""
    row = cursor.execute("SELECT current_schema()").fetchone()
    if row is None or row[0] is None:
        raise SpecError("NoSchema", "the connection's search_path names no existing schema to create tables in")
    return str(row[0])


def find_table(cursor: Cursor, schema: str, name: str) -> Table | None:
    """The table ``schema.name``; ``None`` if absent, :class:`SpecError` if the name is taken by something else."""
    row = cursor.execute(
        """
        SELECT c.oid, c.relkind
        FROM pg_catalog.pg_class c
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s
        """,
        (schema, name),
    ).fetchone()
    if row is None:
        return None
    oid, kind = row
    if kind not in ("r", "p"):
        raise SpecError(
            "NameConflict", f"{schema}.{name} exists and is a {_RELATION_KINDS.get(kind, 'relation')}, not a table"
        )
    columns: dict[str, str] = dict(
        cursor.execute(
            """
            SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)
            FROM pg_catalog.pg_attribute a
            WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum
            """,
            (oid,),
        ).fetchall()
    )
    return Table(oid, schema, name, columns, _partitioning(cursor, oid))


def partitions(cursor: Cursor, table: Table, *, count_rows: bool = False) -> list[Partition]:
    """The table's partitions, ordered by hash remainder (else by name).

    ``count_rows`` counts each partition's rows exactly, which reads every
    row: fine for this example, while a plugin for big tables would report
    ``pg_class.reltuples`` estimates instead.
    """
    rows = cursor.execute(
        """
        SELECT c.relname, pg_catalog.pg_get_expr(c.relpartbound, c.oid), pg_catalog.pg_total_relation_size(c.oid)
        FROM pg_catalog.pg_inherits i
        JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = %s
        """,
        (table.oid,),
    ).fetchall()
    found = sorted((Partition(name, bound or "", int(size)) for name, bound, size in rows), key=_order)
    if not count_rows:
        return found
    counted = []
    for partition in found:
        query = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table.schema, partition.name))
        count = cursor.execute(query).fetchone()
        assert count is not None  # an aggregate always has a row
        counted.append(Partition(partition.name, partition.bound, partition.size, int(count[0])))
    return counted


def _order(partition: Partition) -> tuple[int, str]:
    remainder = _REMAINDER.search(partition.bound)
    return (int(remainder[1]) if remainder else 1 << 30, partition.name)


def _partitioning(cursor: Cursor, oid: int) -> Partitioning:
    row = cursor.execute(
        """
        SELECT p.partstrat,
               array(SELECT a.attname
                     FROM unnest(p.partattrs::int2[]) WITH ORDINALITY AS k(attnum, position)
                     LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = k.attnum
                     ORDER BY k.position),
               (SELECT count(*) FROM pg_catalog.pg_inherits i WHERE i.inhparent = p.partrelid)
        FROM pg_catalog.pg_partitioned_table p
        WHERE p.partrelid = %s
        """,
        (oid,),
    ).fetchone()
    if row is None:
        return Partitioning()
    strategy, keys, count = row
    # An expression key (attnum 0) has no column name; "?" matches no column.
    column = ", ".join(key or "?" for key in keys)
    return Partitioning(_STRATEGIES[strategy], column, int(count))
