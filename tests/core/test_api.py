"""The public API on real Spark: the payments example, bad input, tables that do not fit."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import onceflow
from onceflow.checkpoint.logs import committed_batches
from onceflow.examples import payments
from tests.core.payments_oracle import actual, expected

pytestmark = pytest.mark.spark

SESSION_TZ = "UTC"


@pytest.fixture
def utc(spark: Any) -> Any:
    spark.conf.set("spark.sql.session.timeZone", SESSION_TZ)
    return spark


def _run(spark: Any, tmp: Path, **kw: Any) -> None:
    payments.start(spark, tmp / "in", tmp / "app.db", tmp / "ck", once=True, **kw).awaitTermination()


@pytest.mark.long  # make test's time: the payments example is proven in make test by
# tests/verify/test_pipeline_verify.py (onceflow.testing under faults) and resumed in test_api_crash.py
def test_payments_equal_a_batch_recomputation_and_resume(utc: Any, tmp_path: Path) -> None:
    payments.generate(tmp_path / "in", 6_000, per_file=500, duplicates=0.1, seed=3)
    _run(utc, tmp_path, max_files_per_trigger=4)
    payments.generate(tmp_path / "in", 2_000, per_file=500, duplicates=0.1, seed=3, first=6_000)
    _run(utc, tmp_path, max_files_per_trigger=4)
    rev, pays = expected(utc, tmp_path / "in")
    got_rev, got_pays, rows = actual(tmp_path / "app.db")
    assert got_rev == rev and got_pays == pays and rows == len(pays) == 8_000
    markers = onceflow.sqlite(tmp_path / "app.db").batches()
    assert sum(m["input_rows"] for m in markers) == sum(pq.read_metadata(f).num_rows
                                                         for f in (tmp_path / "in").glob("*.parquet"))
    assert sum(m["duplicates_dropped"] for m in markers) == sum(m["input_rows"] for m in markers) - 8_000
    assert sum(m["late_dropped"] for m in markers) == 0


def _write(path: Path, rows: list[tuple[Any, ...]]) -> None:
    pq.write_table(pa.table({"payment_id": [r[0] for r in rows], "account": [r[1] for r in rows],
                             "amount_cents": pa.array([r[2] for r in rows], pa.int64()),
                             "ts": pa.array([r[3] for r in rows], pa.timestamp("us", tz="UTC"))}), path)


def test_a_batch_with_a_null_key_fails_before_the_commit_log_then_restarts(utc: Any,
                                                                          tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    t = payments.START
    _write(tmp_path / "in" / "part-000000.parquet", [("p1", "a", 100, t), ("p2", "b", 200, t)])
    _run(utc, tmp_path)
    before = committed_batches(tmp_path / "ck")
    _write(tmp_path / "in" / "part-000001.parquet", [("p3", "a", 50, t), ("p4", None, 70, t)])
    with pytest.raises(onceflow.BatchRejectedError, match=r"key column 'account' is null in row \d"):
        _run(utc, tmp_path)
    assert committed_batches(tmp_path / "ck") == before  # Spark did not commit the bad batch
    assert [m["batch_id"] for m in onceflow.sqlite(tmp_path / "app.db").batches()] == before
    _write(tmp_path / "in" / "part-000001.parquet", [("p3", "a", 50, t), ("p4", "c", 70, t)])  # fixed
    _run(utc, tmp_path)
    assert actual(tmp_path / "app.db")[1] == {"p1": 100, "p2": 200, "p3": 50, "p4": 70}


def test_late_payments_are_dropped_and_counted(utc: Any, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    t = payments.START
    _write(tmp_path / "in" / "part-000000.parquet", [("p1", "a", 1, t + dt.timedelta(hours=1))])
    _run(utc, tmp_path)  # batch 0, then a no-data batch moves the watermark to 00:50
    _write(tmp_path / "in" / "part-000001.parquet",
           [("p2", "a", 2, t), ("p3", "a", 3, t + dt.timedelta(hours=1))])
    _run(utc, tmp_path)
    markers = onceflow.sqlite(tmp_path / "app.db").batches()
    assert sum(m["late_dropped"] for m in markers) == 1
    assert actual(tmp_path / "app.db")[1] == {"p1": 1, "p3": 3}


def test_an_existing_table_that_does_not_fit_is_a_clear_error(utc: Any, tmp_path: Path) -> None:
    payments.generate(tmp_path / "in", 100, per_file=100)
    with sqlite3.connect(tmp_path / "app.db") as c:
        c.execute("CREATE TABLE revenue(account TEXT PRIMARY KEY, amount_cents INTEGER, payments INTEGER)")
    with pytest.raises(onceflow.ConfigError, match=r"has no column\(s\) \['window_start'\]"):
        _run(utc, tmp_path)
    assert committed_batches(tmp_path / "ck") == []


def test_api_refuses_what_it_cannot_make_exactly_once(utc: Any, tmp_path: Path) -> None:
    df = utc.readStream.schema(payments.SCHEMA).parquet(str(tmp_path))
    with pytest.raises(onceflow.ConfigError, match="needs within"):
        onceflow.deduplicate(df, id="payment_id", event_time="ts", within=0)
    with pytest.raises(onceflow.ConfigError, match=r"no column\(s\) \['id'\]"):
        onceflow.deduplicate(df, id="id", event_time="ts", within="1 minute")
    with pytest.raises(onceflow.ConfigError, match="streaming DataFrame"):
        onceflow.write_stream(utc.range(3), onceflow.sqlite(tmp_path / "x.db"), tmp_path / "ck",
                              {"t": onceflow.Table()})
    with pytest.raises(onceflow.ConfigError, match="'tabels' \\(did you mean 'tables'\\?\\)"):
        onceflow.write_stream(df, onceflow.sqlite(tmp_path / "x.db"), tmp_path / "ck",  # type: ignore[call-arg]
                              tabels={"t": onceflow.Table()})
    with pytest.raises(onceflow.ConfigError, match="did you mean 'within'"):
        onceflow.deduplicate(df, id="payment_id", event_time="ts", whithin="1 minute")  # type: ignore[call-arg]
    with pytest.raises(onceflow.ConfigError, match="reserved"):
        onceflow.write_stream(df, onceflow.sqlite(tmp_path / "x.db"), tmp_path / "ck",
                              {"onceflow_batches": onceflow.Table()})


def test_an_error_inside_a_spark_worker_arrives_as_the_onceflow_error(utc: Any, tmp_path: Path,
                                                                      pg_dsn: str) -> None:
    # the executor-side sink's data source runs in Spark's Python workers: its ConfigError used
    # to reach the user as an AnalysisException with a traceback inside
    payments.generate(tmp_path / "in", 100, per_file=100)
    df = utc.readStream.schema(payments.SCHEMA).parquet(str(tmp_path / "in"))
    from pyspark.sql import functions as F

    odd = df.withColumn("tags", F.create_map(F.lit("k"), F.col("account")))  # a map: not writable
    query = onceflow.write_stream(odd, onceflow.postgres(pg_dsn, protocol="staged"), tmp_path / "ck",
                                  {"payments": onceflow.Table()}, once=True)
    with pytest.raises(onceflow.ConfigError, match="column 'tags' has Spark type map"):
        query.awaitTermination()


def test_a_json_source_with_a_derived_event_time_is_counted_from_sparks_plan(utc: Any,
                                                                             tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"id": "x1", "t": "2026-01-01 00:00:00", "n": 2}\n'
                                            '{"id": "x1", "t": "2026-01-01 00:00:00", "n": 2}\n'
                                            '{"id": "x2", "t": "2026-01-01 00:00:01", "n": 3}\n')
    from pyspark.sql import functions as F

    raw = utc.readStream.schema("id STRING, t STRING, n BIGINT").json(str(tmp_path / "in"))
    events = raw.withColumn("ts", F.to_timestamp("t"))  # derived: not in the files
    clean = onceflow.deduplicate(events, id="id", event_time="ts", within="1 minute")
    onceflow.write_stream(clean.select("id", "n"), onceflow.sqlite(tmp_path / "j.db"), tmp_path / "ck",
                          {"rows": onceflow.Table()}, once=True).awaitTermination()
    with sqlite3.connect(tmp_path / "j.db") as c:
        assert sorted(c.execute("SELECT id, n FROM rows")) == [("x1", 2), ("x2", 3)]
        # not Parquet, and the event time is derived: the plan's scan and deduplication counted
        markers = c.execute("SELECT input_rows, late_dropped, duplicates_dropped, events_counted, "
                            "rows_written FROM onceflow_batches ORDER BY batch_id").fetchall()
    assert markers[0] == (3, 0, 1, 2, 2)
    assert all(m == (0, 0, 0, 0, 0) for m in markers[1:])  # the watermark's no-data batch: still counted


def test_late_rows_are_kept_and_the_checkpoint_explains_every_marker(utc: Any, tmp_path: Path) -> None:
    from onceflow.checkpoint import logs as ck

    (tmp_path / "in").mkdir()
    t = payments.START

    def run() -> None:
        df = (utc.readStream.schema(payments.SCHEMA).option("maxFilesPerTrigger", 1)
              .parquet(str(tmp_path / "in")))
        clean = onceflow.deduplicate(df, id="payment_id", event_time="ts", within="10 minutes")
        query = onceflow.write_stream(clean, onceflow.sqlite(tmp_path / "l.db"), tmp_path / "ck",
                                      {"payments": onceflow.Table()}, late="late_payments", once=True)
        query.awaitTermination()

    _write(tmp_path / "in" / "part-000000.parquet", [("p1", "a", 1, t + dt.timedelta(hours=1))])
    run()
    _write(tmp_path / "in" / "part-000001.parquet",  # p2 late, sent twice; p3 on time
           [("p2", "a", 2, t), ("p2", "a", 2, t), ("p3", "a", 3, t + dt.timedelta(hours=1))])
    run()
    run()  # nothing new: no batch, nothing written twice
    with sqlite3.connect(tmp_path / "l.db") as c:
        assert sorted(c.execute("SELECT payment_id FROM payments")) == [("p1",), ("p3",)]
        late = c.execute("SELECT payment_id, amount_cents, ts, missed_watermark FROM late_payments")
        late = late.fetchall()
    # once, with the watermark it missed
    assert late == [("p2", 2, "2026-01-01 00:00:00.000000", "2026-01-01 00:50:00.000000")]
    markers = onceflow.sqlite(tmp_path / "l.db").batches()
    assert sum(m["late_dropped"] for m in markers) == 2
    for m in markers:  # an auditor's view: Spark's checkpoint alone explains each marker
        batch = ck.batch_input(tmp_path / "ck", m["batch_id"])
        assert ck.count_input(batch, "ts") == (m["input_rows"], m["late_dropped"])
        assert batch.late_watermark_ms == m["late_watermark_ms"]
    assert [m["batch_id"] for m in markers] == ck.committed_batches(tmp_path / "ck")


def test_arrow_outputs_of_a_large_input_take_the_collected_path(utc: Any, tmp_path: Path) -> None:
    """per_batch's Arrow tables are on the driver already: no DataFrame, cache or task is made of them."""
    (tmp_path / "in").mkdir()
    t = payments.START
    rows = [(f"p{i}", f"acct-{i % 50}", 100 + i, t) for i in range(300)]
    _write(tmp_path / "in" / "part-000000.parquet", rows)
    db = tmp_path / "app.db"

    def per_batch(batch: Any) -> dict[str, pa.Table]:
        return {"totals": batch.groupBy("account").count().toArrow()}

    stream = utc.readStream.schema("payment_id STRING, account STRING, amount_cents LONG, ts TIMESTAMP") \
        .parquet(str(tmp_path / "in"))
    onceflow.write_stream(stream, onceflow.sqlite(db, collect_below=10), tmp_path / "ck",
                          tables={"totals": onceflow.Table(key="account", add="count")}, per_batch=per_batch,
                          once=True).awaitTermination()
    with sqlite3.connect(db) as conn:
        got = dict(conn.execute("SELECT account, count FROM totals"))
    assert got == {f"acct-{a}": sum(1 for i in range(300) if i % 50 == a) for a in range(50)}
    assert not Path(str(db) + ".onceflow-stage").exists()  # the tasks path never ran
