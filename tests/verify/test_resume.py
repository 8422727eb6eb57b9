"""The resume contract's bookkeeping (``onceflow.verify.resume``), on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onceflow.errors import ConfigError
from onceflow.verify.resume import PIDS, REGISTRY_ENV, kill_stale, load_state, save_state


def test_a_started_process_lists_itself(tmp_path: Path) -> None:
    """Step 2: the process registers its own group, without the parent's help."""
    env = {**os.environ, REGISTRY_ENV: str(tmp_path / PIDS)}
    proc = subprocess.Popen([sys.executable, "-m", "onceflow.cli.main", "--version"], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL)
    assert proc.wait(timeout=60) == 0
    assert (tmp_path / PIDS).read_text().split() == [str(proc.pid)]  # its own group


def test_kill_stale_kills_listed_onceflow_groups_only(tmp_path: Path) -> None:
    """Step 2: a listed onceflow group dies; a listed pid of another program is left alone."""
    code = "import time; time.sleep(120)"
    ours = subprocess.Popen([sys.executable, "-c", code, "onceflow"], start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        (tmp_path / PIDS).write_text(f"{ours.pid}\n{other.pid}\n")
        assert kill_stale(tmp_path) == 1
        assert ours.wait(timeout=10) == -9
        time.sleep(0.2)
        assert other.poll() is None
        assert (tmp_path / PIDS).read_text() == ""
    finally:
        ours.kill()
        other.kill()
        ours.wait()
        other.wait()


def test_state_round_trip_and_config_mismatch(tmp_path: Path) -> None:
    """Steps 1 and 5: the state comes back; another configuration is refused, by name."""
    config = {"rounds": 10, "faults": ["kill_random"], "seed": 1, "sink": "sqlite", "cluster": False,
              "ingest": False, "events_per_round": 4000, "segment_size": 1000}
    save_state(tmp_path, {"config": config, "rounds": []})
    assert load_state(tmp_path, config)["rounds"] == []
    with pytest.raises(ConfigError, match=r"these differ: seed \(was 1, now 2\)"):
        load_state(tmp_path, {**config, "seed": 2})
    with pytest.raises(ConfigError, match="nothing to resume"):
        load_state(tmp_path / "elsewhere", config)


def test_kill_stale_kills_what_is_left_of_a_group_whose_leader_exited(tmp_path: Path) -> None:
    """Step 2: a listed group whose leader already exited still has a member (like a driver's
    JVM outliving its Python process): it is killed too."""
    leader = subprocess.Popen(["sh", "-c", "sleep 120 & echo $!"], start_new_session=True,
                              stdout=subprocess.PIPE, text=True)
    assert leader.stdout is not None
    member = int(leader.stdout.readline())
    assert leader.wait(timeout=30) == 0
    (tmp_path / PIDS).write_text(f"{leader.pid}\n")
    assert os.getpgid(member) == leader.pid
    kill_stale(tmp_path)
    assert _gone_or_zombie(member, timeout=10), "the group member outlived kill_stale"


def _gone_or_zombie(pid: int, timeout: float) -> bool:
    """Whether ``pid`` exits within ``timeout`` (a killed orphan may show as a zombie briefly)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False
