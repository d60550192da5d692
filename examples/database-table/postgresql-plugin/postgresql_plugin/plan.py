"""The changes that bring a table in line with its spec, as SQL.

Pure: given the spec and what the catalog says, it returns the statements;
running them (in one transaction) is :mod:`postgresql_plugin.implementation`'s
job. All names go through :class:`psycopg.sql.Identifier`; the only SQL
written verbatim is the fixed type names of :data:`~postgresql_plugin.spec.COLUMN_TYPES`.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from postgresql_plugin.catalog import Table
from postgresql_plugin.spec import Column, Partitioning, SpecError, Strategy, TableSpec


@dataclass(frozen=True, slots=True)
class Change:
    """One change and the statements that make it."""

    #: The result's reason, e.g. ``ColumnAdded``.
    reason: str
    #: What it does, e.g. ``add column email (text)``.
    action: str
    #: What it did, e.g. ``added column email (text)``.
    done: str
    statements: tuple[sql.Composed, ...]


def plan(spec: TableSpec, schema: str, existing: Table | None) -> list[Change]:
    """The changes from ``existing`` (``None``: no table yet) to ``spec``.

    Columns the spec lacks are dropped first, then wrongly typed ones are
    converted (``USING column::type``), then missing ones added, at the end:
    PostgreSQL cannot reorder columns, so their order is not enforced.

    Raises :class:`SpecError` for what cannot be done in place: changing the
    partitioning, or converting the partition key column.
    """
    if existing is None:
        return [_create(spec, schema)]
    _check_partitioning(spec, existing)
    table = existing.identifier()
    wanted = {column.name: column for column in spec.columns}
    changes = [
        Change(
            "ColumnDropped",
            f"drop column {name}",
            f"dropped column {name}",
            (sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(table, sql.Identifier(name)),),
        )
        for name in existing.columns
        if name not in wanted
    ]
    for column in spec.columns:
        current = existing.columns.get(column.name)
        if current is None or current == column.type.catalog:
            continue
        if column.name == spec.partitioning.column:
            raise SpecError(
                "PartitionKeyChangeUnsupported",
                f"column {column.name} is {current} but the spec asks for {column.type.catalog} ({column.type.name}); "
                "PostgreSQL cannot convert the partition key column: recreate the table",
            )
        described = f"column {column.name} from {current} to {column.type.catalog} ({column.type.name})"
        changes.append(
            Change(
                "ColumnTypeChanged",
                f"change {described}",
                f"changed {described}",
                (
                    sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {} USING {}::{}").format(
                        table,
                        sql.Identifier(column.name),
                        sql.SQL(column.type.ddl),
                        sql.Identifier(column.name),
                        sql.SQL(column.type.ddl),
                    ),
                ),
            )
        )
    changes += [
        Change(
            "ColumnAdded",
            f"add column {column.name} ({column.type.name})",
            f"added column {column.name} ({column.type.name})",
            (sql.SQL("ALTER TABLE {} ADD COLUMN {}").format(table, _definition(column)),),
        )
        for column in spec.columns
        if column.name not in existing.columns
    ]
    return changes


def _create(spec: TableSpec, schema: str) -> Change:
    table = sql.Identifier(schema, spec.name)
    create = sql.SQL("CREATE TABLE {} ({})").format(table, sql.SQL(", ").join(map(_definition, spec.columns)))
    partitioning = spec.partitioning
    if partitioning.strategy is not Strategy.NONE:
        assert partitioning.column is not None
        create = sql.SQL("{} PARTITION BY {} ({})").format(
            create, sql.SQL(partitioning.strategy.upper()), sql.Identifier(partitioning.column)
        )
    statements: list[sql.Composed] = [create]
    for remainder, name in enumerate(spec.partition_names()):
        partition = sql.Identifier(schema, name)
        if partitioning.strategy is Strategy.HASH:
            statements.append(
                sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES WITH (MODULUS {}, REMAINDER {})").format(
                    partition, table, sql.Literal(partitioning.partitions), sql.Literal(remainder)
                )
            )
        else:
            statements.append(sql.SQL("CREATE TABLE {} PARTITION OF {} DEFAULT").format(partition, table))
    described = f"table {spec.name} with {len(spec.columns)} columns, {partitioning.describe()}"
    return Change("TableCreated", f"create {described}", f"created {described}", tuple(statements))


def _check_partitioning(spec: TableSpec, existing: Table) -> None:
    have, want = existing.partitioning, spec.partitioning
    same = (have.strategy, have.column) == (want.strategy, want.column)
    # Range and list tables may have partitions attached by hand; only the
    # hash partition count is the plugin's to keep.
    if same and want.strategy is Strategy.HASH:
        same = have.partitions == want.partitions
    if not same:
        raise SpecError(
            "PartitioningChangeUnsupported",
            f"table {spec.name} is {_describe_existing(have)} but the spec asks for it to be {want.describe()}; "
            "changing the partitioning means moving every row: delete and recreate the table, "
            "or migrate it by hand",
        )


def _describe_existing(partitioning: Partitioning) -> str:
    if partitioning.strategy is Strategy.NONE:
        return "not partitioned"
    return f"partitioned by {partitioning.strategy} ({partitioning.column}) into {partitioning.partitions} partitions"


def _definition(column: Column) -> sql.Composed:
    return sql.SQL("{} {}").format(sql.Identifier(column.name), sql.SQL(column.type.ddl))
