"""The start of an exactly-once query: its options, a plan checked before Spark starts, the start.

:func:`onceflow.write_stream` is a thin face: it gathers its keywords into :class:`StreamOptions`
and hands them, with the DataFrame, the sink and the checkpoint, to :class:`Start`, which runs the
steps below and returns a :class:`Started` query that the face wraps for the user. Everything here
runs on the driver (a Spark Connect client's process on Connect), once per ``write_stream`` call;
the checks themselves are in :mod:`onceflow.engine.startup`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceflow import faults
from onceflow.checkpoint.guard import repair_command
from onceflow.engine import contract, startup
from onceflow.engine import rejects as rj
from onceflow.engine.batch import BatchWriter, PerBatch, WriterOptions, takes_batch_id
from onceflow.engine.serverside import StepsSource
from onceflow.engine.stable import StableOutputs
from onceflow.errors import ConfigError, from_spark
from onceflow.runtime import plans
from onceflow.sinks._core.base import TablesSink
from onceflow.sinks._core.several import SeveralSinks
from onceflow.sinks._core.tables import Table, check_specs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

EVENT_TIME = "event_time"
"""What :func:`onceflow.deduplicate` remembers of a DataFrame (:func:`onceflow.runtime.plans.remember`):
its event-time column, and (:data:`IDS`) its id columns."""
IDS = "ids"


@dataclass(frozen=True)
class StreamOptions:
    """What :func:`onceflow.write_stream` takes besides the DataFrame, sink and checkpoint.

    Each field is the keyword of the same name (documented there). Made once per call, on the
    driver; the functions it holds are pickled with the batch writer on Spark Connect.
    """

    tables: Mapping[str, Table] | None = None
    per_batch: PerBatch | None = None
    once: bool = False
    trigger: str = "1 second"
    event_time: str | None = None
    on_batch: Callable[[dict[str, Any]], None] | None = None
    check_files: Callable[[list[Path]], object] | None = None
    late: str | None = None
    stable: bool | Sequence[str] = False
    count_rows: Callable[[dict[str, Any]], int] | None = None
    output_mode: str = "append"
    rejects: str | None = None
    retry_s: float = 60.0


@dataclass
class Started:
    """A query Spark started, with what the running query needs to wait, stop and restart it."""

    query: Any
    writer: BatchWriter
    sink: TablesSink
    listener: Any
    restart: Callable[[], Any]
    checkpoint_on_server: bool


class Start:
    """The start of one query (runs on the driver, once per :func:`onceflow.write_stream`).

    :meth:`run` takes these steps in order; a step that refuses raises before Spark starts:

    1. **Where the checkpoint is** (:meth:`_where`): on Spark Connect the server must have
       onceflow and the path must be absolute; the checkpoint is read here when this process
       sees it, else on the server's driver (step 6).
    2. **The checkpoint** (:func:`onceflow.engine.startup.check_checkpoint`): its logs checked and
       a first batch cut off mended.
    3. **The tables** (:meth:`_tables`): ``tables=`` checked, the ``late=`` and ``rejects=``
       tables added, the ``stable=`` tables chosen.
    4. **The query's shape**: its output mode, a ``late=`` source, the outputs' schemas against
       the tables' columns.
    5. **The sink** (:func:`onceflow.engine.startup.check_sink`): its connection and existing
       tables, retried while the failure passes.
    6. **The batch writer**, bound to the checkpoint's query id (its start-up check against the
       sink's markers); where only the server sees the checkpoint, steps 2, 5 and 6 run there.
    7. **Spark's query** started (a fault hook's query listener first, if it has one); on
       Connect with a checkpoint both sides see, through
       :func:`onceflow.runtime.connect.start_local`.

    Args:
        df: The streaming DataFrame.
        sink: The sink, or ``{table: sink}``.
        checkpoint: Spark's checkpoint directory.
        options: The rest of ``write_stream``'s keywords.
    """

    def __init__(self, df: DataFrame, sink: TablesSink | Mapping[str, TablesSink], checkpoint: str | Path,
                 options: StreamOptions) -> None:
        self.df, self.o = df, options
        self.sink: TablesSink = SeveralSinks(sink) if isinstance(sink, Mapping) else sink
        self.path = Path(checkpoint)
        self.topics = self.sink.tables_are_topics
        self.specs = check_specs(options.tables or {}, self.topics)
        if not df.isStreaming:
            raise ConfigError("write_stream needs a streaming DataFrame (spark.readStream...); for a batch "
                              "DataFrame write it directly")
        if options.per_batch is not None and not callable(options.per_batch):
            raise ConfigError("per_batch must be a function DataFrame -> {table_name: DataFrame}")

    def run(self) -> Started:
        """Steps 1-7 (see the class); the started query."""
        on_server = self._where()  # 1
        jars = self.df.sparkSession.conf.get("spark.jars", "") or ""
        repair_cmd = repair_command(self.path, self.sink)
        if not on_server:
            startup.check_checkpoint(self.path, jars, repair_cmd)  # 2
        options = self._tables()  # 3
        o = self.o
        startup.check_output_mode(o.output_mode, options.specs, o.late)  # 4
        startup.check_late_source(self.df, o.late, options.contract is not None)
        outputs = {n: s for n, s in options.specs.items() if n not in (o.late, o.rejects)}
        if isinstance(self.sink, SeveralSinks):
            self.sink.check_outputs(list(outputs))
        with_id = o.per_batch is not None and takes_batch_id(o.per_batch)
        schemas = startup.output_schemas(self.df, o.per_batch, with_id, outputs)
        startup.check_columns_of(schemas, outputs)
        check_sink = partial(startup.check_sink, self.sink, options.specs,
                             {**schemas, **({o.rejects: rj.ARROW_SCHEMA} if o.rejects else {})}, o.retry_s)
        if not on_server:
            check_sink()  # 5
        startup.print_note(startup.append_note(self.df, o.output_mode))
        writer = BatchWriter(self.sink, self.path, options, self.df.sparkSession)
        try:  # 6
            if on_server:
                steps = partial(startup.check_checkpoint, self.path, jars, repair_cmd, writer, check_sink)
                StepsSource.run(self.df.sparkSession, steps, f"checking the checkpoint {self.path}")
            else:
                writer.bind_at_start()
        except BaseException:
            with contextlib.suppress(Exception):  # the refusal is what the caller needs to see
                writer.close()
            raise
        return self._start(writer, on_server)  # 7

    def _where(self) -> bool:
        """Step 1: whether only the Spark Connect server sees the checkpoint."""
        if not plans.is_connect(self.df):
            return False
        from onceflow.runtime import connect

        connect.check_server(self.df.sparkSession)  # the batches run in its Python worker
        if not self.path.is_absolute():
            raise ConfigError(f"checkpoint {str(self.path)!r} is a relative path: on Spark Connect the "
                              "server resolves it against its own working directory, this client "
                              f"against {Path.cwd()}; pass an absolute path")
        return not connect.sees_checkpoint(self.df.sparkSession, self.path)

    def _tables(self) -> WriterOptions:
        """Step 3: every table's spec (``late=`` and ``rejects=`` ones added), the stable ones."""
        o, specs = self.o, self.specs
        event_time = o.event_time or plans.recall(self.df, EVENT_TIME)
        ids = plans.recall(self.df, IDS)
        if o.late is not None:
            if event_time is None:
                raise ConfigError("late= needs the event-time column: pass event_time=, or build the stream "
                                  "with onceflow.deduplicate(...)")
            late_spec = specs.get(o.late) or (Table(key=ids) if ids else Table())
            specs = check_specs({**specs, o.late: late_spec}, self.topics)
        found = contract.contracts_in(self.df)
        if len(found) > 1:
            raise ConfigError(f"the query has {len(found)} input contracts (onceflow.expect / deduplicate on "
                              "several streams); rejects work on a query of one source")
        the_contract = found[0] if found else None
        if o.rejects is not None:
            if the_contract is None:
                raise ConfigError("rejects= needs rules that decide which records are bad: build the stream "
                                  "with onceflow.expect(source, ...) or onceflow.deduplicate(source, ...) on "
                                  "the source DataFrame")
            if o.rejects == o.late:
                raise ConfigError(f"rejects= and late= name the same table {o.rejects!r}: use two tables")
            given = specs.get(o.rejects)
            if given is not None and given != rj.SPEC:
                raise ConfigError(f"tables[{o.rejects!r}] is the rejects table: leave it out of tables= (it "
                                  "is keyed by the record's coordinates, Table(key=['record']))")
            specs = check_specs({**specs, o.rejects: rj.SPEC}, self.topics)
        if o.count_rows is not None and not callable(o.count_rows):
            raise ConfigError("count_rows must be a function {table: rows} -> int")
        return WriterOptions(specs, o.per_batch, event_time, o.on_batch, o.check_files, o.late, ids,
                             self._stable(specs), o.count_rows, the_contract, o.rejects, o.retry_s)

    def _stable(self, specs: Mapping[str, Table]) -> StableOutputs | None:
        """Step 3's ``stable=``: the tables of ``per_batch``'s output to persist (None: none)."""
        own, stable = {self.o.late, self.o.rejects}, self.o.stable
        if stable is True:
            return StableOutputs(self.path, [n for n in specs if n not in own])
        if stable is False:
            return None
        names = [stable] if isinstance(stable, str) else list(stable)
        unknown_tables = [n for n in names if n not in specs or n in own]
        if unknown_tables:
            raise ConfigError(f"stable= names {unknown_tables}, which are not tables of per_batch's output "
                              f"(those are {sorted(n for n in specs if n not in own)})")
        return StableOutputs(self.path, names)

    def _start(self, writer: BatchWriter, on_server: bool) -> Started:
        """Step 7: Spark's query started with the batch writer as its ``foreachBatch``."""
        df, o = self.df, self.o
        listener = faults.query_listener()  # a hook's (the verifier's ``after_commit_log``)
        if listener is not None:
            df.sparkSession.streams.addListener(listener)
        stream = (df.writeStream.foreachBatch(writer).outputMode(o.output_mode)
                  .option("checkpointLocation", str(self.path)))
        stream = stream.trigger(availableNow=True) if o.once else stream.trigger(processingTime=o.trigger)
        start: Callable[[], Any] = stream.start
        if plans.is_connect(df) and not on_server:  # both see the checkpoint: the server's local files
            from onceflow.runtime import connect

            start = partial(connect.start_local, df.sparkSession, stream.start)
        try:
            started = start()
        except Exception as exc:  # e.g. Spark refuses the output mode for this query
            if listener is not None:
                df.sparkSession.streams.removeListener(listener)
            writer.close()
            raise start_error(exc) from None
        return Started(started, writer, self.sink, listener, start, on_server)


def start_error(exc: Exception) -> Exception:
    """What Spark refused at ``start()``, as the onceflow error (its first line, without the plan)."""
    found = from_spark(exc)
    if found is not exc or not type(exc).__name__.endswith("AnalysisException"):
        return found  # type: ignore[return-value]
    return ConfigError(f"Spark refuses to start this query: {str(exc).splitlines()[0]}")
