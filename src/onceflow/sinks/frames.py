"""Step 1 of the executor-side sinks on a Spark DataFrame: the keys checked before anything is written.

A sink whose rows are written by Spark's tasks (:class:`onceflow.sinks.base.ExecutorSink`) never
holds the batch as Arrow on the driver; its check reads the key columns of a small batch, or
asks Spark to aggregate a large one.
"""

from __future__ import annotations

from typing import Any

from onceflow.errors import BatchRejectedError
from onceflow.tables import Table, repeated_key

SMALL_CHECK_ROWS = 100_000
"""A table of a batch with at most this many rows has its keys checked on the driver (one Spark
job reading them, no shuffle); a larger one by a Spark aggregation. Measured on 40-row batches:
the aggregation's shuffle job was ~0.25 s of a ~1 s batch (BENCHMARKS.md, issue 31)."""

_SEEN = "__onceflow_rows"
"""The row count per key in :func:`check_frame` (a name no user column has)."""


def check_frame(name: str, spec: Table, frame: Any) -> None:
    """Refuse a table of the batch with a missing column, a null key or a key twice.

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
    named = [F.col("`" + c.replace("`", "``") + "`") for c in cols]
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
