"""What :func:`onceflow.write_stream` checks before the query starts, so errors come at start.

A query that cannot write should fail when it is started, not at its first batch (which, with
``once=True`` and no new input, never comes):

0. **A first batch cut off** (:func:`clear_unfinished_start`, also run by
   :func:`onceflow.write_realtime`): the temporary log files a SIGKILL left before Spark
   committed any batch are removed — Spark would refuse the checkpoint as another query's.
1. **Output mode** (:func:`check_output_mode`): Spark's ``append``, ``update`` or ``complete``.
   ``update`` and ``complete`` hand each batch the *current* value of every changed (or every)
   aggregate row, not a per-batch delta: such a table must be upserted by its key, never
   merged (``add`` would count a running total again at every batch).
2. **Output columns** (:func:`output_schemas`): the columns each table will get, from the
   stream's schema, or by calling ``per_batch`` once on an *empty* DataFrame of the stream's
   schema (batch id ``-1``; a local relation Spark's optimizer knows is empty, so plain PySpark
   transformations build a plan and run no shuffle: :func:`empty_like`). A
   ``per_batch`` that cannot run on an empty frame is skipped here and checked at its first
   batch as before. Each table's key and merged columns must be among them
   (:func:`onceflow.sinks._core.checks.check_columns`).
3. **The sink** (:meth:`onceflow.sinks._core.base.Sink.check`): connected (a wrong password or an
   unreachable server fails here), its existing tables checked against the specs and columns.
   Then, for a checkpoint that exists, the sink is bound to it and checked against Spark's logs
   (:meth:`onceflow.engine.batch.BatchWriter.bind_at_start`): a sink restored from a backup is refused
   before Spark runs any batch. Where the client does not see the checkpoint (Spark Connect),
   the checkpoint's checks, the sink's and the bind run on the server's driver
   (:func:`check_checkpoint`, :mod:`onceflow.engine.serverside`).
4. **Append over an event-time aggregation** (:func:`append_note`): one line saying that a
   window is written only once the watermark passes its end, and how to drain.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from onceflow.errors import ConfigError, nearest
from onceflow.runtime import plans
from onceflow.sinks._core.checks import check_columns
from onceflow.sinks._core.tables import Table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from onceflow.engine.batch import BatchWriter
    from onceflow.sinks._core.base import Sink

OUTPUT_MODES = ("append", "update", "complete")
"""Spark's output modes, by its names."""
_UNFINISHED = re.compile(r"^\.\.?\d+\.[0-9a-f-]+\.tmp(\.crc)?$")
"""A log file Spark began and never renamed into place (``.N.<uuid>.tmp``, its ``.crc``)."""


def check_checkpoint(checkpoint: Path, session_jars: str, repair_cmd: str, writer: BatchWriter | None = None,
                     check_sink: Callable[[], None] | None = None) -> None:
    """Step 0 and the checkpoint's checks: the checkpoint checked and mended; then steps 3's.

    Spark's checkpoint is read where this runs: in the client, or on a Spark Connect server's
    driver (:mod:`onceflow.engine.serverside`), where ``check_sink`` (:func:`check_sink`) runs too
    and ``writer`` — a copy of the query's batch writer — is bound
    (:meth:`onceflow.engine.batch.BatchWriter.bind_at_start`), then closed with its sink's connections.

    Args:
        checkpoint: The query's checkpoint directory.
        session_jars: The session's ``spark.jars`` (:func:`onceflow.runtime.idstore.check_checkpoint`).
        repair_cmd: The ``onceflow repair`` command a damaged log's error names.
        writer: The batch writer to bind; None: bound by the caller.
        check_sink: The sink's check, run before the bind; None: run by the caller.
    """
    from onceflow.checkpoint import logcheck
    from onceflow.runtime import idstore

    idstore.check_checkpoint(checkpoint, session_jars)
    clear_unfinished_start(checkpoint)
    logcheck.check(checkpoint, repair_cmd)
    try:
        if check_sink is not None:
            check_sink()
        if writer is not None:
            writer.bind_at_start()
    finally:
        if writer is not None:  # a copy: its sink's connections end here (the batches open their own)
            writer.close()
            writer.sink.close()


