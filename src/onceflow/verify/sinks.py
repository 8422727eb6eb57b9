"""The ``--sink`` choices of ``onceflow run`` / ``onceflow verify``, and the negative controls.

A negative control is a sink that is *meant* to break exactly-once, so that the auditor can
show it catches the break: each is a small subclass of a production sink that leaves out (or
reorders) one step of its commit protocol. They live here, in the verifier, never in the
library: the production classes have no such mode.

* ``naive`` / ``postgres-naive`` / ``delta-naive``: the marker check of step 2 always says
  "not committed", so a re-run batch is written again (duplicates).
* ``lossy``: the marker commits before the rows, so a crash in between loses the batch.
* ``http-naive``: no ledger and no marker: every attempt calls every row.
* ``kafka-naive``: no transaction and no marker: every attempt produces its records.
* ``iceberg-naive``: the table properties' marker is never read, so a replayed batch is added again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from onceflow import faults
from onceflow.errors import ConfigError, nearest
from onceflow.faults import CrashPoint
from onceflow.sinks._core.base import BatchStats, SinkBase, TablesSink
from onceflow.sinks._core.tables import Table
from onceflow.sinks.delta.sink import DeltaTablesSink
from onceflow.sinks.http.sink import HttpEffectsSink
from onceflow.sinks.iceberg.sink import IcebergTablesSink
from onceflow.sinks.postgres import sql as pg
from onceflow.sinks.postgres.conn import require_psycopg
from onceflow.sinks.postgres.sink import PostgresFramesSink, PostgresTablesSink
from onceflow.sinks.sqlite.sink import SQLiteTablesSink

__all__ = ["REALTIME", "REALTIME_STARTED", "SINKS", "USER_SINKS", "USER_SINK_ID", "LossySQLiteSink",
           "family", "location_flag", "make_sinks", "parts",
           "NaiveDeltaSink", "NaiveHttpSink", "NaiveIcebergSink", "NaiveKafkaSink", "NaivePostgresSink",
           "NaiveSQLiteSink", "SinkOptions", "iceberg_in", "make_sink", "marker_id"]

SQLITE_SINKS = ("sqlite", "sqlite-tasks", "naive", "lossy")
EXECUTOR_SINKS = ("postgres-staged", "postgres-2pc")
POSTGRES_SINKS = ("postgres", "postgres-tasks", *EXECUTOR_SINKS, "postgres-naive")
EFFECT_SINKS = ("http", "http-tasks", "http-tasks-pg", "http-naive")
PG_LEDGER_SINKS = ("http-tasks-pg",)
"""Effect sinks whose ledger is in PostgreSQL (``$ONCEFLOW_PG_DSN``): what the tasks of a cluster
without a shared file system reach."""
DELTA_SINKS = ("delta", "delta-tasks", "delta-naive")
KAFKA_SINKS = ("kafka", "kafka-tasks", "kafka-naive")
ICEBERG_SINKS = ("iceberg", "iceberg-naive")
"""Iceberg tables of a SQLite catalog ``DIR/catalog.db``, warehouse ``DIR/warehouse`` (``--iceberg DIR``)."""
SINKS = SQLITE_SINKS + POSTGRES_SINKS + EFFECT_SINKS + DELTA_SINKS + KAFKA_SINKS + ICEBERG_SINKS
USER_SINKS = ("sqlite", "sqlite-tasks", "naive", "lossy", "postgres", "postgres-tasks", "postgres-naive",
              "delta", "delta-tasks", "delta-naive", "kafka", "kafka-tasks", "kafka-naive", *ICEBERG_SINKS)
"""The sinks a user's pipeline (``--pipeline PATH.py:FUNCTION``) runs with: one marker per batch."""
USER_SINK_ID = "pipeline"
"""The sink id (markers' namespace) a user's pipeline writes under in ``onceflow run``/``verify``."""
REALTIME = "realtime"
"""``--sink realtime``: a user's pipeline that writes with :func:`onceflow.write_realtime`."""
REALTIME_STARTED = "real-time query started"
"""What ``onceflow run --sink realtime`` prints once the query runs (verify waits for it)."""
FAMILIES = {"sqlite": SQLITE_SINKS, "postgres": POSTGRES_SINKS, "delta": DELTA_SINKS,
            "iceberg": ICEBERG_SINKS, "kafka": KAFKA_SINKS, "http": EFFECT_SINKS}
