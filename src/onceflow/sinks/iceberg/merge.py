"""Keyed Iceberg tables (``upsert``, merge): a batch merged into the data files it touches, by Spark's tasks.

Iceberg's copy-on-write, with Spark as the engine: the driver picks the table's data files whose
key bounds (the manifests' column statistics) overlap the batch's keys (:func:`touched`); Spark's
tasks read those files and the batch's rows, join them on the key and write every row of the
touched files — merged where the batch has its key, as it was where it has not — and the batch's
new keys as new files (:func:`merged_rows`). The rows are range-partitioned by the key: each file
holds a narrow range of keys, so a later batch's keys touch few files (Spark's adaptive execution
sizes the files; ``spark.sql.shuffle.partitions`` bounds their number). The sink's one Iceberg
commit then deletes the touched files and adds the new ones, with the batch's marker. No row
passes through the driver: it reads manifests and one row of key bounds.

A key's value after the batch is what the other sinks store: ``upsert`` takes the batch's row
(every column the batch has; a column only the table has keeps its value); a merged column
(``add``/``max``/``min``) combines the stored and the batch's value, a null ignored as SQL's
aggregates ignore it. An ``add`` that overflows its column's type fails the batch's task, naming
the table and the column (never a wrapped or null value).

The commit is based on the snapshot the files were picked from: a concurrent commit makes the
catalog refuse it, and the sink decides, picks and writes again (its step 2). A table with delete
files (another writer's merge-on-read) is refused: its rows are not the data files' rows alone.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from onceflow.errors import ConfigError
from onceflow.sinks._core.checks import spark_name
from onceflow.sinks._core.tables import Table

PRUNED = {"integer", "long", "string", "date"}
"""Key types whose batch bounds pick files (others touch every data file: their Python form from
Spark — a timestamp in the session's time zone, a float's NaN — is not a safe bound)."""

_OLD, _NEW = "__onceflow_old_", "__onceflow_new_"


def key_filter(frame: Any, key: list[str]) -> Any:
    """A pyiceberg filter every row of the batch passes: each pruned key column within its bounds.

    Spark computes the bounds (one row reaches the driver). A key of no pruned type: no filter.
    """
    from pyiceberg.expressions import AlwaysTrue, And, GreaterThanOrEqual, LessThanOrEqual
    from pyspark.sql import functions as F

    types = {f.name: f.dataType.typeName() for f in frame.schema.fields}
    pruned = [k for k in key if types.get(k) in PRUNED]
    if not pruned:
        return AlwaysTrue()
    bounds = frame.agg(*[agg(spark_name(k)) for k in pruned for agg in (F.min, F.max)]).first()
    if bounds is None or bounds[0] is None:  # no rows
        return AlwaysTrue()
    at_least: Any = GreaterThanOrEqual  # pydantic models: their stubs want the bound term's type
    at_most: Any = LessThanOrEqual
    both: Any = And
    terms = [term for i, k in enumerate(pruned)
             for term in (at_least(k, bounds[2 * i]), at_most(k, bounds[2 * i + 1]))]
    return functools.reduce(both, terms)


def touched(table: Any, where: str, row_filter: Any) -> list[Any]:
    """The current snapshot's data files that may hold a key of the batch (``DataFile`` entries).

    Raises:
        ConfigError: The table has delete files (merge-on-read): named, with what to do.
    """
    if table.current_snapshot() is None:
        return []
    tasks = list(table.scan(row_filter=row_filter).plan_files())
    if any(task.delete_files for task in tasks):
        raise ConfigError(f"Iceberg table {where} has delete files (another writer's merge-on-read deletes); "
                          "the Iceberg sink merges keyed tables by rewriting data files. Compact the table "
                          "(rewrite its data files with the deletes applied), or write to another table")
    return [task.file for task in tasks]


def table_types(table: Any) -> dict[str, pa.DataType]:
    """The table's columns and their Arrow types as Spark's Arrow form has them (in the table's order).

    pyiceberg gives strings and binaries as ``large_string``/``large_binary``; Spark's are the
    plain ones.
    """
    wide = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}
    return {f.name: wide.get(f.type, f.type) for f in table.schema().as_arrow()}


def old_schema(frame: Any, table: Any) -> Any:
    """The Spark schema the touched files are read with: the table's columns, the batch's types."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    batch = {f.name: f.dataType for f in frame.schema.fields}
    return StructType([StructField(name, batch.get(name) or from_arrow_type(typ))
                       for name, typ in table_types(table).items()])


def _merged(column: str, how: str, old: Any, new: Any, typ: Any, where: str) -> Any:
    """A merged column's value after the batch (nulls ignored; an ``add`` that overflows fails the task)."""
    from pyspark.sql import functions as F

    if how == "add":
        total = F.try_add(old, new).try_cast(typ)
        why = (f"onceflow: Iceberg table {where}: column {column!r}: the stored value plus the batch's "
               f"overflows {typ.simpleString()}; widen the column (cast it in the query and in the table)")
        both = F.when(total.isNull(), F.raise_error(F.lit(why))).otherwise(total)
    else:
        both = F.when(new > old if how == "max" else new < old, new).otherwise(old)
    return F.when(new.isNull(), old).when(old.isNull(), new).otherwise(both)


def merged_rows(frame: Any, spec: Table, schema: Any, paths: list[str], where: str) -> Any:
    """The rows that replace the touched files: theirs merged with the batch's on the key, and its new keys.

    Args:
        frame: The batch's rows (each key once: checked before).
        spec: The table's spec (key, merged columns).
        schema: The table's columns as Spark reads them (:func:`old_schema`), in the table's order.
        paths: The touched data files (none: the batch's rows are all new keys).
        where: ``namespace.table``, for messages.
    """
    from pyspark.sql import functions as F

    columns = [f.name for f in schema.fields]
    batch = set(frame.columns)
    if not paths:
        rows = frame.select(*[F.col(spark_name(c)) if c in batch else F.lit(None).cast(f.dataType).alias(c)
                              for c, f in zip(columns, schema.fields, strict=True)])
        return rows.repartitionByRange(*[F.col(spark_name(k)) for k in spec.key])
    old = frame.sparkSession.read.schema(schema).parquet(*paths)
    old = old.select(*[F.col(spark_name(c)).alias(f"{_OLD}{i}") for i, c in enumerate(columns)],
                     F.lit(True).alias(_OLD))
    new = frame.select(*[F.col(spark_name(c)).alias(f"{_NEW}{i}")
                         for i, c in enumerate(columns) if c in batch], F.lit(True).alias(_NEW))
    pairs = [F.col(f"{_OLD}{columns.index(k)}") == F.col(f"{_NEW}{columns.index(k)}") for k in spec.key]
    on = functools.reduce(lambda a, b: a & b, pairs)
    joined = old.join(new, on=on, how="full_outer")
    merged: Mapping[str, str] = spec.merged
    out = []
    for i, field in enumerate(schema.fields):
        c, o = field.name, F.col(f"{_OLD}{i}")
        if c not in batch:
            value = o
        else:
            n = F.col(f"{_NEW}{i}")
            if c in spec.key:
                value = F.coalesce(n, o)
            elif c in merged:
                value = _merged(c, merged[c], o, n, field.dataType, where)
            else:
                value = F.when(F.col(_NEW).isNotNull(), n).otherwise(o)
        out.append(value.alias(c))
    return joined.select(*out).repartitionByRange(*[F.col(spark_name(k)) for k in spec.key])
