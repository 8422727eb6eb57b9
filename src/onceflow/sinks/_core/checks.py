"""The checks of a batch against its tables' specs, before anything is written; Arrow and Spark names.

A batch is checked against its specs *before* anything is written (:func:`check_batch`): key
columns without nulls, ``add`` columns numeric, no key twice within one batch for
``upsert``/``merge`` (which row would win is undefined; ``0.0`` and ``-0.0`` are one key, as
they are in SQL), no NaN in a key column. A batch that fails is refused
with a :class:`onceflow.errors.BatchRejectedError` naming the table, the column and the first bad
row, so the query stops before Spark's commit log and nothing of the batch is written.

Every check runs on the driver (a frame's, :func:`check_frame`, through a Spark job), once per
batch and table, and reads only.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from onceflow.errors import BatchRejectedError, ConfigError
from onceflow.sinks._core.tables import Table


def spark_name(column: str) -> str:
    """A column name quoted for Spark (a backtick in it doubled): ``F.col`` and ``select`` take it as is."""
    return "`" + column.replace("`", "``") + "`"


def arrow_schema(schema: Any) -> pa.Schema:
    """A Spark ``StructType`` as Arrow, timestamps in UTC (as Spark's own Arrow conversion makes them).

    PySpark 4.2 and later take ``timezone="UTC"``; 4.1 ``timestamp_utc=True`` (the same types).
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    if _takes_timezone():
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema, timestamp_utc=True)  # type: ignore[call-arg]  # PySpark 4.1


