"""The checkpoint readers on hand-built Spark checkpoints (formats as Spark 4.3 writes them)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from onceflow.checkpoint import logs as ckpt


def _offsets(root: Path, batch: int, wm: int, log_offset: int) -> None:
    d = root / "offsets"
    d.mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": wm, "batchTimestampMs": 1, "conf": {}}
    (d / str(batch)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps({'logOffset': log_offset})}")


def _source(root: Path, name: str, entries: list[tuple[str, int]]) -> None:
    d = root / "sources" / "0"
    d.mkdir(parents=True, exist_ok=True)
    lines = ["v1"] + [json.dumps({"path": f"file://{p}", "timestamp": 1, "batchId": b})
                      for p, b in entries]
    (d / name).write_text("\n".join(lines))


def test_files_and_watermarks_with_a_no_data_batch(tmp_path: Path) -> None:
    _offsets(tmp_path, 0, 0, 0)
    _offsets(tmp_path, 1, 1000, 0)  # no-data batch: only advances the watermark
    _offsets(tmp_path, 2, 5000, 1)
    _source(tmp_path, "0", [("/log/seg-1.parquet", 0), ("/log/seg-2.parquet", 0)])
    _source(tmp_path, "1", [("/log/seg%203.parquet", 1)])
    assert ckpt.batch_files(tmp_path, 0) == [Path("/log/seg-1.parquet"), Path("/log/seg-2.parquet")]
    assert ckpt.batch_files(tmp_path, 1) == []
    assert ckpt.batch_files(tmp_path, 2) == [Path("/log/seg 3.parquet")]
    assert ckpt.late_watermark_ms(tmp_path, 0) == 0
    assert ckpt.late_watermark_ms(tmp_path, 2) == 1000  # the previous batch's watermark
    assert ckpt.batch_watermark_ms(tmp_path, 2) == 5000


def test_compacted_source_log(tmp_path: Path) -> None:
    for b in range(3):
        _offsets(tmp_path, b, 0, b)
    _source(tmp_path, "1.compact", [("/a", 0), ("/b", 1), ("/c", 1)])
    _source(tmp_path, "2", [("/d", 2)])
    assert ckpt.batch_files(tmp_path, 0) == [Path("/a")]
    assert ckpt.batch_files(tmp_path, 1) == [Path("/b"), Path("/c")]
    assert ckpt.batch_files(tmp_path, 2) == [Path("/d")]


def test_batch_covering_two_source_log_entries(tmp_path: Path) -> None:
    # A crash after the source logged files but before the offset log: the next batch spans both.
    _offsets(tmp_path, 0, 0, 0)
    _offsets(tmp_path, 1, 0, 2)
    _source(tmp_path, "0", [("/a", 0)])
    _source(tmp_path, "1", [("/b", 1)])
    _source(tmp_path, "2", [("/c", 2)])
    assert ckpt.batch_files(tmp_path, 1) == [Path("/b"), Path("/c")]


def test_committed_batches_and_query_id(tmp_path: Path) -> None:
    assert ckpt.query_id(tmp_path) is None
    (tmp_path / "metadata").write_text('{"id":"abc-123"}')
    (tmp_path / "commits").mkdir()
    for b in (0, 1, 3):
        (tmp_path / "commits" / str(b)).write_text("v1\n{}")
    (tmp_path / "commits" / ".4.tmp").write_text("")
    assert ckpt.query_id(tmp_path) == "abc-123"
    assert ckpt.committed_batches(tmp_path) == [0, 1, 3]


def test_late_rule_is_less_or_equal_in_microseconds() -> None:
    times = pa.array([999_999, 1_000_000, 1_000_001], pa.timestamp("us", tz="UTC"))
    assert ckpt.late_mask(times, 1000).tolist() == [True, True, False]
    assert ckpt.count_late(times, 0) == 0
