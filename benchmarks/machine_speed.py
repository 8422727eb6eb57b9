"""How fast this machine's CPU is right now: a sampler for benchmarks on a shared machine.

The same fixed amount of pure-Python work takes 0.15 s in one minute and 0.25 s in another on
the benchmark machine (CPU time, not just wall time: the CPU itself runs slower while other
tenants are busy). A variant timed in a slow phase then looks up to 1.7x slower for identical
work. The sampler measures that speed while a variant runs, so a benchmark can report each
run's time in "reference-speed seconds" beside its wall time.

How: a separate process (no GIL shared with the driver) runs a fixed work unit (~1 ms) every
``interval`` seconds and records the unit's CPU time (``time.thread_time``: scheduling delays
do not count, a slower CPU does). ``Sampler.window(t0, t1)`` is the median unit time of the
samples taken between two ``time.monotonic()`` stamps. Its cost is ~1% of one core.

Usage::

    with Sampler() as speed:
        t0 = time.monotonic(); run(); t1 = time.monotonic()
        unit = speed.window(t0, t1)          # seconds per work unit during the run
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from typing import Any

UNIT_LOOPS = 20_000
"""Iterations of the work unit (about 1 ms of CPU on the benchmark machine)."""


def _unit() -> int:
    s = 0
    for i in range(UNIT_LOOPS):
        s += i * i % 7
    return s


def _sample(conn: Any, interval: float, stop: Any) -> None:
    """The sampler process: (monotonic time, unit CPU seconds) pairs sent until ``stop`` is set."""
    while not stop.is_set():
        c = time.thread_time()
        _unit()
        conn.send((time.monotonic(), time.thread_time() - c))
        stop.wait(interval)
    conn.close()


class Sampler:
    """Machine speed over time, measured by a background process (see the module docstring).

    Args:
        interval: Seconds between work units.
    """

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.samples: list[tuple[float, float]] = []
        self._proc: Any = None

    def __enter__(self) -> Sampler:
        ctx = mp.get_context("spawn")
        self._recv, send = ctx.Pipe(duplex=False)
        self._stop = ctx.Event()
        self._proc = ctx.Process(target=_sample, args=(send, self.interval, self._stop), daemon=True)
        self._proc.start()
        send.close()
        return self

    def _drain(self) -> None:
        while self._recv.poll():
            try:
                self.samples.append(self._recv.recv())
            except EOFError:
                break

    def window(self, t0: float, t1: float) -> float | None:
        """Median CPU seconds of one work unit between monotonic times ``t0`` and ``t1``."""
        self._drain()
        inside = [u for t, u in self.samples if t0 <= t <= t1]
        return statistics.median(inside) if inside else None

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._drain()
        self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()
