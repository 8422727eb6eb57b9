"""The sink a verify run writes to: how the driver reaches it, and how the auditor reads it.

SQLite sinks live in a fresh database file in the work directory. The ``http`` sinks call the
demo service (:mod:`onceflow.verify.service`, a process of its own, which applies 3% of calls
and answers 500, and applies 1% and answers too late for the driver's 1.5 s timeout), their
ledger a database file in the work directory (``http-tasks-pg``: a fresh PostgreSQL schema, as the
PostgreSQL sinks get); ``http-naive`` calls a service that ignores
idempotency keys (so its duplicates show). The ``delta`` sink writes Delta tables under
``<workdir>/delta`` (its markers: the tables' app transactions and commit metadata);
``delta-naive`` never checks the app transaction (its duplicates show). The ``iceberg`` sinks keep a
SQLite catalog and the tables' files under ``<workdir>/iceberg``;
``iceberg-naive`` never reads its marker. PostgreSQL sinks
get a fresh schema (``onceflow_verify_<id>``) in the database of the given DSN, selected
through the connection's ``search_path``; the DSN reaches the driver processes through
``ONCEFLOW_PG_DSN``, never on a command line. The ``kafka`` sinks produce to a Kafka broker of
the run's own (:class:`onceflow.verify.kafka_server.KafkaServer`); ``kafka-naive`` produces
without a transaction (its duplicates show). Their outage is the broker SIGKILLed and started
again.
"""

from __future__ import annotations

import random
import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from onceflow.errors import ConfigError, OnceflowError
from onceflow.sinks.postgres import sql as pg
from onceflow.sinks.postgres.conn import require_psycopg
from onceflow.sinks.sqlite.db import read_batches
from onceflow.verify.oracle import Expectation
from onceflow.verify.sinks import (
    DELTA_SINKS,
    EFFECT_SINKS,
    EXAMPLE_SINK_ID,
    ICEBERG_SINKS,
    KAFKA_SINKS,
    PG_LEDGER_SINKS,
    SINKS,
    SQLITE_SINKS,
    iceberg_in,
    marker_id,
)
from onceflow.verify.verdict import (
    Verdict,
    judge_delta,
    judge_effects,
    judge_kafka,
    judge_lake,
    judge_postgres,
    judge_sqlite,
)

if TYPE_CHECKING:
    from onceflow.verify.pipeline_verdict import Reader


def delta_batches(root: Path, sink_id: str) -> list[dict[str, Any]]:
    """The markers of a Delta sink (see :meth:`DeltaTablesSink.batches`), read while it may write.

    A table whose first commit is still being written counts as having none yet.
    """
    from onceflow.sinks.delta.sink import DeltaTablesSink

    for _ in range(5):
        try:
            return DeltaTablesSink(root, sink_id=sink_id).batches()
        except Exception as exc:  # deltalake's TableNotFoundError / a log file mid-write
            last = exc
            time.sleep(0.05)
    raise OnceflowError(f"cannot read the Delta sink's markers under {root}: {last}")

KINDS = SINKS
DRIVER_APP = "onceflow-verify-driver"
"""The ``application_name`` of the drivers' PostgreSQL connections (a ``sink_outage`` ends them)."""
SQLITE_KINDS = SQLITE_SINKS
SINK_ID = EXAMPLE_SINK_ID


class Target(Protocol):
    """What a round needs of where the pipeline writes (:class:`SinkTarget`, or several of them)."""

    def committed_batches(self) -> int:  # noqa: D102
        ...

    def outage_seconds(self, rng: random.Random) -> float:  # noqa: D102
        ...

    def outage(self, seconds: float, during: Callable[[], None]) -> str:  # noqa: D102
        ...