def check_sink(sink: Sink, specs: Mapping[str, Table], schemas: Mapping[str, pa.Schema],
               retry_s: float) -> None:
    """Step 3: the sink's check (:meth:`onceflow.sinks._core.base.Sink.check`), retried while it passes."""
    from onceflow.sinks._core.retry import retrying

    retrying("checking the sink before the query starts", retry_s, lambda: sink.check(specs, schemas))


def clear_unfinished_start(checkpoint: Path) -> list[Path]:
    """Step 0: remove what a query killed before it committed its first batch left in its logs.

    Spark writes ``offsets/N`` and ``commits/N`` as a hidden temporary file renamed into place.
    A SIGKILL between the two leaves the temporary file behind, and while no batch is logged
    Spark takes any file in ``offsets/`` or ``commits/`` for another query's and refuses to start
    (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``, "should be empty on batch 0"). Seen here:
    a real-time query killed at the end of its first batch left ``commits/.0.<uuid>.tmp`` with
    ``offsets/`` empty — or with ``offsets/0`` written, which the restarted real-time query
    (asynchronous progress tracking) drops as uncommitted before it checks; a micro-batch
    checkpoint holding ``offsets/.0.<uuid>.tmp`` is refused the same way. Such a file is never
    read (Spark reads ``N`` only): while ``commits/`` holds no batch, each one is removed and
    named in a warning. Once a batch is committed, nothing is touched.

    Returns:
        The files removed.
    """
    logs = [checkpoint / "offsets", checkpoint / "commits"]
    if any(p.name.isdigit() for p in logs[1].glob("*")):
        return []
    removed = [p for d in logs if d.is_dir() for p in sorted(d.iterdir()) if _UNFINISHED.match(p.name)]
    for p in removed:
        p.unlink(missing_ok=True)
        logging.getLogger("onceflow.startup").warning(
            "removed %s: a log file Spark began and never finished (the query was killed before it "
            "committed its first batch); Spark would refuse the checkpoint with it", p)
    return removed


def check_output_mode(mode: str, specs: Mapping[str, Table], late: str | None) -> None:
    """Refuse an unknown output mode, and a merge table under ``update``/``complete``.

    Raises:
        ConfigError: Naming the nearest valid mode, or the table and the spec to use instead.
    """
    if mode not in OUTPUT_MODES:
        hint = nearest(str(mode), OUTPUT_MODES)
        raise ConfigError(f"output_mode {mode!r} is not one of {OUTPUT_MODES}"
                          + (f" (did you mean {hint!r}?)" if hint else ""))
    if mode == "append":
        return
    merged = [n for n, s in specs.items() if s.mode == "merge" and n != late]
    if merged:
        raise ConfigError(
            f"output_mode={mode!r} writes each aggregate's current value at every batch, but tables "
            f"{merged} merge (add/max/min) into the stored value, which would count it again: use "
            f"Table(key=[...]) (upsert by the aggregate's key), or output_mode='append' with "
            "per-batch partial aggregates merged by the sink")


def _arrow_schema(value: Any) -> pa.Schema:
    if isinstance(value, pa.Table):
        return value.schema
    from onceflow.sinks._core.checks import arrow_schema

    return arrow_schema(value.schema)


def empty_like(df: DataFrame) -> DataFrame:
    """An empty batch DataFrame with ``df``'s schema, planned as a local relation.

    Spark's optimizer sees that a local relation is empty, so ``per_batch`` run on it runs no
    shuffle, where an empty frame from ``createDataFrame([], schema)`` is an RDD Spark must run,
    shuffles included, at every start (BENCHMARKS.md).
    """
    spark = df.sparkSession
    if plans.is_connect(df):  # Connect plans an empty local relation itself
        return spark.createDataFrame([], df.schema)
    try:
        from pyspark.sql.classic.dataframe import DataFrame as ClassicFrame

        jvm: Any = spark.sparkContext._jvm
        schema = jvm.org.apache.spark.sql.types.DataType.fromJson(df.schema.json())
        return ClassicFrame(spark._jsparkSession.createDataFrame(jvm.java.util.ArrayList(), schema), spark)
    except Exception:  # noqa: BLE001 - not a classic session: Spark's own empty frame
        return spark.createDataFrame([], df.schema)


