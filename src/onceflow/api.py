"""The public API: make your own streaming query exactly once by changing a few lines.

::

    import onceflow
    from onceflow import Table

    events = spark.readStream.schema(schema).parquet("payments/")       # any replayable source
    clean = onceflow.deduplicate(events, id="payment_id", event_time="ts", within="10 minutes")
    query = onceflow.write_stream(
        clean, sink=onceflow.sqlite("app.db"), checkpoint="ck/",
        tables={"revenue": Table(key=["account", "window_start"], add=["amount"])},
        per_batch=lambda df: {"revenue": revenue_deltas(df)})
    query.awaitTermination()

What :func:`write_stream` does per micro-batch N (inside Spark's ``foreachBatch``; the sink's
numbered commit protocol is in its module, e.g. :mod:`onceflow.sinks.sqlite_tables`):

1. Before the first batch of a process: bind the sink to the checkpoint's query id (a
   database written by another checkpoint is refused: batch ids restart at 0 there).
2. Read N's input files and late watermark from Spark's checkpoint and count its input rows
   and late drops (Parquet file sources; beside Spark's own work, in a thread). Other sources
   (Kafka, ...): Spark's metrics of N's plan once step 3 ran it (:func:`onceflow.checkpoint.plan_counts`).
3. Run ``per_batch`` on N's DataFrame and collect each table's rows (one Spark job per
   DataFrame it returns; a ``pyarrow.Table`` it returns, e.g. derived on the driver from another
   output, is taken as it is). The batch's row count is observed by the first job that reads
   the batch (``DataFrame.observe``: no job of its own; a ``per_batch`` that first runs a
   partial action on the batch — ``limit``, ``isEmpty`` — makes that count partial).
   ``per_batch`` may run more than once for N (after a crash): it must be deterministic
   given N's rows, which Spark guarantees for the rows themselves. With several output
   DataFrames the batch is cached (read once); for an executor-side sink each output is
   cached and counted first, so the sink's checks and its write read it once.
4. With ``late=``: the rows of N's input files that the watermark dropped (event time ``<=``
   the late watermark, the rule :mod:`onceflow.checkpoint` counts by), read back by Spark
   only when N dropped any, go to the ``late`` table with the watermark they missed.
   With ``stable=``: a copy of N's output persisted by an earlier attempt replaces the
   freshly computed one before anything is materialized; else the first computation is
   persisted before any sink sees it (protocol: :mod:`onceflow.stable`).
5. ``sink.commit_tables(N, ...)``: checked, then written with the marker in one transaction
   (the SQLite sink may stage it durably and apply it beside batch N+1), or skipped when N's
   marker is there. Any error here fails the query before Spark writes ``commits/N``;
   :meth:`OnceQuery.awaitTermination` raises it as the onceflow error it is.
   With ``stable=``, N's persisted copy is deleted once the sink committed N.
6. When the query ends (``awaitTermination`` returns or raises, ``stop``), the sink's
   ``flush()`` waits until every batch it accepted is in its tables.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from onceflow import checkpoint as ckpt
from onceflow.durations import parse_duration
from onceflow.errors import ConfigError, OnceflowError, refuse_unknown
from onceflow.faults import CrashPoint, armed, commit_log_listener
from onceflow.sinks.base import BatchStats, TablesSink
from onceflow.sinks.sqlite_tables import SQLiteTablesSink
from onceflow.stable import StableOutputs
from onceflow.tables import Table, check_specs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_EVENT_TIME_ATTR = "_onceflow_event_time"
_ID_ATTR = "_onceflow_id"


def deduplicate(df: DataFrame, id: str | list[str], event_time: str, within: str | float | None = None,
                **unknown: Any) -> DataFrame:
    """Drop duplicates by an id column, with state bounded by an event-time watermark.

    Rows with the same id whose event times are within ``within`` of each other are
    duplicates: the first one seen is kept. Rows more than ``within`` behind the latest event
    time seen are late: Spark drops them, and :func:`write_stream` counts them per batch.

    Args:
        df: A streaming DataFrame.
        id: The id column(s) (a producer-assigned, stable id, never one minted in the query).
        event_time: A timestamp column.
        within: How long ids are remembered, e.g. ``"10 minutes"`` or ``"90s"`` (required:
            an unbounded dedup would keep every id forever).
        **unknown: Refused (a misspelt keyword is named with the nearest valid one).

    Returns:
        The deduplicated streaming DataFrame.

    Raises:
        ConfigError: A missing column, a missing, zero or unreadable ``within``, or an unknown
            keyword (naming the nearest valid one).
    """
    refuse_unknown(set(unknown), {"df", "id", "event_time", "within"}, "onceflow.deduplicate")
    ids = [id] if isinstance(id, str) else list(id)
    missing = [c for c in [*ids, event_time] if c not in df.columns]
    if missing:
        raise ConfigError(f"deduplicate: no column(s) {missing} in the DataFrame (it has {df.columns})")
    if within is None or within == "" or within == 0:
        raise ConfigError("deduplicate needs within= (how long ids are remembered, e.g. '10 minutes'): "
                          "without it the state would keep every id forever")
    seconds = parse_duration(within)
    if seconds <= 0:
        raise ConfigError(f"deduplicate: within must be > 0, got {within!r}")
    out = df.withWatermark(event_time, f"{int(seconds * 1000)} milliseconds")
    out = out.dropDuplicatesWithinWatermark(ids)
    setattr(out, _EVENT_TIME_ATTR, event_time)
    setattr(out, _ID_ATTR, ids)
    return out


def sqlite(path: str | Path, sink_id: str = "default") -> SQLiteTablesSink:
    """The embedded SQLite sink (see :mod:`onceflow.sinks.sqlite_tables`).

    Args:
        path: Database file.
        sink_id: Marker namespace; two queries writing to one database need different ids.
    """
    return SQLiteTablesSink(path, sink_id=sink_id)


def postgres(dsn: str | None = None, sink_id: str = "default", protocol: str = "driver") -> TablesSink:
    """The PostgreSQL sink (see :mod:`onceflow.sinks.postgres_tables`).

    Args:
        dsn: Connection string; ``$ONCEFLOW_PG_DSN`` when None (keeps a password out of code).
        sink_id: Marker namespace; two queries writing to one database need different ids.
        protocol: ``driver`` (the batch's rows through the driver, every table and the marker in
            one transaction: small outputs), or ``staged`` / ``2pc`` (written by Spark's executors,
            each table exactly once by its own marker: large outputs).

    Raises:
        ConfigError: psycopg is missing (``pip install 'onceflow[postgres]'``), no DSN, or an
            unknown protocol.
    """
    from onceflow.sinks.postgres_tables import PostgresFramesSink, PostgresTablesSink

    if protocol == "driver":
        return PostgresTablesSink(dsn, sink_id=sink_id)
    return PostgresFramesSink(dsn, sink_id=sink_id, protocol=protocol)


def delta(root: str | Path, sink_id: str = "default") -> TablesSink:
    """The Delta Lake sink: one Delta table per table name under ``root``.

    Each table commits each batch once, with the app transaction ``(onceflow:<sink_id>,
    batch_id)`` (see :mod:`onceflow.sinks.delta_tables`).

    Raises:
        ConfigError: deltalake is missing (``pip install 'onceflow[delta]'``).
    """
    from onceflow.sinks.delta_tables import DeltaTablesSink

    return DeltaTablesSink(root, sink_id=sink_id)


def http(url: str, ledger: str | Path, sink_id: str = "default", idempotent: bool = True,
         concurrency: int = 16, retries: int = 5, timeout_s: float = 10.0,
         headers: Mapping[str, str] | None = None) -> TablesSink:
    """A side-effect sink: each output row is one ``POST`` to ``url`` (:mod:`onceflow.sinks.http_effects`).

    Each table needs ``key=[...]``: the columns that name an effect; its idempotency key is
    ``<sink_id>/<table>/<key values>``. Pair it with ``write_stream(..., stable=True)`` when
    ``per_batch`` is not deterministic.

    Args:
        url: Where effects are POSTed (the row as JSON, an ``Idempotency-Key`` header).
        ledger: SQLite file of the ledger of started and confirmed keys.
        sink_id: Namespace of keys and markers.
        idempotent: The service honours ``Idempotency-Key``: effects exactly once. False: at
            most one completed call per key; ambiguous ones are listed for reconciliation.
        concurrency: Calls in flight at once.
        retries: Calls per key at most.
        timeout_s: Seconds a call may take.
        headers: Extra headers (e.g. ``Authorization``).
    """
    from onceflow.sinks.http_effects import HttpEffectsSink

    return HttpEffectsSink(url, ledger, sink_id=sink_id, idempotent=idempotent, concurrency=concurrency,
                           retries=retries, timeout_s=timeout_s, headers=headers)


PerBatch = Callable[..., "Mapping[str, DataFrame | pa.Table] | DataFrame | pa.Table"]
"""``per_batch(df)`` or ``per_batch(df, batch_id)`` (as ``foreachBatch`` functions take them)."""


def _takes_batch_id(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes a second positional argument (the batch id)."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or a C callable: call it with the DataFrame only
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


class _Writer:
    """The ``foreachBatch`` function of :func:`write_stream` (steps 1-5 of the module).

    Spark wraps an exception raised inside ``foreachBatch`` into its own; the query's caller
    re-raises :attr:`error` (what the last batch raised) instead, so the user sees onceflow's
    error and its message.
    """

    error: BaseException | None = None

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """Write batch ``batch_id``; remember what it raised, then raise it."""
        try:
            self._write(df, batch_id)
        except BaseException as exc:
            self.error = exc
            raise

    def __init__(self, sink: TablesSink, checkpoint: Path, specs: dict[str, Table],
                 per_batch: PerBatch | None, event_time: str | None,
                 on_batch: Callable[[dict[str, Any]], None] | None,
                 check_files: Callable[[list[Path]], object] | None = None, late: str | None = None,
                 ids: list[str] | None = None, stable: StableOutputs | None = None,
                 count_rows: Callable[[dict[str, Any]], int] | None = None) -> None:
        self.sink, self.checkpoint, self.specs = sink, checkpoint, specs
        self.stable, self._qid, self.count_rows = stable, "", count_rows
        self._with_id = per_batch is not None and _takes_batch_id(per_batch)
        self.per_batch, self.event_time, self.on_batch = per_batch, event_time, on_batch
        self.check_files, self.late, self.ids = check_files, late, ids
        self.out_specs = {n: t for n, t in specs.items() if n != late}
        self._bound = False
        self.spark: Any = None
        self._warned = False
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onceflow-stats")

    def _stats(self, batch_id: int) -> tuple[BatchStats | None, ckpt.BatchInput | None]:
        """Step 2: N's input files, rows and late drops; None when they cannot be counted."""
        if not (self.checkpoint / "sources" / "0").is_dir():  # not a file source: nothing to count
            return None, None
        batch = ckpt.batch_input(self.checkpoint, batch_id)
        if self.check_files is not None:
            self.check_files(batch.files)
        try:
            rows, late = ckpt.count_input(batch, self.event_time)
        except ckpt.UncountableInputError as exc:  # the batch is fine; only its counts are unknown
            if not self._warned:
                print(f"onceflow: warning: input rows and late drops are not counted for this query "
                      f"({exc}); the markers record the batch's own rows and 0 late", file=sys.stderr)
                self._warned = True
            return None, batch
        return BatchStats(rows, late, batch.late_watermark_ms), batch

    def _late_rows(self, df: DataFrame, stats: BatchStats, batch: ckpt.BatchInput) -> DataFrame:
        """The input rows of N that the watermark dropped, as they are in N's files (step 4).

        Plus ``missed_watermark`` (the watermark they were behind); one row per id when the
        ids are known (a late record sent twice is one late record).
        """
        from pyspark.sql import functions as F

        wm = stats.late_watermark_ms
        rows = (df.sparkSession.read.parquet(*[str(f) for f in batch.files])
                .where(F.unix_micros(F.col(str(self.event_time))) <= F.lit(wm * 1000))
                .withColumn("missed_watermark", F.timestamp_millis(F.lit(wm))))
        return rows.dropDuplicates(self.ids) if self.ids else rows

    def _outputs(self, df: DataFrame, batch_id: int) -> dict[str, Any]:
        specs = self.out_specs
        if self.per_batch is None:
            if len(specs) != 1:
                raise ConfigError(f"with several tables ({sorted(specs)}) per_batch= must say which "
                                  "rows go where: return {table_name: DataFrame}")
            return {next(iter(specs)): df}
        out = self.per_batch(df, batch_id) if self._with_id else self.per_batch(df)
        if not isinstance(out, Mapping):
            if len(specs) != 1:
                raise ConfigError("per_batch returned one DataFrame, but tables= names several tables: "
                                  "return {table_name: DataFrame}")
            return {next(iter(specs)): out}
        if self.late is not None and self.late in out:
            raise ConfigError(f"per_batch returned rows for {self.late!r}, the table of late rows (late=): "
                              "onceflow fills it; write to another table")
        return dict(out)

    def _write(self, df: DataFrame, batch_id: int) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        started = time.perf_counter()
        if not self._bound:  # 1
            qid = ckpt.query_id(self.checkpoint)
            if qid is None:
                raise OnceflowError(f"checkpoint {self.checkpoint} has no metadata file")
            self.sink.bind(qid)
            if self.stable is not None:
                self.stable.cleanup(ckpt.committed_batches(self.checkpoint))
            self._qid, self._bound = qid, True
        pending = self._pool.submit(self._stats, batch_id)  # 2
        observation, observed = None, df
        if self.count_rows is None:  # the first job that reads the batch counts it
            observation = Observation(f"onceflow-rows-{id(self)}-{batch_id}-{time.monotonic_ns()}")
            observed = df.observe(observation, F.count(F.lit(1)).alias("rows"))
        frames = self._outputs(observed, batch_id)  # 3
        kept = None
        if self.stable is not None:  # a persisted first computation replaces this one
            kept = self.stable.load(batch_id, self._qid, df.sparkSession)
            if kept is not None:
                frames.update(kept.tables)
        executor_side = bool(getattr(self.sink, "executor_side", False))
        cached = []
        if sum(not isinstance(f, pa.Table) for f in frames.values()) > 1:  # the batch is read once
            cached.append(observed.persist())
        try:
            produced = dict(frames)  # what per_batch returned (count_rows reads these)
            if executor_side:  # the executors write the rows: each frame is computed once
                frames = {n: self._frame(df, f).persist() for n, f in frames.items()}
                cached.extend(frames.values())
                for f in frames.values():
                    f.count()
                rows_out = kept.rows_out if kept is not None else self._rows_out(observation, df, produced)
                if self.stable is not None and kept is None:
                    frames.update(self.stable.save(batch_id, self._qid, frames, rows_out).tables)
                outputs: dict[str, Any] = {n: None for n in frames}
            else:
                try:
                    outputs = {n: f if isinstance(f, pa.Table) else f.toArrow() for n, f in frames.items()}
                except BaseException:
                    pending.result()  # a bad input file is the clearer error: it names the file
                    raise
                rows_out = kept.rows_out if kept is not None else self._rows_out(observation, df, outputs)
                if self.stable is not None and kept is None:
                    outputs.update(self.stable.save(batch_id, self._qid, outputs, rows_out).tables)
            counted, batch = pending.result()
            stats = counted or self._plan_stats(df, batch_id, kept is None, rows_out)
            if self.late is not None and counted is not None and batch is not None and counted.late_dropped:
                late = self._late_rows(df, counted, batch)  # 4
                if executor_side:
                    frames[self.late] = late.persist()
                    cached.append(frames[self.late])
                    outputs[self.late] = None
                else:
                    outputs[self.late] = late.toArrow()
            if executor_side:
                committed = self.sink.commit_frames(batch_id, frames, self.specs, stats, rows_out)  # type: ignore[attr-defined]
            else:
                committed = self.sink.commit_tables(batch_id, outputs, self.specs, stats, rows_out)  # 5
            if self.stable is not None:
                self.stable.drop(batch_id)
        finally:
            for f in cached:
                f.unpersist()
        if self.on_batch is not None:
            self.on_batch({"batch_id": batch_id, "committed": committed, "input_rows": stats.input_rows,
                           "late_dropped": stats.late_dropped, "rows_out": rows_out,
                           "duplicates_dropped": max(stats.input_rows - stats.late_dropped - rows_out, 0),
                           "rows_written": {n: t.num_rows if t is not None else None
                                            for n, t in outputs.items()},
                           "seconds": time.perf_counter() - started})

    def _plan_stats(self, df: DataFrame, batch_id: int, computed: bool, rows_out: int) -> BatchStats:
        """Step 2 for a source without countable files: Spark's metrics of the batch's plan.

        Only when this batch's outputs were computed here (not loaded from a stable copy);
        otherwise, or when the plan read fewer rows than the batch produced (it did not run
        all of it), the batch's own rows and 0 late (:func:`onceflow.checkpoint.plan_counts`).
        """
        watermark = ckpt.late_watermark_ms(self.checkpoint, batch_id)
        found = ckpt.plan_counts(self.spark, self._qid) if computed and self._qid and self.spark else None
        if found is None or found[0] < rows_out:
            return BatchStats(rows_out, 0, watermark)
        return BatchStats(found[0], found[1], watermark)

    @staticmethod
    def _frame(df: DataFrame, value: Any) -> DataFrame:
        """An output as a DataFrame (an Arrow table from ``per_batch`` becomes one)."""
        if isinstance(value, pa.Table):
            return df.sparkSession.createDataFrame(value)
        return value  # type: ignore[no-any-return]

    def _rows_out(self, observation: Any, df: DataFrame, outputs: dict[str, Any]) -> int:
        """Rows of the batch's DataFrame: ``count_rows(outputs)``, or observed by its first job.

        Observed: by the first Spark job that read the batch. If ``per_batch`` never read the
        batch (its outputs do not depend on it), the batch is counted by a job of its own.
        """
        if self.count_rows is not None:
            return int(self.count_rows(outputs))
        jo = observation._jo
        if jo is not None and jo.future().isCompleted():
            return int(observation.get["rows"])
        return int(df.count())

    def close(self) -> None:
        """Stop the stats thread; wait until the sink applied every batch it accepted."""
        self._pool.shutdown(wait=True)
        self.sink.flush()