"""A sink family (the name a pipeline of several sinks gets each sink under) -> its ``--sink`` choices."""
EXAMPLE_SINK_ID = "user_counts"
"""The sink id ``onceflow run`` writes Example 5-1 under (its markers' namespace)."""


class NaiveSQLiteSink(SQLiteTablesSink):
    """Negative control: never finds a marker, so a replayed batch is written twice."""

    def __init__(self, path: str | Path, sink_id: str = "default") -> None:
        super().__init__(path, sink_id=sink_id, staged=False)

    def _committed(self, batch_id: int) -> bool:
        return False


class LossySQLiteSink(SQLiteTablesSink):
    """Negative control: commits the marker before the rows; a crash in between loses the batch."""

    copies_early = False  # its rows come after its marker's commit, never before

    def __init__(self, path: str | Path, sink_id: str = "default") -> None:
        super().__init__(path, sink_id=sink_id, staged=False)

    def _before_rows(self, batch_id: int, stats: BatchStats, rows_out: int, counts: dict[str, int]) -> None:
        self._marker(batch_id, stats, rows_out, counts)
        self.conn.execute("COMMIT")
        faults.reached(CrashPoint.INSIDE_SINK_TXN, batch_id)
        self.conn.execute("BEGIN IMMEDIATE")


class NaivePostgresSink(PostgresTablesSink):
    """Negative control: never finds a marker, so a replayed batch is written twice."""

    def _committed(self, conn: Any, batch_id: int) -> bool:
        return False


class NaiveDeltaSink(DeltaTablesSink):
    """Negative control: writes the app transaction but never checks it (what delta-rs alone does)."""

    def _committed(self, table: Any, batch_id: int) -> bool:
        return False


class NaiveHttpSink(HttpEffectsSink):
    """Negative control: no ledger, no marker: every attempt calls every row."""

    keeps_markers = False
    """No marker: the start-up check that the sink is in step with the checkpoint does not apply."""

    def commit_tables(self, batch_id: int, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int) -> bool:
        """Call every row of the batch, every attempt (step 1, then step 3 without the ledger)."""
        effects = self._effects(batch_id, outputs, specs)
        asyncio.run(self.send_all(effects, lambda _: None, record=False))
        faults.reached(CrashPoint.EFFECTS_SENT, batch_id)
        return True


class NaiveKafkaSink(SinkBase):
    """``kafka-naive``: every attempt of a batch produces its records, without a transaction or marker."""

    all_or_nothing = False
    """No transaction: each record is produced on its own."""

    keeps_markers = False
    """Nothing to check a checkpoint against (:func:`onceflow.checkpoint.repair.check_order` skips it)."""
    tables_are_topics = True

    def __init__(self, bootstrap: str, sink_id: str = "default") -> None:
        from confluent_kafka import Producer

        from onceflow.sinks.kafka.sink import KafkaTopicsSink

        self.sink_id = sink_id
        self._topics = KafkaTopicsSink(bootstrap, sink_id=sink_id)  # only to create missing topics
        self._p = Producer({"bootstrap.servers": bootstrap})

    def repair_options(self) -> str:
        """``--kafka BOOTSTRAP --sink-id ID`` (as the real sink's)."""
        return self._topics.repair_options()

    def bind(self, query_id: str) -> None:  # noqa: D102
        pass

    def check(self, specs: Mapping[str, Table], schemas: Mapping[str, pa.Schema]) -> None:  # noqa: D102
        pass

    def commit_tables(self, batch_id: int, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int) -> bool:
        """Produce every record of the batch, whatever an earlier attempt did."""
        from onceflow.sinks.kafka.records import encode

        faults.reached(CrashPoint.BEFORE_SINK_WRITE, batch_id)
        for name, rows in outputs.items():
            self._topics.ensure_topic(name, 1)
            keys, values = encode(rows, specs[name])
            for key, value in zip(keys, values, strict=True):
                self._p.produce(name, value=value, key=key)
        self._p.flush(60)
        faults.reached(CrashPoint.AFTER_SINK_COMMIT, batch_id)
        return True

    def batches(self) -> list[dict[str, Any]]:  # noqa: D102
        return []

    def flush(self) -> None:  # noqa: D102
        pass

    def close(self) -> None:  # noqa: D102
        self._p.flush(30)


class NaiveIcebergSink(IcebergTablesSink):
    """Negative control: never reads its marker, so a replayed batch is added to the tables again."""

    def committed(self, table: Any) -> int:
        """No batch, ever (step 2 always writes)."""
        return -1

    def _clean(self, table: Any, batch_id: int, keep: str | None = None) -> None:
        """Nothing (a writer without a marker has no idea which files are committed)."""