def output_schemas(df: DataFrame, per_batch: Callable[..., Any] | None, with_id: bool,
                   specs: Mapping[str, Table]) -> dict[str, pa.Schema]:
    """The columns each table will get (step 2), as far as they can be known before the query runs.

    Returns:
        Table -> Arrow schema; empty when ``per_batch`` cannot run on an empty DataFrame.

    Raises:
        ConfigError: ``per_batch`` returns a table ``tables=`` does not name, or one output for
            several tables.
    """
    if per_batch is None:
        return {next(iter(specs)): _arrow_schema(df)} if len(specs) == 1 else {}
    try:
        empty = empty_like(df)
        out = per_batch(empty, -1) if with_id else per_batch(empty)
        if not isinstance(out, Mapping):
            out = {next(iter(specs)): out} if len(specs) == 1 else {}
        schemas = {str(name): _arrow_schema(value) for name, value in out.items()}
    except Exception:  # noqa: BLE001 - the first batch reports what per_batch cannot do
        return {}
    unknown = sorted(set(schemas) - set(specs))
    if unknown:
        raise ConfigError(f"per_batch returns rows for table(s) {unknown}, which tables= does not name "
                          f"(it names {sorted(specs)})")
    return schemas


def check_columns_of(schemas: Mapping[str, pa.Schema], specs: Mapping[str, Table]) -> None:
    """Each table's key and merged columns are among its output's columns (step 2).

    Raises:
        ConfigError: Naming the table, the missing columns and those it has.
    """
    for name, schema in schemas.items():
        check_columns(name, specs[name], schema)


def source_kinds(df: DataFrame) -> list[str]:
    """The kinds of the query's streaming sources.

    Returns:
        ``file`` for each of Spark's file sources, else the source's name (e.g.
        ``onceflow_kafka``); empty when the plan cannot be read.
    """
    leaves = plans.stream_leaves(df)
    return [] if leaves is None else [leaf.kind for leaf in leaves]


def check_late_source(df: DataFrame, late: str | None, has_contract: bool) -> None:
    """Refuse ``late=`` where onceflow could not write the late rows (they would be lost unseen).

    The late rows are read back from the batch's input: a file source's files, or, for another
    source, the records the input contract (:func:`onceflow.expect`) parses from the batch's
    offsets. A Kafka source without a contract has neither.

    Raises:
        ConfigError: ``late=`` on a source other than files, without an input contract.
    """
    if late is None or has_contract:
        return
    other = sorted({k for k in source_kinds(df) if k != "file"})
    if other:
        raise ConfigError(f"late={late!r}: the query reads {', '.join(other)}, whose late rows onceflow can "
                          "read back only through an input contract: parse the records with "
                          "onceflow.expect(raw, json='value', schema=...) and deduplicate that, or leave "
                          "out late= (Spark still drops the late rows)")


def _is_event_time_aggregation(df: DataFrame) -> bool:
    try:
        plan = plans.analyzed_text(df)
    except Exception:  # noqa: BLE001 - py4j of another Spark build: no note
        return False
    return "Aggregate [" in plan and "EventTimeWatermark" in plan


def append_note(df: DataFrame, mode: str) -> str | None:
    """The line printed at start for ``append`` over an event-time aggregation (step 4), or None."""
    if mode != "append" or not _is_event_time_aggregation(df):
        return None
    return ("onceflow: output_mode='append' over an event-time aggregation: a window is written once, "
            "when the watermark passes its end; windows still open when the input stops are not written. "
            "Use output_mode='update' to write every changed window at every batch, or drain the last "
            "windows explicitly (docs: 'Output modes').")


def print_note(line: str | None) -> None:
    """Print a start-up note on stderr (one line)."""
    if line:
        print(line, file=sys.stderr)
