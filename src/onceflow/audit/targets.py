"""The sink a verify run writes to: how the driver reaches it, and how the auditor reads it.

SQLite sinks live in a fresh database file in the work directory. PostgreSQL sinks
get a fresh schema (``onceflow_verify_<id>``) in the database of the given DSN, selected
through the connection's ``search_path``; the DSN reaches the driver processes through
``ONCEFLOW_PG_DSN``, never on a command line.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from onceflow.audit.oracle import Expectation
from onceflow.audit.verdict import Verdict, judge_postgres, judge_sqlite
from onceflow.errors import ConfigError
from onceflow.pgconn import require_psycopg
from onceflow.sinks import EXAMPLE_SINK_ID, SINKS, SQLITE_SINKS, marker_id, pg
from onceflow.sinks.sqlite import read_batches

KINDS = SINKS
SQLITE_KINDS = SQLITE_SINKS
SINK_ID = EXAMPLE_SINK_ID


class SinkTarget:
    """Where one verify run's pipeline writes.

    Args:
        kind: A ``onceflow run --sink`` choice (see :data:`KINDS`).
        workdir: The verify work directory (SQLite database location).
        pg_dsn: PostgreSQL connection string for postgres kinds (else ``$ONCEFLOW_PG_DSN``).

    Raises:
        ConfigError: Unknown kind, or a postgres kind without a DSN.
    """

    def __init__(self, kind: str, workdir: Path, pg_dsn: str | None = None) -> None:
        if kind not in KINDS:
            raise ConfigError(f"sink must be one of {', '.join(KINDS)}, got {kind!r}")
        self.kind = kind
        self.db: Path | None = None
        self.dsn = ""
        self.schema = ""
        self.marker_id = marker_id(kind, "user_counts")
        """The sink id of the markers of ``user_counts`` (per batch, or per table and batch)."""
        if kind in SQLITE_KINDS:
            self.db = workdir / "sink.db"
        else:
            self._base_dsn = pg.resolve_dsn(pg_dsn)

    @property
    def is_postgres(self) -> bool:
        """Whether the sink is in PostgreSQL."""
        return self.db is None

    def prepare(self, schema: str | None = None) -> None:
        """Create the empty place the run writes to (a new PostgreSQL schema).

        Args:
            schema: Reuse this schema of a resumed run instead.
        """
        if not self.is_postgres:
            return
        require_psycopg()
        from psycopg import sql
        from psycopg.conninfo import make_conninfo

        self.schema = schema or f"onceflow_verify_{uuid.uuid4().hex[:10]}"
        with pg.session(self._base_dsn) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
        self.dsn = make_conninfo(self._base_dsn, options=f"-c search_path={self.schema}")

    @property
    def name(self) -> str:
        """How reports name the sink (no password)."""
        if self.db is not None:
            return f"{self.kind}:{self.db}"
        return f"{self.kind}:{pg.redact(self._base_dsn)} schema {self.schema}"

    def run_args(self) -> list[str]:
        """``onceflow run`` arguments that select this sink."""
        return ["--sink", self.kind] + (["--db", str(self.db)] if self.db is not None else [])

    def env(self) -> dict[str, str]:
        """Environment for the driver process."""
        return {pg.DSN_ENV: self.dsn} if self.is_postgres else {}

    def batches(self) -> list[dict[str, Any]]:
        """The sink's batch markers with metrics."""
        if self.db is not None:
            return read_batches(self.db, self.marker_id)
        return pg.read_batches(self.dsn, self.marker_id)

    def committed_batches(self) -> int:
        """Number of batch markers (0 before the sink exists)."""
        if self.db is not None:
            from onceflow.audit.driver import committed_batches

            return committed_batches(self.db)
        with pg.session(self.dsn) as conn:
            row = conn.execute("SELECT count(*) FROM onceflow_batches WHERE sink_id = %s",
                               (self.marker_id,)).fetchone()
        return int(row[0])

    def judge(self, expectation: Expectation) -> Verdict:
        """The auditor's verdict on this sink."""
        if self.db is not None:
            return judge_sqlite(self.db, expectation, self.marker_id)
        verdict = judge_postgres(self.dsn, expectation, self.marker_id, gid_prefix=f"of:{SINK_ID}")
        verdict.sink = self.name
        return verdict
