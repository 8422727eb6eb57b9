"""The oracle and the verdict on hand-built checkpoints and real SQLite sinks."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pyarrow as pa

from onceflow.sinks._core.base import BatchStats
from onceflow.sinks.sqlite.sink import SQLiteTablesSink
from onceflow.sources.events import EVENT_SCHEMA
from onceflow.sources.log import EventLog
from onceflow.verify.oracle import expect
from onceflow.verify.verdict import judge_sqlite
from tests.helpers import commit_deltas

MIN = 60_000_000  # one minute in microseconds


def _seg(log: EventLog, rows: list[tuple[str, str, int]]) -> Path:
    t = pa.table({
        "event_id": [r[0] for r in rows], "user": [r[1] for r in rows],
        "event_time": pa.array([r[2] for r in rows], pa.timestamp("us", tz="UTC")),
        "system_time": pa.array([r[2] for r in rows], pa.timestamp("us", tz="UTC")),
        "bytes": pa.array([1] * len(rows), pa.int64()),
    }, schema=EVENT_SCHEMA)
    return log.append(t).path


def _checkpoint(ck: Path, batches: list[tuple[int, list[Path]]], committed: list[int]) -> None:
    """batches: (batchWatermarkMs, files) per batch; one source-log entry per non-empty batch."""
    (ck / "offsets").mkdir(parents=True)
    (ck / "sources" / "0").mkdir(parents=True)
    (ck / "commits").mkdir()
    log_id = -1
    for batch_id, (wm, files) in enumerate(batches):
        if files:
            log_id += 1
            lines = ["v1"] + [json.dumps({"path": f"file://{f}", "timestamp": 1, "batchId": log_id})
                              for f in files]
            (ck / "sources" / "0" / str(log_id)).write_text("\n".join(lines))
        meta = json.dumps({"batchWatermarkMs": wm, "batchTimestampMs": 0, "conf": {}})
        (ck / "offsets" / str(batch_id)).write_text(f"v1\n{meta}\n{json.dumps({'logOffset': log_id})}")
    for b in committed:
        (ck / "commits" / str(b)).write_text("v1\n{}")


def _scenario(tmp: Path) -> Path:
    log = EventLog(tmp / "log")
    s0 = _seg(log, [("a", "u1", 0), ("b", "u1", 30_000_000), ("c", "u2", 5 * MIN)])
    # batch 1: 'a' again (a duplicate split across batches), 'd' on time
    s1 = _seg(log, [("a", "u1", 0), ("d", "u2", 5 * MIN + 1)])
    # read by batch 3, whose late watermark is 5 min (carried by no-data batch 2): 'e' is late,
    # 'f' exactly at the watermark is late too (<=), 'g' one microsecond after is on time and
    # arrives twice within the batch
    s2 = _seg(log, [("e", "u1", 3 * MIN), ("f", "u1", 5 * MIN), ("g", "u1", 5 * MIN + 1),
                    ("g", "u1", 5 * MIN + 1)])
    ck = tmp / "ck"
    _checkpoint(ck, [(0, [s0]), (240_000, [s1]), (300_000, []), (300_000, [s2]), (400_000, [])],
                committed=[0, 1, 2, 3])
    return ck


def test_oracle_applies_late_rule_and_dedup_across_batches(tmp_path: Path) -> None:
    exp = expect(_scenario(tmp_path))
    by_id = {b.batch_id: b for b in exp.batches}
    assert [b.batch_id for b in exp.batches] == [0, 1, 2, 3]
    assert exp.uncommitted_batches == [4]
    assert by_id[0].counted == 3 and by_id[0].late_dropped == 0  # batch 0: no watermark yet
    assert by_id[1].duplicates == 1 and by_id[1].counted == 1  # 'a' split across batches
    assert by_id[1].late_ids == []  # late watermark of batch 1 is batch 0's = 0
    assert by_id[2].input_rows == 0
    assert sorted(by_id[3].late_ids) == ["e", "f"]
    assert by_id[3].duplicates == 1 and by_id[3].counted == 1
    assert exp.user_counts == {("u1", 0): 2, ("u2", 300_000): 2, ("u1", 300_000): 1}
    assert exp.global_counts == {0: 2, 300_000: 3}


def _fill_sink(db: Path, late3: int = 2, extra: int = 0, skip: int | None = None) -> None:
    sink = SQLiteTablesSink(db, sink_id="user_counts")
    sink.bind("q")

    def deltas(rows: list[tuple[str, int, int]]) -> pa.Table:
        return pa.table({"user": [r[0] for r in rows],
                         "window_start_ms": pa.array([r[1] for r in rows], pa.int64()),
                         "window_end_ms": pa.array([r[1] + 60_000 for r in rows], pa.int64()),
                         "count": pa.array([r[2] for r in rows], pa.int64())})

    plan = {0: (deltas([("u1", 0, 2), ("u2", 300_000, 1 + extra)]), BatchStats(3, 0, 0)),
            1: (deltas([("u2", 300_000, 1)]), BatchStats(2, 0, 0)),
            2: (deltas([]), BatchStats(0, 0, 240_000)),
            3: (deltas([("u1", 300_000, 1)]), BatchStats(4, late3, 300_000))}
    for b, (d, st) in plan.items():
        if b != skip:
            commit_deltas(sink, b, d, st)
    sink.close()


def test_verdict_exact_sink(tmp_path: Path) -> None:
    exp = expect(_scenario(tmp_path))
    _fill_sink(tmp_path / "db")
    v = judge_sqlite(tmp_path / "db", exp)
    assert v.ok, v.violations
    assert v.late_expected == v.late_recorded == 2


def test_verdict_catches_duplication_loss_and_wrong_late_count(tmp_path: Path) -> None:
    exp = expect(_scenario(tmp_path))
    _fill_sink(tmp_path / "db")
    _fill_sink(tmp_path / "dup", extra=1)
    v = judge_sqlite(tmp_path / "dup", exp)
    assert not v.ok and v.duplicated == 2 and v.lost == 0  # user row and global row
    _fill_sink(tmp_path / "lost", skip=1)
    v = judge_sqlite(tmp_path / "lost", exp)
    assert v.lost == 2 and v.missing_markers == [1]
    _fill_sink(tmp_path / "late", late3=1)
    v = judge_sqlite(tmp_path / "late", exp)
    assert v.late_mismatches == [3] and not v.ok and v.lost == 0
    with sqlite3.connect(tmp_path / "db") as conn:  # a batch staged, never applied
        conn.execute("INSERT INTO onceflow_staged VALUES ('user_counts', 9, 0, '{}', x'00')")
    v = judge_sqlite(tmp_path / "db", exp)
    assert v.violations == ["1 staged batches never applied: [9]"]


def test_purged_checkpoint_is_refused_with_the_reason(tmp_path: Path) -> None:
    import pytest

    from onceflow.errors import CheckpointReadError

    ck = _scenario(tmp_path)
    (ck / "offsets" / "0").unlink()  # what Spark's minBatchesToRetain purge does
    with pytest.raises(CheckpointReadError, match="no longer holds batches 0..0.*--retain-batches"):
        expect(ck)
