"""The oracle of a user's pipeline: its tables rebuilt from Spark's checkpoint, not from onceflow.

``onceflow verify --pipeline PATH.py:FUNCTION`` proves the user's own query. The oracle never
uses what onceflow uses to write (the sinks, the batch writer, :mod:`onceflow.checkpoint.logs`): a bug
there would pass unseen. It may run the user's code, which is what is being proven.

Procedure, for each batch N in Spark's commit log, in order (:class:`PipelineOracle`):

1. Read N's input files from the checkpoint (:mod:`onceflow.verify.spark_log`: the file source's
   log between the end offsets of N-1 and N) and N's two watermarks (``offsets/N-1``: rows at
   or before it are late; ``offsets/N``: dedup state expires against it).
2. Call the user's function with a session whose ``readStream`` reads N's files as a batch
   DataFrame (same format, schema and options), and with the oracle's own ``deduplicate`` and
   ``write_stream`` in place of onceflow's (installed while the call runs).
3. The oracle's ``deduplicate`` applies the documented rules to N's rows (:class:`Deduplication`):
   a row whose event time is at or before the late watermark is late (kept aside for the
   ``late=`` table); a row whose id is remembered is a duplicate; else it is kept and its id
   remembered until the watermark passes its event time plus ``within``.
4. The oracle's ``write_stream`` runs the user's ``per_batch`` on the static batch (with the
   batch id when it takes one) and keeps its outputs and the tables' specs.
5. The outputs are folded into the expected tables by each table's mode
   (:mod:`onceflow.verify.pipeline_verdict`); with ``output_mode="update"`` the static batch
   holds every kept row so far (the aggregate Spark updates), upserted by key.

With ``--source kafka`` the batches come from the topic instead (:mod:`onceflow.verify.pipeline_kafka`:
the records Spark's offset log gives each batch, with the columns of the source the pipeline
reads — Spark's connector, ``format("kafka")``, or onceflow's ``onceflow_kafka``).

Before the rounds, :meth:`PipelineOracle.dry_run` reruns the pipeline once on the whole sample
(files, or the Kafka records as one batch) as one static batch: a pipeline the oracle cannot
rerun is refused in seconds, not after every round ran.

Limits (documented in docs/verify.md): one source, files in the ``input`` directory or a Kafka
topic; rows with the same id are resends (same content: which copy Spark keeps within one
batch is its choice); a streaming aggregation needs ``output_mode="update"``; an input contract
(``onceflow.expect``) and its ``rejects=`` table are judged on text files and Kafka records
(:mod:`onceflow.verify.contract_oracle`); a ``per_batch`` that reads the clock or random numbers
is judged only with ``stable=`` tables (and then only its deterministic columns can match).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from onceflow.api import pipelines
from onceflow.api.durations import parse_duration
from onceflow.errors import ConfigError
from onceflow.runtime import plans
from onceflow.sinks._core.tables import Table
from onceflow.verify import kafka_rig, pipeline_kafka, spark_log
from onceflow.verify.contract_oracle import ContractOracle

KafkaBatch = Callable[[dict[str, Any], bool], pa.Table]
"""A Kafka batch's records as a table, given the reader's options and whether the source is
Spark's connector (:func:`onceflow.verify.pipeline_kafka.batch_table`)."""


@dataclass
class Deduplication:
    """The oracle's own deduplication and late rule (step 3), state over batches."""

    ids: list[str] = field(default_factory=list)
    event_time: str = ""
    within_us: int = 0
    expiry: dict[tuple[Any, ...], int] = field(default_factory=dict)
    """Remembered id -> the event time (us) after which the watermark forgets it."""
    late: list[dict[str, Any]] = field(default_factory=list)
    """Every row dropped as late, with ``batch_id``."""
    kept: list[pa.Table] = field(default_factory=list)
    """Every batch's kept rows (for ``output_mode="update"``)."""

    def apply(self, rows: pa.Table, batch_id: int, late_wm_ms: int) -> pa.Table:
        """Batch ``batch_id``'s rows without late rows and duplicates."""
        times = rows.column(self.event_time).cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
        keys = list(zip(*(rows.column(c).to_pylist() for c in self.ids), strict=True))
        keep = []
        for i, (key, ts) in enumerate(zip(keys, times, strict=True)):
            if ts is None or any(k is None or str(k).strip(" ") == "" for k in key):  # null or blank id
                keep.append(False)  # a bad record: never one id (a contract sends it to rejects)
            elif late_wm_ms > 0 and ts <= late_wm_ms * 1000:  # 0: no watermark yet, nothing late
                keep.append(False)
                self.late.append({**rows.slice(i, 1).to_pylist()[0], "batch_id": batch_id})
            elif key in self.expiry:
                keep.append(False)
            else:
                keep.append(True)
                self.expiry[key] = ts + self.within_us
        out = rows.filter(pa.array(keep, pa.bool_()))
        self.kept.append(out)
        return out

    def evict(self, watermark_ms: int) -> None:
        """Forget ids whose expiry the watermark of the batch reached."""
        limit = watermark_ms * 1000
        self.expiry = {k: t for k, t in self.expiry.items() if t > limit}


