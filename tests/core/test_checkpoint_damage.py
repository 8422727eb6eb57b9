"""Spark's checkpoint checked before the query starts: a damaged or missing log file is named, then repaired.

The transfers pipeline (tests/core/transfers.py) into SQLite; each case damages the checkpoint the
way a user's disk or hand would, and the answer is checked against the input files alone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import onceflow
from onceflow.checkpoint.logcheck import CheckpointDamagedError, damage
from tests.core import transfers

pytestmark = pytest.mark.spark


def _run(spark: Any, tmp: Path) -> None:
    sink = onceflow.sqlite(tmp / "out.db")
    try:
        transfers.start(spark, tmp / "in", sink, tmp / "ck").awaitTermination()
    finally:
        sink.close()


def _repair(tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "onceflow.cli.main", "repair", "--checkpoint", str(tmp / "ck")]
    return subprocess.run([*command, "--db", str(tmp / "out.db"), *extra], capture_output=True, text=True,
                          timeout=120)


def _two_runs(spark: Any, tmp: Path) -> None:
    for k in (0, 1):
        transfers.put(tmp / "in", k)
        _run(spark, tmp)
    assert damage(tmp / "ck") == []


def test_a_missing_source_log_entry_is_refused_at_start_then_restored_from_the_markers(
        spark: Any, tmp_path: Path) -> None:
    _two_runs(spark, tmp_path)
    entry = tmp_path / "ck" / "sources" / "0" / "1"
    entry.unlink()  # the entry of the second file; Spark would take the next files for it again
    transfers.put(tmp_path / "in", 2)
    with pytest.raises(CheckpointDamagedError, match=rf"{entry}: is missing: the last planned batch read "
                                                     r"file source 0's log up to entry 1.*onceflow repair "
                                                     r"--checkpoint"):
        _run(spark, tmp_path)
    dry = _repair(tmp_path, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would restore sources/0/1 from the sink's markers (1 file(s))" in dry.stdout, dry.stdout
    assert not entry.exists()
    fixed = _repair(tmp_path)
    assert fixed.returncode == 0 and entry.exists(), fixed.stdout + fixed.stderr
    again = _repair(tmp_path)
    assert "nothing to repair" in again.stdout, again.stdout + again.stderr
    _run(spark, tmp_path)
    assert transfers.read_sink("sqlite", str(tmp_path / "out.db")) == transfers.expected(tmp_path / "in")


def test_a_damaged_last_commit_is_named_and_removed_by_repair(spark: Any, tmp_path: Path) -> None:
    _two_runs(spark, tmp_path)
    commits = sorted(int(p.name) for p in (tmp_path / "ck" / "commits").iterdir() if p.name.isdigit())
    last = tmp_path / "ck" / "commits" / str(commits[-1])
    last.write_text("v1\n{garbage\n")
    with pytest.raises(CheckpointDamagedError, match=rf"{last}: line 2 is not JSON"):
        _run(spark, tmp_path)
    dry = _repair(tmp_path, "--dry-run")
    assert f"would remove commits/{commits[-1]}" in dry.stdout, dry.stdout + dry.stderr
    assert _repair(tmp_path).returncode == 0
    transfers.put(tmp_path / "in", 2)
    _run(spark, tmp_path)
    assert transfers.read_sink("sqlite", str(tmp_path / "out.db")) == transfers.expected(tmp_path / "in")


def test_a_damaged_file_the_markers_do_not_keep_names_the_backup(spark: Any, tmp_path: Path) -> None:
    _two_runs(spark, tmp_path)
    first = tmp_path / "ck" / "offsets" / "0"
    first.write_text("garbage")
    (tmp_path / "ck" / "commits" / "1").unlink()
    with pytest.raises(CheckpointDamagedError) as refused:
        _run(spark, tmp_path)
    assert f"{first}: has no version line" in str(refused.value)
    assert "commits/1: is missing: commits/ holds batches 0-3 but not 1" in str(refused.value)
    fixed = _repair(tmp_path)
    assert fixed.returncode != 0 and "bring the file back from a backup of the checkpoint" in fixed.stderr
