"""PostgreSQL's 63-byte names: long names refused at start, derived names never collide (a real server)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from onceflow.errors import ConfigError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.postgres.sink import PostgresFramesSink, PostgresTablesSink
from onceflow.sinks.postgres.sql import NAME_BYTES, derived_name

STATS = BatchStats(2, 0, 0)


def test_derived_names_stay_within_63_bytes_and_apart() -> None:
    short = derived_name("orders", suffix="_onceflow_stage")
    assert short == "orders_onceflow_stage"
    a, b = "a" * 51 + "_first", "a" * 51 + "_other"  # 57 bytes each, the same first 51
    da, db = (derived_name(n, suffix="_onceflow_stage") for n in (a, b))
    assert da != db and len(da.encode()) <= NAME_BYTES and da.endswith("_onceflow_stage")
    assert da == derived_name(a, suffix="_onceflow_stage")  # stable: the next run finds its staging table
    wide = derived_name("ü" * 40, prefix="onceflow_in_")  # cut at a character boundary
    assert len(wide.encode()) <= NAME_BYTES and wide.encode().decode() == wide


@pytest.mark.parametrize("sink_kind", ["driver", "frames"])
def test_names_postgres_would_cut_are_refused_at_start(pg_dsn: str, sink_kind: str) -> None:
    sink = PostgresTablesSink(pg_dsn) if sink_kind == "driver" else PostgresFramesSink(pg_dsn)
    long_a, long_b = "t" * 63 + "_a", "t" * 63 + "_b"
    with pytest.raises(ConfigError, match=rf"table name '{long_a}' is 65 bytes; PostgreSQL keeps only the "
                                          "first 63"):
        sink.check({long_a: Table(), long_b: Table()}, {})
    column = "c" * 64
    with pytest.raises(ConfigError, match=rf"column name '{column}' of table 'events' is 64 bytes"):
        sink.check({"events": Table()}, {"events": pa.schema([("id", pa.int64()), (column, pa.int64())])})
    at_limit = ({"t" * 63: Table()}, {"t" * 63: pa.schema([("c" * 63, pa.int64())])})
    if sink_kind == "driver":
        sink.check(*at_limit)  # 63 bytes: fine
    else:  # each table's marker "<sink_id>.<table>" is a sink id of at most 64 characters
        with pytest.raises(ConfigError, match=r"the table's marker 'default.t+' must be 1-64 characters"):
            sink.check(*at_limit)
    sink.close()
    with psycopg.connect(pg_dsn) as conn:  # nothing was created
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'ttt%%'").fetchone() == (0,)


def test_two_long_tables_of_one_batch_get_their_own_temporary_tables(pg_dsn: str) -> None:
    sink = PostgresTablesSink(pg_dsn, sink_id="long")
    sink.bind("q1")
    a, b = "x" * 51 + "_first", "x" * 51 + "_other"  # 'onceflow_in_' + name is past 63 bytes for both
    rows = {a: pa.table({"id": [1, 2]}), b: pa.table({"id": [3]})}
    assert sink.commit_tables(0, rows, {a: Table(), b: Table()}, STATS, 3)
    assert not sink.commit_tables(0, rows, {a: Table(), b: Table()}, STATS, 3)
    sink.close()
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT id FROM "{a}" ORDER BY id').fetchall() == [(1,), (2,)]
        assert conn.execute(f'SELECT id FROM "{b}"').fetchall() == [(3,)]


def test_delta_and_kafka_name_limits_are_named(tmp_path: Path) -> None:
    from onceflow.sinks.delta.sink import DeltaTablesSink
    from onceflow.sinks.kafka.sink import KafkaTopicsSink

    with pytest.raises(ConfigError, match="is 300 bytes; a Delta table is a directory"):
        DeltaTablesSink(tmp_path / "lake").check({"d" * 300: Table()}, {})
    with pytest.raises(ConfigError, match="marker topic name 257 characters long; Kafka allows 249"):
        KafkaTopicsSink("127.0.0.1:9", sink_id="s" * 240)
