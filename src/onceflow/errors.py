"""The onceflow error hierarchy.

Every error onceflow raises derives from :class:`OnceflowError`. Where a builtin
exception fits, the subclass inherits it too, so ``except ValueError`` keeps
working for callers that do not know onceflow. Messages say what was wrong,
what was expected, and what to do about it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class OnceflowError(Exception):
    """Root of all onceflow errors."""


class ConfigError(OnceflowError, ValueError):
    """A configuration value is invalid (bad option, unbounded state, ...)."""


class BadSegmentError(OnceflowError, ValueError):
    """A segment file of the event log cannot be used.

    Attributes:
        path: The offending file.
        reason: What is wrong with it.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"bad segment {path}: {reason}. onceflow never skips a segment silently: "
            "move the file out of the log directory (or replace it with a valid segment) "
            "and run again; the checkpoint resumes where it stopped."
        )


class CheckpointMismatchError(OnceflowError, RuntimeError):
    """A sink database was written by a different Spark checkpoint.

    Batch ids restart at 0 with a new checkpoint; reusing a database with a new
    checkpoint would make onceflow skip batches as "already committed" and lose
    data, so this is refused.
    """


class OutOfStepError(OnceflowError, RuntimeError):
    """The sink and Spark's checkpoint disagree on which batches were written, or over what input.

    One of them was restored from a backup (or edited): the sink lacks batches the checkpoint
    committed, has batches the checkpoint never planned, or committed a batch over another
    input than the checkpoint plans for it now. Writing on would lose or skip data, so the
    batch is refused before anything of it is written; ``onceflow repair`` brings the
    checkpoint back into agreement with the sink.
    """


class JavaNotFoundError(OnceflowError, RuntimeError):
    """No usable Java runtime was found for Spark."""


class CrashPointError(OnceflowError, ValueError):
    """The crash-point environment variable names an unknown crash point."""


class SinkApplyError(OnceflowError, RuntimeError):
    """A durably staged batch could not be added to the sink's tables.

    The batch stays staged (nothing is lost); a restart with the same checkpoint and
    database applies it once the cause is fixed.
    """


class EffectsFailedError(OnceflowError, RuntimeError):
    """Some effects of a batch were refused or could not be delivered; the batch is not committed."""


class UnstableOutputError(OnceflowError, RuntimeError):
    """A retry of a batch computed another payload for an effect than its first attempt.

    The batch's output is not deterministic; ``write_stream(..., stable=True)`` makes every
    attempt write the first attempt's rows.
    """


class StorageError(OnceflowError, OSError):
    """A durable write failed for a reason of the storage: a full disk, a read-only file.

    Attributes:
        kind: ``"full"``, ``"read_only"`` or ``"io"``.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __str__(self) -> str:
        return str(self.args[0])


class BatchRejectedError(OnceflowError, ValueError):
    """A micro-batch's output cannot be written as its table specs say.

    A null key, a non-numeric add column, a duplicate key, a value the table's column
    cannot hold: refused before anything is written, so the query stops before Spark's
    commit log and restarts cleanly once the input is fixed.

    Attributes:
        row: The output row that was refused, when one was (to trace it to its input record).
    """

    def __init__(self, message: str, row: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.row = row


class SourceDataLossError(OnceflowError, RuntimeError):
    """Records a source had to deliver are gone (e.g. Kafka retention deleted them unread).

    Never skipped silently: the query stops. Skipping (counted and logged) is an opt-in of
    the source (``failOnDataLoss=false`` for ``onceflow_kafka``).
    """


class SourceReadError(OnceflowError, RuntimeError):
    """A source could not read a range it planned (broker unreachable, fatal client error)."""


class PostgresError(OnceflowError, RuntimeError):
    """PostgreSQL refused or failed an operation (message without secrets)."""


class CheckpointReadError(OnceflowError, RuntimeError):
    """A checkpoint file onceflow needs is missing or unreadable."""


class UncountableInputError(CheckpointReadError):
    """A batch's input files cannot be counted: not Parquet, or without the event-time column."""


class AmbiguousCommitError(OnceflowError, RuntimeError):
    """Raised by the ``ambiguous_commit`` fault after a successful commit (the caller sees a failure)."""


class SenderRefusedError(OnceflowError, PermissionError):
    """The ingest receiver refused this sender (401/403); its events stay in the outbox."""


class ServerLostError(OnceflowError, ConnectionError):
    """The Spark Connect server a query ran on stopped answering for longer than the wait allows."""


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The valid name closest to a misspelt ``name``, or None when none is close.

    Args:
        name: What was given.
        known: The valid names.
    """
    import difflib

    near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return near[0] if near else None


def refuse_unknown(given: set[str], known: set[str], where: str) -> None:
    """Refuse option names ``where`` does not know, naming the nearest valid one.

    Args:
        given: The option names (lower-case: Spark passes them case-insensitively).
        known: The valid names (lower-case).
        where: What takes the options, for the message (e.g. "the onceflow_postgres data source").

    Raises:
        ConfigError: Naming every unknown option and its nearest valid name.
    """
    bad = sorted(set(given) - known)
    if bad:
        hints = []
        for name in bad:
            near = nearest(name, known)
            hints.append(f"{name!r}" + (f" (did you mean {near!r}?)" if near else ""))
        raise ConfigError(f"unknown option(s) for {where}: {', '.join(hints)}; valid options: "
                          f"{', '.join(sorted(known))}")


def from_spark(exc: BaseException) -> BaseException:
    """The onceflow error a Spark exception carries, or ``exc`` itself.

    onceflow code that Spark runs in its own Python processes (a data source's writer, a UDF)
    reaches the caller as a Spark exception whose text ends with the Python traceback, e.g.
    ``[PYTHON_DATA_SOURCE_ERROR] ... onceflow.errors.ConfigError: unknown option(s) ...``. This
    finds the last such line and rebuilds the error, so the user sees one clear onceflow error
    instead of a wrapped stack trace. The same text inside a query plan that Spark's message
    prints (a rule's ``raise_error``) is not an error raised: a failure of another kind is
    returned as it is.

    Args:
        exc: What Spark raised.

    Returns:
        The onceflow error (same class when it can be rebuilt from its message, else
        :class:`OnceflowError`), or ``exc`` when it carries none.
    """
    import re

    # at a line's start (a Python traceback's last line) or after Spark's error class
    # ("[USER_RAISED_EXCEPTION] onceflow.errors..."); never inside a plan printed in the message,
    # where a rule's raise_error(concat(...)) spells the same text
    found = re.findall(r"(?:^\s*|\] )onceflow\.errors\.(\w+): (.*?)(?:\s+SQLSTATE: \w+)?\s*$", str(exc), re.M)
    if not found:
        return exc
    name, message = found[-1]
    cls = globals().get(name)
    if isinstance(cls, type) and issubclass(cls, OnceflowError) \
            and cls not in (BadSegmentError, StorageError):  # those two take other arguments
        return cls(message)
    return OnceflowError(message)