@functools.cache
def _takes_timezone() -> bool:
    """Whether this PySpark's ``to_arrow_schema`` takes ``timezone=`` (4.2 and later), asked once."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return "timezone" in inspect.signature(to_arrow_schema).parameters


def first_true(mask: pa.ChunkedArray | pa.Array) -> int | None:
    """The index of the first true value of ``mask`` (nulls count as false), or None."""
    idx = pc.indices_nonzero(mask.fill_null(False))
    return int(idx[0].as_py()) if len(idx) else None


def _row(table: pa.Table, i: int) -> dict[str, Any]:
    return table.slice(i, 1).to_pylist()[0]  # type: ignore[no-any-return]


def row_name(rows: pa.Table, spec: Table, i: int) -> str:
    """Row ``i`` of a batch in words: by its key (or its position when the table has none)."""
    if spec.key:
        return f"the row with key { {k: rows.column(k)[i].as_py() for k in spec.key} }"
    return f"row {i} of the batch"


def check_batch(name: str, spec: Table, rows: pa.Table) -> None:
    """Refuse a batch that could not be written (before anything is written).

    Args:
        name: The table's name (for the message).
        spec: Its specification.
        rows: The batch's rows for it.

    Raises:
        BatchRejectedError: A missing column, a null key, a non-numeric add column, or a key
            twice in the batch; naming table, column and first bad row.
    """
    missing = [c for c in (*spec.key, *spec.merged) if c not in rows.column_names]
    if missing:
        raise BatchRejectedError(f"table {name!r}: the batch has no column(s) {missing} (its columns: "
                                 f"{rows.column_names})")
    for col in spec.key:
        bad = first_true(rows.column(col).is_null())
        if bad is not None:
            raise BatchRejectedError(f"table {name!r}: key column {col!r} is null in row {bad} of batch "
                                     f"({_row(rows, bad)}); nothing of the batch was written — fix the input "
                                     "or the transformation, then restart the query", row=_row(rows, bad))
    for col in spec.add:
        typ = rows.schema.field(col).type
        if not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ)):
            raise BatchRejectedError(f"table {name!r}: add column {col!r} must be numeric, got {typ}")
    for col in spec.key:
        values = rows.column(col)
        if pa.types.is_floating(values.type):
            bad = first_true(pc.is_nan(values))
            if bad is not None:
                raise BatchRejectedError(f"table {name!r}: key column {col!r} is NaN in row {bad} of batch "
                                         f"({_row(rows, bad)}); a NaN key matches no stored key in most "
                                         "sinks (and none in SQLite); nothing of the batch was written",
                                         row=_row(rows, bad))
    repeated = repeated_key(rows.select(list(spec.key))) if spec.key else None
    if repeated is not None:
        zeros = " (0.0 and -0.0 are one key in a database)" if any(
            pa.types.is_floating(rows.schema.field(k).type) for k in spec.key) else ""
        raise BatchRejectedError(f"table {name!r}: key {repeated[0]} appears more than once in one batch"
                                 f"{zeros}; aggregate per key before writing (mode {spec.mode!r}); nothing "
                                 "of the batch was written")


def check_json(what: str, spec: Table, rows: pa.Table, columns: Sequence[str]) -> None:
    """Refuse values a JSON text would not hold as given (sinks that write rows as JSON: Kafka, HTTP).

    JSON has no NaN or infinity (Python writes ``NaN``, which strict readers refuse), and a JSON
    string holds text: bytes that are not UTF-8 would be replaced.

    Args:
        what: The table or topic, for the message (e.g. ``"topic 'orders'"``).
        spec: Its spec (the key names the bad row).
        rows: The batch's rows.
        columns: The columns written as JSON.

    Raises:
        BatchRejectedError: Naming the table, the column, the row's key and the value.
    """
    for col in columns:
        values = rows.column(col)
        typ = values.type
        bad, why = None, ""
        if pa.types.is_floating(typ):
            bad = first_true(pc.invert(pc.is_finite(values)))
            why = "JSON has no NaN or infinity (cast the column to string, or make it null, in the query)"
        elif pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
            for i, v in enumerate(values.to_pylist()):
                if v is not None and not _utf8(v):
                    bad = i
                    break
            why = "these bytes are not UTF-8 and a JSON string holds text (base64-encode the column)"
        if bad is not None:
            row, where = _row(rows, bad), row_name(rows, spec, bad)
            raise BatchRejectedError(f"{what}: column {col!r} of {where} holds {row[col]!r}, which JSON "
                                     f"cannot hold as given: {why}; nothing of the batch was written",
                                     row=row)


def check_json_frame(what: str, spec: Table, frame: Any, columns: Sequence[str]) -> None:
    """:func:`check_json` on a Spark DataFrame: the bad values found by Spark, the first one refused.

    The float (NaN, infinity) and binary (not UTF-8) columns among ``columns`` are searched in
    one Spark job; the first bad row is read and refused with :func:`check_json`'s message. A
    frame without such columns runs no job (the batch is never held as Arrow on the driver).

    Raises:
        BatchRejectedError: Naming the table, the column, the row's key and the value.
    """
    from pyspark.sql import functions as F

    types = dict(zip(frame.columns, [f.dataType.typeName() for f in frame.schema.fields], strict=True))
    bad = None
    for c in columns:
        col = F.col(spark_name(c))
        if types[c] in ("float", "double"):
            cond = F.isnan(col) | (F.abs(col) == F.lit(float("inf")))
        elif types[c] == "binary":
            cond = ~F.is_valid_utf8(col)
        else:
            continue
        bad = cond if bad is None else bad | cond
    if bad is not None:
        rows = frame.where(bad).limit(1).toArrow()
        if rows.num_rows:
            check_json(what, spec, rows, columns)


def _utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def repeated_key(keys: pa.Table) -> tuple[dict[str, Any], int] | None:
    """The first key that ``keys`` (a table of the key columns only) holds more than once.

    Returns:
        The key (column -> value) and how many rows have it, or None when every key is unique.
    """
    names = keys.column_names
    plain = keys.rename_columns([f"k{i}" for i in range(len(names))])  # a key named count_all: no clash
    for i, col in enumerate(plain.columns):  # -0.0 + 0.0 is 0.0: the two zeros are one key, as in SQL
        if pa.types.is_floating(col.type):
            plain = plain.set_column(i, f"k{i}", pc.add(col, pa.scalar(0.0, col.type)))
    counts = plain.group_by(plain.column_names).aggregate([([], "count_all")])
    at = first_true(pc.greater(counts.column("count_all"), 1))
    if at is None:
        return None
    row = _row(counts, at)
    return {n: row[f"k{i}"] for i, n in enumerate(names)}, int(row["count_all"])


def check_columns(name: str, spec: Table, schema: pa.Schema) -> None:
    """Check an output's columns against its spec before the query starts.

    Args:
        name: The table's name (for the message).
        spec: Its specification.
        schema: The columns the output will have (from the stream's schema).

    Raises:
        ConfigError: A key or merged column the output does not have, or a non-numeric ``add``
            column.
    """
    missing = [c for c in (*spec.key, *spec.merged) if c not in schema.names]
    if missing:
        raise ConfigError(f"table {name!r}: its spec names column(s) {missing} that the query's output "
                          f"for it does not have (it has {schema.names}); fix the Table(...) or the "
                          "transformation")
    for col in spec.add:
        typ = schema.field(col).type
        if not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ)):
            raise ConfigError(f"table {name!r}: add column {col!r} must be numeric, it is {typ}")


def check_existing(where: str, name: str, spec: Table, columns: Sequence[str], have: Sequence[str],
                   pk: Sequence[str] | None) -> None:
    """Check a table that exists in the sink against its spec and the columns it will get.

    Args:
        where: The sink's location (for the message).
        name: The table.
        spec: Its spec.
        columns: The columns the batches will have (or at least the key and merged ones).
        have: The table's columns.
        pk: Its primary key columns (None: the backend has none).

    Raises:
        ConfigError: A column the table lacks, or a primary key other than the spec's key.
    """
    missing = [c for c in columns if c not in have]
    if missing:
        raise ConfigError(f"table {name!r} in {where} has no column(s) {missing} that the batch has "
                          f"(it has {sorted(have)}); add them or write to another table")
    if pk is not None and spec.key and set(pk) != set(spec.key):
        raise ConfigError(f"table {name!r} in {where} has primary key {list(pk)}, but its spec says "
                          f"key={list(spec.key)}; {spec.mode} needs them to be the same")


def expected_columns(name: str, spec: Table, schemas: Mapping[str, pa.Schema]) -> list[str]:
    """The columns a table's batches will have: its output's, else at least the key and merged ones."""
    return list(schemas[name].names) if name in schemas else [*spec.key, *spec.merged]


def check_outputs(outputs: Mapping[str, Any], specs: Mapping[str, Table], rows: bool = True) -> None:
    """Step 1 of every generic sink: each output is for a table of ``tables=`` and fits its spec.

    With ``rows`` (the outputs are Arrow tables) each is checked by :func:`check_batch`.

    Raises:
        ConfigError: An output for a table ``tables=`` does not name.
        BatchRejectedError: See :func:`check_batch`.
    """
    for name, out in outputs.items():
        if name not in specs:
            raise ConfigError(f"the batch has rows for table {name!r}, which tables= does not name "
                              f"(it names {sorted(specs)})")
        if rows:
            check_batch(name, specs[name], out)


SMALL_CHECK_ROWS = 100_000
"""A table of a batch with at most this many rows has its keys checked on the driver (one Spark
job reading them, no shuffle); a larger one by a Spark aggregation, whose shuffle job is a large
part of a small batch's time (BENCHMARKS.md, "End-to-end latency")."""

_SEEN = "__onceflow_rows"
"""The row count per key in :func:`check_frame` (a name no user column has)."""


def check_frame(name: str, spec: Table, frame: Any) -> None:
    """Step 1 of an executor-side sink on a Spark DataFrame: a missing column, a null key or a key twice.

    The batch is never held as Arrow on the driver: a small table's keys are read, a large
    one's are aggregated by Spark.

    Raises:
        BatchRejectedError: Naming the column, or the first bad row or key.
    """
    from pyspark.sql import functions as F

    missing = [c for c in (*spec.key, *spec.merged) if c not in frame.columns]
    if missing:
        raise BatchRejectedError(f"table {name!r}: the batch has no column(s) {missing}")
    cols = list(spec.key)
    if not cols:
        return
    named = [F.col(spark_name(c)) for c in cols]
    null = named[0].isNull()
    for c in named[1:]:
        null = null | c.isNull()
    keys = frame.select(*named).limit(SMALL_CHECK_ROWS + 1).toArrow()
    if keys.num_rows <= SMALL_CHECK_ROWS:  # a small batch: its keys checked here, no shuffle
        has_null = any(keys.column(i).null_count for i in range(len(cols)))
        repeated = repeated_key(keys)
        dup = {**repeated[0], "count": repeated[1]} if repeated is not None else None
    else:  # one job finds both: a null key (its own group) and a key twice (nulls first)
        groups = frame.groupBy(*named).agg(F.count(F.lit(1)).alias(_SEEN))
        rows = (groups.where(null | (F.col(_SEEN) > 1)).orderBy(F.when(null, 0).otherwise(1))
                .limit(1).collect())
        has_null = bool(rows) and any(rows[0][c] is None for c in cols)
        dup = {**{c: rows[0][c] for c in cols}, "count": rows[0][_SEEN]} if rows else None
    if has_null:
        bad = frame.where(null).limit(1).collect()  # the whole row, for the message and the trace
        col = next(c for c in cols if bad[0][c] is None)
        raise BatchRejectedError(f"table {name!r}: key column {col!r} is null in row "
                                 f"{bad[0].asDict()}; nothing of the batch was written",
                                 row=bad[0].asDict())
    if dup is not None:
        raise BatchRejectedError(f"table {name!r}: key {dup} appears more than once "
                                 "in one batch; aggregate per key before writing")