@dataclass
class Captured:
    """What the user's function built for one batch (step 4)."""

    tables: dict[str, Table]
    outputs: dict[str, pa.Table]
    late: str | None
    output_mode: str
    rejects: str | None = None
    """The ``rejects=`` table (its expected rows: :mod:`onceflow.verify.contract_oracle`)."""
    routes: dict[str, str] = field(default_factory=dict)
    """Table -> the sink it goes to, when the pipeline writes several (:attr:`PipelineOracle.sinks`)."""


REJECTS_SPEC = Table(key=["record"])
"""The rejects table as the docs define it: one row per bad record, keyed by its coordinates."""


class _BatchReader:
    """``spark.readStream`` of the proxy session: the same reader, over one batch's files."""

    def __init__(self, spark: Any, files: Sequence[Path],
                 kafka: KafkaBatch | None = None) -> None:
        self._spark, self._files, self._kafka = spark, files, kafka
        self._format, self._schema, self._options = "parquet", None, {}  # type: ignore[var-annotated]

    def format(self, source: str) -> _BatchReader:  # noqa: D102
        self._format = source
        return self

    def schema(self, schema: Any) -> _BatchReader:  # noqa: D102
        self._schema = schema
        return self

    def option(self, key: str, value: Any) -> _BatchReader:  # noqa: D102
        self._options[key] = value
        return self

    def options(self, **options: Any) -> _BatchReader:  # noqa: D102
        self._options.update(options)
        return self

    def load(self, path: str | None = None, format: str | None = None,  # noqa: A002, D102
             schema: Any = None, **options: Any) -> Any:
        self._format = format or self._format
        self._schema = schema if schema is not None else self._schema
        self._options.update(options)
        if self._format in ("onceflow_kafka", "kafka") and self._kafka is not None:
            return self._spark.createDataFrame(self._kafka(dict(self._options), self._format == "kafka"))
        if self._format in ("kafka", "onceflow_kafka", "rate", "socket"):
            raise ConfigError(f"verify --pipeline: the oracle reads files (or Kafka with --source kafka: "
                              f"format('kafka') or onceflow.read_kafka), not {self._format!r}")
        reader = self._spark.read.format(self._format).options(**self._options)
        if self._schema is not None:
            reader = reader.schema(self._schema)
        return reader.load([str(f) for f in self._files])

    def parquet(self, path: str, **options: Any) -> Any:  # noqa: D102
        return self.load(path, "parquet", **options)

    def json(self, path: str, schema: Any = None, **options: Any) -> Any:  # noqa: D102
        return self.load(path, "json", schema, **options)

    def csv(self, path: str, schema: Any = None, **options: Any) -> Any:  # noqa: D102
        return self.load(path, "csv", schema, **options)

    def orc(self, path: str, **options: Any) -> Any:  # noqa: D102
        return self.load(path, "orc", **options)

    def text(self, path: str, **options: Any) -> Any:  # noqa: D102
        return self.load(path, "text", **options)


class BatchSession:
    """The user's ``spark`` during the oracle's call: ``readStream`` reads one batch's files."""

    def __init__(self, spark: Any, files: Sequence[Path],
                 kafka: KafkaBatch | None = None) -> None:
        self._spark, self._files, self._kafka = spark, files, kafka

    @property
    def readStream(self) -> _BatchReader:  # noqa: N802, D102
        return _BatchReader(self._spark, self._files, self._kafka)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spark, name)


def _takes_batch_id(fn: Callable[..., Any]) -> bool:
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):
        return False
    return len(params) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


