"""A large batch of the driver-side PostgreSQL sink: rows staged by Spark's tasks, moved in one transaction.

:class:`onceflow.sinks.postgres.sink.PostgresTablesSink` commits every table of a batch and its
marker in one transaction. A batch too large for the driver keeps that guarantee without a row
through the driver: the ``onceflow_postgres`` data source runs with ``protocol=stage`` (internal
to the sink), and for table T of batch N:

1. **Task** (partition p, attempt a), any number of times: exactly step 1 of the ``staged``
   protocol (:mod:`onceflow.sinks.postgres.writer`) — a fresh token, the rows ``COPY``'d into the
   unlogged ``<T>_onceflow_stage`` tagged ``(N, token)``; a task that sees the sink's marker of N
   stages nothing (``skipped``).
2. **Winners** (the driver, the data source's ``commit``): the tokens and row counts of the
   attempts Spark kept, one row ``(sink_id, N, T)`` of ``onceflow_stage_winners`` (a later
   attempt of N replaces an earlier one's). Nothing reaches T.
3. **Move** (the sink, in its batch transaction, :func:`move`): the winners' staged rows counted
   (an unlogged table is emptied by a server crash: a shortfall fails the batch, Spark re-runs
   it) and moved into T by T's mode — ``INSERT ... SELECT`` (``ON CONFLICT`` for keyed modes).
4. **Forget** (same transaction, :func:`forget`): staged rows and winners of batches up to N.
   Rows staged by attempts that lost, or by a process that died, are deleted there, by the
   data source's ``abort``, or when a writer starts (``recover``: up to the sink's last marker).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from onceflow.errors import PostgresError
from onceflow.sinks.postgres import writer as pg_writer
from onceflow.sinks.postgres.writer import TargetSpec, TaskMessage


def record_winners(spec: TargetSpec, batch_id: int, messages: Iterable[str | None]) -> None:
    """Step 2: the kept attempts' tokens for ``(sink_id, batch_id, table)``.

    Raises:
        PostgresError: A task sent no message (Spark passes None for a task that failed).
    """
    tasks = []
    for m in messages:
        if not m:
            raise PostgresError(f"batch {batch_id}: a task staging PostgreSQL table {spec.table!r} sent "
                                "no message; the batch runs again")
        tasks.append(TaskMessage.from_json(m))
    tokens = [t.token for t in tasks if not t.skipped]
    rows = sum(t.rows for t in tasks if not t.skipped)
    from onceflow.sinks.postgres import sql as pg

    with pg.session(spec.dsn) as conn:
        conn.execute("INSERT INTO onceflow_stage_winners VALUES (%s, %s, %s, %s, %s, %s) "
                     "ON CONFLICT (sink_id, batch_id, tbl) DO UPDATE SET tokens = excluded.tokens, "
                     "rows = excluded.rows, skipped = excluded.skipped",
                     (spec.sink_id, batch_id, spec.table, tokens, rows, any(t.skipped for t in tasks)))


def _winners_row(conn: Any, spec: TargetSpec, batch_id: int) -> tuple[Any, ...] | None:
    """Step 2's row of ``(sink_id, batch_id, table)``: ``(tokens, rows, skipped)``; None: not recorded."""
    row = conn.execute("SELECT tokens, rows, skipped FROM onceflow_stage_winners WHERE sink_id = %s AND "
                       "batch_id = %s AND tbl = %s", (spec.sink_id, batch_id, spec.table)).fetchone()
    return None if row is None else tuple(row)


def move(conn: Any, spec: TargetSpec, batch_id: int) -> int:
    """Step 3, inside the sink's transaction: the winners' staged rows into the table; their count.

    Raises:
        PostgresError: No winners recorded, a task that saw a marker now gone, or fewer staged
            rows than the tasks wrote (the batch runs again).
    """
    from psycopg import sql

    found = _winners_row(conn, spec, batch_id)
    if found is None:
        raise PostgresError(f"batch {batch_id} of sink {spec.sink_id!r}: Spark's write of table "
                            f"{spec.table!r} returned without recording its tasks; the batch runs again")
    tokens, rows, skipped = found
    if skipped:
        raise PostgresError(f"batch {batch_id} of sink {spec.sink_id!r}: tasks of table {spec.table!r} saw a "
                            "marker that is gone; refusing to commit a partial batch")
    staged = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE _of_batch = %s AND _of_token = ANY(%s)")
                          .format(spec.stage), (batch_id, tokens)).fetchone()[0]
    if staged != rows:
        raise PostgresError(f"batch {batch_id} of sink {spec.sink_id!r}: {staged} staged rows of table "
                            f"{spec.table!r} found, its tasks wrote {rows} (server restart?); the batch runs "
                            "again")
    if tokens:
        conn.execute(pg_writer.merge_sql(spec), (batch_id, tokens))
    return int(rows)


def winners(conn: Any, spec: TargetSpec, batch_id: int) -> tuple[Any, tuple[Any, ...]] | None:
    """The winners' staged rows of ``batch_id`` as a relation to select from, and its parameters.

    For a diagnosis inside the sink's transaction (e.g. which key's merge left bigint) from the
    rows already in the server. None: no winners recorded.
    """
    from psycopg import sql

    found = _winners_row(conn, spec, batch_id)
    if found is None:
        return None
    relation = sql.SQL("(SELECT * FROM {} WHERE _of_batch = %s AND _of_token = ANY(%s))").format(spec.stage)
    return relation, (batch_id, found[0])


def forget(conn: Any, specs: Iterable[TargetSpec], sink_id: str, batch_id: int) -> None:
    """Step 4, inside the sink's transaction: staged rows and winners of batches up to ``batch_id``."""
    from psycopg import sql

    for spec in specs:
        conn.execute(sql.SQL("DELETE FROM {} WHERE _of_batch <= %s").format(spec.stage), (batch_id,))
    conn.execute("DELETE FROM onceflow_stage_winners WHERE sink_id = %s AND batch_id <= %s",
                 (sink_id, batch_id))