def iceberg_in(folder: Path, sink_id: str, naive: bool = False) -> IcebergTablesSink:
    """The Iceberg sink of ``--iceberg DIR``: a SQLite catalog ``DIR/catalog.db``, files in DIR/warehouse."""
    cls = NaiveIcebergSink if naive else IcebergTablesSink
    return cls(f"sqlite:///{Path(folder).absolute() / 'catalog.db'}", Path(folder) / "warehouse",
               sink_id=sink_id)


@dataclass(frozen=True)
class SinkOptions:
    """Where a ``--sink`` choice writes.

    Attributes:
        db: SQLite database (SQLite sinks; the ledger of the ``http`` sinks).
        pg_dsn: PostgreSQL connection string (else ``$ONCEFLOW_PG_DSN``).
        delta: Root directory of the Delta tables (``delta``).
        effects_url: Where the ``http`` sinks POST effects.
        effects_timeout_s: Seconds an effect call may take.
        kafka: ``host:port`` of the brokers the ``kafka`` sinks produce to.
        iceberg: Directory of the ``iceberg`` sinks' SQLite catalog and warehouse.
    """

    db: Path | None = None
    pg_dsn: str | None = None
    delta: Path | None = None
    effects_url: str | None = None
    effects_timeout_s: float = 10.0
    kafka: str | None = None
    iceberg: Path | None = None


def make_sink(kind: str, where: SinkOptions, sink_id: str = EXAMPLE_SINK_ID) -> TablesSink:
    """The sink a ``--sink`` choice names.

    Args:
        kind: One of :data:`SINKS`.
        where: Its locations.
        sink_id: Marker namespace.

    Returns:
        The sink (not yet connected).

    Raises:
        ConfigError: A required location is missing, or the extra the sink needs is not installed.
    """
    if "+" in kind:
        raise ConfigError(f"--sink {kind} names several sinks: a pipeline of several sinks gets them from "
                          "make_sinks")
    if kind in ICEBERG_SINKS:
        if where.iceberg is None:
            raise ConfigError(f"--sink {kind} writes Iceberg tables: pass --iceberg DIR (a SQLite catalog "
                              "DIR/catalog.db, the tables' files under DIR/warehouse)")
        return iceberg_in(where.iceberg, sink_id, naive=kind == "iceberg-naive")
    if kind in KAFKA_SINKS:
        if not where.kafka:
            raise ConfigError(f"--sink {kind} produces to Kafka: pass --out-kafka HOST:PORT (the brokers)")
        if kind == "kafka-naive":
            return NaiveKafkaSink(where.kafka, sink_id=sink_id)
        from onceflow.sinks.kafka.sink import KafkaTopicsSink

        every = kind == "kafka-tasks"  # every batch produced by Spark's tasks
        return KafkaTopicsSink(where.kafka, sink_id=sink_id, collect_below=0 if every else 100_000)
    if kind in DELTA_SINKS:
        if where.delta is None:
            raise ConfigError(f"--sink {kind} writes Delta tables: pass --delta DIR (their root directory)")
        if kind == "delta-naive":
            return NaiveDeltaSink(where.delta, sink_id=sink_id)
        every = kind == "delta-tasks"  # every batch through Spark's tasks
        return DeltaTablesSink(where.delta, sink_id=sink_id, collect_below=0 if every else 100_000)
    if kind in EFFECT_SINKS:
        ledger = _ledger(kind, where)
        timeout = where.effects_timeout_s
        assert where.effects_url
        if kind == "http-naive":
            return NaiveHttpSink(where.effects_url, ledger, sink_id=sink_id, timeout_s=timeout)
        every = kind.startswith("http-tasks")  # every batch called by Spark's tasks
        return HttpEffectsSink(where.effects_url, ledger, sink_id=sink_id, timeout_s=timeout,
                               collect_below=0 if every else 100_000)
    if kind in SQLITE_SINKS:
        if where.db is None:
            raise ConfigError(f"--sink {kind} writes to SQLite: pass --db PATH")
        if kind == "naive":
            return NaiveSQLiteSink(where.db, sink_id=sink_id)
        if kind == "lossy":
            return LossySQLiteSink(where.db, sink_id=sink_id)
        every = kind == "sqlite-tasks"  # every batch through Spark's tasks
        return SQLiteTablesSink(where.db, sink_id=sink_id, collect_below=0 if every else 100_000)
    require_psycopg()
    if kind in ("postgres", "postgres-tasks"):  # -tasks: every batch staged by Spark's tasks
        return PostgresTablesSink(where.pg_dsn, sink_id=sink_id, collect_below=0 if kind == "postgres-tasks"
                                  else 100_000)
    if kind == "postgres-naive":
        return NaivePostgresSink(where.pg_dsn, sink_id=sink_id)
    if kind in EXECUTOR_SINKS:
        return PostgresFramesSink(where.pg_dsn, sink_id=sink_id, protocol=kind.removeprefix("postgres-"))
    raise ConfigError(f"unknown sink {kind!r}; use one of {', '.join(SINKS)}")