class PipelineOracle:
    """Steps 1-5 of the module over a checkpoint; :meth:`run` gives the expected tables.

    Args:
        spark: A SparkSession for the static batches (any: the oracle's own).
        pipeline: The user's function, ``PATH.py:FUNCTION``; its module is imported again while
            the oracle's functions are in place (so that ``from onceflow import deduplicate``
            binds the oracle's).
        checkpoint: The verified query's checkpoint.
        kafka: ``(bootstrap, topic)`` of a pipeline that reads onceflow's Kafka source.
        sinks: The families of a pipeline of several sinks (``--sink sqlite+iceberg``): its
            ``sink`` argument is ``{family: family}``, so each route the pipeline gives
            ``write_stream`` names the sink of a table (:meth:`routes`).
    """

    def __init__(self, spark: Any, pipeline: str, checkpoint: Path,
                 kafka: tuple[str, str] | None = None, sinks: Sequence[str] = ()) -> None:
        self.spark, self.spec, self.checkpoint, self.kafka = spark, pipeline, checkpoint, kafka
        self.sinks = tuple(sinks)
        self.pipeline: Callable[..., Any] = lambda *a: None
        self.dedup = Deduplication()
        self.contract = ContractOracle(spark)
        self._files: list[Path] = []
        self.captured: list[tuple[int, Captured]] = []
        self.output_mode = "append"
        self._batch_id = -1
        self._late_wm_ms = 0

    # the oracle's deduplicate and write_stream (steps 3 and 4)
    def deduplicate(self, df: Any, id: str | list[str], event_time: str,  # noqa: A002
                    within: str | float | None = None, **unknown: Any) -> Any:
        """Step 3 on the static batch ``df``."""
        ids = [id] if isinstance(id, str) else list(id)
        missing = [c for c in [*ids, event_time] if c not in df.columns]
        if missing or within is None:
            raise ConfigError(f"deduplicate: no column(s) {missing} or no within= (the pipeline fails too)")
        self.contract.dedup_rules(ids, event_time, self._batch_id)  # rules 4-5 of an input contract
        d = self.dedup
        d.ids, d.event_time, d.within_us = ids, event_time, int(parse_duration(within) * 1_000_000)
        kept = d.apply(df.toArrow(), self._batch_id, self._late_wm_ms)
        if self.output_mode == "update":  # the aggregate Spark updates covers every row kept so far
            kept = pa.concat_tables(d.kept)
        return self.spark.createDataFrame(kept, schema=df.schema)

    def expect(self, df: Any, *, json: str | None = None, schema: Any = None,
               required: str | Sequence[str] = (), checks: Mapping[str, Any] | None = None,
               keep: str | Sequence[str] = (), **unknown: Any) -> Any:
        """The oracle's ``onceflow.expect`` on the static batch (:mod:`onceflow.verify.contract_oracle`)."""
        return self.contract.expect(df, self._files, self._batch_id, json, schema,
                                    (required,) if isinstance(required, str) else tuple(required),
                                    dict(checks or {}), (keep,) if isinstance(keep, str) else tuple(keep))

    def write_stream(self, df: Any, sink: Any = None, checkpoint: Any = None,
                     tables: Mapping[str, Table] | None = None, per_batch: Callable[..., Any] | None = None,
                     **kw: Any) -> Captured:
        """Step 4: ``per_batch`` on the static batch; its outputs and the specs."""
        specs = dict(tables or {})
        rejects = kw.get("rejects")
        late = kw.get("late")
        mode = kw.get("output_mode", "append")
        if mode == "append" and "Aggregate" in plans.analyzed_text(df):
            raise ConfigError("verify --pipeline: a streaming aggregation in append mode writes a window "
                              "once the watermark passes it; the oracle judges it with "
                              "output_mode='update' (or aggregate in per_batch)")
        if per_batch is None:
            outs = {next(n for n in specs if n != late): df}
        else:
            got = per_batch(df, self._batch_id) if _takes_batch_id(per_batch) else per_batch(df)
            outs = dict(got) if isinstance(got, Mapping) else {next(n for n in specs if n != late): got}
        arrow = {n: f if isinstance(f, pa.Table) else f.toArrow() for n, f in outs.items()}
        taken = self.contract.take()
        if rejects is not None:
            specs[rejects], arrow[rejects] = REJECTS_SPEC, taken
        routes = {str(t): str(s) for t, s in sink.items()} if isinstance(sink, Mapping) else {}
        return Captured(specs, arrow, late, mode, rejects, routes)

    def routes(self) -> dict[str, str]:
        """Table -> the sink (family) the pipeline sends it to; empty for a pipeline of one sink."""
        return next((c.routes for _, c in reversed(self.captured) if c.routes), {})

    def _call(self, batch_id: int, files: list[Path],
              kafka: KafkaBatch | None = None) -> Captured:
        self._batch_id, self._files = batch_id, list(files)
        where = f"{self.kafka[0]}/{self.kafka[1]}" if self.kafka else ""
        sink = {name: name for name in self.sinks} if self.sinks else None
        built = self.pipeline(BatchSession(self.spark, files, kafka), where, sink, "", True)
        if not isinstance(built, Captured):
            raise ConfigError("the pipeline function did not return what onceflow.write_stream returned")
        return built

    def dry_run(self, files: Sequence[Path], kafka: KafkaBatch | None = None) -> None:
        """Before any round: the pipeline reruns on the whole sample as one static batch, or is refused.

        What the oracle cannot rerun (a ``rejects=`` table, a source it cannot read, a transform
        that fails on a static batch) would otherwise be found only after every round ran. The
        oracle's state is left as it was.

        Raises:
            ConfigError: Naming the pipeline and what the oracle met.
        """
        try:
            with installed(self):
                self.pipeline = pipelines.load(self.spec, fresh=True)
                self._call(0, list(files), kafka)
        except Exception as exc:  # noqa: BLE001 - anything the rerun meets stops the run before its rounds
            why = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
            first = (why.splitlines() or [""])[0][:600]
            raise ConfigError(f"verify --pipeline: the oracle cannot rerun {self.spec} on the sample as one "
                              f"batch, so the run could not be judged (nothing was run): {first}") from None
        finally:
            self.dedup, self.captured, self._batch_id = Deduplication(), [], -1

    def run(self) -> list[tuple[int, Captured]]:
        """Steps 1-4 for every committed batch; each batch's captured outputs, in batch order."""
        ck = self.checkpoint
        planned = spark_log.planned(ck)
        if planned and planned[0] != 0:
            raise ConfigError(f"checkpoint {ck} no longer holds batches 0..{planned[0] - 1} (Spark purged "
                              "them): verify runs the pipeline with every batch retained")
        records: list[dict[str, Any]] = []
        if self.kafka is not None:
            records = kafka_rig.read_topic(*self.kafka)
        entries = spark_log.source_entries(ck) if self.kafka is None else {}
        with installed(self):
            self.pipeline = pipelines.load(self.spec, fresh=True)
            for batch_id in spark_log.committed(ck):
                self._late_wm_ms = spark_log.late_watermark_ms(ck, batch_id)
                files, chosen, kafka = [], [], None
                if self.kafka is None:
                    files = spark_log.batch_files(ck, batch_id, entries=entries)
                else:
                    chosen = pipeline_kafka.batch_records(records, ck, batch_id, self.kafka[1])
                    kafka = functools.partial(pipeline_kafka.batch_table, chosen, self.kafka[1])
                if files or chosen:
                    captured = self._call(batch_id, files, kafka)
                    self.output_mode = captured.output_mode
                    self.captured.append((batch_id, captured))
                self.dedup.evict(spark_log.read_offsets(ck, batch_id).watermark_ms)
        return self.captured


