"""Without a JVM: input ranges read from and written to a checkpoint, the retry policy, a recorded archive.

The checkpoints here are written in Spark's own file formats (``v1`` and JSON lines; a file
source's log with a compact file every ten ids), as Spark 4.3 writes them (see a real one in
``tests/core/test_restore.py``).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from pathlib import Path

import pytest

from onceflow.checkpoint import ranges
from onceflow.errors import BatchRejectedError, PostgresError
from onceflow.runtime import jvmstart
from onceflow.sinks._core.retry import retrying, transient

META = {"batchWatermarkMs": 5, "batchTimestampMs": 7, "conf": {"spark.sql.shuffle.partitions": "2"}}


def _offsets(ck: Path, batch: int, *lines: str) -> None:
    (ck / "offsets").mkdir(parents=True, exist_ok=True)
    (ck / "offsets" / str(batch)).write_text("v1\n" + json.dumps(META) + "\n" + "\n".join(lines))


def _log(ck: Path, name: str, entries: list[dict[str, object]]) -> None:
    (ck / "sources" / "0").mkdir(parents=True, exist_ok=True)
    (ck / "sources" / "0" / name).write_text("v1\n" + "".join(json.dumps(e) + "\n" for e in entries))


def _entry(log_id: int, name: str) -> dict[str, object]:
    return {"path": f"file:///in/{name}", "timestamp": 1, "batchId": log_id}


def test_a_file_batch_is_its_files_across_log_ids_and_compact_files(tmp_path: Path) -> None:
    _log(tmp_path, "9.compact", [_entry(i, f"f{i}") for i in range(10)])
    _log(tmp_path, "10", [_entry(10, "f10a"), _entry(10, "f10b")])
    _offsets(tmp_path, 0, '{"logOffset":7}')
    _offsets(tmp_path, 1, '{"logOffset":10}')
    _offsets(tmp_path, 2, '{"logOffset":10}')
    r = ranges.read(tmp_path, 1)
    assert [e["path"] for e in r.files[0]] == ["file:///in/f8", "file:///in/f9", "file:///in/f10a",
                                               "file:///in/f10b"]
    assert r.watermark_ms == 5 and r.timestamp_ms == 7
    assert ranges.read(tmp_path, 2).files == {0: []}  # a no-data batch
    assert "4 file(s)" in r.describe()
    again = ranges.InputRange.from_json(1, r.to_json())
    assert again == r and again.same_input(r)


def test_the_same_offsets_over_other_files_are_another_input(tmp_path: Path) -> None:
    _log(tmp_path, "0", [_entry(0, "a")])
    _offsets(tmp_path, 0, '{"logOffset":0}')
    first = ranges.read(tmp_path, 0)
    _log(tmp_path, "0", [_entry(0, "a"), _entry(0, "b")])  # a restored checkpoint, other files at id 0
    assert not ranges.read(tmp_path, 0).same_input(first)
    moved = ranges.InputRange.from_json(0, first.to_json().replace('"batchId":0', '"batchId":3'))
    assert moved.same_input(first)  # the files count, not the ids they were logged under


def test_kafka_offsets_are_start_and_end(tmp_path: Path) -> None:
    _offsets(tmp_path, 0, '{"orders":{"0":10,"1":4}}')
    _offsets(tmp_path, 1, '{"orders":{"1":9,"0":12}}')
    r = ranges.read(tmp_path, 1)
    assert r.files == {} and r.start == ('{"orders":{"0":10,"1":4}}',)
    assert "-> " in r.describe()
    same = ranges.InputRange(1, 0, 0, ('{"orders": {"0": 12, "1": 9}}',), ('{"orders":{"1":4,"0":10}}',))
    assert same.same_input(r)  # JSON compared as values
    other = ranges.InputRange(1, 0, 0, ('{"orders":{"0":13,"1":9}}',), r.start)
    assert not other.same_input(r)
    with pytest.raises(Exception, match="input range onceflow cannot read"):
        ranges.InputRange.from_json(1, '{"v":1}')
    # the records of a batch before it runs (a sink with two paths picks one by them)
    assert r.records() == 2 + 5
    assert ranges.read(tmp_path, 0).records() == 14  # batch 0: the end's numbers, an upper bound
    assert ranges.InputRange(1, 0, 0, ('{"orders":{"0":"x"}}',), None).records() is None
    assert ranges.InputRange(1, 0, 0, ('{"logOffset":3}',), ('{"logOffset":1}',), {0: []}).records() is None


def test_a_range_written_back_reads_the_same_and_compacts_where_spark_would(tmp_path: Path) -> None:
    _log(tmp_path, "7", [_entry(7, "g7")])
    for i in range(7):
        _log(tmp_path, str(i), [_entry(i, f"g{i}")])
    _offsets(tmp_path, 0, '{"logOffset":7}')
    plan = ranges.InputRange(1, 11, 12, ('{"logOffset":9}',), ('{"logOffset":7}',),
                             {0: [_entry(8, "h8"), _entry(9, "h9a"), _entry(9, "h9b")]})
    ranges.write(tmp_path, plan, {"k": "v"})
    assert (tmp_path / "sources" / "0" / "8").exists() and (tmp_path / "sources" / "0" / "9.compact").exists()
    compact = (tmp_path / "sources" / "0" / "9.compact").read_text().splitlines()
    assert compact[0] == "v1" and len(compact) == 1 + 11  # every entry up to id 9
    back = ranges.read(tmp_path, 1)
    assert back.same_input(plan) and back.watermark_ms == 11
    assert json.loads((tmp_path / "offsets" / "1").read_text().splitlines()[1])["conf"] == {"k": "v"}


def test_a_replaced_file_loses_its_stale_checksum(tmp_path: Path) -> None:
    _offsets(tmp_path, 0, '{"logOffset":0}')
    crc = tmp_path / "offsets" / ".0.crc"
    crc.write_bytes(b"stale")
    ranges.write(tmp_path, ranges.InputRange(0, 0, 0, ('{"logOffset":0}',), None), {})
    assert not crc.exists()


def test_what_is_transient() -> None:
    assert transient(sqlite3.OperationalError("database is locked"))
    assert transient(RuntimeError("FATAL: terminating connection due to administrator command"))
    try:
        try:
            raise ConnectionError("server closed the connection unexpectedly")
        except ConnectionError:
            raise PostgresError("batch 3 failed in PostgreSQL: lost") from None
    except PostgresError as exc:
        assert transient(exc)  # found in the error it was raised from
    assert transient(sqlite3.OperationalError("no such table: t")) is None
    assert transient(BatchRejectedError("database is locked, and a null key")) is None
    assert transient(ValueError("wrong password")) is None
    try:  # psycopg reports a wrong password as an OperationalError: it is not an outage
        try:
            raise ConnectionError('FATAL:  password authentication failed for user "app"')
        except ConnectionError:
            raise PostgresError("cannot connect to PostgreSQL") from None
    except PostgresError as exc:
        assert transient(exc) is None
    assert transient(RuntimeError('connection refused; database "app" does not exist')) is None


def test_retrying_runs_again_while_transient_and_logs_each_retry(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise sqlite3.OperationalError("database is locked")
        return "done"

    with caplog.at_level(logging.WARNING, logger="onceflow.retry"):
        assert retrying("batch 4: the sink's commit", 30, flaky) == "done"
    assert len(calls) == 3
    said = [r.getMessage().split(" failed")[0] for r in caplog.records]
    assert said == ["onceflow: batch 4: the sink's commit"] * 2

    def wrong() -> None:
        calls.append(1)
        raise ValueError("a missing column")

    calls.clear()
    with pytest.raises(ValueError):
        retrying("x", 30, wrong)
    assert len(calls) == 1
    with pytest.raises(sqlite3.OperationalError):
        retrying("x", 0, lambda: (_ for _ in ()).throw(sqlite3.OperationalError("database is locked")))


def test_a_recorded_archive_is_adopted_once_its_driver_is_gone(tmp_path: Path) -> None:
    archive = tmp_path / "spark-driver.jsa"
    old = time.time() - 3600
    gone = tmp_path / f".{archive.name}.999999999.dump"
    alive = tmp_path / f".{archive.name}.{os.getppid()}.dump"
    for p in (gone, alive):
        p.write_bytes(b"archive")
        os.utime(p, (old, old))
    fresh = tmp_path / f".{archive.name}.999999998.dump"
    fresh.write_bytes(b"still being written")
    jvmstart.adopt_recorded(archive)
    assert archive.read_bytes() == b"archive" and not gone.exists()
    assert alive.exists() and fresh.exists()  # its driver runs / it may still be written
