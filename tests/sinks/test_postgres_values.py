"""PostgreSQL refuses what its columns cannot hold; the driver-side sink names the key and the value."""

from __future__ import annotations

from typing import Any

import psycopg
import pyarrow as pa
import pytest

from onceflow.errors import BatchRejectedError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.postgres.sink import PostgresTablesSink

STATS = BatchStats(2, 0, 0)
I64_MAX = 2**63 - 1


def test_a_nul_in_text_and_a_sum_past_bigint_are_refused_naming_the_key(pg_dsn: str) -> None:
    sink = PostgresTablesSink(pg_dsn, sink_id="values")
    sink.bind("q1")
    with pytest.raises(BatchRejectedError, match=r"table 'notes': column 'text' of the row with key "
                                                 r"\{'id': 2\} holds 'a\\x00b', with a NUL character"):
        sink.commit_tables(0, {"notes": pa.table({"id": [1, 2], "text": ["fine", "a\x00b"]})},
                           {"notes": Table(key="id")}, STATS, 2)
    spec = {"sums": Table(key=["account", "day"], add="n")}
    first = pa.table({"account": ["a", "b"], "day": [1, 1], "n": pa.array([I64_MAX - 1, 7], pa.int64())})
    assert sink.commit_tables(0, {"sums": first}, spec, STATS, 2)
    over = pa.table({"account": ["b", "a"], "day": [1, 1], "n": pa.array([1, 2], pa.int64())})
    with pytest.raises(BatchRejectedError, match=r"bigint out of range\): add column 'n' of the row with key "
                                                 r"\{'account': 'a', 'day': 1\} would become "
                                                 rf"{I64_MAX - 1} \+ 2 = {I64_MAX + 1}, outside"):
        sink.commit_tables(1, {"sums": over}, spec, STATS, 2)
    assert [m["batch_id"] for m in sink.batches()] == [0]
    sink.close()
    with psycopg.connect(pg_dsn) as conn:
        stored = conn.execute("SELECT account, n FROM sums ORDER BY 1").fetchall()
        assert stored == [("a", I64_MAX - 1), ("b", 7)]
        assert conn.execute("SELECT to_regclass('notes')").fetchone() == (None,)


@pytest.mark.parametrize("protocol", ["staged", "2pc"])
def test_the_executor_side_sink_names_the_row_with_a_nul(spark: Any, pg_dsn: str, protocol: str) -> None:
    from onceflow.sinks.postgres.sink import PostgresFramesSink

    sink = PostgresFramesSink(pg_dsn, sink_id="frames", protocol=protocol)
    sink.bind("q1")
    frame = spark.createDataFrame([("a", "fine"), ("b", "x\u0000y"), ("c", "ok")], "k STRING, t STRING")
    with pytest.raises(BatchRejectedError, match=r"table 'notes': column 't' of the row with key "
                                                 r"\{'k': 'b'\} holds 'x\\x00y', with a NUL character"):
        sink.commit_frames(0, {"notes": frame}, {"notes": Table(key="k")}, STATS, 3)
    assert sink.batches() == []
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM notes").fetchone() == (0,)
    # 2pc: a task that prepared after Spark's abort leaves its transaction to the batch's next attempt
    fixed = spark.createDataFrame([("a", "fine"), ("b", "xy"), ("c", "ok")], "k STRING, t STRING")
    assert sink.commit_frames(0, {"notes": fixed}, {"notes": Table(key="k")}, STATS, 3)
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT k, t FROM notes ORDER BY k").fetchall() == [("a", "fine"), ("b", "xy"),
                                                                               ("c", "ok")]
        assert conn.execute("SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()"
                            ).fetchone() == (0,)


@pytest.mark.parametrize("protocol", ["staged", "2pc"])
def test_the_executor_side_sink_names_the_key_of_a_sum_past_bigint(spark: Any, pg_dsn: str,
                                                                   protocol: str) -> None:
    from onceflow.sinks.postgres.sink import PostgresFramesSink

    sink = PostgresFramesSink(pg_dsn, sink_id="frames", protocol=protocol)
    sink.bind("q1")
    spec = {"sums": Table(key="account", add="n")}
    schema = "account STRING, n LONG"
    first = spark.createDataFrame([("a", I64_MAX - 1), ("b", 7)], schema)
    assert sink.commit_frames(0, {"sums": first}, spec, STATS, 2)
    over = spark.createDataFrame([("b", 1), ("a", 2), ("c", 5)], schema)
    with pytest.raises(BatchRejectedError, match=r"table 'sums': add column 'n' of the row with key "
                                                 rf"\{{'account': 'a'\}} would become {I64_MAX - 1} \+ 2"):
        sink.commit_frames(1, {"sums": over}, spec, STATS, 3)
    assert [m["batch_id"] for m in sink.batches()] == [0]
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT account, n FROM sums ORDER BY 1").fetchall() == [("a", I64_MAX - 1),
                                                                                    ("b", 7)]
