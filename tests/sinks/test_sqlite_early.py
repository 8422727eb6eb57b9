"""The SQLite sink's early copy: scratch files copied while later tasks still write (no Spark here).

Scratch files are made as a task makes them (``tasks._Scratch``, renamed once complete) in the
folder an :class:`EarlyCopy` watches; the sink's T4 (:meth:`SQLiteTablesSink.apply_files`) then
gets the messages of the attempts "Spark kept". The oracle is the rows this test generated, read
back with Python's ``sqlite3``.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from onceflow.errors import ConfigError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.sqlite.early import EarlyCopy, FilesGone
from onceflow.sinks.sqlite.sink import SQLiteTablesSink
from onceflow.sinks.sqlite.tasks import _Scratch, scratch_name
from onceflow.sinks.sqlite.values import stored_array

SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string())])


def _rows(first: int, n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(first, first + n), pa.int64()),
                     "k": [f"k{i % 7}" for i in range(first, first + n)]}, schema=SCHEMA)


def _scratch(folder: Path, table: str, partition: int, attempt: int, rows: pa.Table) -> dict[str, Any]:
    """A task attempt's complete scratch file of ``rows`` (written under ``.part``, then renamed)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / scratch_name(table, partition, attempt)
    part = path.with_name(path.name + ".part")
    scratch = _Scratch(part, rows.schema)
    scratch.add(pa.table([stored_array(rows.column(c)) for c in rows.column_names], names=rows.column_names))
    scratch.commit()
    scratch.close()
    part.replace(path)
    return {"path": str(path), "rows": rows.num_rows, "extents": {}}


def _copied(early: EarlyCopy, made: dict[str, Any]) -> dict[str, Any]:
    """``made`` (a complete scratch file) once the early copy has copied it."""
    deadline = time.monotonic() + 20
    while made["path"] not in early.copied:
        assert early.error is None, early.error
        assert time.monotonic() < deadline, "the early copy never took the complete file"
        time.sleep(0.02)
    return made


def _ids(db: Path, table: str = "t") -> list[int]:
    with sqlite3.connect(db) as c:
        return sorted(r[0] for r in c.execute(f"SELECT id FROM {table}"))


@pytest.fixture
def sink(tmp_path: Path) -> Any:
    made = SQLiteTablesSink(tmp_path / "app.db", sink_id="s", collect_below=0)
    made.bind("q")
    yield made
    made.close()


def _early(sink: SQLiteTablesSink, tmp_path: Path) -> tuple[Path, EarlyCopy]:
    """An early copy of batch 0 watching ``tmp_path / "stage"``."""
    folder = tmp_path / "stage"
    return folder, EarlyCopy(sink, 0, folder)


def _attached(sink: SQLiteTablesSink) -> list[str]:
    return [r[1] for r in sink.conn.execute("PRAGMA database_list")]


def test_a_file_copied_early_is_invisible_until_the_batch_commits_with_the_rest(
        sink: SQLiteTablesSink, tmp_path: Path) -> None:
    folder, early = _early(sink, tmp_path)
    with early.watching("t", Table(), SCHEMA):
        first = _copied(early, _scratch(folder, "t", 0, 0, _rows(0, 500)))
        assert not Path(first["path"]).exists()  # read into memory, copied, removed
        with sqlite3.connect(sink.path) as reader:  # the copy is inside the batch's open transaction
            assert not reader.execute("SELECT 1 FROM sqlite_master WHERE name = 't'").fetchone()
            assert not reader.execute("SELECT 1 FROM onceflow_batches").fetchone()
    second = _scratch(folder, "t", 1, 0, _rows(500, 300))  # after its table's tasks: copied in T4
    found = {"t": (SCHEMA, [first, second])}
    assert sink.apply_files(0, found, {"t": Table()}, BatchStats(800, 0, 0), 800, early=early)
    early.close()
    assert _ids(sink.path) == list(range(800))
    assert [m["batch_id"] for m in sink.batches()] == [0]
    assert _attached(sink) == ["main"] and not sink.conn.in_transaction


