"""A running exactly-once query: Spark's ``StreamingQuery`` with onceflow's errors and a clean Ctrl-C.

:meth:`OnceQuery.awaitTermination` waits in short steps, with its own SIGINT handler while it
waits (in the main thread), so that Ctrl-C never interrupts a py4j call halfway (PySpark's own
handler raises ``KeyboardInterrupt`` inside one, and py4j then prints pages of tracebacks):

1. The first Ctrl-C prints one line and lets the batch in flight finish: the next batch is
   refused before anything of it is written (:meth:`BatchWriter.request_stop`; Spark runs it
   again at the next start), or the query is stopped at once when no batch runs.
2. A second Ctrl-C stops the query at once: the batch in flight is abandoned before Spark's
   commit log, so the next start runs it again and its sink commit (whole or not at all) makes
   that exact.

While ``onceflow repair`` restores batches from the sink's markers (:mod:`onceflow.checkpoint.repair`),
Spark stops the query after each restored batch (the next batch's plan exists already), and
the wait starts it again, once per restored batch.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from onceflow.engine.batch import BatchWriter
from onceflow.errors import from_spark
from onceflow.runtime import plans
from onceflow.sinks._core.base import TablesSink

STEP_S = 0.5
"""How often the wait looks for a Ctrl-C."""


def restore_point(root: Path) -> tuple[int, int] | None:
    """While ``onceflow repair``'s restore is under way: (the batch planned next, the last committed).

    None when no restore is under way or the planned batch is committed (nothing to run).
    """
    from onceflow.checkpoint import guard
    from onceflow.checkpoint import logs as ckpt

    if not guard.restore_under_way(root):
        return None
    planned, committed = ckpt.offset_batches(root), ckpt.committed_batches(root)
    done = committed[-1] if committed else -1
    if not planned or planned[-1] <= done:
        return None
    return planned[-1], done


class _Interrupts:
    """Ctrl-C presses counted while :meth:`OnceQuery.awaitTermination` waits."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, signum: int, frame: Any) -> None:
        self.count += 1


@contextmanager
def _counting_interrupts() -> Iterator[_Interrupts]:
    """Count SIGINT instead of raising, in the main thread; elsewhere nothing changes."""
    counter = _Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield counter
        return
    previous = signal.signal(signal.SIGINT, counter)
    try:
        yield counter
    finally:
        signal.signal(signal.SIGINT, previous)


