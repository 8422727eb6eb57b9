"""An ``append`` table's files written by Spark's own Parquet writer, for :mod:`onceflow.sinks.delta.files`.

A Delta append is Parquet files plus one commit that names them. When a batch's columns have
exactly the table's types, Spark's own Parquet writer writes the same values as step 1 of
:mod:`onceflow.sinks.delta.files` would, without a Python worker per task and without the Python
data source's start in each new process; its file commit protocol keeps the files of one
attempt per task (a failed, retried or speculative attempt's files never leave its temporary
directory). Then, on the driver:

1. Spark writes the frame into the attempt's staging directory
   ``<root>/_onceflow/stage/<T>/<N>-<token>/``; its tasks run the batch's plan (this is the
   batch's only Spark job when the frame is not cached).
2. Each committed file's footer gives its rows and statistics (``numRecords``, ``nullCount``,
   ``minValues``/``maxValues`` of integer and date columns: what step 1 of ``files`` computes
   from the rows) — no row is read.
3. The files move (a rename) into the table's directory as
   ``part-<N>-<token>-<i>-spark-<random>.<codec>.parquet`` and become the messages of ``files.commit``, which
   decides, commits them with the marker and deletes them on a replay.

Only flat columns of Spark's primitive types take this way (no arrays, maps or structs, whose
Parquet shape depends on Spark's legacy settings), only when every column's type is the table's
and a column the table declares not null is not nullable in the batch, and a batch with dates or
timestamps only when the session writes them without rebasing (``spark.sql.parquet.
datetimeRebaseModeInWrite=CORRECTED``, Spark's default: proleptic Gregorian, as Arrow and
delta-rs read them; ``LEGACY`` would shift a date before 1582 by days); otherwise
(:func:`columns` returns None) onceflow's own task writer (``files.write_task``) writes the
files, casting each value safely or refusing it. Timestamps are written as ``TIMESTAMP_MICROS`` (Delta's
timestamp; Spark's default ``INT96`` is not), whatever the session sets.

Task faults (``task_mid_write``, ``task_after_write``) need Python in the task: when one is armed
for the batch, the rows pass through an identity ``mapInArrow`` whose worker dies after its
first Arrow batch (mid-write) or after its last (every row handed to the writer, its file not
committed); Spark's retry writes the task again and only its file is committed.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from onceflow import faults
from onceflow.sinks.delta.files import FilesSpec, clear_stage

_PRIMITIVE = {"boolean", "byte", "short", "integer", "long", "float", "double", "string", "binary", "date",
              "timestamp", "timestamp_ntz"}
"""Spark's (and Delta's, which uses the same names) flat types this way writes."""
WRITE_OPTIONS = {"compression": "snappy", "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}
"""Spark's Parquet write options of this way (see the module)."""
REBASE = "spark.sql.parquet.datetimeRebaseModeInWrite"
"""The session's calendar of dates and times written to Parquet; a write option cannot set it."""


def _type_name(raw: Any) -> str | None:
    """A field type of Spark's (= Delta's) schema JSON as a name, None for a nested type."""
    if isinstance(raw, str) and (raw in _PRIMITIVE or raw.startswith("decimal(")):
        return raw.replace(" ", "")
    return None


def columns(frame: Any, table: Any | None) -> list[str] | None:
    """The table's columns in its order, when Spark's Parquet writer may write ``frame`` into it.

    Args:
        frame: The batch's rows of the table (a DataFrame).
        table: The Delta table, loaded (a ``DeltaTable``; None: it does not exist yet).

    Returns:
        The columns to select (the table's order; the frame's when the table does not exist), or
        None: a nested type, a type or a column set that differs from the table's, a column the
        table declares not null that the batch may hold nulls in, or dates and times the session
        would rebase (onceflow's own task writer writes it).
    """
    mine = {f["name"]: f for f in frame.schema.jsonValue()["fields"]}
    if any(_type_name(f["type"]) is None for f in mine.values()):
        return None
    timed = any(f["type"] in ("date", "timestamp", "timestamp_ntz") for f in mine.values())
    if timed and str(frame.sparkSession.conf.get(REBASE, "CORRECTED")).upper() != "CORRECTED":
        return None
    if table is None:
        return list(mine)
    theirs = json.loads(table.schema().to_json())["fields"]
    if {f["name"] for f in theirs} != set(mine):
        return None
    for f in theirs:
        have = mine[f["name"]]
        if _type_name(f["type"]) != _type_name(have["type"]) or (not f["nullable"] and have["nullable"]):
            return None
    return [f["name"] for f in theirs]