def test_a_file_of_an_attempt_spark_did_not_keep_is_rolled_back_and_each_row_counts_once(
        sink: SQLiteTablesSink, tmp_path: Path) -> None:
    folder, early = _early(sink, tmp_path)
    with early.watching("t", Table(key="id", mode="upsert"), SCHEMA):
        _copied(early, _scratch(folder, "t", 0, 0, _rows(0, 400)))  # complete, then its attempt was killed
    retry = _scratch(folder, "t", 0, 1, _rows(0, 400))  # after the table's tasks: T4 copies them
    other = _scratch(folder, "t", 1, 0, _rows(400, 100))
    found = {"t": (SCHEMA, [retry, other])}
    assert sink.apply_files(0, found, {"t": Table(key="id", mode="upsert")}, BatchStats(500, 0, 0), 500,
                            early=early)
    early.close()
    assert _ids(sink.path) == list(range(500))
    assert _attached(sink) == ["main"] and not sink.conn.in_transaction


def test_a_rollback_after_a_kept_file_was_removed_asks_for_the_tasks_again(
        sink: SQLiteTablesSink, tmp_path: Path) -> None:
    """The early copy took a kept file (and removed it) and a dead attempt's: T4 cannot copy the kept one."""
    folder, early = _early(sink, tmp_path)
    with early.watching("t", Table(), SCHEMA):
        kept = _copied(early, _scratch(folder, "t", 1, 0, _rows(400, 100)))
        _copied(early, _scratch(folder, "t", 0, 0, _rows(0, 400)))  # a dead attempt's
    retry = _scratch(folder, "t", 0, 1, _rows(0, 400))
    with pytest.raises(FilesGone, match="removed 1 kept scratch file"):
        sink.apply_files(0, {"t": (SCHEMA, [retry, kept])}, {"t": Table()}, BatchStats(500, 0, 0), 500,
                         early=early)
    early.close()
    assert sink.batches() == []
    with sqlite3.connect(sink.path) as c:  # rolled back: the table the early copy made is gone too
        assert not c.execute("SELECT 1 FROM sqlite_master WHERE name = 't'").fetchone()
    assert _attached(sink) == ["main"] and not sink.conn.in_transaction


def test_an_append_table_without_the_check_gets_a_dead_attempts_rows_twice(tmp_path: Path) -> None:
    """The control: without step 3's check (every copied file kept as it is), rows count twice."""

    class Trusting(EarlyCopy):
        def hand_over(self, found: Any) -> set[str]:
            self._halt()
            self._owns = False
            return set(self.copied)

    made = SQLiteTablesSink(tmp_path / "app.db", sink_id="s", collect_below=0)
    folder = tmp_path / "stage"
    early = Trusting(made, 0, folder)
    with early.watching("t", Table(), SCHEMA):
        _copied(early, _scratch(folder, "t", 0, 0, _rows(0, 50)))  # a dead attempt's
        retry = _scratch(folder, "t", 0, 1, _rows(0, 50))
    made.apply_files(0, {"t": (SCHEMA, [retry])}, {"t": Table()}, BatchStats(50, 0, 0), 50, early=early)
    early.close()
    assert len(_ids(made.path)) == 100
    made.close()


def test_a_replayed_batch_copied_early_is_rolled_back(sink: SQLiteTablesSink, tmp_path: Path) -> None:
    once = _scratch(tmp_path / "a", "t", 0, 0, _rows(0, 200))
    assert sink.apply_files(0, {"t": (SCHEMA, [once])}, {"t": Table()}, BatchStats(200, 0, 0), 200)
    folder = tmp_path / "b"
    early = EarlyCopy(sink, 0, folder)
    with early.watching("t", Table(), SCHEMA):
        again = _copied(early, _scratch(folder, "t", 0, 0, _rows(0, 200)))
    assert not sink.apply_files(0, {"t": (SCHEMA, [again])}, {"t": Table()}, BatchStats(200, 0, 0), 200,
                                early=early)
    early.close()
    assert _ids(sink.path) == list(range(200))
    assert _attached(sink) == ["main"] and not sink.conn.in_transaction


