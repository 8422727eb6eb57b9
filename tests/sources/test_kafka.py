"""onceflow_kafka (``connector="onceflow"``) on a real Kafka broker: replay, ids, partitions, data loss."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from pyspark.sql.streaming.datasource import ReadMaxRows

from onceflow.checkpoint import logs as ckpt
from onceflow.errors import ConfigError, SourceDataLossError, from_spark
from onceflow.sources.kafka.read import OffsetRange, ReadSpec, read_range
from onceflow.sources.kafka.source import KafkaOptions, _limit, read_kafka, skipped_offsets

pytestmark = pytest.mark.spark


def _read(*args: Any, **kwargs: Any) -> Any:
    """onceflow's Python source (the session has Spark's connector: auto would pick that one)."""
    return read_kafka(*args, connector="onceflow", **kwargs)


def produce(bootstrap: str, topic: str, n: int, partitions: int = 1, first: int = 0,
            header: bool = True) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(first, first + n):
        headers = [("event_id", f"e{i}".encode())] if header else None
        p.produce(topic, key=f"k{i}".encode(), value=json.dumps({"n": i, "eid": f"f{i}"}).encode(),
                  partition=i % partitions, headers=headers)
    p.flush(30)


def run(spark: Any, bootstrap: str, ck: Path, **options: Any) -> list[pa.Table]:
    """One availableNow run of the source into foreachBatch; the batches' rows."""
    got: list[pa.Table] = []
    df = _read(spark, bootstrap, **options)
    q = (df.writeStream.foreachBatch(lambda d, _: got.append(d.toArrow()))
         .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
    q.awaitTermination()
    return got


def coords(t: pa.Table) -> list[tuple[str, int, int]]:
    return list(zip(t["topic"].to_pylist(), t["partition"].to_pylist(), t["offset"].to_pylist(), strict=True))


def test_a_range_reads_the_same_records_every_time(broker: Any) -> None:
    broker.create_topic("replay", 1)
    produce(broker.bootstrap, "replay", 1000)
    spec = ReadSpec(consumer={"bootstrap.servers": broker.bootstrap}, id_header="event_id", batch_rows=128)
    rng = OffsetRange("replay", 0, 100, 600)
    first = pa.Table.from_batches(list(read_range(spec, rng)))
    again = pa.Table.from_batches(list(read_range(spec, rng)))
    assert first.num_rows == 500 and first["offset"].to_pylist() == list(range(100, 600))
    assert first.drop_columns(["timestamp"]).equals(again.drop_columns(["timestamp"]))
    assert first["timestamp"].equals(again["timestamp"])
    assert first["record_id"][0].as_py() == "e100" and first["key"][0].as_py() == b"k100"


def test_batches_read_exactly_their_logged_ranges(spark: Any, broker: Any, tmp_path: Path) -> None:
    broker.create_topic("ranges", 3)
    produce(broker.bootstrap, "ranges", 3000, partitions=3)
    ck = tmp_path / "ck"
    got = run(spark, broker.bootstrap, ck, subscribe="ranges", max_offsets_per_trigger=1000,
              options={"maxRecordsPerTask": "300"})
    assert len(got) == 3 and [t.num_rows for t in got] == [1000, 1000, 1000]
    prev: dict[tuple[str, int], int] = {("ranges", p): 0 for p in range(3)}
    seen: list[tuple[str, int, int]] = []
    for batch_id, table in enumerate(got):
        end = ckpt.source_offset(ck, batch_id)
        assert end is not None
        ends = {("ranges", int(p)): o for p, o in end["offsets"]["ranges"].items()}  # type: ignore[index]
        planned = sorted((t, p, o) for (t, p), e in ends.items() for o in range(prev[(t, p)], e))
        assert sorted(coords(table)) == planned
        seen += planned
        prev = ends
    assert sorted(seen) == sorted(("ranges", i % 3, i // 3) for i in range(3000))


def test_record_ids_from_header_field_or_coordinates(spark: Any, broker: Any, tmp_path: Path) -> None:
    broker.create_topic("ids", 1)
    produce(broker.bootstrap, "ids", 5)
    produce(broker.bootstrap, "ids", 2, first=3)  # producer retries: same ids at new offsets
    produce(broker.bootstrap, "ids", 1, first=9, header=False)
    by_header = pa.concat_tables(run(spark, broker.bootstrap, tmp_path / "a", subscribe="ids",
                                     id_header="event_id"))
    assert by_header["record_id"].to_pylist() == ["e0", "e1", "e2", "e3", "e4", "e3", "e4", "ids/0/7"]
    by_field = pa.concat_tables(run(spark, broker.bootstrap, tmp_path / "b", subscribe="ids", id_field="eid"))
    assert by_field["record_id"].to_pylist() == ["f0", "f1", "f2", "f3", "f4", "f3", "f4", "f9"]
    assert "headers" not in by_header.column_names and "headers" not in by_field.column_names
    plain = pa.concat_tables(run(spark, broker.bootstrap, tmp_path / "c", subscribe=["ids"],
                                 include_headers=True))
    assert plain["record_id"].to_pylist() == [f"ids/0/{i}" for i in range(8)]
    assert plain["headers"][0].as_py() == [{"key": "event_id", "value": b"e0"}]
    assert plain["headers"][7].as_py() is None  # a record without headers
    assert plain["timestampType"].to_pylist() == [0] * 8


def test_a_new_partition_is_read_from_offset_zero(spark: Any, broker: Any, tmp_path: Path) -> None:
    broker.create_topic("np-a", 2)
    produce(broker.bootstrap, "np-a", 100, partitions=2)
    ck = tmp_path / "ck"
    first = pa.concat_tables(run(spark, broker.bootstrap, ck, subscribe_pattern="np-.*"))
    assert first.num_rows == 100
    broker.create_topic("np-b", 3)  # the mock broker cannot add partitions to np-a: a new topic's are new
    produce(broker.bootstrap, "np-b", 60, partitions=3)
    produce(broker.bootstrap, "np-a", 10, partitions=2, first=100)
    second = pa.concat_tables(run(spark, broker.bootstrap, ck, subscribe_pattern="np-.*"))
    assert sorted(coords(second)) == sorted([("np-a", i % 2, 50 + (i - 100) // 2) for i in range(100, 110)]
                                            + [("np-b", i % 3, i // 3) for i in range(60)])
    last = ckpt.source_offset(ck, ckpt.committed_batches(ck)[-1])
    assert last is not None and last["offsets"]["np-b"] == {"0": 20, "1": 20, "2": 20}  # type: ignore[index]


def test_deleted_offsets_fail_unless_skipping_is_chosen(spark: Any, broker: Any, tmp_path: Path) -> None:
    broker.create_topic("gone", 1)
    produce(broker.bootstrap, "gone", 40)
    ck = tmp_path / "ck"
    assert sum(t.num_rows for t in run(spark, broker.bootstrap, ck, subscribe="gone")) == 40
    produce(broker.bootstrap, "gone", 60, first=40)
    broker.delete_records("gone", 0, 70)  # retention took offsets 40..69 before they were read
    with pytest.raises(Exception) as caught:
        run(spark, broker.bootstrap, ck, subscribe="gone")
    err = from_spark(caught.value)
    assert isinstance(err, SourceDataLossError) and "[40, 70)" in str(err) and "failOnDataLoss" in str(err)
    assert ckpt.committed_batches(ck) == [0]
    rest = pa.concat_tables(run(spark, broker.bootstrap, ck, subscribe="gone", fail_on_data_loss=False))
    assert rest["offset"].to_pylist() == list(range(70, 100))
    assert list(skipped_offsets(ck).values()) == [{"gone/0": 30}]


def test_a_range_deleted_after_planning_is_an_error_or_a_counted_skip(broker: Any) -> None:
    broker.create_topic("late-gone", 1)
    produce(broker.bootstrap, "late-gone", 50)
    broker.delete_records("late-gone", 0, 20)
    rng = OffsetRange("late-gone", 0, 0, 50)
    with pytest.raises(SourceDataLossError, match=r"\[0, 20\)"):
        list(read_range(ReadSpec(consumer={"bootstrap.servers": broker.bootstrap}), rng))
    spec = ReadSpec(consumer={"bootstrap.servers": broker.bootstrap}, fail_on_data_loss=False)
    rows = pa.Table.from_batches(list(read_range(spec, rng)))
    assert rows["offset"].to_pylist() == list(range(20, 50))


def test_bad_options_are_refused_before_the_query(spark: Any) -> None:
    base = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
    with pytest.raises(ConfigError, match="did you mean 'subscribe'"):
        KafkaOptions.parse({"kafka.bootstrap.servers": "x:1", "subscrib": "t"})
    with pytest.raises(ConfigError, match="exactly one of"):
        KafkaOptions.parse({**base, "subscribePattern": "t.*"})
    with pytest.raises(ConfigError, match="auto.offset.reset"):
        KafkaOptions.parse({**base, "kafka.auto.offset.reset": "earliest"})
    with pytest.raises(ConfigError, match="maxOffsetsPerTrigger|maxoffsetspertrigger"):
        KafkaOptions.parse({**base, "maxOffsetsPerTrigger": "0"})
    with pytest.raises(ConfigError, match="startingOffsets"):
        KafkaOptions.parse({**base, "startingOffsets": "{oops"})
    with pytest.raises(ConfigError, match="kafka.bootstrap.servers"):
        _read(spark, "", subscribe="t")
    parsed = KafkaOptions.parse({**base, "kafka.security.protocol": "SASL_SSL",
                                 "KAFKA.SASL.MECHANISM": "PLAIN"})
    assert parsed.spec.consumer == {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_SSL",
                                    "sasl.mechanism": "PLAIN"}


def test_late_rows_of_a_kafka_source_need_an_input_contract(spark: Any, tmp_path: Path) -> None:
    """Without onceflow.expect, onceflow cannot read a Kafka batch's late rows back: late= is refused."""
    from pyspark.sql import functions as F

    import onceflow

    raw = _read(spark, "127.0.0.1:1", subscribe="t", id_field="id")
    events = raw.select("record_id", F.from_json(F.col("value").cast("string"), "ts TIMESTAMP").alias("v"))
    clean = onceflow.deduplicate(events.select("record_id", "v.ts"), id="record_id", event_time="ts",
                                 within="1 minute")
    with pytest.raises(ConfigError, match="reads onceflow_kafka.*onceflow.expect"):
        onceflow.write_stream(clean, onceflow.sqlite(tmp_path / "x.db"), tmp_path / "ck",
                              tables={"t": onceflow.Table()}, late="late")
    assert not (tmp_path / "ck").exists()  # refused before the query started


def test_a_read_limit_is_shared_by_backlog() -> None:
    starts = {("t", 0): 0, ("t", 1): 100, ("t", 2): 5}
    ends = {("t", 0): 700, ("t", 1): 400, ("t", 2): 5}
    capped = _limit(starts, ends, ReadMaxRows(100))
    assert capped == {("t", 0): 70, ("t", 1): 130, ("t", 2): 5}
    assert sum(capped[tp] - starts[tp] for tp in capped) == 100
    assert _limit(starts, ends, ReadMaxRows(5000)) == ends


def test_starting_offsets_latest_and_per_partition(spark: Any, broker: Any, tmp_path: Path) -> None:
    broker.create_topic("start", 2)
    produce(broker.bootstrap, "start", 20, partitions=2)
    given = pa.concat_tables(run(spark, broker.bootstrap, tmp_path / "a", subscribe="start",
                                 starting_offsets={"start": {"0": 7, "1": -1}}))
    assert sorted(coords(given)) == [("start", 0, o) for o in range(7, 10)]  # partition 1 from its end
    latest = run(spark, broker.bootstrap, tmp_path / "b", subscribe="start", starting_offsets="latest")
    assert sum(t.num_rows for t in latest) == 0
    produce(broker.bootstrap, "start", 4, partitions=2, first=20)
    later = pa.concat_tables(run(spark, broker.bootstrap, tmp_path / "b", subscribe="start"))
    assert sorted(coords(later)) == [("start", p, o) for p in (0, 1) for o in (10, 11)]


def test_start_errors_arrive_as_the_onceflow_error(spark: Any, broker: Any, tmp_path: Path) -> None:
    import onceflow
    from onceflow.sources.kafka.source import register

    hint = r"'max_offset_per_trigger' \(did you mean 'max_offsets_per_trigger'\?\)"
    with pytest.raises(ConfigError, match=hint):
        _read(spark, broker.bootstrap, subscribe="t", max_offset_per_trigger=10)
    broker.create_topic("orders", 1)
    produce(broker.bootstrap, "orders", 20)

    def start(df: Any, name: str) -> Any:
        return onceflow.write_stream(df.select("record_id"), onceflow.sqlite(tmp_path / f"{name}.db"),
                                     tmp_path / name, {"t": onceflow.Table()}, once=True)

    typo = start(_read(spark, broker.bootstrap, subscribe="ordres"), "typo")
    with pytest.raises(ConfigError, match=r"no topic 'ordres' \(did you mean 'orders'\?\).*allow_missing"):
        typo.awaitTermination()
    register(spark)
    raw = (spark.readStream.format("onceflow_kafka").option("kafka.bootstrap.servers", broker.bootstrap)
           .option("subscibe", "orders").load())
    with pytest.raises(ConfigError, match=r"'subscibe' \(did you mean 'subscribe'\?\)"):
        start(raw, "option").awaitTermination()
    # waiting for a topic is a choice: nothing to read until it exists, then every record once
    waiting = _read(spark, broker.bootstrap, subscribe="later", allow_missing_topics=True)
    start(waiting, "wait").awaitTermination()
    broker.create_topic("later", 1)
    produce(broker.bootstrap, "later", 7)
    start(waiting, "wait").awaitTermination()
    import sqlite3

    with sqlite3.connect(tmp_path / "wait.db") as c:
        assert c.execute("SELECT count(*) FROM t").fetchone() == (7,)


def test_markers_of_a_kafka_query_count_its_records_and_retries(spark: Any, broker: Any,
                                                                 tmp_path: Path) -> None:
    import sqlite3

    import onceflow

    broker.create_topic("metered", 2)
    produce(broker.bootstrap, "metered", 300, partitions=2)  # ids e0..e299 in the header
    produce(broker.bootstrap, "metered", 40, partitions=2, first=100)  # retries: e100..e139 again
    raw = _read(spark, broker.bootstrap, subscribe="metered", id_header="event_id",
                     max_offsets_per_trigger=120)
    clean = onceflow.deduplicate(raw, id="record_id", event_time="timestamp", within="10 minutes")
    onceflow.write_stream(clean.select("record_id"), onceflow.sqlite(tmp_path / "k.db"), tmp_path / "ck",
                          {"ids": onceflow.Table(key="record_id")}, once=True).awaitTermination()
    with sqlite3.connect(tmp_path / "k.db") as c:
        m = c.execute("SELECT sum(input_rows), sum(duplicates_dropped), sum(late_dropped), "
                      "sum(events_counted), sum(rows_written), count(*), count(input_rows) "
                      "FROM onceflow_batches").fetchone()
        assert c.execute("SELECT count(*) FROM ids").fetchone() == (300,)
    assert m[:5] == (340, 40, 0, 300, 300) and m[5] == m[6] >= 3  # every batch knows its input


def test_starting_a_running_broker_again_keeps_one_process() -> None:
    from onceflow.verify.kafka_server import KafkaServer

    with KafkaServer({"once": 1}) as server:  # started by the constructor
        first = server.proc
        assert first is not None and server.start() is server and server.proc is first
        server.stop()
        assert first.poll() is not None  # stop reached the only process
        server.start()  # a stopped broker starts again
        assert server.proc is not first and server.proc is not None and server.proc.poll() is None
