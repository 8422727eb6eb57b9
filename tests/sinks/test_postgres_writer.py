"""The ``onceflow_postgres`` data source against a real PostgreSQL server."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from onceflow.errors import ConfigError, PostgresError
from onceflow.sinks.postgres import sql as pg
from onceflow.sinks.postgres import writer as pg_writer
from onceflow.sinks.postgres.datasource import NAME, register
from onceflow.sinks.postgres.writer import TargetSpec
from onceflow.sources.events import EVENT_DDL
from onceflow.sources.log import EventLog
from onceflow.verify.generator import GeneratorConfig, generate_segments
from tests.pg_server import TempPostgres

SCHEMA = StructType([StructField("id", LongType()), StructField("name", StringType())])


def _log(tmp_path: Path, events: int, seed: int = 5) -> tuple[EventLog, list[pa.Table]]:
    cfg = GeneratorConfig(events=events, users=20, minutes=5, duplicates=0.1, late=0.0, seed=seed,
                          segment_size=400)
    return EventLog(tmp_path / "log"), list(generate_segments(cfg))


def _ids(dsn: str, table: str) -> Counter[str]:
    with psycopg.connect(dsn) as conn:
        return Counter(r[0] for r in conn.execute(f"SELECT event_id FROM {table}"))


def _start(spark: Any, log: EventLog, dsn: str, ck: Path, protocol: str) -> Any:
    src = spark.readStream.schema(EVENT_DDL).option("maxFilesPerTrigger", 2).parquet(str(log.directory))
    return (src.writeStream.format(NAME).option("dsn", dsn).option("table", "events")
            .option("protocol", protocol).option("checkpointLocation", str(ck))
            .trigger(availableNow=True).start())


@pytest.mark.parametrize("protocol", ["staged", "2pc"])
def test_streaming_append_writes_every_record_once_across_restarts(
        spark: Any, pg_dsn: str, tmp_path: Path, protocol: str) -> None:
    register(spark)
    log, segments = _log(tmp_path, 2_000)
    for seg in segments[:3]:
        log.append(seg)
    _start(spark, log, pg_dsn, tmp_path / "ck", protocol).awaitTermination()
    for seg in segments[3:]:
        log.append(seg)
    _start(spark, log, pg_dsn, tmp_path / "ck", protocol).awaitTermination()  # resumes
    expected = Counter(eid for seg in segments for eid in seg.column("event_id").to_pylist())
    assert _ids(pg_dsn, "events") == expected  # producer duplicates are records too: appended as sent
    with pg.session(pg_dsn) as conn:
        assert pg.prepared_gids(conn, "of:") == []
        assert conn.execute("SELECT count(*) FROM events_onceflow_stage").fetchone()[0] == 0
        markers = conn.execute("SELECT count(*), sum(rows_written) FROM onceflow_batches").fetchone()
    assert markers[1] == sum(expected.values())


def _spec(dsn: str, protocol: str, **kw: Any) -> TargetSpec:
    return TargetSpec.from_options({"dsn": dsn, "table": "t", "protocol": protocol, "batch_id": "4",
                                    **kw}, SCHEMA)


def _rows(n: int) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"id": list(range(n)), "name": [f"n{i}" for i in range(n)]})]


@pytest.mark.parametrize("protocol", ["staged", "2pc"])
def test_an_attempt_that_lost_never_reaches_the_target(pg_dsn: str, protocol: str) -> None:
    spec = _spec(pg_dsn, protocol)
    pg_writer.ensure_tables(spec)
    loser = pg_writer.write_task(spec, _rows(50))  # e.g. a speculative or failed-over attempt
    winner = pg_writer.write_task(spec, _rows(50))
    assert loser.token != winner.token
    assert pg_writer.commit(spec, 4, [winner.to_json()])
    assert not pg_writer.commit(spec, 4, [winner.to_json()])  # Spark re-running the commit
    with pg.session(pg_dsn) as conn:
        assert conn.execute("SELECT count(*), count(DISTINCT id) FROM t").fetchone() == (50, 50)
        assert conn.execute("SELECT count(*) FROM t_onceflow_stage").fetchone()[0] == 0
        assert pg.prepared_gids(conn, "of:") == []


def test_staged_rows_lost_before_the_commit_fail_the_batch(pg_dsn: str) -> None:
    spec = _spec(pg_dsn, "staged")
    pg_writer.ensure_tables(spec)
    msg = pg_writer.write_task(spec, _rows(10))
    with pg.session(pg_dsn) as conn:  # what a server crash does to an unlogged table
        conn.execute("TRUNCATE t_onceflow_stage")
    with pytest.raises(PostgresError, match="0 staged rows found, tasks wrote 10"):
        pg_writer.commit(spec, 4, [msg.to_json()])
    assert pg.read_batches(pg_dsn, "t") == []


def test_upsert_replace_and_add(pg_dsn: str) -> None:
    schema = StructType([StructField("k", StringType()), StructField("v", LongType()),
                         StructField("note", StringType())])
    for batch, mode_opts in enumerate(({"add": "v"}, {"add": "v"})):
        spec = TargetSpec.from_options({"dsn": pg_dsn, "table": "u", "mode": "upsert", "key": "k",
                                        "batch_id": str(batch), **mode_opts}, schema)
        pg_writer.ensure_tables(spec)
        # the same key from two tasks of one batch: added up, not a conflict
        a = pg_writer.write_task(spec, [pa.RecordBatch.from_pydict(
            {"k": ["x", "y"], "v": [1, 2], "note": ["a", "b"]})])
        b = pg_writer.write_task(spec, [pa.RecordBatch.from_pydict(
            {"k": ["x"], "v": [10], "note": ["c"]})])
        pg_writer.commit(spec, batch, [a.to_json(), b.to_json()])
    with pg.session(pg_dsn) as conn:
        assert dict(conn.execute("SELECT k, v FROM u").fetchall()) == {"x": 22, "y": 4}
    spec = TargetSpec.from_options({"dsn": pg_dsn, "table": "u", "mode": "upsert", "key": "k",
                                    "batch_id": "2"}, schema)
    msg = pg_writer.write_task(spec, [pa.RecordBatch.from_pydict({"k": ["x"], "v": [5], "note": ["z"]})])
    pg_writer.commit(spec, 2, [msg.to_json()])
    with pg.session(pg_dsn) as conn:
        assert conn.execute("SELECT v, note FROM u WHERE k = 'x'").fetchone() == (5, "z")


@pytest.mark.parametrize("protocol", ["staged", "2pc"])
def test_max_and_min_merge_across_tasks_and_batches_ignoring_nulls(pg_dsn: str, protocol: str) -> None:
    schema = StructType([StructField("k", StringType()), StructField("n", LongType()),
                         StructField("hi", LongType()), StructField("lo", LongType())])
    tasks = [  # per batch: two tasks' rows; the same key in both tasks of a batch
        [{"k": ["x", "y"], "n": [1, 1], "hi": [5, None], "lo": [5, None]},
         {"k": ["x"], "n": [2], "hi": [7], "lo": [3]}],
        [{"k": ["x", "y"], "n": [None, 4], "hi": [6, 2], "lo": [None, 9]},
         {"k": ["y"], "n": [1], "hi": [1], "lo": [8]}],
    ]
    for batch, parts in enumerate(tasks):
        spec = TargetSpec.from_options({"dsn": pg_dsn, "table": f"m_{protocol}", "mode": "upsert", "key": "k",
                                        "add": "n", "max": "hi", "min": "lo", "protocol": protocol,
                                        "batch_id": str(batch)}, schema)
        pg_writer.ensure_tables(spec)
        if protocol == "2pc":  # outside Spark every task is partition 0: one task, both parts' rows
            parts = [{c: parts[0][c] + parts[1][c] for c in parts[0]}]
        msgs = [pg_writer.write_task(spec, [pa.RecordBatch.from_pydict(t)]).to_json() for t in parts]
        assert pg_writer.commit(spec, batch, msgs)
        assert not pg_writer.commit(spec, batch, msgs)  # a replay merges nothing
    with pg.session(pg_dsn) as conn:
        got = sorted(conn.execute(f"SELECT k, n, hi, lo FROM m_{protocol}").fetchall())
    # x: n 1+2 (+null), hi max(5,7,6), lo min(5,3,null); y: n 1+4+1, hi max(null,2,1), lo min(null,9,8)
    assert got == [("x", 3, 7, 3), ("y", 6, 2, 8)]


@pytest.mark.parametrize(("options", "message"), [
    ({}, "needs option 'table'"),
    ({"table": "t", "mode": "upsert"}, "needs option 'key'"),
    ({"table": "t", "key": "nope"}, r"option 'key' names columns \['nope'\]"),
    ({"table": "t", "protocol": "3pc"}, "'staged' or '2pc'"),
    ({"table": "t", "sink_id": "a:b"}, "sink id 'a:b' is invalid"),
    ({"table": "t", "add": "id"}, "'add', 'max' and 'min' are for mode 'upsert'"),
    ({"table": "t", "protocl": "2pc"}, r"unknown option\(s\) .*'protocl' \(did you mean 'protocol'\?\)"),
    ({"table": "t", "sinkid": "s"}, r"'sinkid' \(did you mean 'sink_id'\?\)"),
    ({"table": "t", "Protocl": "2pc"}, "did you mean 'protocol'"),  # keys arrive case-insensitive
])
def test_bad_options_say_what_is_wrong(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TargetSpec.from_options({"dsn": "host=x", **options}, SCHEMA)


def test_missing_dsn_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pg.DSN_ENV, raising=False)
    with pytest.raises(ConfigError, match="ONCEFLOW_PG_DSN"):
        TargetSpec.from_options({"table": "t"}, SCHEMA)


def test_batch_write_without_batch_id_is_refused_through_spark(spark: Any, pg_dsn: str) -> None:
    register(spark)
    df = spark.createDataFrame([(1, "a")], SCHEMA)
    with pytest.raises(Exception, match="needs option 'batch_id'"):
        df.write.format(NAME).mode("append").option("dsn", pg_dsn).option("table", "t").save()


def test_password_never_appears_in_errors(pg_server: TempPostgres) -> None:
    dsn = f"host=127.0.0.1 port={pg_server.port} user=nobody password=s3cr3t-pw dbname=postgres"
    with pytest.raises(PostgresError) as info:
        pg.connect(dsn)
    assert "s3cr3t-pw" not in str(info.value)
    assert "nobody" in str(info.value)
    assert "s3cr3t-pw" not in pg.redact(dsn)


def test_two_phase_commit_disabled_on_the_server_is_explained() -> None:
    server = TempPostgres(max_prepared_transactions=0)
    try:
        dsn = server.start()
        with pytest.raises(PostgresError, match="max_prepared_transactions = 0"):
            pg_writer.ensure_tables(_spec(dsn, "2pc"))
        pg_writer.ensure_tables(_spec(dsn, "staged"))  # the staged protocol needs nothing
        # onceflow verify says so before its first round (else every driver fails at its first batch)
        verify = subprocess.run([sys.executable, "-m", "onceflow.cli.main", "verify", "--rounds", "1",
                                 "--sink", "postgres-2pc", "--pg-dsn", dsn, "--report", "/nonexistent/r"],
                                capture_output=True, text=True, timeout=120)
        assert verify.returncode == 2 and "max_prepared_transactions = 0" in verify.stderr, verify.stderr
    finally:
        server.stop()
