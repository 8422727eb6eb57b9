"""onceflow through a real Spark Connect server (a process of its own), the client in another.

The pipeline is written for these tests: orders read from Parquet files one file per batch,
checked (``expect``: quantity positive), deduplicated by id within 10 minutes, summed per
customer into SQLite, with ``late=`` and ``rejects=``. The expected tables are computed here
with pyarrow from the files (the watermark rule written out), never through onceflow. Faults:
a crash point in the server's ``foreachBatch`` worker SIGKILLs the server JVM between the sink's
commit and Spark's commit log of a batch with data; the client is SIGKILLed while a batch with
data runs; both restarted, the tables are exact. The client that waited on the killed server
ends by itself within its bound (``$ONCEFLOW_CONNECT_SERVER_WAIT``), naming the server, while
Spark's own query's client on that server still waits. A client that cannot see the server's
checkpoint restarts the query with the checkpoint's checks run on the server's driver, and gets
their refusal of a log damaged on the server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from onceflow.runtime.connect import SERVER_WAIT_ENV
from onceflow.verify.connect_server import ConnectServer

pytestmark = [pytest.mark.spark, pytest.mark.faults]

START = datetime(2026, 5, 1)
CLIENT = '''
import sys, time
import onceflow
from onceflow import Table
from onceflow.runtime.session import session
from pyspark.sql import functions as F

url, root, trigger, pause = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
checkpoint = sys.argv[5] if len(sys.argv) > 5 else f"{root}/ck"
spark = session(remote=url)
raw = (spark.readStream.schema("order_id STRING, customer STRING, qty BIGINT, ts TIMESTAMP")
       .option("maxFilesPerTrigger", 1).parquet(f"{root}/in"))
checked = onceflow.expect(raw, checks={"qty_positive": "qty > 0"})
clean = onceflow.deduplicate(checked, id="order_id", event_time="ts", within="10 minutes")

def per_batch(batch):
    import pyspark  # where the server's foreachBatch worker imported it from
    with open(f"{root}/worker-pyspark", "w") as f:
        f.write(pyspark.__file__)
    time.sleep(pause)  # a batch with data stays in flight long enough to be killed
    return batch.groupBy("customer").agg(F.sum("qty").alias("qty"), F.count("*").alias("orders"))

query = onceflow.write_stream(
    clean, sink=onceflow.sqlite(f"{root}/db/out.db"), checkpoint=checkpoint,
    tables={"per_customer": Table(key=["customer"], add=["qty", "orders"])}, per_batch=per_batch,
    late="late_orders", rejects="bad_orders", once=trigger == "once", trigger="1 second")
if trigger == "once":
    query.awaitTermination()
else:
    query.awaitTermination(float(trigger))
    query.stop()
print("PROVIDER", spark.conf.get("spark.sql.streaming.stateStore.providerClass"))
'''

PLAIN = '''
import sys
from pyspark.sql import SparkSession
url, root = sys.argv[1], sys.argv[2]
spark = SparkSession.builder.remote(url).getOrCreate()
schema = "order_id STRING, customer STRING, qty BIGINT, ts TIMESTAMP"
raw = spark.readStream.schema(schema).parquet(f"{root}/in")
query = (raw.writeStream.foreachBatch(lambda df, _: df.count())
         .option("checkpointLocation", f"{root}/ck-plain").trigger(processingTime="1 second").start())
print("STARTED", flush=True)
query.awaitTermination()
'''
"""Spark's own ``foreachBatch`` query waiting on the same server: the control of the client's bound."""


def _write_inputs(root: Path, upto: int = 4) -> tuple[dict[str, tuple[int, int]], int, int]:
    """The first ``upto`` files (one batch each), those missing written; the oracle over them.

    Returns:
        Per customer (qty, orders), late rows, bad records.
    """
    def at(s: int) -> datetime:
        return START + timedelta(seconds=s)

    files = [
        [(f"a{i}", f"c{i % 5}", i + 1, at(i)) for i in range(300)],
        [(f"b{i}", f"c{i % 5}", 2 * i + 1, at(3_600 + i)) for i in range(300)],
        # more on time, ids of file 1 again (duplicates), two bad records (a null id, a quantity
        # that is not positive)
        [(f"d{i}", f"c{i % 5}", 3, at(3_700 + i)) for i in range(200)]
        + [(f"b{i}", f"c{i % 5}", 2 * i + 1, at(3_600 + i)) for i in range(50)]
        + [(None, "c1", 5, at(3_750)), ("neg1", "c2", -4, at(3_750))],
        # late ones (event times far behind the watermark) and more on time
        [(f"late{i}", f"c{i % 5}", 7, at(100 + i)) for i in range(40)]
        + [(f"e{i}", f"c{i % 5}", 4, at(4_000 + i)) for i in range(100)],
        # written after the rest (a run that starts with data to read): on time, new ids
        [(f"f{i}", f"c{i % 5}", 6, at(4_100 + i)) for i in range(60)],
    ][:upto]
    (root / "in").mkdir(parents=True, exist_ok=True)
    (root / "db").mkdir(exist_ok=True)
    for n, rows in enumerate(files):
        if (root / "in" / f"part-{n}.parquet").exists():
            continue
        cols = list(zip(*rows, strict=True))
        table = pa.table({"order_id": pa.array(cols[0], pa.string()), "customer": list(cols[1]),
                          "qty": pa.array(cols[2], pa.int64()), "ts": pa.array(cols[3], pa.timestamp("us"))})
        pq.write_table(table, root / "in" / f"part-{n}.parquet")
    # the oracle, Spark's rules written out: a record is bad (null id, qty <= 0); late in batch k
    # when its event time is at or below the late watermark of k — the max event time of batches
    # 0..k-2 minus 10 minutes (Spark filters late rows by the watermark of the batch before); a
    # duplicate of an id seen; else counted
    seen: set[str] = set()
    sums: dict[str, list[int]] = {}
    late = bad = 0
    for k, rows in enumerate(files):
        before = [r[3] for f in files[:max(0, k - 1)] for r in f]
        watermark = max(before) - timedelta(minutes=10) if k >= 2 else None
        for oid, cust, qty, ts in rows:
            if oid is None or qty <= 0:
                bad += 1
            elif watermark is not None and ts <= watermark:
                late += 1
            elif oid not in seen:
                seen.add(oid)
                s = sums.setdefault(cust, [0, 0])
                s[0] += qty
                s[1] += 1
    return {c: (q, k) for c, (q, k) in sums.items()}, late, bad


def _client(server: ConnectServer, root: Path, trigger: str = "once", pause: float = 0.0,
            unseen: tuple[Path, ...] = (), checkpoint: str | None = None,
            server_wait: float | None = None) -> subprocess.Popen[str]:
    """The client in a process of its own; the directories ``unseen`` are hidden from it.

    ``server_wait``: its ``$ONCEFLOW_CONNECT_SERVER_WAIT`` (seconds for a server that stopped answering).

    Each is covered by an empty tmpfs in a mount namespace of the client's own
    (``unshare -m``): the server still sees what is there, the client does not.
    """
    (root / "client.py").write_text(CLIENT)
    cmd = [sys.executable, str(root / "client.py"), server.url, str(root), trigger, str(pause),
           *([checkpoint] if checkpoint else [])]
    if unseen:
        mounts = " && ".join(f'mount -t tmpfs none "{d}"' for d in unseen)
        cmd = ["unshare", "-m", "sh", "-c", f'{mounts} && exec "$@"', "sh", *cmd]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "SPARK_CONNECT_MODE_ENABLED": "1",
                                 **({SERVER_WAIT_ENV: str(server_wait)} if server_wait else {})},
                            start_new_session=True)


def _markers(root: Path) -> dict[int, tuple[int | None, ...]]:
    """Batch -> (input rows, events counted, duplicates, late, rejected) of the sink's markers."""
    with sqlite3.connect(root / "db" / "out.db") as db:
        return {b: tuple(m) for b, *m in db.execute(
            "SELECT batch_id, input_rows, events_counted, duplicates_dropped, late_dropped, rejected_rows "
            "FROM onceflow_batches WHERE sink_id = 'default'")}


