"""Sinks that commit every micro-batch exactly once, and the ``--sink`` choices of ``onceflow run``."""

from __future__ import annotations

import os
from pathlib import Path

from onceflow.errors import ConfigError
from onceflow.sinks.base import BatchStats, TablesSink
from onceflow.sinks.sqlite_tables import SQLiteTablesSink

__all__ = ["BatchStats", "SINKS", "SQLiteTablesSink", "TablesSink", "make_sink", "marker_id"]

SQLITE_SINKS = ("sqlite", "naive", "lossy")
EXECUTOR_SINKS = ("postgres-staged", "postgres-2pc")
POSTGRES_SINKS = ("postgres", *EXECUTOR_SINKS, "postgres-naive")
EFFECT_SINKS = ("http", "http-naive")
DELTA_SINKS = ("delta", "delta-naive")
SINKS = SQLITE_SINKS + POSTGRES_SINKS + EFFECT_SINKS + DELTA_SINKS
EFFECTS_URL_ENV = "ONCEFLOW_EFFECTS_URL"
"""Where ``--sink http`` POSTs effects (``onceflow run --effects-url``)."""
EFFECTS_TIMEOUT_ENV = "ONCEFLOW_EFFECTS_TIMEOUT_S"
"""Seconds an effect call of ``--sink http`` may take (default 10)."""
EXAMPLE_SINK_ID = "user_counts"
"""The sink id ``onceflow run`` writes Example 5-1 under (its markers' namespace)."""


def make_sink(kind: str, db: Path | None, pg_dsn: str | None, sink_id: str = EXAMPLE_SINK_ID,
              delta: Path | None = None) -> TablesSink:
    """The generic sink a ``--sink`` choice names.

    Args:
        kind: One of :data:`SINKS`.
        db: SQLite database (SQLite sinks; the ledger of the ``http`` sinks).
        pg_dsn: PostgreSQL connection string (else ``$ONCEFLOW_PG_DSN``).
        sink_id: Marker namespace.
        delta: Root directory of the Delta tables (``delta``).

    Returns:
        The sink (not yet connected).

    Raises:
        ConfigError: A required location is missing, or the extra the sink needs is not installed.
    """
    if kind in DELTA_SINKS:
        from onceflow.sinks.delta_tables import DeltaTablesSink

        if delta is None:
            raise ConfigError(f"--sink {kind} writes Delta tables: pass --delta DIR (their root directory)")
        return DeltaTablesSink(delta, sink_id=sink_id,
                               mode="naive" if kind == "delta-naive" else "exactly_once")
    if kind in EFFECT_SINKS:
        from onceflow.sinks.http_effects import HttpEffectsSink

        url = os.environ.get(EFFECTS_URL_ENV, "")
        if db is None or not url:
            raise ConfigError(f"--sink {kind} calls a service: pass --effects-url URL (or set "
                              f"{EFFECTS_URL_ENV}) and --db PATH for its ledger")
        timeout = float(os.environ.get(EFFECTS_TIMEOUT_ENV, 10))
        return HttpEffectsSink(url, db, sink_id=sink_id, timeout_s=timeout,
                               mode="naive" if kind == "http-naive" else "exactly_once")
    if kind in SQLITE_SINKS:
        if db is None:
            raise ConfigError(f"--sink {kind} writes to SQLite: pass --db PATH")
        return SQLiteTablesSink(db, sink_id=sink_id,
                                mode="exactly_once" if kind == "sqlite" else kind)  # type: ignore[arg-type]
    from onceflow.pgconn import require_psycopg

    require_psycopg()
    from onceflow.sinks.postgres_tables import PostgresFramesSink, PostgresTablesSink

    if kind == "postgres":
        return PostgresTablesSink(pg_dsn, sink_id=sink_id)
    if kind == "postgres-naive":
        return PostgresTablesSink(pg_dsn, sink_id=sink_id, mode="naive")
    if kind in EXECUTOR_SINKS:
        return PostgresFramesSink(pg_dsn, sink_id=sink_id, protocol=kind.removeprefix("postgres-"))
    raise ConfigError(f"unknown sink {kind!r}; use one of {', '.join(SINKS)}")


def marker_id(kind: str, table: str, sink_id: str = EXAMPLE_SINK_ID) -> str:
    """The sink id of the markers that record ``table``'s batches for a ``--sink`` choice.

    The executor-side PostgreSQL sinks keep one marker per table (``<sink_id>.<table>``);
    the others one per batch for all tables (``<sink_id>``).
    """
    return f"{sink_id}.{table}" if kind in EXECUTOR_SINKS else sink_id