class SinkTarget:
    """Where one verify run's pipeline writes.

    Args:
        kind: A ``onceflow run --sink`` choice (see :data:`KINDS`).
        workdir: The verify work directory (SQLite database location).
        pg_dsn: PostgreSQL connection string for postgres kinds (else ``$ONCEFLOW_PG_DSN``).

    Raises:
        ConfigError: Unknown kind, or a postgres kind without a DSN.
    """

    def __init__(self, kind: str, workdir: Path, pg_dsn: str | None = None, sink_id: str = SINK_ID) -> None:
        if kind not in KINDS:
            raise ConfigError(f"sink must be one of {', '.join(KINDS)}, got {kind!r}")
        self.kind = kind
        self.sink_id = sink_id
        self.db: Path | None = None
        self.dsn = ""
        self.schema = ""
        self.marker_id = marker_id(kind, "user_counts", sink_id)
        """The sink id of the markers of ``user_counts`` (per batch, or per table and batch)."""
        self.service: Any = None
        self.broker: Any = None
        self.workdir = workdir
        if kind in KAFKA_SINKS:
            from onceflow.sinks.kafka.sink import _require

            _require()  # no confluent-kafka: a ConfigError naming the extra
            self._base_dsn = ""
        elif kind in SQLITE_KINDS:
            self.db = workdir / "sink.db"
        elif kind in EFFECT_SINKS and kind not in PG_LEDGER_SINKS:
            self.db = workdir / "ledger.db"
        elif kind in DELTA_SINKS:
            from onceflow.sinks.delta.sink import DeltaTablesSink

            self.db = workdir / "delta"  # the tables' root directory
            DeltaTablesSink(self.db, sink_id=SINK_ID)  # no deltalake: a ConfigError naming the extra
        elif kind in ICEBERG_SINKS:
            from onceflow.sinks.iceberg.sink import _require

            self.db = workdir / "iceberg"  # the SQLite catalog and the warehouse (run --iceberg)
            _require()  # no pyiceberg: a ConfigError naming the extra
        else:
            self._base_dsn = pg.resolve_dsn(pg_dsn)

    @property
    def is_postgres(self) -> bool:
        """Whether the sink (or its ledger: ``http-tasks-pg``) is in PostgreSQL."""
        return self.db is None and self.kind not in KAFKA_SINKS

    def prepare(self, schema: str | None = None) -> None:
        """Create the place the run writes to, and start the service an effect sink calls.

        A new PostgreSQL schema for the PostgreSQL sinks and ``http-tasks-pg`` (its ledger).

        Args:
            schema: Reuse this schema of a resumed run instead.
        """
        if self.kind in EFFECT_SINKS:
            from onceflow.verify.service import ServiceProcess

            pid = self.workdir / "service.pid"
            if pid.exists():  # a resumed run: the service of the killed verify may still run
                _kill(int(pid.read_text()))
            flags = ["--fail-after-apply", "0.03", "--timeout-after-apply", "0.01", "--hang-s", "3"]
            self.service = ServiceProcess(self.workdir / "service.db", *flags,
                                          *(["--ignore-keys"] if self.kind == "http-naive" else [])).start()
            pid.write_text(str(self.service.proc.pid))
        elif self.kind in KAFKA_SINKS:
            from onceflow.verify.kafka_server import KafkaServer

            self.broker = KafkaServer(data_dir=self.workdir / "kafka-out")
            return
        if not self.is_postgres:
            return
        require_psycopg()
        from psycopg import sql
        from psycopg.conninfo import make_conninfo

        self.schema = schema or f"onceflow_verify_{uuid.uuid4().hex[:10]}"
        with pg.session(self._base_dsn) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
        self.dsn = make_conninfo(self._base_dsn, options=f"-c search_path={self.schema}")
        self.driver_dsn = make_conninfo(self.dsn, application_name=DRIVER_APP)

    @property
    def name(self) -> str:
        """How reports name the sink (no password)."""
        if self.db is not None:
            return f"{self.kind}:{self.db}"
        if self.broker is not None:
            return f"{self.kind}:{self.broker.bootstrap}"
        return f"{self.kind}:{pg.redact(self._base_dsn)} schema {self.schema}"

    def extra_args(self) -> list[str]:
        """``onceflow run`` arguments beyond the sink's kind and location (the demo service's)."""
        if self.service is not None:
            return ["--effects-url", self.service.effects_url, "--effects-timeout", "1.5"]
        if self.broker is not None:
            return ["--out-kafka", self.broker.bootstrap]
        return []

    def env(self) -> dict[str, str]:
        """Environment for the driver process."""
        return {pg.DSN_ENV: self.driver_dsn} if self.is_postgres else {}

    def close(self) -> None:
        """Stop what :meth:`prepare` started (the demo service)."""
        if self.service is not None:
            self.service.stop()
            (self.workdir / "service.pid").unlink(missing_ok=True)
        if self.broker is not None:
            self.broker.stop()

    def drop(self) -> str:
        """Remove what the run wrote into the user's server (the PostgreSQL schema); what was done.

        Runs after the verdict. A schema still locked (a prepared transaction left pending,
        which the verdict names) is kept rather than waited for.
        """
        if not self.is_postgres or not self.schema:
            return f"sink: {self.name} (files in the work directory)"
        from psycopg import sql

        try:
            with pg.session(self._base_dsn) as conn:
                conn.execute("SET lock_timeout = '5s'")
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema)))
        except Exception as exc:  # noqa: BLE001 - a schema left behind is said, never fatal to the verdict
            why = (str(exc).strip().splitlines() or [""])[0][:200]
            return f"sink: schema {self.schema} kept ({why}): drop it by hand"
        return f"sink: schema {self.schema} dropped (--keep-sink keeps it)"

    def batches(self) -> list[dict[str, Any]]:
        """The sink's batch markers with metrics."""
        if self.broker is not None:
            from onceflow.verify.kafka_rig import read_markers

            return read_markers(self.broker.bootstrap, self.sink_id)
        if self.kind in DELTA_SINKS:
            assert self.db is not None
            return delta_batches(self.db, self.sink_id)
        if self.kind in ICEBERG_SINKS:
            assert self.db is not None
            return iceberg_in(self.db, self.sink_id).batches() if (self.db / "catalog.db").exists() else []
        if self.db is not None:
            return read_batches(self.db, self.marker_id)
        return pg.read_batches(self.dsn, self.marker_id)

    def committed_batches(self) -> int:
        """Number of batch markers (0 before the sink exists)."""
        if self.kind in DELTA_SINKS or self.kind in ICEBERG_SINKS or self.broker is not None:
            return len(self.batches())
        if self.db is not None:
            from onceflow.verify.driver import committed_batches

            return committed_batches(self.db)
        with pg.session(self.dsn) as conn:
            row = conn.execute("SELECT count(*) FROM onceflow_batches WHERE sink_id = %s",
                               (self.marker_id,)).fetchone()
        return int(row[0])

    def outage_seconds(self, rng: random.Random) -> float:
        """How long a ``sink_outage`` lasts: SQLite's longer than a statement waits for a lock."""
        if self.kind in KAFKA_SINKS:
            return rng.uniform(2.0, 5.0)  # plus the broker's ~4.5 s start
        return rng.uniform(12.0, 15.0) if self.kind in SQLITE_KINDS else rng.uniform(6.0, 10.0)

    def outage(self, seconds: float, during: Callable[[], None]) -> str:
        """Make the sink unavailable for ``seconds``, calling ``during`` every 0.2 s; what was done.

        SQLite: another connection holds ``BEGIN EXCLUSIVE`` (longer than the sink waits for a
        lock). PostgreSQL: the drivers' connections (``application_name`` :data:`DRIVER_APP`) are
        terminated again and again. Delta: another writer changes the tables' metadata without
        pause (a table property; every concurrent commit of the sink's conflicts with it, the rows
        stay the same); Iceberg: the same with empty appends. The sink must retry inside the batch.
        """
        end = time.monotonic() + seconds
        if self.broker is not None:
            self.broker.kill()
            while time.monotonic() < end:
                during()
                time.sleep(0.2)
            self.broker.start()
            return f"the Kafka broker SIGKILLed, down {seconds:.0f} s, started again"
        if self.kind in SQLITE_KINDS:
            assert self.db is not None
            conn = sqlite3.connect(self.db, timeout=30, isolation_level=None)
            conn.execute("BEGIN EXCLUSIVE")
            try:
                while time.monotonic() < end:
                    during()
                    time.sleep(0.2)
            finally:
                conn.execute("COMMIT")
                conn.close()
            return f"database locked by another process (BEGIN EXCLUSIVE) for {seconds:.0f} s"
        if self.kind in DELTA_SINKS:
            from deltalake import DeltaTable

            assert self.db is not None
            commits = 0
            while time.monotonic() < end:
                for i, table in enumerate(sorted(self.db.glob("*/_delta_log"))):
                    try:  # a metadata change: every concurrent commit of the sink's conflicts with it
                        DeltaTable(str(table.parent)).alter.set_table_properties(
                            {"delta.logRetentionDuration": f"interval {30 + (commits + i) % 2} days"})
                        commits += 1
                    except Exception:  # noqa: BLE001 - the other writer lost a race: it tries again
                        pass
                during()
                time.sleep(0.05)
            return (f"another writer changed the tables' metadata for {seconds:.0f} s ({commits} commits, "
                    "each conflicting with the sink's)")
        if self.kind in ICEBERG_SINKS:
            return self._iceberg_outage(seconds, end, during)
        killed = 0
        with pg.session(self._base_dsn) as conn:
            while time.monotonic() < end:
                row = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                   "WHERE application_name = %s", (DRIVER_APP,)).fetchone()
                killed += int(row[0])
                during()
                time.sleep(0.2)
        return f"the drivers' database connections terminated for {seconds:.0f} s ({killed} killed)"

    def _iceberg_outage(self, seconds: float, end: float, during: Callable[[], None]) -> str:
        """Another writer commits a table property to every table until ``end`` (:meth:`outage`).

        Each commit is an empty append: a new snapshot, the rows unchanged. Each of the sink's
        commits that overlaps one is refused by the catalog (its table's snapshot moved): the
        sink must decide again.
        """
        import logging

        assert self.db is not None
        commits = 0
        # the other writer's own retries (pyiceberg logs each) are the outage, not news
        logging.getLogger("pyiceberg.table").setLevel(logging.ERROR)
        if (self.db / "catalog.db").exists():
            catalog = iceberg_in(self.db, self.sink_id).catalog
            while time.monotonic() < end:
                for ident in catalog.list_tables("onceflow"):
                    try:  # an empty append: a new snapshot (a property alone is rebased by the catalog)
                        table = catalog.load_table(ident)
                        table.append(table.schema().as_arrow().empty_table())
                        commits += 1
                    except Exception:  # noqa: BLE001 - the other writer lost a race: it tries again
                        pass
                during()
                time.sleep(0.05)
        while time.monotonic() < end:
            during()
            time.sleep(0.2)
        return (f"another writer committed to the Iceberg tables for {seconds:.0f} s "
                f"({commits} empty appends, each moving its table's snapshot)")

    def reader(self) -> Reader:
        """Reads one of the sink's tables by name (a user pipeline's verdict)."""
        from onceflow.verify import pipeline_verdict as pv

        if self.broker is not None:
            return pv.kafka_reader(self.broker.bootstrap)
        if self.kind in DELTA_SINKS:
            assert self.db is not None
            return pv.delta_reader(self.db)
        if self.kind in ICEBERG_SINKS:
            assert self.db is not None
            return pv.iceberg_reader(self.db)
        if self.db is not None:
            return pv.sqlite_reader(self.db)
        return pv.postgres_reader(self.dsn)

    def judge(self, expectation: Expectation) -> Verdict:
        """The auditor's verdict on this sink."""
        if self.broker is not None:
            return judge_kafka(self.broker.bootstrap, expectation, self.sink_id)
        if self.kind in EFFECT_SINKS:
            ledger = self.db or self.dsn
            return judge_effects(self.workdir / "service.db", ledger, expectation, self.marker_id)
        if self.kind in DELTA_SINKS:
            assert self.db is not None
            return judge_delta(self.db, expectation, SINK_ID)
        if self.kind in ICEBERG_SINKS:
            from onceflow.verify import pipeline_verdict as pv

            assert self.db is not None
            rows = pv.iceberg_reader(self.db)
            return judge_lake(f"iceberg:{self.db}", lambda name: rows(name, None), self.batches(),
                              pv.iceberg_last_batch(self.db, self.sink_id), expectation)
        if self.db is not None:
            return judge_sqlite(self.db, expectation, self.marker_id)
        verdict = judge_postgres(self.dsn, expectation, self.marker_id, gid_prefix=f"of:{SINK_ID}")
        verdict.sink = self.name
        return verdict


def _kill(pid: int) -> None:
    import os
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
