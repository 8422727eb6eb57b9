"""The named steps of onceflow's protocols where a process may die, and the one hook that acts there.

The library names the places in its commit protocols where a crash matters — for example exactly
between the sink's commit and Spark's commit log (:class:`CrashPoint`) — and says when it reaches
one (:func:`reached`; in Spark's tasks :func:`task_reached`), and, before any step of batch N,
whether N has input (:func:`planned`). Nothing happens there unless a :class:`Hook` is installed
(:func:`install`). onceflow installs none and reads no setting for one: the verifier's crash hook
(:mod:`onceflow.verify.crashes`) is installed in the processes the verifier (or a test) starts and
arms, to kill them with SIGKILL at a named step — the proof that a crash at each step loses and
repeats nothing. Every function here runs wherever its step runs (the driver, a Spark task, the
ingest receiver), at each pass through the step; without a hook each is one comparison.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Protocol


class CrashPoint(str, Enum):
    """A step of a protocol where a process may die: what the library names, a hook acts on."""

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
    only, so Spark's retry (``spark.task.maxFailures`` > 1) or the
    batch's next attempt writes them again beside the dead attempt's."""
    TASK_MID_WRITE = "task_mid_write"
    """Not the driver: an executor-side task has written part of its rows (its file, its open
    transaction, its calls not yet confirmed) and its executor JVM is SIGKILLed with it — on each
    task's first attempt only; Spark runs the task again on another
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


class Hook(Protocol):
    """What acts at the named steps (the verifier's crash hook; none in production)."""

    def armed_for(self, point: CrashPoint, batch_id: int) -> bool:
        """Whether reaching ``point`` in batch ``batch_id`` would act."""
        ...

    def reached(self, point: CrashPoint, batch_id: int) -> None:
        """A process reached ``point`` in batch ``batch_id`` (may not return)."""
        ...

    def task_reached(self, point: CrashPoint, batch_id: int, attempt: int) -> None:
        """A Spark task's attempt ``attempt`` reached ``point`` in batch ``batch_id``."""
        ...

    def planned(self, batch_id: int, has_input: bool) -> None:
        """Batch ``batch_id`` is about to be written; whether its input range holds any input."""
        ...

    def query_listener(self) -> Any:
        """A Spark ``StreamingQueryListener`` to add before the query starts, or None."""
        ...

    def reply_lost(self) -> bool:
        """Whether the ingest receiver's reply to a committed group is to be lost on the network."""
        ...


_hook: Hook | None = None


def install(hook: Hook | None) -> None:
    """Install ``hook`` for this process (None: remove it). Runs once per process, before any step."""
    global _hook
    _hook = hook


def installed() -> Hook | None:
    """The hook of this process, if any."""
    return _hook


def armed_for(point: CrashPoint, batch_id: int) -> bool:
    """Whether reaching ``point`` in batch ``batch_id`` would act (False without a hook)."""
    return _hook is not None and _hook.armed_for(point, batch_id)


def reached(point: CrashPoint, batch_id: int) -> None:
    """The caller reached step ``point`` of batch ``batch_id`` (a hook may end the process here)."""
    if _hook is not None:
        _hook.reached(point, batch_id)


def task_reached(point: CrashPoint, batch_id: int, attempt: int) -> None:
    """A Spark task's attempt ``attempt`` reached step ``point`` of batch ``batch_id``."""
    if _hook is not None:
        _hook.task_reached(point, batch_id, attempt)


def planned(batch_id: int, has_input: bool) -> None:
    """Batch ``batch_id`` is about to be written, before any of its steps; whether it has input."""
    if _hook is not None:
        _hook.planned(batch_id, has_input)


def query_listener() -> Any:
    """The hook's Spark query listener for a query about to start (None without a hook)."""
    return _hook.query_listener() if _hook is not None else None


def reply_lost() -> bool:
    """Whether the reply to a committed ingest group is to be lost (False without a hook).

    Runs in the ingest receiver, once per committed group, after the commit.
    """
    return _hook is not None and _hook.reply_lost()
