"""Kafka -> PostgreSQL through a real Spark Connect server, with the server killed mid-stream.

The pipeline is written for this test: JSON payments in a 2-partition topic (the producer's id in
a header; every tenth payment sent twice), checked and parsed with ``expect`` (an amount must be
positive; one record is not JSON), deduplicated by the header id, summed per account into
PostgreSQL with ``rejects=``. A crash point in the server's ``foreachBatch`` worker SIGKILLs the
server JVM inside the sink's transaction of a batch with data; a new server and client finish.
The expected sums are computed here from what was produced.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.verify.connect_server import ConnectServer
from onceflow.verify.kafka_server import KafkaServer

pytestmark = [pytest.mark.spark, pytest.mark.faults, pytest.mark.postgres,
              pytest.mark.long]  # ~100 s: make test-long (make test is near its 30 minutes)

CLIENT = '''
import sys
import onceflow
from onceflow import Table
from onceflow.runtime.session import session
from pyspark.sql import functions as F

url, bootstrap, dsn, root = sys.argv[1:5]
spark = session(remote=url)
raw = onceflow.read_kafka(spark, bootstrap, subscribe="payments", id_header="payment_id",
                          max_offsets_per_trigger=400)
payments = onceflow.expect(raw, json="value", schema="account STRING, amount BIGINT, ts TIMESTAMP",
                           checks={"amount_positive": "amount > 0"}, keep="record_id")
clean = onceflow.deduplicate(payments, id="record_id", event_time="ts", within="1 hour")
query = onceflow.write_stream(
    clean, sink=onceflow.postgres(dsn, sink_id="connect_payments"), checkpoint=f"{root}/ck",
    tables={"per_account": Table(key=["account"], add=["amount", "payments"])},
    per_batch=lambda b: b.groupBy("account").agg(F.sum("amount").alias("amount"),
                                                 F.count("*").alias("payments")),
    rejects="bad_payments", once=True)
query.awaitTermination()
'''


def _produce(bootstrap: str) -> dict[str, tuple[int, int]]:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap})
    expected: dict[str, list[int]] = {}
    for i in range(1_200):
        value = {"account": f"acct{i % 9}", "amount": i + 1, "ts": f"2026-06-01T00:{i % 60:02d}:00Z"}
        sends = 2 if i % 10 == 0 else 1  # a producer retry: the same id twice
        for _ in range(sends):
            p.produce("payments", value=json.dumps(value).encode(), partition=i % 2,
                      headers=[("payment_id", f"p{i}".encode())])
        e = expected.setdefault(value["account"], [0, 0])
        e[0] += value["amount"]
        e[1] += 1
    p.produce("payments", value=b"{not json", partition=0, headers=[("payment_id", b"bad1")])
    p.produce("payments", value=json.dumps({"account": "acct1", "amount": -5, "ts": "2026-06-01T00:00:00Z"})
              .encode(), partition=1, headers=[("payment_id", b"bad2")])
    p.flush(30)
    return {a: (s, n) for a, (s, n) in expected.items()}


def _client(server: ConnectServer, bootstrap: str, dsn: str, root: Path) -> subprocess.Popen[str]:
    (root / "client.py").write_text(CLIENT)
    return subprocess.Popen([sys.executable, str(root / "client.py"), server.url, bootstrap, dsn, str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def test_kafka_to_postgres_through_connect_survives_a_server_killed_inside_the_sinks_transaction(
        tmp_path: Path, pg_dsn: str) -> None:
    import psycopg

    with KafkaServer(topics={"payments": 2}) as broker:
        expected = _produce(broker.bootstrap)
        crash = {"ONCEFLOW_CRASH_AT": "inside_sink_txn@1"}
        with ConnectServer(tmp_path / "server1", env=crash) as server:
            client = _client(server, broker.bootstrap, pg_dsn, tmp_path)
            # the client ending first means the crash point never fired
            alive = not server.wait_exit(240, unless=lambda: client.poll() is not None)
            os.killpg(client.pid, signal.SIGKILL)  # Connect's client retries a lost server for minutes
            out = client.communicate(timeout=60)[0]
            assert not alive, f"the crash point did not fire: {out[-3000:]}"
        log = (tmp_path / "server1" / "connect-server.log").read_text()
        assert "crash point inside_sink_txn at batch 1" in log
        with ConnectServer(tmp_path / "server2") as server:
            client = _client(server, broker.bootstrap, pg_dsn, tmp_path)
            out = client.communicate(timeout=300)[0]
            assert client.returncode == 0, out[-4000:]
    with psycopg.connect(pg_dsn) as db:
        got = {a: (int(s), int(n))
               for a, s, n in db.execute("SELECT account, amount, payments FROM per_account")}
        rules = sorted(r for (r,) in db.execute("SELECT rule FROM bad_payments"))
        markers = db.execute("SELECT batch_id, input_rows, events_counted, duplicates_dropped, late_dropped, "
                             "rejected_rows FROM onceflow_batches WHERE sink_id = %s ORDER BY batch_id",
                             ("connect_payments",)).fetchall()
    assert got == expected
    assert rules == ["check", "parse"]
    assert len(markers) >= 3  # several batches: the crash hit batch 1 of them
    # the plan's metrics, from the query's progress a batch later (the rows between the Kafka
    # offsets checked against its input rows): where known they add up, and they are known
    # for a batch with duplicates
    known = [m for m in markers if m[3] is not None]
    assert any(m[3] > 0 for m in known), markers
    for batch, rows, counted, dups, late, bad in known:
        assert rows == counted + dups + late + bad, (batch, markers)
