"""Spark's own Kafka connector under ``onceflow.read_kafka``: the same records and ids as onceflow's source.

The session of these tests has the connector's jars (``session(kafka=True)``), so
``connector="auto"`` picks it; ``connector="onceflow"`` is the Python source. Which one read a
stream is told by the checkpoint itself: Spark's connector logs ``{topic: {partition: offset}}``
and writes batch 0's start to ``sources/0/0``; onceflow's nests offsets under ``"offsets"``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer

import onceflow
from onceflow.checkpoint import logs as ckpt
from onceflow.checkpoint import ranges
from onceflow.errors import ConfigError
from onceflow.sources.kafka.native import initial_offsets
from onceflow.sources.kafka.source import logged_offsets

pytestmark = pytest.mark.spark


def _produce(bootstrap: str, topic: str, n: int, partitions: int, first: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(first, first + n):
        headers = [("event_id", f"e{i}".encode())] if i % 5 else None  # every 5th: no header
        if headers and i % 3 == 0:  # every 3rd: the id is not the first header
            headers = [("trace", b"t"), *headers, ("event_id", b"second")]
        value = {"n": i, "eid": f"f{i}"} if i % 7 else {"n": i}  # every 7th: no field
        p.produce(topic, key=f"k{i}".encode(), value=json.dumps(value).encode(), partition=i % partitions,
                  headers=headers)
    p.flush(30)


def _run(spark: Any, bootstrap: str, ck: Path, connector: str, **options: Any) -> pa.Table:
    got: list[pa.Table] = []
    df = onceflow.read_kafka(spark, bootstrap, connector=connector, **options)
    q = (df.writeStream.foreachBatch(lambda d, _: got.append(d.toArrow()))
         .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
    q.awaitTermination()
    rows = pa.concat_tables(got) if got else pa.table({})
    return rows.sort_by([("partition", "ascending"), ("offset", "ascending")])


def _comparable(t: pa.Table) -> list[dict[str, Any]]:
    out = t.select(["key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
                    *(["headers"] if "headers" in t.column_names else []), "record_id"]).to_pylist()
    for r in out:  # null or an empty list for no headers
        if "headers" in r:
            r["headers"] = r["headers"] or []
    return out


@pytest.mark.parametrize("ids", [{"id_header": "event_id", "id_field": "eid"}, {"id_field": "eid"},
                                 {"include_headers": True},
                                 {"id_header": "event_id", "include_headers": True}])
def test_the_connectors_give_the_same_rows_and_ids(spark: Any, broker: Any, tmp_path: Path,
                                                   ids: dict[str, Any]) -> None:
    topic = "same-" + "-".join(sorted(ids)).replace("_", "")
    broker.create_topic(topic, 3)
    _produce(broker.bootstrap, topic, 600, partitions=3)
    spark_rows = _run(spark, broker.bootstrap, tmp_path / "spark", "auto", subscribe=topic,
                      max_offsets_per_trigger=250, **ids)
    own_rows = _run(spark, broker.bootstrap, tmp_path / "own", "onceflow", subscribe=topic,
                    max_offsets_per_trigger=250, **ids)
    assert spark_rows.num_rows == own_rows.num_rows == 600
    for rows in (spark_rows, own_rows):  # headers only when asked for (Spark's includeHeaders)
        assert ("headers" in rows.column_names) == bool(ids.get("include_headers")), rows.column_names
    assert _comparable(spark_rows) == _comparable(own_rows)
    for r in spark_rows.to_pylist():  # the producer's id: header, then field, else the coordinates
        n = json.loads(r["value"])["n"]
        want = (f"e{n}" if "id_header" in ids and n % 5 else f"f{n}" if "id_field" in ids and n % 7
                else f"{topic}/{r['partition']}/{r['offset']}")
        assert r["record_id"] == want, r
    # the checkpoints tell the connectors apart: Spark's logs {topic: {partition: offset}}
    end0 = ckpt.source_offset(tmp_path / "spark", 0)
    assert end0 is not None and "offsets" not in end0 and set(end0) == {topic}
    assert initial_offsets(tmp_path / "spark") == {topic: {"0": 0, "1": 0, "2": 0}}
    own0 = ckpt.source_offset(tmp_path / "own", 0)
    assert own0 is not None and "offsets" in own0 and initial_offsets(tmp_path / "own") is None
    last = max(ckpt.offset_batches(tmp_path / "spark"))  # either form read: all 600 offsets planned
    ends = logged_offsets(ckpt.source_offset(tmp_path / "spark", last))[0]
    assert ends == {(topic, p): 200 for p in range(3)}
    assert ranges.read(tmp_path / "spark", 0).has_input()


def test_a_missing_topic_is_refused_when_read_kafka_is_called(spark: Any, broker: Any) -> None:
    broker.create_topic("orders-here", 1)
    with pytest.raises(ConfigError, match=r"no topic 'orders-hre' \(did you mean 'orders-here'\?\)"):
        onceflow.read_kafka(spark, broker.bootstrap, subscribe="orders-hre")
    df = onceflow.read_kafka(spark, broker.bootstrap, subscribe="orders-later", allow_missing_topics=True)
    assert df.isStreaming and "record_id" in df.columns


def test_which_connector_is_said_in_one_log_line(spark: Any, broker: Any,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    broker.create_topic("said", 1)
    with caplog.at_level(logging.INFO, logger="onceflow.kafka"):
        onceflow.read_kafka(spark, broker.bootstrap, subscribe="said")
    said = [r.getMessage() for r in caplog.records if r.name == "onceflow.kafka"]
    assert said == ["onceflow.read_kafka: reading with Spark's Kafka connector (format 'kafka')"]
    with pytest.raises(ConfigError, match="connector must be 'auto', 'spark' or 'onceflow'"):
        onceflow.read_kafka(spark, broker.bootstrap, subscribe="said", connector="native")