@contextlib.contextmanager
def oracle_session() -> Iterator[Any]:
    """A SparkSession for an oracle; stopped after, unless the process had one already.

    ``verify_pipeline`` runs the oracle in the caller's process: a test's or a notebook's session
    is the one :func:`onceflow.session` returns, and it must outlive the oracle.
    """
    from pyspark import SparkContext

    from onceflow.runtime.session import session

    had = SparkContext._active_spark_context is not None
    spark = session()
    try:
        yield spark
    finally:
        if not had:
            spark.stop()


@contextlib.contextmanager
def replaced(modules: Sequence[Any], **functions: Callable[..., Any]) -> Iterator[None]:
    """Each of ``modules``' ``functions`` (by name) replaced by the one given while inside."""
    saved = [(m, name, getattr(m, name)) for m in modules for name in functions]
    for m, name, _ in saved:
        setattr(m, name, functions[name])
    try:
        yield
    finally:
        for m, name, fn in saved:
            setattr(m, name, fn)


@contextlib.contextmanager
def installed(oracle: PipelineOracle) -> Iterator[None]:
    """The oracle's ``deduplicate``, ``expect`` and ``write_stream`` in place of onceflow's while inside."""
    import onceflow
    from onceflow.api import stream as api
    from onceflow.engine import contract

    with replaced((onceflow, api), deduplicate=oracle.deduplicate, write_stream=oracle.write_stream), \
            replaced((onceflow, contract), expect=oracle.expect):
        yield


def late_ids(oracle: PipelineOracle) -> list[tuple[Any, ...]]:
    """The ids of the rows the oracle dropped as late (one per id)."""
    ids = oracle.dedup.ids
    return sorted({tuple(r[c] for c in ids) for r in oracle.dedup.late}, key=repr)

