from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from onceflow.errors import ConfigError, CrashPointError, SinkApplyError
from onceflow.faults import CRASH_ENV, CrashPoint, armed
from onceflow.sinks.base import BatchStats
from onceflow.sinks.sqlite import SQLiteSink, read_batches, read_counts, read_staged


def _deltas(rows: list[tuple[str, int, int]]) -> pa.Table:
    return pa.table({
        "user": [r[0] for r in rows],
        "window_start_ms": pa.array([r[1] for r in rows], pa.int64()),
        "window_end_ms": pa.array([r[1] + 60_000 for r in rows], pa.int64()),
        "count": pa.array([r[2] for r in rows], pa.int64()),
    })


B0 = _deltas([("a", 0, 3), ("b", 0, 2), ("a", 60_000, 1)])
B1 = _deltas([("a", 60_000, 4), ("c", 120_000, 5)])
STATS = BatchStats(input_rows=20, late_dropped=2, late_watermark_ms=0)


# The commit contract itself is tested against every backend in tests/contract.


def test_marker_records_counted_and_duplicates(tmp_path: Path) -> None:
    sink = SQLiteSink(tmp_path / "db.sqlite")
    sink.bind("q1")
    assert sink.commit_batch(0, B0, STATS)
    assert sink.commit_batch(1, B1, STATS)
    sink.flush()
    batches = read_batches(tmp_path / "db.sqlite")
    assert [b["batch_id"] for b in batches] == [0, 1]
    assert batches[0]["events_counted"] == 6
    assert batches[0]["duplicates_dropped"] == 20 - 2 - 6
    assert batches[0]["late_dropped"] == 2


def test_naive_sink_double_counts_a_replay(tmp_path: Path) -> None:
    sink = SQLiteSink(tmp_path / "db.sqlite", mode="naive")
    sink.bind("q1")
    assert sink.commit_batch(0, B0, STATS)
    assert sink.commit_batch(0, B0, STATS)
    assert read_counts(tmp_path / "db.sqlite")[0][("a", 0)] == 6


def test_bad_mode_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        SQLiteSink(tmp_path / "x", mode="sometimes")  # type: ignore[arg-type]


def test_crash_point_env_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CRASH_ENV, raising=False)
    assert armed() is None
    monkeypatch.setenv(CRASH_ENV, "after_sink_commit@3")
    assert armed() == (CrashPoint.AFTER_SINK_COMMIT, 3)
    monkeypatch.setenv(CRASH_ENV, "after_lunch")
    with pytest.raises(CrashPointError, match="before_sink_write"):
        armed()


def test_fixed_schema_columns_and_keys(tmp_path: Path) -> None:
    import sqlite3

    SQLiteSink(tmp_path / "db.sqlite").bind("q1")
    conn = sqlite3.connect(tmp_path / "db.sqlite")
    cols = {t: [(r[1], r[2], r[5]) for r in conn.execute(f"PRAGMA table_info({t})")]
            for t in ("user_counts", "global_counts")}
    conn.close()
    assert cols["user_counts"] == [("user", "TEXT", 1), ("window_start_ms", "INTEGER", 2),
                                   ("window_end_ms", "INTEGER", 0), ("count", "INTEGER", 0)]
    assert cols["global_counts"] == [("window_start_ms", "INTEGER", 1),
                                     ("window_end_ms", "INTEGER", 0), ("count", "INTEGER", 0)]


def test_database_with_rowid_tables_from_an_earlier_version_keeps_working(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "db.sqlite"
    conn = sqlite3.connect(db)  # the tables as the first releases created them
    conn.executescript(
        "CREATE TABLE user_counts(user TEXT, window_start_ms INTEGER, window_end_ms INTEGER, "
        "count INTEGER, PRIMARY KEY(user, window_start_ms));"
        "INSERT INTO user_counts VALUES ('a', 0, 60000, 10);")
    conn.close()
    sink = SQLiteSink(db)
    sink.bind("q1")
    assert sink.commit_batch(0, B0, STATS)
    assert sink.commit_batch(1, B1, STATS)
    sink.close()
    users, glob = read_counts(db)
    assert users == {("a", 0): 13, ("b", 0): 2, ("a", 60_000): 5, ("c", 120_000): 5}
    assert glob == {0: 5, 60_000: 5, 120_000: 5}


def test_staged_batch_that_cannot_be_applied_is_kept_and_applied_by_the_restart(
        tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "db.sqlite"
    sink = SQLiteSink(db)
    sink.bind("q1")
    assert sink.commit_batch(0, B0, STATS)
    sink.flush()
    with sqlite3.connect(db) as conn:  # every insert of window 120000 fails
        conn.execute("CREATE TRIGGER boom BEFORE INSERT ON user_counts "
                     "WHEN NEW.window_start_ms = 120000 BEGIN SELECT RAISE(ABORT, 'boom'); END")
    assert sink.commit_batch(1, B1, STATS)  # staged: Spark may now write its commit log
    with pytest.raises(SinkApplyError, match=r"batch 1 .*safely staged.*boom.*restart"):
        sink.commit_batch(2, B0, STATS)  # the next batch reports it (and is not taken)
    sink.close()  # reported once; closing leaves the staged batch where it is
    assert read_counts(db)[0] == {("a", 0): 3, ("b", 0): 2, ("a", 60_000): 1}
    assert read_staged(db) == [1]
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TRIGGER boom")
    again = SQLiteSink(db)  # the restart applies the staged batch before anything else
    again.bind("q1")
    assert read_counts(db)[0] == {("a", 0): 3, ("b", 0): 2, ("a", 60_000): 5, ("c", 120_000): 5}
    assert [b["batch_id"] for b in read_batches(db)] == [0, 1]
    assert not again.commit_batch(1, B1, STATS)  # Spark's replay of 1, if any, is a no-op
    again.close()
    assert read_counts(db)[1] == {0: 5, 60_000: 5, 120_000: 5}
