"""The marker's ``rejected_rows`` reaches databases an older onceflow made, and the rejects command's answers.

No JVM: the SQLite marker table as onceflow made it before bad records were counted (and before
its metrics were nullable), and the ``onceflow rejects`` command on a rejects table written here.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from click.testing import CliRunner

from onceflow.cli.main import cli
from onceflow.engine.rejects import COLUMNS, stop_message
from onceflow.sinks._core.marker import BatchStats
from onceflow.sinks.sqlite.db import read_batches
from onceflow.sinks.sqlite.sink import SQLiteTablesSink

OLD = ("CREATE TABLE onceflow_batches(sink_id TEXT NOT NULL, batch_id INTEGER NOT NULL, committed_ms INTEGER "
       "NOT NULL, input_rows INTEGER NOT NULL, late_dropped INTEGER NOT NULL, duplicates_dropped INTEGER NOT "
       "NULL, events_counted INTEGER NOT NULL, rows_written INTEGER NOT NULL, late_watermark_ms INTEGER NOT "
       "NULL, PRIMARY KEY(sink_id, batch_id))")


def test_an_older_marker_table_gets_rejected_rows_and_keeps_its_rows(tmp_path: Path) -> None:
    import pyarrow as pa

    from onceflow.sinks._core.tables import Table

    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    conn.execute(OLD)
    conn.execute("INSERT INTO onceflow_batches VALUES ('default', 0, 1, 10, 0, 0, 10, 10, 0)")
    conn.commit()
    conn.close()
    sink = SQLiteTablesSink(db, staged=False)
    sink.bind("q")
    sink.commit_tables(1, {"t": pa.table({"a": [1, 2]})}, {"t": Table()}, BatchStats(5, 0, 0, 1, 2), 2)
    sink.close()
    rows = read_batches(db, "default")
    assert [(r["batch_id"], r["input_rows"], r["rejected_rows"]) for r in rows] == [(0, 10, None), (1, 5, 2)]


def test_the_stop_message_names_coordinates_rule_and_fix() -> None:
    kafka = stop_message(3, 2, {"topic": "orders", "partition": 1, "offset": 42, "rule": "parse",
                                "reason": "value is not a JSON object", "value": "x" * 500})
    assert "topic 'orders' partition 1 offset 42" in kafka and "rejects='table_name'" in kafka
    assert "x" * 200 + "..." in kafka and "x" * 201 not in kafka
    files = stop_message(0, 1, {"topic": None, "file": "file:/in/a.json", "row": 7, "rule": "id",
                                "reason": "id column 'id' is null or empty", "value": "{}"})
    assert "file file:/in/a.json row 7" in files and "rule 'id'" in files


def test_the_rejects_command_lists_per_batch_and_prints_records(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    conn = sqlite3.connect(db)
    conn.execute(f"CREATE TABLE bad({', '.join(chr(34) + c + chr(34) for c in COLUMNS)})")
    rows = [("t/0/5", 0, "t", 0, 5, None, None, "k", "oops", "[]", "parse", "value", "not JSON"),
            ("t/0/9", 1, "t", 0, 9, None, None, "k", "{}", "[]", "id", "order_id", "null id"),
            ("t/1/2", 1, "t", 1, 2, None, None, "k", "{}", "[]", "id", "order_id", "null id")]
    conn.executemany(f"INSERT INTO bad VALUES ({', '.join('?' * len(COLUMNS))})", rows)
    conn.commit()
    conn.close()
    runner = CliRunner()
    summary = runner.invoke(cli, ["rejects", "--db", str(db), "--table", "bad"])
    assert summary.exit_code == 0 and "3 rejected records in 2 batches" in summary.output, summary.output
    listed = runner.invoke(cli, ["rejects", "--db", str(db), "--table", "bad", "--batch", "1", "--records"])
    assert [json.loads(line)["record"] for line in listed.output.splitlines()] == ["t/0/9", "t/1/2"]
    none = runner.invoke(cli, ["rejects", "--table", "bad"])
    assert none.exit_code != 0 and "exactly one of --db" in str(none.exception or none.output)
    missing = runner.invoke(cli, ["rejects", "--db", str(db), "--table", "nope"])
    assert missing.exit_code != 0 and "cannot read table 'nope'" in str(missing.exception or missing.output)
