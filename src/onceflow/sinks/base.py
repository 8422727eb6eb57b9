"""The sink contract: every micro-batch reaches the sink exactly once.

A sink receives, for each micro-batch, the batch's per-window count *deltas*
(how many new, deduplicated, on-time events each ``(user, window)`` got in this
batch) and adds them to its tables. Adding is not idempotent — a batch applied
twice double-counts — so the sink keeps a marker per ``(sink_id, batch_id)``
and writes it in the same transaction as the rows.

Commit protocol, run by :meth:`ExactlyOnceSink.commit_batch` for batch N:

1. Spark computed batch N; its output is deterministic: after a crash Spark
   re-runs N with the same input and state and hands over the same deltas.
   Steps 1-3 may run any number of times.
2. Crash point ``before_sink_write``.
3. Open a write transaction (exclusive against other writers).
4. If the marker ``(sink_id, N)`` exists, the batch was committed by an earlier
   attempt: roll back and return False. Nothing changes — a replay is a no-op.
5. Add the deltas to the per-user and global tables, insert the marker with
   the batch's metrics. Crash point ``inside_sink_txn``: a crash here leaves
   nothing visible (the transaction was not committed).
6. Commit durably. Crash point ``after_sink_commit``: Spark has not written its
   commit log, so it will re-run N after a restart and step 4 skips it. Fault
   ``ambiguous_commit``: the commit succeeded but the caller sees an error — the
   same: the batch fails, is re-run, and step 4 skips it.
7. Return True; Spark then writes ``commits/N``.

A sink may instead make the batch durable in step 6 and apply it after returning
(the staged SQLite sink, :mod:`onceflow.sinks.sqlite`); it then applies every staged
batch in :meth:`ExactlyOnceSink.bind` and :meth:`ExactlyOnceSink.flush`.

:meth:`ExactlyOnceSink.bind` runs before the first batch of a process: it ties
the sink to the Spark checkpoint's query id, because a new checkpoint restarts
batch ids at 0 and step 4 would then wrongly skip new data. It may be called
any number of times with the same id.

Executor-side sinks (``executor_side = True``, e.g. the PostgreSQL writer of
:mod:`onceflow.sinks.pg_writer`) take the deltas as a Spark DataFrame in
:meth:`ExactlyOnceSink.commit_frame` instead, so the rows go from the executors
straight to the database; the same steps hold, each batch's marker written in
the transaction that makes its rows visible (or records the decision to).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

if TYPE_CHECKING:
    from onceflow.tables import Table

DELTA_COLUMNS = ("user", "window_start_ms", "window_end_ms", "count")
"""Columns of the delta table a sink receives."""


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


class ExactlyOnceSink(ABC):
    """A sink that applies each batch's deltas exactly once (see module protocol).

    Attributes:
        sink_id: Name of this sink's markers; two sinks in one database need
            different ids.
    """

    sink_id: str
    executor_side: bool = False
    """Whether the pipeline hands over a DataFrame (:meth:`commit_frame`) instead of Arrow."""

    @abstractmethod
    def bind(self, query_id: str) -> None:
        """Tie this sink to the checkpoint with ``query_id`` (idempotent).

        Args:
            query_id: The id in the checkpoint's ``metadata`` file.

        Raises:
            CheckpointMismatchError: The sink holds batches of another checkpoint.
        """

    @abstractmethod
    def commit_batch(self, batch_id: int, deltas: pa.Table, stats: BatchStats) -> bool:
        """Apply batch ``batch_id`` unless it was already committed.

        May be called again with the same arguments (after a crash); only the
        first call that commits has an effect.

        Args:
            batch_id: Spark's micro-batch id.
            deltas: Columns :data:`DELTA_COLUMNS`.
            stats: The batch's input and late counts.

        Returns:
            True if this call committed the batch, False if it was a replay.
        """

    def commit_frame(self, batch_id: int, deltas: Any, stats: BatchStats) -> bool:
        """Apply batch ``batch_id`` from a Spark DataFrame (executor-side sinks).

        Args:
            batch_id: Spark's micro-batch id.
            deltas: A DataFrame with columns :data:`DELTA_COLUMNS`.
            stats: The batch's input and late counts.

        Returns:
            True if this call committed the batch, False if it was a replay.
        """
        return self.commit_batch(batch_id, deltas.toArrow(), stats)

    def flush(self) -> None:
        """Wait until every batch :meth:`commit_batch` accepted is in the tables.

        A sink that applies batches in the background after making them durable (the
        staged SQLite sink) finishes here; for the others it does nothing.
        """
        return None

    @abstractmethod
    def close(self) -> None:
        """Release connections (idempotent)."""


class TablesSink(Protocol):
    """What :func:`onceflow.write_stream` needs of a sink: tables of any schema, per batch.

    Implemented by :class:`onceflow.sinks.sqlite_tables.SQLiteTablesSink` and
    :class:`onceflow.sinks.postgres_tables.PostgresTablesSink`; each module states its numbered
    commit protocol.
    """

    sink_id: str

    def bind(self, query_id: str) -> None:
        """Tie the sink to the checkpoint with ``query_id`` (idempotent)."""

    def commit_tables(self, batch_id: int, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int) -> bool:
        """Write the batch to every table unless its marker exists; True if this call committed it."""

    def batches(self) -> list[dict[str, Any]]:
        """The sink's marker rows, by batch id."""

    def close(self) -> None:
        """Release connections (idempotent)."""
