"""The stable-input store without Spark: atomic save, load, drop, cleanup of leftovers."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from onceflow.engine.stable import DIR, StableOutputs
from onceflow.errors import ConfigError


def _t(v: int) -> pa.Table:
    return pa.table({"k": ["a", "b"], "v": [v, v + 1]})


def test_first_computation_is_kept_and_a_retry_reads_it(tmp_path: Path) -> None:
    store = StableOutputs(tmp_path, ["charges"])
    assert store.load(3, "q1") is None
    saved = store.save(3, "q1", {"charges": _t(1), "other": _t(5)}, rows_out=7)
    assert set(saved.tables) == {"charges"}  # only the stable table is persisted
    again = store.load(3, "q1")
    assert again is not None and again.rows_out == 7
    assert again.tables["charges"].equals(_t(1))
    assert store.batches() == [3]
    with pytest.raises(ConfigError, match="holds batch 3 of query q1, not of this checkpoint's query q2"):
        store.load(3, "q2")
    store.drop(3)
    store.drop(3)  # idempotent
    assert store.load(3, "q1") is None and store.batches() == []


def test_cleanup_removes_committed_batches_and_half_written_copies(tmp_path: Path) -> None:
    store = StableOutputs(tmp_path)
    for b in (1, 2, 3):
        store.save(b, "q1", {"t": _t(b)}, rows_out=b)
    half = tmp_path / DIR / ".tmp-4-deadbeef"  # a crash before the rename
    half.mkdir()
    (half / "t.parquet").write_bytes(b"partial")
    assert store.cleanup([0, 1, 2]) == [1, 2]
    assert store.batches() == [3] and not half.exists()
    kept = store.load(3, "q1")
    assert kept is not None and kept.tables["t"].equals(_t(3))
    assert StableOutputs(tmp_path / "nothing").cleanup([1]) == []