def _ledger(kind: str, where: SinkOptions) -> str | Path:
    """The ledger of an effect sink: ``--db PATH``, or (``http-tasks-pg``) the PostgreSQL database.

    Raises:
        ConfigError: No service URL, or no ledger where the kind keeps it.
    """
    if kind in PG_LEDGER_SINKS:
        if not where.effects_url:
            raise ConfigError(f"--sink {kind} calls a service: pass --effects-url URL (its ledger is in "
                              f"PostgreSQL: --pg-dsn or ${pg.DSN_ENV})")
        require_psycopg()
        return pg.resolve_dsn(where.pg_dsn)
    if where.db is None or not where.effects_url:
        raise ConfigError(f"--sink {kind} calls a service: pass --effects-url URL and --db PATH for "
                          "its ledger")
    return where.db


def marker_id(kind: str, table: str, sink_id: str = EXAMPLE_SINK_ID) -> str:
    """The sink id of the markers that record ``table``'s batches for a ``--sink`` choice.

    The executor-side PostgreSQL sinks keep one marker per table (``<sink_id>.<table>``);
    the others one per batch for all tables (``<sink_id>``).
    """
    return f"{sink_id}.{table}" if kind in EXECUTOR_SINKS else sink_id


def family(kind: str) -> str:
    """The family of one ``--sink`` choice (``sqlite-tasks`` -> ``sqlite``, ``naive`` -> ``sqlite``)."""
    return next((name for name, kinds in FAMILIES.items() if kind in kinds), kind)


def location_flag(kind: str) -> str:
    """``onceflow run``'s option for where a ``--sink`` choice's files are (``--db``: SQLite, a ledger)."""
    return {"delta": "--delta", "iceberg": "--iceberg"}.get(family(kind), "--db")


def parts(kind: str) -> list[str]:
    """The sinks a ``--sink`` choice names: ``sqlite+iceberg`` -> both, in order; one kind -> itself.

    Raises:
        ConfigError: A part that is not a sink a user's pipeline writes with (a "did you mean"
            for a misspelling), two of one family, or an empty part.
    """
    names = kind.split("+")
    for name in names:
        if name not in USER_SINKS:
            near = nearest(name, USER_SINKS)
            raise ConfigError(f"--sink {kind}: {name!r} is not a sink of a pipeline"
                              + (f" (did you mean {near!r}?)" if near else "")
                              + f"; choose from {', '.join(USER_SINKS)}, or several joined by '+'")
    families = [family(n) for n in names]
    twice = sorted({f for f in families if families.count(f) > 1})
    if twice:
        raise ConfigError(f"--sink {kind}: one sink of each family (sqlite, postgres, delta, iceberg, "
                          f"kafka), got {' and '.join(n for n in names if family(n) in twice)}: a pipeline "
                          "names its sinks by family")
    return names


def make_sinks(kind: str, where: SinkOptions,
               sink_id: str = EXAMPLE_SINK_ID) -> TablesSink | dict[str, TablesSink]:
    """What a user's pipeline gets as its ``sink`` for a ``--sink`` choice.

    One kind: that sink (:func:`make_sink`). Several (``sqlite+iceberg``): ``{family: sink}`` in
    the given order, e.g. ``{"sqlite": ..., "iceberg": ...}``; the pipeline routes its tables with
    ``onceflow.write_stream(df, {"counts": sink["sqlite"], "events": sink["iceberg"]}, ...)``. A
    negative control takes its family's place (``naive+iceberg``: ``sink["sqlite"]`` never reads its
    markers), so the same pipeline runs against it.

    Raises:
        ConfigError: As :func:`parts` and :func:`make_sink` do.
    """
    names = parts(kind)
    if len(names) == 1:
        return make_sink(kind, where, sink_id)
    return {family(name): make_sink(name, where, sink_id) for name in names}
