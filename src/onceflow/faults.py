"""Named crash points for fault injection.

A crash point is a place in a commit protocol where a test wants the driver to
die with SIGKILL — for example exactly between the sink's commit and Spark's
commit-log write. Select one with the environment variable
``ONCEFLOW_CRASH_AT=<point>`` or ``ONCEFLOW_CRASH_AT=<point>@<batch_id>`` (the
first batch with an id ``>= batch_id`` that has input). The driver then kills its
companion processes (the Spark JVM) and itself, with SIGKILL, so nothing gets to clean up:
the same as ``kill -9`` from outside.

**A crash point fires on a batch with input only.** Spark runs no-data batches (no new
offsets, only a watermark to advance); a crash there puts no row at risk and proves nothing.
The query's batch writer notes, before any crash point of batch N, whether N's planned input
range is empty (:func:`note_input`); crash points of a noted no-data batch do not fire and the
armed point waits for the next batch with input. The note is a file under the temporary
directory, named after the driver's process id, so that the Python workers of the driver's JVM
(an executor-side writer's ``commit``) see it too; it is written only while a crash point is
armed. Points of processes that run no batches (the ingest receiver's) are not gated.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from enum import Enum
from pathlib import Path
from typing import Any

from onceflow.errors import AmbiguousCommitError, CrashPointError

CRASH_ENV = "ONCEFLOW_CRASH_AT"
DRIVER_PID_ENV = "ONCEFLOW_DRIVER_PID"

_companions: list[int] = []


class CrashPoint(str, Enum):
    """Where a driver can be told to die."""

    BEFORE_SINK_WRITE = "before_sink_write"
    """The batch's output is computed; nothing written to the sink yet."""
    INSIDE_SINK_TXN = "inside_sink_txn"
    """Rows and marker written inside the open sink transaction, not committed."""
    AFTER_SINK_COMMIT = "after_sink_commit"
    """The sink transaction committed; Spark has not written its commit log."""
    APPLY_PENDING = "apply_pending"
    """SQLite sink: the batch is staged and Spark wrote its commit log; the apply to the
    tables has not run (the process dies at the next batch or at the end of the run)."""
    AFTER_COMMIT_LOG = "after_commit_log"
    """Spark wrote the commit log of the batch."""
    AFTER_STABLE_SAVE = "after_stable_save"
    """Stable input: the batch's output is persisted; no sink has seen it."""
    BEFORE_STABLE_DROP = "before_stable_drop"
    """Stable input: the sink committed the batch; its persisted copy is not deleted yet."""
    EFFECTS_STARTED = "effects_started"
    """Side-effect sink: the batch's keys are recorded as started in the ledger; no call sent."""
    EFFECTS_SENT = "effects_sent"
    """Side-effect sink: every call of the batch was answered; the ledger has not recorded the
    answers (the window between a call and its ledger write)."""
    TASK_AFTER_WRITE = "task_after_write"
    """Not the driver: an executor-side task wrote its rows (files, staged rows) and its Python
    worker is SIGKILLed before its message reaches the driver — on each task's first attempt
    only (:func:`maybe_kill_task`), so Spark's retry (``spark.task.maxFailures`` > 1) or the
    batch's next attempt writes them again beside the dead attempt's."""
    TASK_MID_WRITE = "task_mid_write"
    """Not the driver: an executor-side task has written part of its rows (its file, its open
    transaction, its calls not yet confirmed) and its executor JVM is SIGKILLed with it — on each
    task's first attempt only (:func:`maybe_kill_executor`); Spark runs the task again on another
    executor and the batch commits in the same run."""
    AMBIGUOUS_COMMIT = "ambiguous_commit"
    """Not a kill: the sink transaction committed, then the sink raises as if it had failed
    (a lost commit acknowledgement). The query fails; a restart must not apply it twice."""


    INGEST_AFTER_STAGE = "ingest_after_stage"
    """Receiver: the group's new events are staged (hidden file); ids not recorded yet."""
    INGEST_AFTER_RECORD = "ingest_after_record"
    """Receiver: ids and the pending segment committed to the catalog; not yet published."""
    INGEST_AFTER_PUBLISH = "ingest_after_publish"
    """Receiver: the segment is in the log; the senders have no ack yet."""


