"""A query that cannot write fails when it starts; Ctrl-C stops one cleanly (real processes)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import onceflow
from onceflow import Table
from onceflow.errors import PostgresError
from tests.core import clicks

pytestmark = pytest.mark.spark


def test_a_wrong_password_fails_at_start_even_with_nothing_to_read(utc_spark: Any, tmp_path: Path,
                                                                  pg_server: Any, pg_dsn: str) -> None:
    clicks.generate(tmp_path / "in", 100, per_file=100)
    right = pg_server.password_role(pg_dsn)
    clicks.start(utc_spark, "deltas", tmp_path / "in", onceflow.postgres(right),
                 tmp_path / "ck").awaitTermination()
    wrong = right.replace("password=right", "password=wrong")
    with pytest.raises(PostgresError, match="password authentication failed"):  # no new input: no batch
        clicks.start(utc_spark, "deltas", tmp_path / "in", onceflow.postgres(wrong), tmp_path / "ck")
    assert not utc_spark.streams.active


def test_an_existing_postgres_table_that_does_not_fit_fails_at_start(utc_spark: Any, tmp_path: Path,
                                                                    pg_dsn: str) -> None:
    import psycopg

    clicks.generate(tmp_path / "in", 20, per_file=20)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE clicks(page text, window_start timestamptz, clicks bigint, worst_ms bigint, "
                  "PRIMARY KEY (page, window_start))")  # no best_ms
    for protocol in ("driver", "staged"):
        with pytest.raises(onceflow.ConfigError, match=r"has no column\(s\) \['best_ms'\]"):
            clicks.start(utc_spark, "deltas", tmp_path / "in", onceflow.postgres(pg_dsn, protocol=protocol),
                         tmp_path / "ck")
    assert not (tmp_path / "ck" / "commits").exists()


def test_ctrl_c_stops_after_the_batch_in_flight_with_one_line(spark: Any, tmp_path: Path,
                                                               fast_child_drivers: Any) -> None:
    (tmp_path / "in").mkdir()
    for i in range(4):
        path = tmp_path / "in" / f"f{i}.parquet"
        ids = [f"{i}-{j}" for j in range(100)]
        pq.write_table(pa.table({"id": ids, "n": pa.array(range(100), pa.int64())}), path)
        clicks._stamp(path)  # one batch per file, in this order
    args = [sys.executable, "-m", "tests.core.interrupt_driver", str(tmp_path / "in"), str(tmp_path / "o.db"),
            str(tmp_path / "ck")]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("BATCH 0"), line
    time.sleep(1.0)  # batch 0 is in flight
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "EXITED" in out, err[-3000:]
    ours = [ln for ln in err.splitlines() if "onceflow" in ln]
    assert len(ours) == 1 and "Ctrl-C: stopping after the batch in flight" in ours[0], err[-3000:]
    assert "Traceback" not in err and "Py4J" not in err and "Exception" not in err, err[-3000:]
    with sqlite3.connect(tmp_path / "o.db") as c:  # batch 0 finished and committed; nothing after it
        assert c.execute("SELECT batch_id, rows_written FROM onceflow_batches").fetchall() == [(0, 100)]
        assert c.execute("SELECT count(*) FROM t").fetchone() == (100,)
    assert [f for f in os.listdir(tmp_path / "ck" / "commits") if not f.startswith(".")] == ["0"]
    # the next start resumes: batch 1, refused before anything of it was written, runs now
    df = spark.readStream.schema("id STRING, n BIGINT").option("maxFilesPerTrigger", 1).parquet(
        str(tmp_path / "in"))
    onceflow.write_stream(df, onceflow.sqlite(tmp_path / "o.db"), tmp_path / "ck", {"t": Table(key="id")},
                          once=True).awaitTermination()
    with sqlite3.connect(tmp_path / "o.db") as c:
        assert c.execute("SELECT count(*), count(DISTINCT id) FROM t").fetchone() == (400, 400)
        assert [r[0] for r in c.execute("SELECT batch_id FROM onceflow_batches")] == [0, 1, 2, 3]


def test_the_output_columns_are_learnt_without_a_shuffle(spark: Any, tmp_path: Path) -> None:
    """write_stream runs per_batch on an empty frame at start: Spark must see it is empty (no shuffle)."""
    from pyspark.sql import functions as F

    from onceflow.engine.startup import output_schemas

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"page": ["a"], "ms": pa.array([5], pa.int64())}), tmp_path / "in" / "f.parquet")
    stream = spark.readStream.schema("page STRING, ms LONG").parquet(str(tmp_path / "in"))

    def per_batch(df: Any) -> dict[str, pa.Table]:  # a shuffle and a collect, as users write them
        return {"pages": df.groupBy("page").agg(F.max("ms").alias("worst_ms")).toArrow()}

    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("onceflow-start-test", "output schemas")
    try:
        schemas = output_schemas(stream, per_batch, False, {"pages": Table(key=["page"])})
    finally:
        spark.sparkContext.setJobGroup("", "")
    assert schemas["pages"].names == ["page", "worst_ms"]
    assert schemas["pages"].field("worst_ms").type == pa.int64()
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup("onceflow-start-test")]
    stages = [tracker.getStageInfo(s) for j in jobs if j for s in j.stageIds]
    # an RDD-backed empty frame ran two jobs here, one a shuffle of 2 tasks
    assert len(jobs) <= 1 and sum(s.numTasks for s in stages if s) <= 1, (jobs, stages)


def test_a_query_killed_before_its_first_batch_was_logged_starts_again(spark: Any, tmp_path: Path) -> None:
    """The temporary log files a SIGKILL leaves before batch 0 is logged must not block the restart.

    ``onceflow verify --sink realtime`` found it (a real-time query killed at the end of its first
    batch left ``commits/.0.<uuid>.tmp``, and every restart failed); the same state is made here
    by hand for a micro-batch query, with plain Spark's refusal beside it.
    """
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": ["a", "b", "c"], "n": pa.array([1, 2, 3], pa.int64())}),
                   tmp_path / "in" / "f.parquet")

    def killed_before_batch_0(ck: Path) -> Path:
        for log, name in (("offsets", ".0.0f3c9a52-6a7e-4bd1-9d53-8e2f1c0a7b10.tmp"),
                          ("commits", ".0.5d1e2f80-13aa-4c6b-a0f4-7c9e8b2d4e61.tmp")):
            (ck / log).mkdir(parents=True)
            (ck / log / name).write_text("v1\n")  # begun, never renamed into place
        return ck

    stream = spark.readStream.schema("id STRING, n LONG").parquet(str(tmp_path / "in"))
    plain = (stream.writeStream.format("noop").trigger(availableNow=True)
             .option("checkpointLocation", str(killed_before_batch_0(tmp_path / "plain"))).start())
    with pytest.raises(Exception, match="should be empty on batch 0"):
        plain.awaitTermination(120)
    ck = killed_before_batch_0(tmp_path / "ck")
    query = onceflow.write_stream(stream, onceflow.sqlite(tmp_path / "out.db"), ck,
                                  {"rows": Table(key="id")}, once=True)
    query.awaitTermination()
    with sqlite3.connect(tmp_path / "out.db") as c:
        assert sorted(c.execute("SELECT id, n FROM rows")) == [("a", 1), ("b", 2), ("c", 3)]
    assert not [p for p in ck.rglob(".*.tmp")]
    # once a batch is logged, a temporary file is Spark's business: left alone
    (ck / "commits" / ".1.9a8b7c6d-0000-4000-8000-000000000001.tmp").write_text("")
    onceflow.write_stream(stream, onceflow.sqlite(tmp_path / "out.db"), ck, {"rows": Table(key="id")},
                          once=True).awaitTermination()
    assert (ck / "commits" / ".1.9a8b7c6d-0000-4000-8000-000000000001.tmp").exists()


def test_unfinished_log_files_are_removed_only_while_no_batch_is_committed(tmp_path: Path) -> None:
    """The states SIGKILLs left (offsets/ empty or holding 0; commits/ a temporary file only)."""
    from onceflow.engine.startup import clear_unfinished_start

    tmp = ".0.296b5c57-6ba5-40e9-832e-8ccdce04559b.tmp"
    for offsets in ([], ["0"]):  # a restarted real-time query drops an uncommitted offsets/0, then checks
        ck = tmp_path / f"ck{len(offsets)}"
        (ck / "offsets").mkdir(parents=True)
        (ck / "commits").mkdir()
        for name in offsets:
            (ck / "offsets" / name).write_text("v1\n{}\n")
        (ck / "commits" / tmp).write_text("")
        (ck / "commits" / f".{tmp}.crc").write_text("")
        assert sorted(p.name for p in clear_unfinished_start(ck)) == sorted([tmp, f".{tmp}.crc"])
        assert sorted(p.name for p in (ck / "offsets").iterdir()) == offsets
        assert not list((ck / "commits").iterdir())
    (ck / "commits" / "0").write_text("v1\n{}\n")  # a batch committed: nothing is touched
    (ck / "commits" / ".1.0a0b0c0d-0000-4000-8000-000000000002.tmp").write_text("")
    assert clear_unfinished_start(ck) == []
    assert clear_unfinished_start(tmp_path / "no-such-checkpoint") == []