def _tables(root: Path) -> tuple[dict[str, tuple[int, int]], int, list[str]]:
    with sqlite3.connect(root / "db" / "out.db") as db:
        sums = {c: (q, k) for c, q, k in db.execute("SELECT customer, qty, orders FROM per_customer")}
        late = db.execute("SELECT count(*) FROM late_orders").fetchone()[0]
        rules = sorted(r for (r,) in db.execute("SELECT rule FROM bad_orders"))
    return sums, late, rules


@pytest.mark.long  # make test reached 30:52: the killed-server test below runs the same pipeline there
def test_the_pipeline_runs_exactly_once_through_a_connect_server(tmp_path: Path) -> None:
    expected, late, bad = _write_inputs(tmp_path)
    assert late == 40 and bad == 2
    with ConnectServer(tmp_path / "server") as server:
        client = _client(server, tmp_path)
        out, _ = client.communicate(timeout=300)
        assert client.returncode == 0, out[-4000:]
    assert "PROVIDER org.apache.spark.sql.onceflow.IdStateStoreProvider" in out  # the server has the jars
    sums, late_rows, rules = _tables(tmp_path)
    assert sums == expected
    assert late_rows == late
    assert rules == ["check", "id"]
    # a batch's plan metrics (from the query's progress, written a batch later) where the batch
    # after it ran in the same run: batch 3's 40 late rows by the last run's no-data batch 4; a
    # batch whose next ran elsewhere (the orphaned run of the killed client) keeps NULL, never wrong
    markers = _markers(tmp_path)
    assert markers[3] == (140, 100, 0, 40, 0)
    for batch, (rows, counted, dups, late_n, bad_n) in markers.items():
        if dups is not None:
            assert rows == counted + dups + late_n + bad_n, (batch, markers)
    # the plan's metrics of a batch come from the query's progress into its marker, a batch later:
    # every batch but the last of the run has them, and they add up (no aggregation before per_batch)
    markers = _markers(tmp_path)
    assert markers[2] == (252, 200, 50, 0, 2)
    for batch, (rows, counted, dups, late_n, bad_n) in markers.items():
        if batch < max(markers):
            assert None not in (rows, counted, dups, late_n, bad_n), (batch, markers)
            assert rows == counted + dups + late_n + bad_n, (batch, markers)


