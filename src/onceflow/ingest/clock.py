"""The sender's clock: system timestamps strictly increasing, also across the sender's restarts."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from onceflow.errors import ConfigError
from onceflow.runtime.files import fsync_path


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
