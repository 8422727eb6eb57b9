"""The late count that skips row groups by Parquet statistics equals a full read."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.checkpoint import logs as ckpt
from onceflow.sinks._core.base import BatchStats
from onceflow.sources.events import EVENT_SCHEMA


def _batch_stats(batch: ckpt.BatchInput) -> BatchStats:
    rows, late = ckpt.count_input(batch, "event_time")
    return BatchStats(rows, late, batch.late_watermark_ms)


def _file(path: Path, micros: list[int], row_group_size: int) -> Path:
    n = len(micros)
    t = pa.table({
        "event_id": [str(i) for i in range(n)], "user": ["u"] * n,
        "event_time": pa.array(micros, pa.timestamp("us", tz="UTC")),
        "system_time": pa.array(micros, pa.timestamp("us", tz="UTC")),
        "bytes": pa.array([1] * n, pa.int64()),
    }, schema=EVENT_SCHEMA)
    pq.write_table(t, path, row_group_size=row_group_size)
    return path


def test_row_groups_all_late_mixed_and_on_time(tmp_path: Path) -> None:
    wm_ms = 1_000
    micros = [1, 2, 3] + [999_999, 1_000_000, 1_000_001] + [2_000_000, 3_000_000, 4_000_000]
    f = _file(tmp_path / "a.parquet", micros, row_group_size=3)
    assert pq.ParquetFile(f).metadata.num_row_groups == 3
    stats = _batch_stats(ckpt.BatchInput(0, [f], wm_ms))
    assert stats.input_rows == 9
    assert stats.late_dropped == 5  # 3 + (999_999 and exactly 1_000_000)


@settings(max_examples=60, deadline=None)
@given(micros=st.lists(st.integers(0, 10_000_000), min_size=1, max_size=200),
       wm_ms=st.integers(0, 10_000), rg=st.integers(1, 50))
def test_equals_full_read(tmp_path_factory: object, micros: list[int], wm_ms: int, rg: int) -> None:
    d = tmp_path_factory.mktemp("p")  # type: ignore[attr-defined]
    f = _file(d / "x.parquet", micros, rg)
    full = ckpt.count_late(pq.read_table(f, columns=["event_time"]).column(0), wm_ms)
    stats = _batch_stats(ckpt.BatchInput(0, [f], wm_ms))
    assert stats.late_dropped == full
    assert stats.input_rows == len(micros)