class OnceQuery:
    """A running exactly-once query: Spark's ``StreamingQuery`` plus onceflow's errors.

    Attributes:
        query: Spark's ``StreamingQuery`` (progress, status, id).
        sink: The sink the query writes to.
    """

    def __init__(self, query: Any, writer: _Writer, sink: TablesSink, listener: Any) -> None:
        self.query, self._writer, self.sink, self._listener = query, writer, sink, listener

    def awaitTermination(self, timeout: float | None = None) -> bool | None:  # noqa: N802
        """Wait for the query to end (``once``: when everything available is written).

        Raises:
            OnceflowError: What failed inside a batch (the original error, not Spark's wrapper).
        """
        try:
            return self.query.awaitTermination(timeout)  # type: ignore[no-any-return]
        except KeyboardInterrupt:
            print("onceflow: stopping after the current batch ...", file=sys.stderr)
            self.stop()
            return True
        except Exception:
            if self._writer.error is not None:
                raise self._writer.error from None
            raise
        finally:
            if not self.query.isActive:
                self._cleanup()

    def stop(self) -> None:
        """Stop after the current batch."""
        self.query.stop()
        self._cleanup()

    def _cleanup(self) -> None:
        if self._listener is not None:
            self.query.sparkSession.streams.removeListener(self._listener)
            self._listener = None
        self._writer.close()

    @property
    def lastProgress(self) -> Any:  # noqa: N802
        """Spark's last progress report."""
        return self.query.lastProgress

    @property
    def isActive(self) -> bool:  # noqa: N802
        """Whether the query runs."""
        return bool(self.query.isActive)


