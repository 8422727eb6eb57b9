"""The SQLite sink stores every value as given, or refuses the batch naming table, column, key and value."""

from __future__ import annotations

import decimal
import sqlite3
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from onceflow.errors import BatchRejectedError, ConfigError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.sqlite.sink import SQLiteTablesSink
from tests.sinks.test_sqlite import q

STATS = BatchStats(2, 0, 0)
I64_MAX = 2**63 - 1


def sink_at(tmp_path: Path) -> SQLiteTablesSink:
    sink = SQLiteTablesSink(tmp_path / "app.db")
    sink.bind("q1")
    return sink


def test_zero_and_negative_zero_are_one_key(tmp_path: Path) -> None:
    sink = sink_at(tmp_path)
    rows = pa.table({"k": [0.0, -0.0], "v": [1, 2]})
    with pytest.raises(BatchRejectedError, match=r"'t': key \{'k': 0.0\} appears more than once.*"
                                                 r"-0.0 are one key"):
        sink.commit_tables(0, {"t": rows}, {"t": Table(key="k")}, STATS, 2)
    assert q(tmp_path / "app.db", "SELECT name FROM sqlite_master WHERE name = 't'") == []


def test_a_nan_key_is_refused(tmp_path: Path) -> None:
    sink = sink_at(tmp_path)
    rows = pa.table({"k": [1.0, float("nan")], "v": [1, 2]})
    with pytest.raises(BatchRejectedError, match=r"key column 'k' is NaN in row 1"):
        sink.commit_tables(0, {"t": rows}, {"t": Table(key="k")}, STATS, 2)


@pytest.mark.parametrize(("column", "message"), [
    (pa.array([1.5, float("nan")]), r"column 'v' of the row with key \{'k': 2\} holds nan, which is NaN"),
    (pa.array([1.5, -0.0]), r"column 'v' of the row with key \{'k': 2\} holds -0.0, which is -0.0"),
    (pa.array([1.5, -0.0], pa.float32()), r"holds -0.0, which is -0.0"),
    (pa.array([decimal.Decimal("1.50"), decimal.Decimal("123456789012345678.91")], pa.decimal128(21, 2)),
     r"holds Decimal\('123456789012345678.91'\), which has more digits than a SQLite REAL"),
    (pa.array([1, I64_MAX + 5], pa.uint64()), r"is above SQLite's largest integer"),
])
def test_values_sqlite_would_change_are_refused(tmp_path: Path, column: pa.Array, message: str) -> None:
    sink = sink_at(tmp_path)
    rows = pa.table({"k": [1, 2], "v": column})
    with pytest.raises(BatchRejectedError, match=message) as err:
        sink.commit_tables(0, {"t": rows}, {"t": Table(key="k")}, STATS, 2)
    assert "'t'" in str(err.value) and "nothing of the batch was written" in str(err.value)
    assert sink.batches() == []


def test_values_it_can_hold_come_back_exactly(tmp_path: Path) -> None:
    sink = sink_at(tmp_path)
    decimals = [decimal.Decimal("0.10"), decimal.Decimal("-99.99"), None]
    rows = pa.table({"k": [1, 2, 3], "f": [float("inf"), float("-inf"), 5e-324],
                     "s": ["a\x00b", "ünïcødé " * 100, ""], "i": pa.array([I64_MAX, -(2**63), 0], pa.int64()),
                     "d": pa.array(decimals, pa.decimal128(10, 2))})
    assert sink.commit_tables(0, {"t": rows}, {"t": Table(key="k")}, STATS, 3)
    sink.flush()
    got = q(tmp_path / "app.db", "SELECT k, f, s, i, d FROM t ORDER BY k")
    assert got == [(1, float("inf"), "a\x00b", I64_MAX, 0.1),
                   (2, float("-inf"), "ünïcødé " * 100, -(2**63), -99.99), (3, 5e-324, "", 0, None)]
    ddl = q(tmp_path / "app.db", "SELECT sql FROM sqlite_master WHERE name = 't'")[0][0]
    assert ddl.endswith("WITHOUT ROWID, STRICT")