class OnceQuery:
    """A running exactly-once query: Spark's ``StreamingQuery`` plus onceflow's errors.

    Attributes:
        query: Spark's ``StreamingQuery`` (progress, status, id).
        sink: The sink the query writes to.
    """

    def __init__(self, query: Any, writer: BatchWriter, sink: TablesSink, listener: Any,
                 restart: Callable[[], Any] | None = None, checkpoint_on_server: bool = False) -> None:
        self.query, self._writer, self.sink, self._listener = query, writer, sink, listener
        self._restart = restart
        self._checkpoint_on_server = checkpoint_on_server
        self._restored_after = -1

    def awaitTermination(self, timeout: float | None = None, *,  # noqa: N802
                         server_wait: float | None = None) -> bool | None:
        """Wait for the query to end (``once``: when everything available is written).

        Runs on the client (the driver of a classic session), once per wait. Ctrl-C stops the
        query cleanly (see the module): after the batch in flight, or at once on a second Ctrl-C.
        On Spark Connect, a server that stops answering ends the wait within ``server_wait``
        seconds with :class:`~onceflow.errors.ServerLostError` (Spark's client alone retries
        for at least ten minutes).

        Args:
            timeout: Seconds to wait at most (None: until the query ends).
            server_wait: Spark Connect only: the seconds to wait for a server that stopped
                answering (default ``$ONCEFLOW_CONNECT_SERVER_WAIT``, else 60).

        Returns:
            True when the query ended (or was stopped by Ctrl-C), False when ``timeout`` passed.

        Raises:
            OnceflowError: What failed inside a batch or one of onceflow's data sources (the
                original error, not Spark's wrapper).
            ServerLostError: The Connect server did not answer for ``server_wait`` seconds.
            ConfigError: ``server_wait`` is not a positive number.
        """
        from onceflow.runtime import connect

        on_connect = plans.is_connect(self.query)
        wait_s = connect.server_wait_s(server_wait) if on_connect else 0.0
        lost = False
        try:
            with (connect.bounded_retries(self._spark, wait_s)
                  if on_connect else contextlib.nullcontext()), _counting_interrupts() as interrupts:
                while True:
                    try:
                        return self._wait(timeout, interrupts)
                    except Exception as exc:
                        if (on_connect and connect.is_server_gone(exc)) or not self._restarted():
                            raise
        except Exception as exc:
            if on_connect and connect.is_server_gone(exc):
                lost = True
                raise connect.server_lost(self._spark, wait_s, exc) from None
            if isinstance(self._writer.error, BatchWriter.Stopped):
                return True
            if self._writer.error is not None:  # a Spark error may carry onceflow's (a rule's raise_error)
                found = from_spark(self._writer.error)
                raise found from None
            found = from_spark(exc)  # raised inside one of onceflow's data sources
            if found is not exc:
                raise found from None
            raise
        finally:
            if lost:  # nothing to ask a server that is gone: close what is local
                self._listener = None
                self._writer.close()
            elif not self.query.isActive:
                self._cleanup()

    @property
    def _spark(self) -> Any:
        """The query's session (a Connect query keeps it as ``_session``: it has no ``sparkSession``)."""
        return self.query._session if plans.is_connect(self.query) else self.query.sparkSession

    def _restarted(self) -> bool:
        """Start the query again when a batch restored by ``onceflow repair`` is next (see the module)."""
        batch, self._writer.restoring = self._writer.restoring, None
        if batch is None and plans.is_connect(self.query):  # the writer that saw it ran on the server
            batch = self._restore_on_server()
        if batch is None or self._restart is None or self.query.isActive:
            return False
        print(f"onceflow: restoring batch {batch} from the sink's marker (onceflow repair): starting the "
              "query again to run it as it was", file=sys.stderr)
        self._writer.error = None
        self.query = self._restart()
        return True

    def _restore_on_server(self) -> int | None:
        """On Spark Connect: the restored batch the query stopped before, read from the checkpoint.

        The batch writer that replayed a restored batch ran in the server's worker; the client
        sees the restore from the checkpoint (:func:`restore_point`; read on the server's driver
        when the client cannot see the checkpoint). Only when a batch committed since the last
        restart (a restore moves forward, never loops).
        """
        root = self._writer.checkpoint
        if self._checkpoint_on_server:
            from functools import partial

            from onceflow.engine.serverside import StepsSource

            point: tuple[int, int] | None = StepsSource.run(
                self._spark, partial(restore_point, root), "reading the checkpoint's restore")
        else:
            point = restore_point(root)
        if point is None or point[1] <= self._restored_after:
            return None
        self._restored_after = point[1]
        return point[0]

    def _wait(self, timeout: float | None, interrupts: _Interrupts) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        told = False
        while True:
            left = STEP_S if deadline is None else max(0.0, min(STEP_S, deadline - time.monotonic()))
            if self.query.awaitTermination(left):
                return True
            if interrupts.count and not told:
                print("onceflow: Ctrl-C: stopping after the batch in flight (Ctrl-C again: stop now; "
                      "the next start resumes exactly)", file=sys.stderr)
                self._writer.request_stop()
                told = True
            if interrupts.count >= 2 or (interrupts.count and not self.query.status["isTriggerActive"]):
                self.stop()
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def stop(self) -> None:
        """Stop the query now (a batch in flight is abandoned; the next start runs it again)."""
        self.query.stop()
        self._cleanup()

    def _cleanup(self) -> None:
        if self._listener is not None:
            self._spark.streams.removeListener(self._listener)
            self._listener = None
        self._writer.close()

    @property
    def lastProgress(self) -> Any:  # noqa: N802
        """Spark's last progress report."""
        return self.query.lastProgress

    @property
    def isActive(self) -> bool:  # noqa: N802
        """Whether the query runs."""
        return bool(self.query.isActive)