def write_stream(df: DataFrame, sink: TablesSink, checkpoint: str | Path,
                 tables: Mapping[str, Table] | None = None, per_batch: PerBatch | None = None, *,
                 once: bool = False,
                 trigger: str = "1 second", event_time: str | None = None,
                 on_batch: Callable[[dict[str, Any]], None] | None = None,
                 check_files: Callable[[list[Path]], object] | None = None, late: str | None = None,
                 stable: bool | Sequence[str] = False,
                 count_rows: Callable[[dict[str, Any]], int] | None = None, **unknown: Any) -> OnceQuery:
    """Start a query that writes every micro-batch to ``tables`` exactly once.

    Args:
        df: The streaming DataFrame (e.g. from :func:`deduplicate`); its source must be
            replayable by offset (files, the onceflow event log, Kafka).
        sink: Where the tables live: :func:`sqlite`, :func:`postgres` or :func:`delta`.
        checkpoint: Spark checkpoint directory; reuse it to resume exactly.
        tables: Table name -> :class:`Table` (write mode and key); required.
        per_batch: Turns one micro-batch's DataFrame into ``{table_name: DataFrame}`` (or one
            DataFrame when there is one table; a ``pyarrow.Table`` works in place of a
            DataFrame); plain PySpark, run once per batch attempt. It may take the batch id as
            a second argument, like a ``foreachBatch`` function (stable across retries of the
            batch: e.g. part of a side effect's key).
            Without it the batch's rows go to the single table as they are.
        once: Process everything available now, then stop (``availableNow``).
        trigger: Processing-time trigger of a continuous query.
        event_time: The event-time column for late counting; taken from :func:`deduplicate` when
            ``df`` is its result — pass it when the query transforms the DataFrame in between.
        on_batch: Called after every batch with its numbers (e.g. to print progress).
        check_files: Called with each batch's input files (file sources) before anything of the
            batch is written; raise to stop the query (e.g. ``EventLog(dir).validate``, which
            refuses a file whose schema Spark would silently read as nulls).
        late: A table that receives, exactly once, the input rows each batch's watermark
            dropped (file sources): the rows as they are in the input files, plus
            ``missed_watermark``; one per id when ``df`` comes from :func:`deduplicate`. Its
            spec is ``tables[late]`` if given, else upsert by the dedup id (else append).
        stable: Stable input (:mod:`onceflow.stable`): ``True`` persists every table of each
            batch's ``per_batch`` output the first time it is computed, and every retry of the
            batch (after a task failure, a crash, an ambiguous commit) writes the persisted copy
            instead of computing again; or a list of the table names to keep stable. Needed when
            ``per_batch`` is not deterministic (clock, random numbers, a lookup whose answer
            changes) and the sink has side effects (e.g. :func:`http`).
        count_rows: How many rows the batch had (after deduplication and late drops), computed
            from what ``per_batch`` returned (``{table: DataFrame or pyarrow.Table}``; Arrow
            tables for driver-side sinks) — for outputs that carry the count already, e.g. ``lambda out:
            pc.sum(out["counts"]["count"]).as_py()``. Without it the first Spark job that reads
            the batch counts its rows (``DataFrame.observe``: ~2% of Example 5-1's batch time,
            measured).
        **unknown: Refused (a misspelt keyword is named with the nearest valid one).

    Returns:
        The running query; :meth:`OnceQuery.awaitTermination` raises onceflow's errors.

    Raises:
        ConfigError: Bad tables, a DataFrame that is not streaming, or an unknown keyword
            (naming the nearest valid one, e.g. ``tabels`` -> ``tables``).
    """
    refuse_unknown(set(unknown), {"df", "sink", "checkpoint", "tables", "per_batch", "once", "trigger",
                                  "event_time", "on_batch", "check_files", "late", "stable",
                                  "count_rows"},
                   "onceflow.write_stream")
    specs = check_specs(tables or {})
    if not df.isStreaming:
        raise ConfigError("write_stream needs a streaming DataFrame (spark.readStream...); for a batch "
                          "DataFrame write it directly")
    if per_batch is not None and not callable(per_batch):
        raise ConfigError("per_batch must be a function DataFrame -> {table_name: DataFrame}")
    path = Path(checkpoint)
    event_time = event_time or getattr(df, _EVENT_TIME_ATTR, None)
    ids = getattr(df, _ID_ATTR, None)
    if late is not None:
        if event_time is None:
            raise ConfigError("late= needs the event-time column: pass event_time=, or build the stream "
                              "with onceflow.deduplicate(...)")
        specs = check_specs({**specs, late: specs.get(late) or (Table(key=ids) if ids else Table())})
    keep = None
    if stable is True:
        keep = StableOutputs(path, [n for n in specs if n != late])
    elif stable is not False:
        names = [stable] if isinstance(stable, str) else list(stable)
        unknown_tables = [n for n in names if n not in specs or n == late]
        if unknown_tables:
            raise ConfigError(f"stable= names {unknown_tables}, which are not tables of per_batch's output "
                              f"(those are {sorted(n for n in specs if n != late)})")
        keep = StableOutputs(path, names)
    if count_rows is not None and not callable(count_rows):
        raise ConfigError("count_rows must be a function {table: rows} -> int")
    writer = _Writer(sink, path, specs, per_batch, event_time, on_batch, check_files, late, ids, keep,
                     count_rows)
    writer.spark = df.sparkSession  # the query's own session (foreachBatch gets a clone without it)
    listener = None
    selected = armed()
    if selected is not None and selected[0] is CrashPoint.AFTER_COMMIT_LOG:
        listener = commit_log_listener()
        df.sparkSession.streams.addListener(listener)
    stream = df.writeStream.foreachBatch(writer).option("checkpointLocation", str(path))
    stream = stream.trigger(availableNow=True) if once else stream.trigger(processingTime=trigger)
    return OnceQuery(stream.start(), writer, sink, listener)
