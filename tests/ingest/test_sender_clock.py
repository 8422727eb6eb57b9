from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.errors import ConfigError
from onceflow.ingest.clock import SenderClock


class JumpyClock:
    """A wall clock a test moves by hand (also backward)."""

    def __init__(self, t: int) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def test_strictly_increasing_when_the_clock_stalls_or_jumps_back(tmp_path: Path) -> None:
    wall = JumpyClock(1_000_000)
    clock = SenderClock(tmp_path / "s.json", now_us=wall, reserve_us=100)
    out = [clock.next() for _ in range(5)]  # stalled clock
    wall.t = 500_000  # an NTP step back by half a second
    out += [clock.next() for _ in range(5)]
    wall.t = 2_000_000
    out.append(clock.next())
    assert all(a < b for a, b in zip(out, out[1:], strict=False))
    assert out[-1] == 2_000_000


def test_restart_continues_above_everything_handed_out(tmp_path: Path) -> None:
    wall = JumpyClock(1_000_000)
    first = SenderClock(tmp_path / "s.json", now_us=wall, reserve_us=1_000)
    issued = [first.next() for _ in range(2_500)]  # crosses several reservations
    wall.t = 10  # the restarted sender's clock is far behind
    second = SenderClock(tmp_path / "s.json", now_us=wall, reserve_us=1_000)
    assert second.next() > max(issued)
    assert max(issued) - min(issued) < 3_000


def test_fsyncs_once_per_reservation_not_per_timestamp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onceflow.ingest.clock as records

    calls = []
    real = records.os.fsync
    monkeypatch.setattr(records.os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    wall = JumpyClock(0)
    clock = SenderClock(tmp_path / "s.json", now_us=wall, reserve_us=1_000)
    for _ in range(10_000):
        wall.t += 1
        clock.next()
    assert 10 <= len(calls) // 2 <= 11  # file + directory per reservation


def test_corrupt_state_is_refused_not_reset(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text("{not json")
    with pytest.raises(ConfigError, match="restore it"):
        SenderClock(tmp_path / "s.json")
