"""Bad Kafka records: routed once to ``rejects=`` with topic/partition/offset, or named when the query stops.

The records and their verdicts come from the producer's delivery reports and the generator
(:mod:`tests.core.orders`: good or bad by construction), never from onceflow's contract.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import onceflow
from onceflow.errors import BatchRejectedError
from tests.core import orders

pytestmark = pytest.mark.spark


def test_bad_kafka_records_go_to_rejects_with_their_offsets(spark: Any, broker: Any, tmp_path: Path) -> None:
    broker.create_topic("orders-mixed", 2)
    manifest, db = tmp_path / "manifest.jsonl", tmp_path / "app.db"
    orders.produce(broker.bootstrap, "orders-mixed", manifest, 0, 700, bad_rate=0.15, seed=11)
    orders.start(spark, broker.bootstrap, onceflow.sqlite(db), tmp_path / "ck", topic="orders-mixed") \
        .awaitTermination()
    entries = orders.read_manifest(manifest)
    want = orders.expected(entries)
    assert orders.read_result(db) == want and len(want["rejected"]) > 50
    conn = sqlite3.connect(db)
    value, key, record, headers = conn.execute(
        "SELECT value, key, record, headers FROM rejected WHERE rule = 'parse' AND "
        "value LIKE 'order % lost its braces' LIMIT 1").fetchone()
    assert key.startswith("k") and record.startswith("orders-mixed/")
    # the stream reads no headers (read_kafka's default), the rejects table keeps the record's
    seq = [base64.b64decode(h["value"]).decode() for h in json.loads(headers) if h["key"] == "order_seq"]
    assert seq == [key[1:]], headers
    markers = conn.execute("SELECT input_rows, events_counted, duplicates_dropped, late_dropped, "
                           "rejected_rows FROM onceflow_batches").fetchall()
    assert sum(m[0] for m in markers) == len(entries)
    assert all(m[0] == m[1] + m[2] + m[3] + m[4] for m in markers), markers
    assert sum(m[4] for m in markers) == len(want["rejected"])


def test_without_rejects_the_error_names_topic_partition_offset(spark: Any, broker: Any,
                                                                tmp_path: Path) -> None:
    broker.create_topic("orders-poison", 1)
    manifest, db = tmp_path / "manifest.jsonl", tmp_path / "app.db"
    orders.produce(broker.bootstrap, "orders-poison", manifest, 0, 50, bad_rate=0.2, seed=5, partitions=1)
    query = orders.start(spark, broker.bootstrap, onceflow.sqlite(db), tmp_path / "ck", topic="orders-poison",
                         rejects=None)
    with pytest.raises(BatchRejectedError) as info:
        query.awaitTermination()
    entries = orders.read_manifest(manifest)
    first = min((e for e in entries if orders.KINDS[e["kind"]] is not None), key=lambda e: e["row"])
    assert f"topic 'orders-poison' partition 0 offset {first['row']}" in str(info.value), str(info.value)
    orders.start(spark, broker.bootstrap, onceflow.sqlite(db), tmp_path / "ck", topic="orders-poison") \
        .awaitTermination()
    assert orders.read_result(db) == orders.expected(entries)
