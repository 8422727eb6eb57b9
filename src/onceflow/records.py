"""The event record: schema shared by the generator, the log and the pipelines.

Every event carries a stable ``event_id`` assigned by its producer where the
record is born. The pipeline never mints IDs: a replay would mint new ones and
deduplication would be impossible.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from onceflow.errors import ConfigError


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a file or a directory (its entries: a rename into it) to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes (hex), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


EVENT_FIELDS: tuple[tuple[str, pa.DataType], ...] = (
    ("event_id", pa.string()),
    ("user", pa.string()),
    ("event_time", pa.timestamp("us", tz="UTC")),
    ("system_time", pa.timestamp("us", tz="UTC")),
    ("bytes", pa.int64()),
)
"""Field names and Arrow types of an event, in column order."""

EVENT_SCHEMA: pa.Schema = pa.schema(list(EVENT_FIELDS))
"""Arrow schema of an event segment."""

EVENT_DDL = (
    "event_id STRING, user STRING, event_time TIMESTAMP, system_time TIMESTAMP, bytes BIGINT"
)
"""The same schema as a Spark DDL string (Spark reads segments with it, never infers)."""

WINDOW_MS = 60_000
"""Width of the fixed event-time windows of Example 5-1 (one minute)."""


def schema_problems(schema: pa.Schema, expected: pa.Schema | None = None) -> list[str]:
    """Compare a segment's schema with the log's (:data:`EVENT_SCHEMA` by default).

    Args:
        schema: The Arrow schema read from a segment file.
        expected: The log's schema.

    Returns:
        Human-readable differences; empty when the schema matches. Timestamp
        units and time zones must match exactly, because Spark reads the file
        with a fixed schema and a silent reinterpretation would shift times.
    """
    problems: list[str] = []
    found = {f.name: f.type for f in schema}
    fields = EVENT_FIELDS if expected is None else tuple((f.name, f.type) for f in expected)
    for name, typ in fields:
        if name not in found:
            problems.append(f"missing column {name!r} (expected {typ})")
        elif found[name] != typ:
            problems.append(f"column {name!r} has type {found[name]}, expected {typ}")
    extra = sorted(set(found) - {n for n, _ in fields})
    if extra:
        problems.append(f"unexpected columns {extra}")
    return problems


class SenderClock:
    """System timestamps strictly increasing per sender, also across the sender's restarts.

    The catalog buckets and garbage-collects ids by these timestamps, so one sender must never
    stamp a later record with an earlier time — even after a restart on a clock that went
    backward. The clock persists a *reservation*: a high-water mark ahead of every timestamp it
    has handed out. Protocol of :meth:`next`:

    1. ``ts = max(now, last + 1)`` (a clock that jumps back does not move ``ts`` back).
    2. If ``ts`` reaches the reservation, write ``ts + reserve_us`` as the new reservation to
       the state file atomically (temp file, fsync, rename, fsync of the directory) before
       handing out ``ts``.
    3. Return ``ts``.

    On start-up ``last`` is the persisted reservation, so a restarted sender continues above
    everything its previous life handed out (at the cost of skipping at most ``reserve_us``).

    Args:
        state: The sender's state file (created if missing).
        now_us: Wall clock in microseconds (injectable for tests).
        reserve_us: How far ahead each reservation reaches (one fsync per this much time).
    """

    def __init__(self, state: str | Path, now_us: Callable[[], int] | None = None,
                 reserve_us: int = 1_000_000) -> None:
        if reserve_us < 1:
            raise ConfigError(f"reserve_us must be >= 1, got {reserve_us}")
        self.state = Path(state)
        self.now_us = now_us or (lambda: time.time_ns() // 1000)
        self.reserve_us = reserve_us
        self.reserved = self._load()
        self.last = self.reserved

    def _load(self) -> int:
        try:
            raw = self.state.read_text()
        except FileNotFoundError:
            return 0
        try:
            return int(json.loads(raw)["reserved_us"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"sender clock state {self.state} is unreadable ({exc}); it holds the "
                              "sender's high-water mark: restore it, do not delete it") from None

    def _persist(self, reserved: int) -> None:
        self.state.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state.with_name(f".{self.state.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"reserved_us": reserved}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state)
        fsync_path(self.state.parent)

    def next(self) -> int:
        """The next timestamp (microseconds since the epoch), strictly above every earlier one."""
        ts = max(self.now_us(), self.last + 1)  # 1
        if ts >= self.reserved:  # 2
            self._persist(ts + self.reserve_us)
            self.reserved = ts + self.reserve_us
        self.last = ts
        return ts  # 3
