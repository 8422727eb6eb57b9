"""The generic SQLite sink without Spark: modes, atomic multi-table batches, refusals."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path

import pyarrow as pa
import pytest

from onceflow.errors import BatchRejectedError, CheckpointMismatchError, ConfigError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.sqlite.sink import SQLiteTablesSink
from onceflow.verify.sinks import NaiveSQLiteSink

STATS = BatchStats(10, 1, 0, duplicates=7)
SPECS = {"revenue": Table(key=["account", "window_start"], add=["amount"]),
         "payments": Table(),
         "latest": Table(key="account")}
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def batch(rows: list[tuple[str, int, float]]) -> dict[str, pa.Table]:
    accounts = [r[0] for r in rows]
    starts = pa.array([T0 + dt.timedelta(minutes=r[1]) for r in rows], pa.timestamp("us", tz="UTC"))
    amounts = [r[2] for r in rows]
    return {"revenue": pa.table({"account": accounts, "window_start": starts, "amount": amounts}),
            "payments": pa.table({"account": accounts, "amount": amounts}),
            "latest": pa.table({"account": accounts, "amount": amounts})}


def q(path: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as c:
        return c.execute(sql).fetchall()


def test_modes_and_replays(tmp_path: Path) -> None:
    sink = SQLiteTablesSink(tmp_path / "app.db")
    sink.bind("q1")
    assert sink.commit_tables(0, batch([("a", 0, 1.5), ("b", 5, 2.0)]), SPECS, STATS, 2)
    assert not sink.commit_tables(0, batch([("a", 0, 1.5), ("b", 5, 2.0)]), SPECS, STATS, 2)  # replay
    assert sink.commit_tables(1, batch([("a", 0, 3.0), ("c", 5, 1.0)]), SPECS, STATS, 2)
    sink.flush()  # batch 1 was staged: applied beside the caller
    db = tmp_path / "app.db"
    assert q(db, "SELECT account, window_start, amount FROM revenue ORDER BY 1") == [
        ("a", "2026-01-01 00:00:00.000000", 4.5), ("b", "2026-01-01 00:05:00.000000", 2.0),
        ("c", "2026-01-01 00:05:00.000000", 1.0)]
    assert q(db, "SELECT count(*), sum(amount) FROM payments") == [(4, 7.5)]
    assert q(db, "SELECT account, amount FROM latest ORDER BY 1") == [("a", 3.0), ("b", 2.0), ("c", 1.0)]
    markers = sink.batches()
    assert [m["batch_id"] for m in markers] == [0, 1]
    assert markers[0]["input_rows"] == 10 and markers[0]["late_dropped"] == 1
    assert markers[0]["duplicates_dropped"] == 7 and markers[0]["rows_written"] == 6
    assert markers[0]["tables"] == '{"revenue": 2, "payments": 2, "latest": 2}'
    with pytest.raises(CheckpointMismatchError):
        sink.bind("another-checkpoint")
    names = {r[0] for r in q(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert names == {"revenue", "payments", "latest", "onceflow_batches", "onceflow_sinks", "onceflow_staged"}
    assert sink.staged_batches() == []


@pytest.mark.parametrize(("rows", "column", "row"), [
    ([("a", 0, 1.0), (None, 5, 2.0)], "account", 1),
    ([("a", 0, 1.0), ("b", 5, 2.0), ("c", 5, 2.0), (None, 5, 2.0)], "account", 3),
])
def test_a_null_key_refuses_the_whole_batch(tmp_path: Path, rows: list, column: str,
                                                        row: int) -> None:
    sink = SQLiteTablesSink(tmp_path / "app.db")
    sink.bind("q1")
    with pytest.raises(BatchRejectedError, match=f"column {column!r} is null in row {row}"):
        sink.commit_tables(0, batch(rows), SPECS, STATS, 2)
    assert sink.batches() == []
    assert q(tmp_path / "app.db", "SELECT name FROM sqlite_master WHERE name = 'payments'") == []  # no table
    assert sink.commit_tables(0, batch([("a", 0, 1.0)]), SPECS, STATS, 1)  # the fixed batch goes through


def test_duplicate_keys_and_non_numeric_add_columns_are_refused(tmp_path: Path) -> None:
    sink = SQLiteTablesSink(tmp_path / "app.db")
    with pytest.raises(BatchRejectedError, match="appears more than once"):
        sink.commit_tables(0, batch([("a", 0, 1.0), ("a", 0, 2.0)]), SPECS, STATS, 2)
    bad = {"revenue": pa.table({"account": ["a"], "window_start": [1], "amount": ["x"]})}
    with pytest.raises(BatchRejectedError, match="must be numeric"):
        sink.commit_tables(0, bad, SPECS, STATS, 1)
    odd = {"odd": Table(key=["count_all", "k"], add=["n"])}  # a key named like the check's count
    rows = pa.table({"count_all": [1, 2, 1], "k": ["x", "x", "x"], "n": [1, 1, 5]})
    with pytest.raises(BatchRejectedError, match=r"key \{'count_all': 1, 'k': 'x'\} appears more than once"):
        sink.commit_tables(0, {"odd": rows}, odd, STATS, 3)


def test_an_existing_table_that_does_not_fit_is_refused_before_writing(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE revenue(account TEXT, window_start TEXT, total REAL, PRIMARY KEY(account))")
    sink = SQLiteTablesSink(db)
    with pytest.raises(ConfigError, match=r"has no column\(s\) \['amount'\]"):
        sink.commit_tables(0, batch([("a", 0, 1.0)]), SPECS, STATS, 1)
    with sqlite3.connect(db) as c:
        c.execute("ALTER TABLE revenue ADD COLUMN amount REAL")
    with pytest.raises(ConfigError, match=r"primary key \['account'\]"):
        sink.commit_tables(0, batch([("a", 0, 1.0)]), SPECS, STATS, 1)
    assert sink.batches() == [] and q(db, "SELECT count(*) FROM revenue") == [(0,)]


def test_a_constraint_of_the_users_table_rolls_back_every_table(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE latest(account TEXT PRIMARY KEY, amount REAL CHECK (amount < 100))")
    sink = SQLiteTablesSink(db)
    with pytest.raises(BatchRejectedError, match="table 'latest': the batch breaks a constraint"):
        sink.commit_tables(0, batch([("a", 0, 1.0), ("b", 0, 500.0)]), SPECS, STATS, 2)
    assert q(db, "SELECT name FROM sqlite_master WHERE name IN ('revenue', 'payments')") == []
    assert sink.batches() == []


def test_negative_controls_write_twice_or_lose(tmp_path: Path) -> None:
    naive = NaiveSQLiteSink(tmp_path / "n.db")
    for _ in range(2):
        one = {"payments": batch([("a", 0, 1.0)])["payments"]}
        naive.commit_tables(0, one, {"payments": Table()}, STATS, 1)
    with pytest.raises(ConfigError, match="which tables= does not name"):
        naive.commit_tables(1, batch([("a", 0, 1.0)]), {"payments": Table()}, STATS, 1)
    assert q(tmp_path / "n.db", "SELECT count(*) FROM payments") == [(2,)]


@pytest.mark.parametrize(("kw", "message"), [
    ({"mode": "sum"}, "unknown table mode"),
    ({"mode": "upsert"}, "needs key"),
    ({"key": "k", "mode": "add"}, r"needs add=\[...\], max="),
    ({"key": "k", "add": "n", "max": "n"}, "more than one of add=, max=, min="),
    ({"max": "n"}, "needs key"),
    ({"key": "k", "ad": ["n"]}, r"'ad' \(did you mean 'add'\?\)"),
    ({"add": "n", "mode": "append"}, "are for mode .merge."),
    ({"key": "k", "add": "k"}, "both key and merged"),
])
def test_table_specs_are_checked_when_made(kw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Table(**kw)
    assert Table(key="k", add=["n"]).mode == "merge" and Table(key=["k"]).mode == "upsert"
    assert Table(key="k", add="n", mode="add").mode == "merge"  # the old name of the mode
    assert Table(key="k", max="hi", min=["lo"]).merged == {"hi": "max", "lo": "min"}


def test_a_staged_batch_keeps_its_specs_and_every_metric() -> None:
    from onceflow.sinks._core.marker import Amend
    from onceflow.sinks.sqlite.db import decode_staged, encode_staged

    specs = {"stats": Table(key="page", add="clicks", max="worst", min="best"), "raw": Table()}
    outputs = {"stats": pa.table({"page": ["a"], "clicks": [1], "worst": [2], "best": [0]}),
               "raw": pa.table({"page": ["a", "a"]})}
    stats = BatchStats(12, 3, 5_000, duplicates=4, rejected=1, input_range='{"sources": []}',
                       amend=Amend(6, 11, 2, None, span=11))  # the batch before's, from Spark Connect
    got_outputs, got_specs, got_stats, rows_out = decode_staged(*encode_staged(outputs, specs, stats, 5))
    assert got_specs == specs and got_stats == stats and rows_out == 5  # as recovery re-applies it
    assert all(got_outputs[n].equals(outputs[n]) for n in outputs)