def test_an_error_in_the_early_copy_leaves_the_batch_to_t4_which_says_it(sink: SQLiteTablesSink,
                                                                         tmp_path: Path) -> None:
    sink.conn.execute("CREATE TABLE t (id INTEGER)")  # no column k: the table check refuses the batch
    folder, early = _early(sink, tmp_path)
    with early.watching("t", Table(), SCHEMA):
        made = _scratch(folder, "t", 0, 0, _rows(0, 10))
        deadline = time.monotonic() + 20
        while early.error is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert isinstance(early.error, ConfigError)
    with pytest.raises(ConfigError, match="'k'"):
        sink.apply_files(0, {"t": (SCHEMA, [made])}, {"t": Table()}, BatchStats(10, 0, 0), 10, early=early)
    early.close()
    assert sink.batches() == []
    assert _attached(sink) == ["main"] and not sink.conn.in_transaction


def test_an_add_table_waits_for_t4(sink: SQLiteTablesSink, tmp_path: Path) -> None:
    folder, early = _early(sink, tmp_path)
    spec = Table(key="id", add="n")
    schema = pa.schema([("id", pa.int64()), ("n", pa.int64())])
    with early.watching("sums", spec, schema):
        made = _scratch(folder, "sums", 0, 0, pa.table({"id": [1, 2], "n": [5, 6]}, schema=schema))
        made["extents"] = {"n": (5, 6)}
        time.sleep(0.5)
        assert early.copied == {}
    found = {"sums": (schema, [made])}
    assert sink.apply_files(0, found, {"sums": spec}, BatchStats(2, 0, 0), 2, early=early)
    early.close()
    with sqlite3.connect(sink.path) as c:
        assert dict(c.execute("SELECT id, n FROM sums")) == {1: 5, 2: 6}


def test_a_database_onceflow_creates_has_16k_pages_one_made_elsewhere_keeps_its_own(tmp_path: Path) -> None:
    made = SQLiteTablesSink(tmp_path / "new.db", sink_id="s", collect_below=0)
    made.bind("q")
    once = _scratch(tmp_path / "a", "t", 0, 0, _rows(0, 3000))
    assert made.apply_files(0, {"t": (SCHEMA, [once])}, {"t": Table()}, BatchStats(3000, 0, 0), 3000)
    made.close()
    with sqlite3.connect(tmp_path / "new.db") as c:
        assert c.execute("PRAGMA page_size").fetchone()[0] == 16384
    with sqlite3.connect(tmp_path / "old.db") as c:  # a user's database, SQLite's default pages
        c.execute("CREATE TABLE mine (x INTEGER)")
    theirs = SQLiteTablesSink(tmp_path / "old.db", sink_id="s", collect_below=0)
    theirs.bind("q")
    assert theirs.apply_files(0, {"t": (SCHEMA, [once])}, {"t": Table()}, BatchStats(3000, 0, 0), 3000)
    theirs.close()
    assert _ids(tmp_path / "old.db") == list(range(3000))
    with sqlite3.connect(tmp_path / "old.db") as c:
        assert c.execute("PRAGMA page_size").fetchone()[0] == 4096


def test_attached_files_stop_at_what_sqlite_attaches_with_a_clear_error(sink: SQLiteTablesSink,
                                                                         tmp_path: Path) -> None:
    """Python 3.10's way (files attached): the eleventh file is refused naming the fix; memory takes any."""
    from onceflow.errors import ConfigError
    from onceflow.sinks.sqlite.tasks import MAX_FILES, Scratches

    files = [_scratch(tmp_path / "stage", "t", p, 0, _rows(p * 10, 10))["path"] for p in range(MAX_FILES + 1)]
    attached = Scratches(sink.conn, memory=False)
    sink.conn.execute("BEGIN")
    for path in files[:MAX_FILES]:
        attached.open(path)
    with pytest.raises(ConfigError, match=r"more than 10 scratch files.*coalesce the batch to 10 partitions"):
        attached.open(files[-1])
    sink.conn.execute("ROLLBACK")
    attached.close()
    memory = Scratches(sink.conn, memory=True)
    sink.conn.execute("BEGIN")
    total = 0
    for path in files:
        total += sink.conn.execute(f"SELECT count(*) FROM {memory.open(path)}.rows").fetchone()[0]
    sink.conn.execute("ROLLBACK")
    memory.close()
    assert total == 10 * (MAX_FILES + 1)
    assert _attached(sink) == ["main"]
