"""Sinks that commit every micro-batch exactly once, and the ``--sink`` choices."""

from __future__ import annotations

from pathlib import Path

from onceflow.errors import ConfigError
from onceflow.sinks.base import BatchStats, ExactlyOnceSink
from onceflow.sinks.sqlite import SQLiteSink

__all__ = ["BatchStats", "ExactlyOnceSink", "SQLiteSink", "SINKS", "make_sink"]

SQLITE_SINKS = ("sqlite", "naive", "lossy")
POSTGRES_SINKS = ("postgres", "postgres-staged", "postgres-2pc", "postgres-naive")
SINKS = SQLITE_SINKS + POSTGRES_SINKS


def make_sink(kind: str, db: Path | None, pg_dsn: str | None) -> ExactlyOnceSink:
    """The sink a ``--sink`` choice names.

    Args:
        kind: One of :data:`SINKS`.
        db: SQLite database (SQLite sinks).
        pg_dsn: PostgreSQL connection string (else ``$ONCEFLOW_PG_DSN``).

    Returns:
        The sink (not yet connected).

    Raises:
        ConfigError: A required location is missing.
    """
    if kind in SQLITE_SINKS:
        if db is None:
            raise ConfigError(f"--sink {kind} writes to SQLite: pass --db PATH")
        return SQLiteSink(db, mode="exactly_once" if kind == "sqlite" else kind)  # type: ignore[arg-type]
    from onceflow.pgconn import require_psycopg

    require_psycopg()
    from onceflow.sinks.postgres import PostgresSink, PostgresWriterSink

    if kind == "postgres":
        return PostgresSink(pg_dsn)
    if kind == "postgres-naive":
        return PostgresSink(pg_dsn, mode="naive")
    return PostgresWriterSink(pg_dsn, protocol=kind.removeprefix("postgres-"))
