"""librdkafka's client logs through Python's ``logging``, each kind explained once.

Every Kafka client onceflow makes (its sink's producers and readers, its source's consumers, on the
driver and in Spark's tasks) gets ``"logger": client_logger()`` in its settings, so librdkafka's
lines reach the logger ``onceflow.kafka.client`` instead of the process's stderr: silence them with
``logging.getLogger("onceflow.kafka.client").setLevel(logging.CRITICAL)``, or send them where the
application's logs go. Two things are added on the way:

* **what a line means**, once per kind and process: the first "Connect to ipv4#... failed" is
  followed by a line saying the broker is unreachable and the client retries until it answers or
  the operation's timeout ends; the first "Failed to acquire transactional PID" by a line saying
  the transaction coordinator is not ready yet (a broker that is starting or restarting) and the
  producer retries; and so on (:data:`MEANINGS`);
* **repeats of a kind are counted, not printed**: librdkafka retries every few hundred
  milliseconds and logs each attempt; after a kind's line, the next of that kind passes after
  :data:`QUIET_S` seconds, saying how many were held back in between.

A line of no known kind passes as it is. The logger delivers lines when the client is polled
(``poll``, ``flush``, ``consume``), which onceflow's clients do.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

NAME = "onceflow.kafka.client"
"""The logger librdkafka's lines go to."""

QUIET_S = 30.0
"""Seconds during which further lines of one kind are counted, not printed."""

MEANINGS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("unreachable", re.compile(r"Connect to .* failed|Connection refused|all brokers? (are )?down|"
                               r"Disconnected|Broker transport failure", re.I),
     "the Kafka broker does not answer (down, restarting, or a wrong bootstrap address): the client "
     "retries until it answers or the operation's timeout ends; nothing is lost or written twice"),
    ("coordinator", re.compile(r"Failed to acquire transactional PID|NOT_COORDINATOR|coordinator .* not "
                               r"available|COORDINATOR_(NOT_AVAILABLE|LOAD_IN_PROGRESS)", re.I),
     "the transaction coordinator is not ready yet (a broker starting or restarting): the producer "
     "retries; onceflow's transaction waits for it"),
    ("fenced", re.compile(r"fenced|PRODUCER_FENCED|INVALID_PRODUCER_EPOCH", re.I),
     "a newer producer with the same transactional id took over (a replayed batch or task): this "
     "one's open transaction is aborted by the broker, as exactly once needs"),
    ("resolve", re.compile(r"Failed to resolve", re.I),
     "a broker's host name does not resolve: check the bootstrap address and the advertised listeners"),
)
"""``(kind, pattern, meaning)`` of the lines onceflow explains."""


class _Explain(logging.Filter):
    """Adds a kind's meaning after its first line; counts its repeats for :data:`QUIET_S` seconds."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._explained: set[str] = set()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        kind, meaning = next(((k, m) for k, p, m in MEANINGS if p.search(text)), (None, ""))
        if kind is None:
            return True
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, -QUIET_S) < QUIET_S:
                self._held[kind] = self._held.get(kind, 0) + 1
                return False
            self._last[kind] = now
            held = self._held.pop(kind, 0)
            first = kind not in self._explained
            self._explained.add(kind)
        extra = [f"({held} more like it in the last {QUIET_S:.0f} s)"] if held else []
        if first:
            extra.append(f"onceflow: {meaning}")
        if extra:
            record.msg, record.args = " ".join([text, *extra]), ()
        return True


def client_logger() -> logging.Logger:
    """Return the logger every Kafka client of onceflow's gets as its ``logger`` setting."""
    logger = logging.getLogger(NAME)
    if not any(isinstance(f, _Explain) for f in logger.filters):
        logger.addFilter(_Explain())
    return logger


def with_logger(conf: Mapping[str, Any]) -> dict[str, Any]:
    """A client's librdkafka settings with :func:`client_logger` as its ``logger``.

    Settings travel to Spark's tasks as JSON; the logger is added where the client is made, in the
    process that uses it. A ``logger`` the caller gave is kept.
    """
    return {"logger": client_logger(), **conf}
