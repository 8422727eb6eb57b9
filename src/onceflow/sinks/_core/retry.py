"""Short outages retried inside the batch: a lost connection, a server restart, a lock, a concurrent commit.

Every sink's commit is safe to run again from its first step (:mod:`onceflow.sinks._core.base`: the
marker decides whether the batch is there), so a batch whose commit failed for a reason that
passes — PostgreSQL restarting (``terminating connection due to administrator command``,
``the database system is starting up``, connection refused), a SQLite database locked by
another process, a serialization failure or deadlock, Delta commits of other writers winning
every attempt — is committed again with backoff, each retry logged, for at most ``retry_for``
(:func:`onceflow.write_stream`) before the query fails with the last error.

What is transient is decided by :func:`transient` from the error and the errors it was raised
from (an executor-side write reaches the driver as Spark's error, carrying the database's text).
Anything else — a row the table refuses, a wrong password, a missing column — fails at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay, wait_exponential

_log = logging.getLogger("onceflow.retry")

T = TypeVar("T")

PATTERNS = (
    "terminating connection due to administrator command", "server closed the connection unexpectedly",
    "the database system is starting up", "the database system is shutting down",
    "the database system is in recovery mode", "connection refused", "connection reset by peer",
    "connection is lost", "the connection is closed", "consuming input failed", "could not receive data",
    "could not send data", "no connection to the server", "database is locked", "database is busy",
    "database table is locked", "could not serialize access", "deadlock detected",
    "canceling statement due to lock timeout", "could not obtain lock", "concurrent transaction failed",
    "concurrent commits won",
)
"""Lower-case texts of errors that pass (PostgreSQL, SQLite, Delta), found in an error's message."""

PERMANENT = (
    "password authentication failed", "authentication failed", "no pg_hba.conf entry", "does not exist",
    "permission denied", "invalid dsn", "invalid connection option", "could not translate host name",
)
"""Lower-case texts of errors that stay until someone fixes the setup (a wrong password, a missing
database or role): never retried, even when the driver reports them as an OperationalError."""

_PSYCOPG_TRANSIENT = ("OperationalError", "InterfaceError", "SerializationFailure", "DeadlockDetected",
                      "LockNotAvailable", "AdminShutdown", "CannotConnectNow", "ConnectionFailure")


def _chain(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in found and len(found) < 10:
        found.append(e)
        e = e.__cause__ or e.__context__
    return found


def transient(exc: BaseException) -> str | None:
    """Why ``exc`` is an outage that passes (the matching error's first line), or None.

    Args:
        exc: What a sink's commit raised.
    """
    from onceflow.errors import BatchRejectedError, ConfigError

    if isinstance(exc, BatchRejectedError | ConfigError):
        return None
    chain = _chain(exc)
    if any(p in str(e).lower() for e in chain for p in PERMANENT):
        return None
    for e in chain:
        name = type(e).__name__
        module = type(e).__module__
        if module.startswith("psycopg") and name in _PSYCOPG_TRANSIENT:
            return _first_line(e)
        if name == "CommitFailedError" or any(p in str(e).lower() for p in PATTERNS):
            return _first_line(e)
    return None


def _first_line(e: BaseException) -> str:
    lines = [x for x in str(e).strip().splitlines() if x.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def retrying(what: str, seconds: float, call: Callable[[], T]) -> T:
    """``call()``, again with backoff while it fails with a transient error, for at most ``seconds``.

    Args:
        what: What is retried, for the log (e.g. ``batch 7: the sink's commit``).
        seconds: How long to keep retrying (0: never).
        call: The step to run again from its start.

    Returns:
        What ``call`` returned.

    Raises:
        BaseException: The last error, when it is not transient or ``seconds`` passed.
    """
    if seconds <= 0:
        return call()

    def log(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        _log.warning("onceflow: %s failed (%s); retry %d in %.1f s (retrying for up to %.0f s)", what,
                     transient(exc) if exc is not None else "?", state.attempt_number, wait, seconds)

    retry = Retrying(stop=stop_after_delay(seconds), wait=wait_exponential(multiplier=0.25, max=5),
                     retry=retry_if_exception(lambda e: transient(e) is not None), before_sleep=log,
                     reraise=True)
    return retry(call)
