from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from onceflow.errors import BadSegmentError
from onceflow.sources.events import EVENT_SCHEMA
from onceflow.sources.log import EventLog
from onceflow.verify.generator import GeneratorConfig, generate_table


def _events(n: int, seed: int = 0) -> pa.Table:
    return generate_table(GeneratorConfig(events=n, seed=seed))


def test_append_names_in_order_and_mtimes_strictly_increase(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "log")
    segs = [log.append(_events(10, seed=i)) for i in range(5)]
    assert [s.seq for s in segs] == [1, 2, 3, 4, 5]
    assert [s.path.name for s in log.segments()] == sorted(s.path.name for s in segs)
    mtimes_ms = [s.path.stat().st_mtime_ns // 1_000_000 for s in segs]
    assert all(b > a for a, b in zip(mtimes_ms, mtimes_ms[1:], strict=False))
    assert log.read().num_rows == 50


def test_restarted_writer_continues_sequence_and_removes_temp_leftovers(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    log.append(_events(3))
    (tmp_path / ".seg-000000000002.parquet.tmp").write_bytes(b"partial")  # crash before rename
    assert [s.seq for s in log.segments()] == [1]  # a partial file is never listed
    seg = EventLog(tmp_path).append(_events(3, seed=1))
    assert seg.seq == 2
    assert not list(tmp_path.glob(".seg-*"))
    EventLog(tmp_path).validate()


def test_append_rejects_wrong_schema_and_writes_nothing(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    bad = pa.table({"event_id": ["a"], "user": ["u"]})
    with pytest.raises(BadSegmentError, match="missing column 'event_time'"):
        log.append(bad)
    assert log.segments() == []


def test_validate_names_corrupt_file(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    log.append(_events(5))
    corrupt = tmp_path / "seg-000000000002.parquet"
    corrupt.write_bytes(b"PAR1 this is not parquet at all")
    with pytest.raises(BadSegmentError) as info:
        log.validate()
    assert info.value.path == str(corrupt)
    assert "unreadable Parquet" in str(info.value)


def test_validate_names_wrong_schema_file(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    wrong = pa.table({
        "event_id": pa.array(["a"]), "user": pa.array(["u"]),
        "event_time": pa.array([1], pa.timestamp("us", tz="UTC")),
        "system_time": pa.array([1], pa.timestamp("us", tz="UTC")),
        "bytes": pa.array(["12"]),  # string instead of long
    })
    path = tmp_path / "seg-000000000001.parquet"
    pq.write_table(wrong, path)
    with pytest.raises(BadSegmentError, match="column 'bytes' has type string, expected int64") as info:
        log.validate()
    assert info.value.path == str(path)


def test_foreign_file_in_log_dir_is_an_error(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    log.append(_events(2))
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(BadSegmentError, match="not a segment file name"):
        log.segments()


def test_validate_rechecks_a_changed_file(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    seg = log.append(_events(5))
    assert log.validate() == 1
    assert log.validate() == 0  # cached
    seg.path.write_bytes(b"garbage")
    os.utime(seg.path, ns=(1, 1))
    with pytest.raises(BadSegmentError):
        log.validate()


def test_empty_log_reads_empty_table(tmp_path: Path) -> None:
    assert EventLog(tmp_path / "missing").read().schema == EVENT_SCHEMA


def test_a_log_of_any_schema_declared_or_taken_from_its_first_segment(tmp_path: Path) -> None:
    payments = pa.table({"payment_id": ["p1"], "amount_cents": pa.array([5], pa.int64())})
    log = EventLog(tmp_path / "pay", schema=None)
    assert log.schema is None
    log.append(payments)
    log.append(payments)
    assert EventLog(tmp_path / "pay", schema=None).schema == payments.schema  # from the first segment
    with pytest.raises(BadSegmentError, match="column 'amount_cents' has type double"):
        log.append(payments.set_column(1, "amount_cents", pa.array([5.0])))
    other = EventLog(tmp_path / "other", schema=None)
    other.append(pa.table({"x": [1]}))
    (tmp_path / "other" / "seg-000000000001.parquet").replace(tmp_path / "pay" / "seg-000000000009.parquet")
    with pytest.raises(BadSegmentError, match=r"seg-000000000009.*missing column 'payment_id'"):
        EventLog(tmp_path / "pay", schema=None).validate()
    declared = EventLog(tmp_path / "declared", schema=payments.schema)
    with pytest.raises(BadSegmentError, match="unexpected columns"):
        declared.append(payments.append_column("extra", pa.array([1])))
    assert declared.read().schema == payments.schema and declared.read().num_rows == 0