@pytest.mark.parametrize("staged", [True, False])
def test_an_add_column_past_64_bits_is_refused_naming_the_key(tmp_path: Path, staged: bool) -> None:
    sink = SQLiteTablesSink(tmp_path / "app.db", staged=staged)
    sink.bind("q1")
    spec = {"t": Table(key="k", add="n")}
    first = pa.table({"k": ["a", "b"], "n": pa.array([I64_MAX - 10, 5], pa.int64())})
    assert sink.commit_tables(0, {"t": first}, spec, STATS, 2)
    ten = pa.table({"k": ["a"], "n": pa.array([10], pa.int64())})
    assert sink.commit_tables(1, {"t": ten}, spec, STATS, 1)
    over = pa.table({"k": ["b", "a"], "n": pa.array([1, 1], pa.int64())})
    with pytest.raises(BatchRejectedError, match=r"add column 'n' of the row with key \{'k': 'a'\} would "
                                                 rf"become {I64_MAX} \+ 1 = {I64_MAX + 1}, outside"):
        sink.commit_tables(2, {"t": over}, spec, STATS, 2)
    sink.flush()
    assert q(tmp_path / "app.db", "SELECT k, n, typeof(n) FROM t ORDER BY k") == [
        ("a", I64_MAX, "integer"), ("b", 5, "integer")]
    assert [m["batch_id"] for m in sink.batches()] == [0, 1]
    sink.close()
    again = SQLiteTablesSink(tmp_path / "app.db")  # a new process reads the bounds from the table
    again.bind("q1")
    with pytest.raises(BatchRejectedError, match="would become"):
        again.commit_tables(2, {"t": over}, spec, STATS, 2)
    one = pa.table({"k": ["b"], "n": pa.array([1], pa.int64())})
    assert again.commit_tables(2, {"t": one}, spec, STATS, 1)
    again.flush()
    assert q(tmp_path / "app.db", "SELECT k, n FROM t ORDER BY k") == [("a", I64_MAX), ("b", 6)]


def test_a_column_of_another_type_than_the_table_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    sink = sink_at(tmp_path)
    spec = {"t": Table(key="k")}
    assert sink.commit_tables(0, {"t": pa.table({"k": [1], "v": pa.array([7], pa.int64())})}, spec, STATS, 1)
    sink.close()
    with sqlite3.connect(db) as c:  # an older onceflow's table: not STRICT, INTEGER affinity
        c.execute('CREATE TABLE "old"("k" INTEGER, "v" INTEGER, PRIMARY KEY("k")) WITHOUT ROWID')
    for table in ("t", "old"):
        again = SQLiteTablesSink(db)
        again.bind("q1")
        text = pa.table({"k": [2], "v": ["not-a-number"]})
        with pytest.raises(ConfigError, match=rf"table '{table}' in .*app.db: column 'v' is declared "
                                              "INTEGER .* the batch's 'v' is string, stored as TEXT"):
            again.check({table: Table(key="k")}, {table: text.schema})
        with pytest.raises(ConfigError, match="is declared INTEGER"):
            again.commit_tables(1, {table: text}, {table: Table(key="k")}, STATS, 1)
        again.close()
    assert q(db, "SELECT k, v, typeof(v) FROM t") == [(1, 7, "integer")]
    assert q(db, "SELECT count(*) FROM old") == [(0,)]


def test_an_older_onceflows_table_still_takes_the_staged_path(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as c:  # what onceflow created before its tables were STRICT
        c.execute('CREATE TABLE "t"("k" TEXT, "n" INTEGER, PRIMARY KEY("k")) WITHOUT ROWID')
    sink = SQLiteTablesSink(db)
    sink.bind("q1")
    spec = {"t": Table(key="k", add="n")}
    gate = threading.Event()  # the apply thread kept busy: the staged batch waits (else it may be
    sink._apply_thread().submit(gate.wait, 60)  # applied before the check: seen under load)
    assert sink.commit_tables(0, {"t": pa.table({"k": ["a"], "n": [1]})}, spec, STATS, 1)
    assert sink.staged_batches() == [0]
    gate.set()
    sink.flush()
    assert q(db, "SELECT k, n FROM t") == [("a", 1)]


def test_a_database_that_cannot_be_opened_is_named(tmp_path: Path) -> None:
    from onceflow.errors import StorageError

    folder = tmp_path / "app.db"
    folder.mkdir()  # a directory where the database file should be
    with pytest.raises(StorageError, match=rf"cannot open the SQLite database {folder}: unable to open"):
        SQLiteTablesSink(folder).bind("q1")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database, " * 100)
    with pytest.raises(StorageError, match=rf"cannot open the SQLite database {junk}: file is not a "
                                           "database"):
        SQLiteTablesSink(junk).bind("q1")