def write(frame: Any, spec: FilesSpec, batch_id: int) -> list[dict[str, Any]]:
    """Steps 1-3: ``frame`` written by Spark into the table's directory; the messages of ``files.commit``.

    Args:
        frame: The batch's rows, columns as :func:`columns` gave them.
        spec: The table's write (``append``).
        batch_id: The micro-batch.

    Returns:
        One message, ``{"files": [...], "rows": n}`` (see :func:`onceflow.sinks.delta.files.write_task`).

    Raises:
        OnceflowError: Spark's write failed (an onceflow error from a task as itself).
    """
    from onceflow.errors import from_spark

    stage = spec.stage(batch_id)
    clear_stage(spec, batch_id)
    armed = task_fault(batch_id)
    if armed is not None:
        frame = frame.mapInArrow(dying(armed, batch_id), frame.schema)
    try:
        frame.write.options(**WRITE_OPTIONS).mode("overwrite").parquet(str(stage))  # 1
    except Exception as exc:
        raise from_spark(exc) from None
    try:
        found, rows = [], 0
        for i, src in enumerate(sorted(stage.glob("part-*.parquet"))):
            count, stats = footer_stats(src)  # 2
            if not count:
                continue
            unique = f"{i:05d}-spark-{uuid.uuid4().hex[:8]}"
            name = f"part-{batch_id:05d}-{spec.token}-{unique}.{_suffix(src.name)}"
            spec.path.mkdir(parents=True, exist_ok=True)
            os.replace(src, spec.path / name)  # 3
            st = os.stat(spec.path / name)
            found.append({"path": name, "size": st.st_size, "mtime_ms": int(st.st_mtime * 1000),
                          "rows": count, "stats": stats})
            rows += count
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return [{"files": found, "rows": rows}]


def _suffix(name: str) -> str:
    """``snappy.parquet`` of Spark's ``part-...-c000.snappy.parquet`` (``parquet`` without a codec)."""
    parts = name.rsplit(".", 2)
    return ".".join(parts[-2:]) if len(parts) == 3 else "parquet"


def footer_stats(path: Path) -> tuple[int, str]:
    """A Parquet file's rows and its Delta statistics (JSON), from its footer only."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    schema = meta.schema.to_arrow_schema()
    nulls: dict[str, int] = {}
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    for c, f in enumerate(schema):
        ranged = pa.types.is_integer(f.type) or pa.types.is_date32(f.type)
        parts = [meta.row_group(g).column(c).statistics for g in range(meta.num_row_groups)]
        if not parts or any(s is None or not s.has_null_count for s in parts):
            continue
        nulls[f.name] = sum(s.null_count for s in parts)
        if ranged and all(s.has_min_max for s in parts):
            low[f.name] = min(s.min for s in parts)
            high[f.name] = max(s.max for s in parts)

    def form(v: Any) -> Any:
        return v if isinstance(v, int) else v.isoformat()

    return meta.num_rows, json.dumps({"numRecords": meta.num_rows, "nullCount": nulls,
                                      "minValues": {k: form(v) for k, v in low.items()},
                                      "maxValues": {k: form(v) for k, v in high.items()}})


def task_fault(batch_id: int) -> faults.CrashPoint | None:
    """The task-level crash point armed for this batch, if any."""
    for point in (faults.CrashPoint.TASK_MID_WRITE, faults.CrashPoint.TASK_AFTER_WRITE):
        if faults.armed_for(point, batch_id):
            return point
    return None


def dying(point: faults.CrashPoint, batch_id: int) -> Any:
    """The identity over a task's Arrow batches whose first attempt dies at ``point`` (see the module)."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from onceflow.sinks._core.tasks import running_task

        attempt = running_task().attempt
        for batch in batches:
            yield batch
            if point is faults.CrashPoint.TASK_MID_WRITE:
                faults.task_reached(point, batch_id, attempt)
        faults.task_reached(faults.CrashPoint.TASK_AFTER_WRITE, batch_id, attempt)

    return run