def register_companion(pid: int) -> None:
    """Remember a process to SIGKILL together with the driver (the Spark JVM).

    Args:
        pid: Its process id.
    """
    if pid not in _companions:
        _companions.append(pid)


def armed() -> tuple[CrashPoint, int] | None:
    """The crash point selected by the environment, if any.

    Returns:
        The point and the first batch id it fires at, or None.

    Raises:
        CrashPointError: The variable names no known crash point.
    """
    raw = os.environ.get(CRASH_ENV, "").strip()
    if not raw:
        return None
    name, _, batch = raw.partition("@")
    try:
        point = CrashPoint(name)
    except ValueError:
        known = ", ".join(p.value for p in CrashPoint)
        raise CrashPointError(
            f"{CRASH_ENV}={raw!r} names no crash point; use one of: {known} "
            "(optionally followed by @<batch_id>)"
        ) from None
    try:
        first = int(batch) if batch else 0
    except ValueError:
        raise CrashPointError(f"{CRASH_ENV}={raw!r}: batch id after '@' must be an integer") from None
    return point, first


def _parent(pid: int) -> int:
    """The parent process id of ``pid`` (0 when unknown)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _driver_side_victims() -> list[int]:
    """The processes to kill from a Python worker that Spark's JVM started.

    In such a worker (e.g. a data source's ``commit``), these are the driver and every
    ancestor between it and this process (the JVM, the worker daemon), so that the crash
    takes down the whole driver, as ``kill -9`` of it would. The driver is the Python process
    of a classic session, or the JVM itself (a Spark Connect server, whose ``foreachBatch``
    worker runs the batch).
    """
    driver = int(os.environ.get(DRIVER_PID_ENV, "0") or 0)
    if driver <= 0 or driver == os.getpid():
        return []
    victims: list[int] = []
    pid = _parent(os.getpid())
    while pid > 1 and pid != driver and len(victims) < 8:
        victims.append(pid)
        pid = _parent(pid)
    if pid != driver or not (_is_java(driver) or any(_is_java(v) for v in victims)):
        return []  # not a worker of the driver's JVM (e.g. a child process the driver started)
    return [driver, *victims]


def _is_java(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
            return f.read().strip() == "java"
    except OSError:
        return False


def crash_now() -> None:
    """SIGKILL the companions and then this process. Never returns."""
    sys.stdout.flush()
    sys.stderr.flush()
    for pid in [*_companions, *_driver_side_victims()]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def _notes_dir() -> Path:
    """Where the notes of this driver's batches go (the same path in its JVM's Python workers)."""
    driver = os.environ.get(DRIVER_PID_ENV, "") or str(os.getpid())
    return Path(tempfile.gettempdir()) / f"onceflow-crash-notes-{driver}"


def note_input(batch_id: int, has_input: bool) -> None:
    """Note whether batch ``batch_id`` has input, before any of its crash points (see the module).

    Args:
        batch_id: The micro-batch about to be written.
        has_input: Whether its planned input range holds any input.
    """
    if not os.environ.get(CRASH_ENV, "").strip():
        return
    notes = _notes_dir()
    notes.mkdir(exist_ok=True)
    tmp = notes / f".{batch_id}.{os.getpid()}"
    tmp.write_text("1" if has_input else "0", encoding="ascii")
    os.replace(tmp, notes / str(batch_id))


def noted_empty(batch_id: int) -> bool:
    """Whether batch ``batch_id`` was noted as a batch without input (see :func:`note_input`)."""
    try:
        return (_notes_dir() / str(batch_id)).read_text(encoding="ascii") == "0"
    except OSError:
        return False


def armed_for(point: CrashPoint, batch_id: int) -> bool:
    """Whether the environment selects ``point`` for batch ``batch_id``.

    Args:
        point: A crash point.
        batch_id: The micro-batch being processed.

    Returns:
        True if :func:`maybe_crash` would fire for them: the point is armed, the batch id is
        at least the armed one, and the batch was not noted as one without input.
    """
    selected = armed()
    if selected is None or selected[0] is not point or batch_id < selected[1]:
        return False
    return point.value.startswith("ingest_") or not noted_empty(batch_id)


def maybe_crash(point: CrashPoint, batch_id: int) -> None:
    """Die (or raise, for ``ambiguous_commit``) if the environment selects this point.

    Args:
        point: The point the caller has reached.
        batch_id: The micro-batch being processed.
    """
    if armed_for(point, batch_id):
        if point is CrashPoint.AMBIGUOUS_COMMIT:
            raise AmbiguousCommitError(
                f"injected fault: batch {batch_id} committed, reporting failure anyway"
            )
        _say(f"onceflow: crash point {point.value} at batch {batch_id}")
        crash_now()


def maybe_kill_task(point: CrashPoint, batch_id: int, attempt: int) -> None:
    """SIGKILL this task's Python worker (only) if the environment selects ``point``, on attempt 0.

    Args:
        point: A task-level point (``task_after_write``).
        batch_id: The micro-batch the task writes.
        attempt: Spark's attempt number of the task (retries and speculative copies count up).
    """
    if attempt == 0 and armed_for(point, batch_id):
        _say(f"onceflow: crash point {point.value} at batch {batch_id} (a task's first attempt)")
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def maybe_kill_executor(point: CrashPoint, batch_id: int, attempt: int) -> None:
    """SIGKILL this task's executor JVM and its Python worker if the environment selects ``point``.

    Once per batch: the first task attempt 0 that gets here claims the batch with a file in the
    notes directory (a stage Spark runs again after losing the executor's shuffle files numbers
    its attempts from 0 again). The executor is the nearest ancestor JVM that runs Spark's
    executor backend; where there is none (``local[*]``: the driver's JVM runs the tasks) only the
    Python worker dies, as with :func:`maybe_kill_task`.

    Args:
        point: A task-level point (``task_mid_write``).
        batch_id: The micro-batch the task writes.
        attempt: Spark's attempt number of the task.
    """
    if attempt != 0 or not armed_for(point, batch_id):
        return
    notes = _notes_dir()
    notes.mkdir(exist_ok=True)
    try:
        os.close(os.open(notes / f"killed-{point.value}-{batch_id}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:  # this batch's executor was killed already
        return
    _say(f"onceflow: crash point {point.value} at batch {batch_id} (a task's first attempt: its executor)")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = _parent(os.getpid())
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                executor = b"org.apache.spark.executor." in f.read()
        except OSError:
            break
        if executor:
            os.kill(pid, signal.SIGKILL)
            break
        pid = _parent(pid)
    os.kill(os.getpid(), signal.SIGKILL)


def _say(message: str) -> None:
    """Print ``message`` on stderr; in a Python worker of the driver's JVM, on the driver's too.

    A worker's stderr reaches the driver's only through a JVM thread that copies it: killed
    with the JVM, the copy may never happen. The driver's own stderr (``/proc/<pid>/fd/2``)
    gets the line directly.
    """
    print(message, file=sys.stderr, flush=True)
    driver = int(os.environ.get(DRIVER_PID_ENV, "0") or 0)
    if driver > 0 and driver != os.getpid():
        try:
            with open(f"/proc/{driver}/fd/2", "a", encoding="utf-8") as out:
                out.write(message + "\n")
        except OSError:
            pass


def commit_log_listener() -> Any:
    """A Spark query listener that fires ``after_commit_log`` once Spark reported a batch.

    Spark reports a batch's progress after it wrote ``commits/N``; add the listener with
    ``spark.streams.addListener`` when that crash point is armed.
    """
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class CrashAfterCommitLog(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:  # noqa: D102, N802
            pass

        def onQueryProgress(self, event: Any) -> None:  # noqa: D102, N802
            maybe_crash(CrashPoint.AFTER_COMMIT_LOG, int(event.progress.batchId))

        def onQueryIdle(self, event: Any) -> None:  # noqa: D102, N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: D102, N802
            pass

    return CrashAfterCommitLog()
