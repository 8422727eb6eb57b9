"""Every sink of ``write_stream`` through a real Spark Connect server, collected and task-written.

The pipeline is written for this test: orders (some ids twice) deduplicated and summed per
customer, one batch per file, written through a client of a Connect server (a process of its
own) into each sink — its collected path and its task-written path (``collect_below=0``: every
batch written by Spark's tasks on the server's executors). What each sink holds is read back with
its own reader (sqlite3, deltalake, a read_committed Kafka consumer, the HTTP service's record)
and compared with sums computed here. Delta, Kafka and HTTP again with a server SIGKILLed by a
crash point between the sink's commit and Spark's commit log, the query then resumed on another.
``make test-long`` (one server and one broker, ~2 minutes; a crashing server per killed test).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from onceflow.verify.connect_server import ConnectServer
from onceflow.verify.kafka_server import KafkaServer
from onceflow.verify.service import ServiceProcess, read_effects

pytestmark = [pytest.mark.spark, pytest.mark.long]

CLIENT = '''
import sys
import onceflow
from onceflow import Table
from onceflow.runtime.session import session
from pyspark.sql import functions as F

url, root, sink_name, target, collect_below, name = sys.argv[1:7]
below = int(collect_below)
spark = session(remote=url)
orders = (spark.readStream.schema("order_id STRING, customer STRING, qty BIGINT, ts TIMESTAMP")
          .option("maxFilesPerTrigger", 1).parquet(f"{root}/in"))
clean = onceflow.deduplicate(orders, id="order_id", event_time="ts", within="1 hour")
table = Table(key=["customer"], add=["qty", "orders"])
if sink_name == "delta":
    sink = onceflow.delta(target, collect_below=below)
elif sink_name == "kafka":
    sink, table = onceflow.kafka(target, sink_id=f"k{below}", collect_below=below), Table(key=["customer"])
elif sink_name == "http":
    sink = onceflow.http(target, ledger=f"{root}/ledger.db", collect_below=below)
    table = Table(key=["customer", "b"])
elif sink_name == "iceberg":  # every batch through the tasks; append tables
    sink, table = onceflow.iceberg(f"sqlite:///{root}/catalog.db", target), Table()
else:
    sink = onceflow.sqlite(target, collect_below=below)

def per_batch(batch, batch_id):
    out = batch.groupBy("customer").agg(F.sum("qty").alias("qty"), F.count("*").alias("orders"))
    return out.withColumn("b", F.lit(batch_id)) if sink_name in ("kafka", "http") else out

query = onceflow.write_stream(clean, sink=sink, checkpoint=f"{root}/ck", tables={name: table},
                              per_batch=per_batch, once=True)
query.awaitTermination()
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    with ConnectServer(tmp_path_factory.mktemp("connect")) as s:
        yield s


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaServer]:
    with KafkaServer() as b:
        yield b


def _inputs(root: Path) -> tuple[int, int]:
    """Three files, 100 ids of the second once more in the third; returns (orders, qty) once each."""
    start = datetime(2026, 8, 1)
    once: dict[str, int] = {}
    (root / "in").mkdir()
    for n in range(3):
        ids = [f"o{n}-{i}" for i in range(400)] + ([f"o1-{i}" for i in range(100)] if n == 2 else [])
        qty = [int(i[1]) * 1000 + int(i.split("-")[1]) + 1 for i in ids]  # a copy has its original's
        once.update(zip(ids, qty, strict=True))
        pq.write_table(pa.table({"order_id": ids, "customer": [f"c{k % 3}" for k in range(len(ids))],
                                 "qty": pa.array(qty, pa.int64()),
                                 "ts": [start + timedelta(minutes=n, seconds=k % 50)
                                        for k in range(len(ids))]}),
                       root / "in" / f"part-{n}.parquet")
    return len(once), sum(once.values())


def _run(server: ConnectServer, root: Path, sink: str, target: str, collect_below: int,
         name: str) -> None:
    (root / "client.py").write_text(CLIENT)
    done = subprocess.run([sys.executable, str(root / "client.py"), server.url, str(root), sink, target,
                           str(collect_below), name], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-20000:]


def _kafka_rows(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "isolation.level": "read_committed",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0)])
    rows = []
    while (m := c.poll(5)) is not None:
        if not m.error():
            rows.append(json.loads(m.value()))
    c.close()
    return rows


@pytest.mark.parametrize(("sink", "collect_below"), [
    *((s, c) for s in ("sqlite", "delta", "kafka", "http") for c in (100_000, 0)), ("iceberg", 0)],
    ids=lambda v: {100_000: "collected", 0: "tasks"}.get(v, v) if isinstance(v, int) else v)
def test_every_sink_through_connect(server: ConnectServer, broker: KafkaServer, tmp_path: Path,
                                    sink: str, collect_below: int) -> None:
    orders, qty = _inputs(tmp_path)
    name = f"per_customer_{sink}_{'tasks' if collect_below == 0 else 'collected'}"  # a topic per test
    with contextlib.ExitStack() as stack:
        target = _target(stack, sink, tmp_path, broker)
        _run(server, tmp_path, sink, target, collect_below, name)
    got = _sums(sink, tmp_path, broker, name)
    assert got == (orders, qty)
    _check_markers(_markers(sink, tmp_path, broker.bootstrap, collect_below))


@pytest.mark.parametrize("sink", ["delta", "kafka", "http"])
def test_a_server_killed_after_the_sinks_commit_then_another_server_write_each_row_once(
        server: ConnectServer, broker: KafkaServer, tmp_path: Path, sink: str) -> None:
    """A crash point SIGKILLs a server's JVM between the sink's commit and Spark's commit log of
    batch 1 (data, written by Spark's tasks); the client, left retrying, is SIGKILLed too. Another
    server runs the query again from its checkpoint: batch 1 is not written twice."""
    orders, qty = _inputs(tmp_path)
    name = f"per_customer_{sink}_killed"
    (tmp_path / "client.py").write_text(CLIENT)
    with contextlib.ExitStack() as stack:
        target = _target(stack, sink, tmp_path, broker)
        crash = {"ONCEFLOW_CRASH_AT": "after_sink_commit@1"}
        with ConnectServer(tmp_path / "crashing", env=crash) as crashing:
            args = [crashing.url, str(tmp_path), sink, target, "0", name]  # every batch by Spark's tasks
            client = subprocess.Popen([sys.executable, str(tmp_path / "client.py"), *args],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True)
            died = crashing.wait_exit(240)
            os.killpg(client.pid, signal.SIGKILL)  # Connect's client retries a lost server for minutes
            client.wait(timeout=60)
        assert died, "the crash point left the server running"
        assert "crash point after_sink_commit at batch 1" in crashing.log.read_text()
        assert not (tmp_path / "ck" / "commits" / "1").exists()  # the sink has batch 1, Spark not
        _run(server, tmp_path, sink, target, 0, name)
    assert _sums(sink, tmp_path, broker, name) == (orders, qty)


def _target(stack: contextlib.ExitStack, sink: str, root: Path, broker: KafkaServer) -> str:
    """Where the client writes (an HTTP sink's service started on ``stack``)."""
    if sink == "http":
        return stack.enter_context(ServiceProcess(root / "effects.db")).effects_url
    return {"sqlite": str(root / "out.db"), "delta": str(root / "lake"), "iceberg": str(root / "warehouse"),
            "kafka": broker.bootstrap}[sink]


def _sums(sink: str, root: Path, broker: KafkaServer, name: str) -> tuple[int, int]:
    """(orders, qty) summed over what the sink holds, read with its own reader."""
    if sink == "sqlite":
        with sqlite3.connect(root / "out.db") as db:
            return db.execute(f"SELECT sum(orders), sum(qty) FROM {name}").fetchone()
    if sink == "delta":
        from deltalake import DeltaTable

        t = DeltaTable(str(root / "lake" / name)).to_pyarrow_table()
        return sum(t["orders"].to_pylist()), sum(t["qty"].to_pylist())
    if sink == "iceberg":
        from onceflow.sinks.iceberg.sink import IcebergTablesSink

        lake = IcebergTablesSink(f"sqlite:///{root}/catalog.db", root / "warehouse")
        t = lake.catalog.load_table(("onceflow", name)).scan().to_arrow()
        return sum(t["orders"].to_pylist()), sum(t["qty"].to_pylist())
    if sink == "kafka":
        rows = _kafka_rows(broker.bootstrap, name)
        return sum(r["orders"] for r in rows), sum(r["qty"] for r in rows)
    effects = [e["payload"] for e in read_effects(root / "effects.db")]
    return sum(e["orders"] for e in effects), sum(e["qty"] for e in effects)


def _markers(sink: str, root: Path, bootstrap: str, collect_below: int) -> list[dict[str, Any]]:
    """The sink's batch markers, read after the run."""
    import onceflow

    if sink == "sqlite":
        with sqlite3.connect(root / "out.db") as db:
            db.row_factory = sqlite3.Row
            return [dict(r) for r in db.execute("SELECT * FROM onceflow_batches ORDER BY batch_id")]
    if sink == "delta":
        return onceflow.delta(str(root / "lake")).batches()
    if sink == "iceberg":
        return onceflow.iceberg(f"sqlite:///{root}/catalog.db", root / "warehouse").batches()
    if sink == "kafka":
        return onceflow.kafka(bootstrap, sink_id=f"k{collect_below}").batches()
    return onceflow.http("http://127.0.0.1:9/unused", ledger=str(root / "ledger.db")).batches()


def _check_markers(markers: list[dict[str, Any]]) -> None:
    """Each file's batch: its rows from the files; the dedup's drops from the progress (Connect).

    A batch's duplicates come with the batch after it (``marker.Amend``): every batch but the
    last has them (the third file repeats 100 ids of the second).
    """
    data = [m for m in markers if m["input_rows"]]
    assert [m["input_rows"] for m in data] == [400, 400, 500], markers
    dups = [m["duplicates_dropped"] for m in data]
    assert dups[:2] == [0, 0] and dups[2] in (100, None), markers
    assert all(m["duplicates_dropped"] is not None for m in markers[:-1]), markers
