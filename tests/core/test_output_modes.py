"""Output modes, merge tables and start-up checks of ``write_stream``, on a click stream (real Spark).

The click pipeline (:mod:`tests.core.clicks`) is written three ways — per-batch partial
aggregates merged by the sink, Spark's aggregation in ``update`` mode, and in ``append`` mode
with an explicit drain — and each is compared with a recomputation from the input files.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import onceflow
from onceflow import Table
from tests.core import clicks

pytestmark = pytest.mark.spark


@pytest.fixture
def utc(spark: Any) -> Any:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark


@pytest.mark.parametrize("style", ["deltas", "update"])
def test_both_styles_equal_the_recomputation_at_every_run(utc: Any, tmp_path: Path, style: str) -> None:
    inputs, db = tmp_path / "in", tmp_path / "app.db"
    rows = clicks.generate(inputs, 1_500, per_file=300, seed=4)
    clicks.start(utc, style, inputs, onceflow.sqlite(db), tmp_path / "ck").awaitTermination()
    # every window, also those still open when the input stops, is in the table
    assert clicks.read_table("sqlite", str(db)) == clicks.recompute(inputs)
    rows += clicks.generate(inputs, 900, per_file=300, first=1_500, seed=4)
    clicks.start(utc, style, inputs, onceflow.sqlite(db), tmp_path / "ck").awaitTermination()
    assert clicks.read_table("sqlite", str(db)) == clicks.recompute(inputs)
    with sqlite3.connect(db) as c:
        m = c.execute("SELECT sum(input_rows), sum(late_dropped), sum(duplicates_dropped), "
                      "count(duplicates_dropped) = count(*) FROM onceflow_batches").fetchone()
    distinct = sum(v[0] for v in clicks.recompute(inputs).values())
    assert m == (rows, 0, rows - distinct, 1)  # every batch knows its duplicates: the dedup's own count


def test_append_mode_leaves_open_windows_until_the_documented_drain(
        utc: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    inputs, db = tmp_path / "in", tmp_path / "app.db"
    clicks.generate(inputs, 1_200, per_file=400, seed=5)
    clicks.start(utc, "append", inputs, onceflow.sqlite(db), tmp_path / "ck").awaitTermination()
    assert "output_mode='append' over an event-time aggregation" in capfd.readouterr().err
    expected = clicks.recompute(inputs)
    got = clicks.read_table("sqlite", str(db))
    assert set(got) < set(expected) and all(got[k] == expected[k] for k in got)  # final windows only
    last = max(pq.read_table(inputs)["ts"].to_pylist())
    clicks.write_flush(inputs, last)  # the drain: one row past every open window, filtered out
    clicks.start(utc, "append", inputs, onceflow.sqlite(db), tmp_path / "ck").awaitTermination()
    assert clicks.read_table("sqlite", str(db)) == expected


def test_output_mode_mistakes_are_refused_before_the_query_starts(utc: Any, tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    clicks.generate(inputs, 50, per_file=50)
    clean = clicks._clean(utc, inputs, 1)
    agg = clicks._aggregate(clean)
    sink = onceflow.sqlite(tmp_path / "a.db")
    with pytest.raises(onceflow.ConfigError, match=r"'updte' is not one of .*did you mean 'update'"):
        onceflow.write_stream(agg, sink, tmp_path / "ck", {"clicks": Table(key=clicks.KEY)},
                              output_mode="updte")
    with pytest.raises(onceflow.ConfigError, match=r"would count it again: use Table\(key=\[...\]\)"):
        onceflow.write_stream(agg, sink, tmp_path / "ck",
                              {"clicks": Table(key=clicks.KEY, add=["clicks"])}, output_mode="update")
    with pytest.raises(onceflow.ConfigError, match="Spark refuses to start this query: .*[Cc]omplete"):
        onceflow.write_stream(clean, sink, tmp_path / "ck2", {"c": Table()}, output_mode="complete")
    assert not utc.streams.active


def test_a_missing_key_column_is_refused_at_start_not_at_the_first_batch(utc: Any, tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    clicks.generate(inputs, 50, per_file=50)
    clean = clicks._clean(utc, inputs, 1)
    sink = onceflow.sqlite(tmp_path / "a.db")
    missing = r"table 'clicks': its spec names column\(s\) \['window'\]"
    with pytest.raises(onceflow.ConfigError, match=missing):
        onceflow.write_stream(clean, sink, tmp_path / "ck",
                              {"clicks": Table(key=["page", "window"], add=["clicks"])},
                              per_batch=clicks._per_batch_deltas)
    with pytest.raises(onceflow.ConfigError, match=r"its spec names column\(s\) \['latency'\]"):
        onceflow.write_stream(clean, sink, tmp_path / "ck", {"raw": Table(key="click_id", max="latency")})
    with sqlite3.connect(tmp_path / "a.db") as c:  # a table that exists with another key
        c.execute("CREATE TABLE clicks(page TEXT PRIMARY KEY, window_start TEXT, clicks INTEGER, "
                  "worst_ms INTEGER, best_ms INTEGER)")
    with pytest.raises(onceflow.ConfigError, match=r"has primary key \['page'\]"):
        clicks.start(utc, "deltas", inputs, sink, tmp_path / "ck")
    assert not utc.streams.active and not (tmp_path / "ck" / "commits").exists()


def test_per_batch_returning_an_unknown_table_is_refused_at_start(utc: Any, tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    clicks.generate(inputs, 20, per_file=20)
    clean = clicks._clean(utc, inputs, 1)
    with pytest.raises(onceflow.ConfigError, match=r"returns rows for table\(s\) \['clickz'\]"):
        onceflow.write_stream(clean, onceflow.sqlite(tmp_path / "a.db"), tmp_path / "ck",
                              {"clicks": Table(key=clicks.KEY)}, per_batch=lambda df: {"clickz": df})
