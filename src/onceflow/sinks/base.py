"""The sink contract: every micro-batch reaches the sink's tables exactly once.

A sink receives, for each micro-batch, the rows of each of its tables (see
:class:`onceflow.tables.Table` for the write modes). ``append`` and ``add`` are not
idempotent — a batch written twice duplicates rows or double-counts — so the sink keeps a
marker per ``(sink_id, batch_id)`` and writes it in the transaction that writes the rows.

Commit protocol, run by :meth:`TablesSink.commit_tables` for batch N (each backend's module
numbers its own version of it, with its crash points):

1. Spark computed batch N; its output is deterministic: after a crash Spark re-runs N with
   the same input and state and hands over the same rows. Steps 1-3 may run any number of
   times.
2. Crash point ``before_sink_write``. The rows are checked against the tables' specs (null
   keys or ``add`` values, a key twice): a batch that cannot be written is refused here,
   before anything is written and before Spark's commit log.
3. Open a write transaction (exclusive against other writers of the marker).
4. If the marker ``(sink_id, N)`` exists, an earlier attempt committed N: roll back and
   return False. Nothing changes — a replay is a no-op.
5. Write every table, insert the marker with the batch's metrics. Crash point
   ``inside_sink_txn``: a crash here leaves nothing visible.
6. Commit durably. Crash point ``after_sink_commit``: Spark has not written its commit log,
   so it re-runs N after a restart and step 4 skips it. Fault ``ambiguous_commit``: the
   commit succeeded but the caller sees an error — the same: N fails, is re-run, is skipped.
7. Return True; Spark then writes ``commits/N``.

A sink may also make N durable in step 5 in a form that it applies to the tables later
(the SQLite sink's staged path): then its recovery (in ``bind``) must apply whatever is
durable and not applied, in batch order, and :meth:`TablesSink.flush` waits for the apply.

:meth:`TablesSink.bind` runs before the first batch of a process: it ties the sink to the
Spark checkpoint's query id, because a new checkpoint restarts batch ids at 0 and step 4
would then wrongly skip new data. It may be called any number of times with the same id.

Executor-side sinks (``executor_side = True``: the PostgreSQL ``staged`` and ``2pc``
protocols of :mod:`onceflow.sinks.pg_writer`) take each table as a Spark DataFrame instead,
so the rows go from the executors straight to the database; each table then has its own
marker, written in the transaction that makes its rows visible (or records the decision to).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

if TYPE_CHECKING:
    from onceflow.tables import Table


@dataclass(frozen=True)
class BatchStats:
    """What one micro-batch read and dropped (computed from the checkpoint).

    Attributes:
        input_rows: Rows in the batch's input files.
        late_dropped: Rows Spark's late rule dropped.
        late_watermark_ms: The watermark those rows were behind.
    """

    input_rows: int
    late_dropped: int
    late_watermark_ms: int


class TablesSink(Protocol):
    """What :func:`onceflow.write_stream` needs of a sink: tables of any schema, per batch.

    Implemented by :class:`onceflow.sinks.sqlite_tables.SQLiteTablesSink`,
    :class:`onceflow.sinks.postgres_tables.PostgresTablesSink` (and, executor-side,
    ``PostgresFramesSink``) and :class:`onceflow.sinks.delta_tables.DeltaTablesSink`.
    """

    sink_id: str

    def bind(self, query_id: str) -> None:
        """Tie the sink to the checkpoint with ``query_id`` (idempotent)."""

    def commit_tables(self, batch_id: int, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int) -> bool:
        """Write the batch to every table unless its marker exists; True if this call committed it."""

    def batches(self) -> list[dict[str, Any]]:
        """The sink's marker rows, by batch id."""

    def flush(self) -> None:
        """Wait until every batch the sink accepted is in its tables (a sink may apply later)."""

    def close(self) -> None:
        """Release connections (idempotent)."""
