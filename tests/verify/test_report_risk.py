"""Verify's crash rounds hit batches with data, the negative control fails, the report in Chromium.

One run of the command a user runs: ``onceflow verify --rounds 4 --seed 3 --faults all --sink
naive`` once passed with "OK" because its ``crash_after_sink_commit`` round hit a no-data batch.
It must exit 1 now, every crash round must name a batch with input rows, and the HTML report
must show, in a real browser, the start-up as one narrow span and the failure in its tables.
The run's checkpoint also serves to check the auditor's own reader of Spark's log against the
pipeline's (two implementations of the same documented format).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from onceflow.checkpoint import logs as ckpt
from onceflow.verify import spark_log
from onceflow.verify.report import STARTUP_PX

pytestmark = [pytest.mark.spark, pytest.mark.faults]


@pytest.fixture(scope="module")
def naive_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, dict[str, Any], Path]:
    report = tmp_path_factory.mktemp("naive") / "report"
    proc = subprocess.run([sys.executable, "-m", "onceflow.cli.main", "verify", "--rounds", "4",
                           "--seed", "3", "--faults", "all", "--sink", "naive", "--report", str(report)],
                          capture_output=True, text=True, timeout=600)
    data = json.loads((report / "report.json").read_text())
    return proc.returncode, proc.stdout + proc.stderr, data, report


def test_the_seed_3_negative_control_fails_and_its_crashes_hit_data(
        naive_run: tuple[int, str, dict[str, Any], Path]) -> None:
    rc, out, data, _ = naive_run
    assert rc == 1, out
    assert data["verdict"]["duplicated"] > 0, out
    crashes = [r for r in data["rounds"] if r["fault"].startswith("crash_")]
    assert [r["fault"] for r in crashes] == ["crash_before_sink_write", "crash_inside_sink_txn",
                                             "crash_after_sink_commit"]
    markers = {b["batch_id"]: b["input_rows"] for b in data["batches"]}
    for r in crashes:
        assert r["fault_batches"], r
        assert all(markers[b] > 0 for b in r["fault_batches"]), (r, markers)
        assert r["rows_at_risk"] == sum(markers[b] for b in r["fault_batches"]) > 0
    assert "with data at risk" in out


def test_the_auditors_reader_of_sparks_log_agrees_with_the_pipelines(
        naive_run: tuple[int, str, dict[str, Any], Path]) -> None:
    ck = naive_run[3] / "work" / "checkpoint"
    committed = spark_log.committed(ck)
    assert committed == ckpt.committed_batches(ck) and len(committed) >= 3
    entries = spark_log.source_entries(ck)
    with_files = 0
    for b in committed:
        theirs = ckpt.batch_input(ck, b)
        ours = spark_log.batch_files(ck, b, entries=entries)
        assert sorted(map(str, ours)) == sorted(map(str, theirs.files)), b
        assert spark_log.late_watermark_ms(ck, b) == theirs.late_watermark_ms, b
        with_files += bool(ours)
    assert 0 < with_files < len(committed)  # data batches and no-data batches both read
    assert spark_log.in_flight(ck) == []  # the final drain committed every planned batch


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI"):
        raise AssertionError("Chromium is missing (scripts/ensure_chromium.sh installs it)")
    pytest.skip("no Chromium here (scripts/ensure_chromium.sh installs it)")


def test_the_report_in_chromium(naive_run: tuple[int, str, dict[str, Any], Path], tmp_path: Path) -> None:
    """Screenshot report.html in headless Chromium and look at its pixels."""
    from PIL import Image

    page = naive_run[3] / "report.html"
    shot = tmp_path / "report.png"
    subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1000,1500", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    img = Image.open(shot).convert("RGB")
    width, height = img.size
    px = img.load()
    assert px is not None

    def columns(color: tuple[int, int, int], tall: int = 1) -> list[int]:
        """The x of each column with at least ``tall`` pixels of ``color`` (tall: not text)."""
        return [x for x in range(width) if sum(px[x, y] == color for y in range(height)) >= tall]

    pink = columns((255, 204, 213))  # .bad: the duplicated counter and the failed tables' rows
    assert len(pink) > 100, "the failure is not shown in red"
    startup = columns((238, 238, 238), tall=60)  # the start-up span of the timeline
    assert startup, "no start-up span"
    assert max(startup) - min(startup) <= STARTUP_PX, "start-up is wider than one narrow span"
    kill = columns((214, 39, 40), tall=60)  # the kill_random round's fault line (#d62728)
    assert kill and min(kill) > max(startup), "the first fault is drawn inside the start-up span"
    text = page.read_text()
    for heading in ("<h2>Tables</h2>", "<h2>Faults</h2>", "at risk"):
        assert heading in text