def test_a_server_killed_between_the_sinks_commit_and_sparks_and_a_killed_client_resume_exactly(
        tmp_path: Path) -> None:
    expected, late, _ = _write_inputs(tmp_path)
    crash = {"ONCEFLOW_CRASH_AT": "after_sink_commit@1"}
    with ConnectServer(tmp_path / "server1", env=crash) as server:
        (tmp_path / "plain.py").write_text(PLAIN)
        plain = subprocess.Popen([sys.executable, str(tmp_path / "plain.py"), server.url, str(tmp_path)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env={**os.environ, "SPARK_CONNECT_MODE_ENABLED": "1"},
                                 start_new_session=True)
        client = _client(server, tmp_path, server_wait=8)
        assert server.wait_exit(240), "the crash point left the server"
        gone = time.monotonic()
        try:  # the waiting client ends on its own, naming the server
            out, _ = client.communicate(timeout=60)
            ended = time.monotonic() - gone
            plain_waits = plain.poll() is None  # Spark's own: its client retries for minutes
        finally:
            for proc in (client, plain):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        said = plain.communicate(timeout=60)[0]
    assert client.returncode != 0 and "ServerLostError" in out, out[-4000:]
    assert f"the Spark Connect server {server.url} has not answered for 8 s (UNAVAILABLE" in out, out[-4000:]
    assert "run this pipeline again" in out
    assert ended < 8 + 20, ended  # its bound, plus the client's exit
    assert plain_waits and "STARTED" in said, said[-3000:]
    log = (tmp_path / "server1" / "connect-server.log").read_text()
    assert "crash point after_sink_commit at batch 1" in log
    assert not (tmp_path / "ck" / "commits" / "1").exists()  # the sink has batch 1, Spark's commit log not
    with ConnectServer(tmp_path / "server2") as server:
        client = _client(server, tmp_path, trigger="600", pause=3.0)  # a continuous query, slow batches
        deadline = time.monotonic() + 240
        while not (tmp_path / "ck" / "offsets" / "2").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
        assert (tmp_path / "ck" / "offsets" / "2").exists()
        assert not (tmp_path / "ck" / "commits" / "2").exists()
        os.killpg(client.pid, signal.SIGKILL)  # batch 2 (data) in flight: its per_batch sleeps
        client.wait(timeout=60)
        again = _client(server, tmp_path)  # the same checkpoint; Spark stops the orphaned run
        out, _ = again.communicate(timeout=300)
        assert again.returncode == 0, out[-4000:]
        markers = _markers(tmp_path)
        # Spark put its pyspark.zip first on the worker's path; the install's start-up line moved it
        # (no module compiled at the query's start: tests/core/test_jvmstart.py)
        worker = (tmp_path / "worker-pyspark").read_text()
        assert ".zip" not in worker and worker.endswith(os.path.join("pyspark", "__init__.py")), worker
        # a client that cannot see the checkpoint nor the database (an empty file system mounted
        # over each in the client's own mount namespace), with a new file to read: the
        # checkpoint's checks, the sink's and its bind run on the server's driver
        hidden = (tmp_path / "ck", tmp_path / "db")
        expected, late, _ = _write_inputs(tmp_path, 5)
        blind = _client(server, tmp_path, unseen=hidden)
        out, _ = blind.communicate(timeout=300)
        assert blind.returncode == 0, out[-4000:]
        assert _markers(tmp_path)[5][:2] == (60, 60)
        # they are the server's: a commit file damaged, or a table that no longer fits, where only
        # the server sees them stops the blind client before the query starts, naming them
        commits = tmp_path / "ck" / "commits"
        last = commits / str(max(int(p.name) for p in commits.glob("[0-9]*")))
        kept = last.read_bytes()
        last.write_text("not a commit\n")
        damaged = _client(server, tmp_path, unseen=hidden)
        out, _ = damaged.communicate(timeout=300)
        last.write_bytes(kept)
        assert damaged.returncode != 0 and "CheckpointDamagedError" in out and str(last) in out, out[-4000:]
        planned = sorted(p.name for p in (tmp_path / "ck" / "offsets").iterdir())
        with sqlite3.connect(tmp_path / "db" / "out.db") as db:
            db.execute("ALTER TABLE per_customer RENAME COLUMN orders TO n_orders")
        unfit = _client(server, tmp_path, unseen=hidden)
        out, _ = unfit.communicate(timeout=300)
        with sqlite3.connect(tmp_path / "db" / "out.db") as db:
            db.execute("ALTER TABLE per_customer RENAME COLUMN n_orders TO orders")
        assert unfit.returncode != 0 and "ConfigError" in out and "per_customer" in out, out[-4000:]
        assert sorted(p.name for p in (tmp_path / "ck" / "offsets").iterdir()) == planned  # never started
        # a relative checkpoint: the client and the server would each resolve it in their own
        # working directory
        relative = _client(server, tmp_path, checkpoint="ck-relative")
        out, _ = relative.communicate(timeout=300)
        assert relative.returncode != 0 and "ConfigError" in out, out[-4000:]
        assert "'ck-relative' is a relative path" in out, out[-4000:]
        assert not (Path.cwd() / "ck-relative").exists() and not (server.workdir / "ck-relative").exists()
    sums, late_rows, rules = _tables(tmp_path)
    assert sums == expected
    assert late_rows == late
    assert rules == ["check", "id"]
    # a batch's plan metrics (from the query's progress, written a batch later) where the batch
    # after it ran in the same run: batch 3's 40 late rows by the last run's no-data batch 4; a
    # batch whose next ran elsewhere (the orphaned run of the killed client) keeps NULL, never wrong
    assert markers[3] == (140, 100, 0, 40, 0)
    markers = _markers(tmp_path)
    for batch, (rows, counted, dups, late_n, bad_n) in markers.items():
        if dups is not None:
            assert rows == counted + dups + late_n + bad_n, (batch, markers)
