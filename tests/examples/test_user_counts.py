"""Example 5-1 on the public API and real Spark: exact results, counted late data, clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from onceflow.cli.run import PipelineConfig, Totals, run_pipeline
from onceflow.errors import BadSegmentError, CheckpointMismatchError
from onceflow.sinks.sqlite.db import read_batches
from onceflow.sources.log import EventLog
from onceflow.verify.generator import GeneratorConfig, generate_segments
from onceflow.verify.recompute import diff_counts, expected_counts
from onceflow.verify.sinks import SinkOptions, make_sink
from onceflow.verify.verdict import read_counts
from tests.helpers import distinct_counts

pytestmark = pytest.mark.spark


def _fill(log_dir: Path, **kw: Any) -> int:
    log = EventLog(log_dir)
    n = 0
    for t in generate_segments(GeneratorConfig(**kw)):
        log.append(t)
        n += t.num_rows
    return n


def run(spark: Any, cfg: PipelineConfig, db: Path) -> Totals:
    """Example 5-1 (``onceflow.examples.user_counts``) into SQLite, as ``onceflow run --once`` runs it."""
    sink = make_sink("sqlite", SinkOptions(db=db))
    try:
        return run_pipeline(spark, cfg, sink, once=True)
    finally:
        sink.close()


def _run(spark: Any, tmp: Path, **kw: Any) -> Totals:
    return run(spark, PipelineConfig(log_dir=tmp / "log", checkpoint=tmp / "ck", **kw), tmp / "db.sqlite")


def test_result_equals_independent_recomputation_and_resumes(spark: Any, tmp_path: Path) -> None:
    _fill(tmp_path / "log", events=30_000, users=40, minutes=15, duplicates=0.1, seed=1,
          segment_size=3_000)
    first = _run(spark, tmp_path, max_files_per_trigger=3)
    assert first.batches_committed >= 4
    assert first.duplicates_dropped == 3_000
    assert first.late_dropped == 0
    assert read_counts(tmp_path / "db.sqlite") == distinct_counts(tmp_path / "log")
    # more data, same checkpoint: resumes exactly, nothing re-read
    _fill(tmp_path / "log", events=10_000, users=40, minutes=5, duplicates=0.05, seed=2,
          segment_size=5_000, start=datetime(2026, 1, 1, 0, 15, tzinfo=timezone.utc))
    second = _run(spark, tmp_path, max_files_per_trigger=3)
    assert second.input_rows == 10_500
    assert second.batches_replayed == 0
    users, glob = read_counts(tmp_path / "db.sqlite")
    exp_users, exp_glob = distinct_counts(tmp_path / "log")
    assert diff_counts(exp_users, users).exact  # type: ignore[arg-type]
    assert users == exp_users and glob == exp_glob
    assert sum(glob.values()) == 40_000


def test_late_drops_follow_spark_and_are_recorded(spark: Any, tmp_path: Path) -> None:
    rows = _fill(tmp_path / "log", events=20_000, users=10, minutes=30, duplicates=0.05, late=0.03,
                 seed=5, segment_size=2_000)
    res = _run(spark, tmp_path, max_files_per_trigger=2)
    recorded = {b["batch_id"]: b for b in read_batches(tmp_path / "db.sqlite", "user_counts")}
    assert sum(b["input_rows"] for b in recorded.values()) == rows
    # Spark's own metric, per batch, equals what onceflow computed from the checkpoint
    spark_late = {p["batchId"]: sum(op["numRowsDroppedByWatermark"] for op in p["stateOperators"])
                  for p in res.progress}
    assert spark_late, "no progress reports"
    for batch_id, dropped in spark_late.items():
        if batch_id in recorded:
            assert recorded[batch_id]["late_dropped"] == dropped, batch_id
    total_late = sum(b["late_dropped"] for b in recorded.values())
    assert 200 < total_late <= 600  # late events in the first batches precede any watermark
    users, glob = read_counts(tmp_path / "db.sqlite")
    exp_users, exp_glob = expected_counts(spark, tmp_path / "log", tmp_path / "ck")
    assert users == exp_users
    assert glob == exp_glob
    # every row is accounted for: counted + duplicates + late = input
    assert sum(glob.values()) + res.duplicates_dropped + total_late == rows


def test_bad_segment_mid_stream_stops_before_writing(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(tmp_path / "log", events=2_000, seed=1, segment_size=1_000)
    _run(spark, tmp_path)
    before = read_counts(tmp_path / "db.sqlite")
    good = pq.read_table(EventLog(tmp_path / "log").segments()[0].path)
    bad_path = tmp_path / "log" / "seg-000000000003.parquet"
    pq.write_table(good.drop(["user"]), bad_path)  # missing a column: Spark would read nulls
    # As if the segment arrived after start-up: skip the start-up check of the whole log,
    # keep the per-batch check of the batch's own files.
    original = EventLog.validate
    monkeypatch.setattr(EventLog, "validate",
                        lambda self, paths=None: 0 if paths is None else original(self, paths))
    cfg = PipelineConfig(log_dir=tmp_path / "log", checkpoint=tmp_path / "ck")
    with pytest.raises(BadSegmentError, match="missing column 'user'") as info:
        run(spark, cfg, tmp_path / "db.sqlite")
    monkeypatch.undo()
    assert info.value.path == str(bad_path)
    assert read_counts(tmp_path / "db.sqlite") == before
    # fix the segment and run again: the batch is processed, nothing lost
    bad_path.unlink()
    new = EventLog(tmp_path / "log").append(
        pa.Table.from_batches(pq.read_table(EventLog(tmp_path / "log").segments()[1].path).to_batches())
    )
    assert new.seq == 3
    _run(spark, tmp_path)
    assert sum(read_counts(tmp_path / "db.sqlite")[1].values()) == 2_000


def test_new_checkpoint_with_old_database_is_refused(spark: Any, tmp_path: Path) -> None:
    _fill(tmp_path / "log", events=1_000, seed=1)
    _run(spark, tmp_path)
    cfg = PipelineConfig(log_dir=tmp_path / "log", checkpoint=tmp_path / "other-ck")
    with pytest.raises(CheckpointMismatchError, match="query id"):
        run(spark, cfg, tmp_path / "db.sqlite")


@pytest.mark.parametrize("kind", ["corrupt", "wrong_schema"])
def test_cli_reports_bad_segment(tmp_path: Path, kind: str) -> None:
    _fill(tmp_path / "log", events=500, seed=1)
    bad = tmp_path / "log" / "seg-000000000002.parquet"
    if kind == "corrupt":
        bad.write_bytes(b"PAR1 truncated")
        expect = "unreadable Parquet"
    else:
        t = pq.read_table(EventLog(tmp_path / "log").segments()[0].path)
        pq.write_table(t.set_column(4, "bytes", t.column("bytes").cast(pa.float64())), bad)
        expect = "column 'bytes' has type double, expected int64"
    proc = subprocess.run(
        [sys.executable, "-m", "onceflow.cli.main", "run", "--log", str(tmp_path / "log"),
         "--checkpoint", str(tmp_path / "ck"), "--db", str(tmp_path / "db"), "--once"],
        capture_output=True, text=True, timeout=120, env=os.environ.copy(),
    )
    assert proc.returncode == 1, proc.stderr
    assert f"onceflow: error: bad segment {bad}" in proc.stderr
    assert expect in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.long  # make test is near its 30 minutes (29:24 measured)
def test_retain_batches_controls_checkpoint_history(tmp_path: Path) -> None:
    from onceflow.checkpoint import logs as ckpt

    _fill(tmp_path / "log", events=6_000, seed=1, segment_size=1_000)
    for retain, name in ((2, "short"), (1_000, "long")):
        proc = subprocess.run(
            [sys.executable, "-m", "onceflow.cli.main", "run", "--log", str(tmp_path / "log"),
             "--checkpoint", str(tmp_path / name), "--db", str(tmp_path / f"{name}.db"), "--once",
             "--max-files-per-trigger", "1", "--retain-batches", str(retain)],
            capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert ckpt.offset_batches(tmp_path / "long")[0] == 0
    assert len(ckpt.offset_batches(tmp_path / "long")) >= 6
    assert ckpt.offset_batches(tmp_path / "short")[0] > 0  # Spark purged the early batches
