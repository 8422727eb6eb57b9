"""onceflow under ``spark-submit``: a driver JVM started before onceflow's session.

The pipeline is written for this test (orders deduplicated by id, summed per customer); each test
runs it with the real ``spark-submit`` of the installed PySpark and checks the table against a
recomputation with pyarrow. Also: a session whose jars are neither shipped nor compilable (a
read-only cache) falls back to Spark's own classes.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.spark

APP = '''
import sys
import onceflow
from onceflow import Table
from onceflow.runtime.session import session
from pyspark.sql import functions as F

root = sys.argv[1]
spark = session()
orders = spark.readStream.schema("order_id STRING, customer STRING, qty BIGINT, ts TIMESTAMP") \\
    .parquet(f"{root}/in")
clean = onceflow.deduplicate(orders, id="order_id", event_time="ts", within="1 hour")
query = onceflow.write_stream(
    clean, sink=onceflow.sqlite(f"{root}/out.db"), checkpoint=f"{root}/ck",
    tables={"per_customer": Table(key=["customer"], add=["qty", "orders"])},
    per_batch=lambda b: b.groupBy("customer").agg(F.sum("qty").alias("qty"), F.count("*").alias("orders")),
    once=True)
query.awaitTermination()
print("PROVIDER", spark.conf.get("spark.sql.streaming.stateStore.providerClass", None))
print("CHECKPOINT_FILES", spark.conf.get("spark.sql.streaming.checkpointFileManagerClass", None))
import pyspark, py4j
print("PYSPARK_FROM", pyspark.__file__, py4j.__file__)
'''


def _orders(root: Path, n: int = 3_000) -> dict[str, tuple[int, int]]:
    """Input with every id written twice or thrice (same values); returns the expected table."""
    start = datetime(2026, 3, 1)
    ids = [f"o{i % (n // 3)}" for i in range(n)]
    table = pa.table({"order_id": ids, "customer": [f"c{int(i[1:]) % 7}" for i in ids],
                      "qty": [int(i[1:]) * 3 + 1 for i in ids],
                      "ts": [start + timedelta(seconds=int(i[1:])) for i in ids]})
    (root / "in").mkdir(parents=True)
    pq.write_table(table, root / "in" / "part-0.parquet")
    distinct = table.group_by(["order_id", "customer"]).aggregate([("qty", "max")])
    summed = distinct.group_by("customer").aggregate([("qty_max", "sum"), ("order_id", "count")])
    return {c: (q, k) for c, q, k in zip(summed["customer"].to_pylist(), summed["qty_max_sum"].to_pylist(),
                                        summed["order_id_count"].to_pylist(), strict=True)}


def _submit(root: Path, *flags: str, master: str = "local[2]", app: str = APP,
            env: dict[str, str] | None = None) -> str:
    """Run the app with ``spark-submit``; returns its stdout and stderr."""
    (root / "app.py").write_text(app)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})}
    done = subprocess.run([str(bin_dir / "spark-submit"), "--master", master, *flags,
                           str(root / "app.py"), str(root)], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    return out


def _table(root: Path) -> dict[str, tuple[int, int]]:
    with sqlite3.connect(root / "out.db") as db:
        return {c: (q, k) for c, q, k in db.execute("SELECT customer, qty, orders FROM per_customer")}


def test_spark_submit_without_flags_loads_the_classes_and_says_the_driver_memory(tmp_path: Path) -> None:
    expected = _orders(tmp_path)
    out = _submit(tmp_path, env={"ONCEFLOW_DRIVER_JAVA_OPTIONS": ""})  # not the tests' quick start-up options
    assert "ClassNotFoundException" not in out
    assert "PROVIDER org.apache.spark.sql.onceflow.IdStateStoreProvider" in out  # added to the running driver
    assert "CHECKPOINT_FILES org.apache.spark.sql.onceflow.LocalCheckpointFileManager" in out
    assert "pass --driver-memory 4g to spark-submit" in out  # a 1 GiB driver is said, not ignored
    # and Java's default collector, where onceflow's session would start its driver on the throughput one
    assert "pass --driver-java-options '-XX:+UseParallelGC' to spark-submit" in out
    # spark-submit put Spark's zips first on the path; onceflow, imported first, imported the
    # installed package instead (the same files, with bytecode)
    imported = next(line for line in out.splitlines() if line.startswith("PYSPARK_FROM")).split()[1:]
    assert all(".zip" not in f for f in imported), imported
    assert _table(tmp_path) == expected


@pytest.mark.long  # ~13 s: make test is near its 30 minutes (the flagless run above is the hard case)
def test_spark_submit_with_the_printed_jars_and_memory_says_nothing(tmp_path: Path) -> None:
    expected = _orders(tmp_path)
    cli = str(Path(sys.executable).parent / "onceflow")
    printed = subprocess.run([cli, "jars", "path", "onceflow"], capture_output=True, text=True,
                             check=True).stdout.strip()
    assert all(Path(p).is_file() for p in printed.split(","))
    out = _submit(tmp_path, "--driver-memory", "4g", "--driver-java-options", "-XX:+UseParallelGC",
                  "--jars", printed, env={"ONCEFLOW_DRIVER_JAVA_OPTIONS": ""})
    assert "pass --driver-memory" not in out and "cannot be added now" not in out
    assert "pass --driver-java-options" not in out
    assert "PROVIDER org.apache.spark.sql.onceflow.IdStateStoreProvider" in out
    assert _table(tmp_path) == expected


def test_a_read_only_cache_without_shipped_jars_falls_back_to_sparks_classes(tmp_path: Path) -> None:
    """No jar in the wheel for this Spark and a cache that cannot be written: Spark's own classes."""
    cache = tmp_path / "cache"
    cache.write_text("a file where the cache directory should be: nothing can be written under it")
    code = ("import sys; from pathlib import Path; from onceflow.runtime import scalac; "
            "scalac.SHIPPED_DIR = Path(sys.argv[1]); "
            "from onceflow.runtime.session import session; s = session(master='local[1]'); "
            "print('PROVIDER', s.conf.get('spark.sql.streaming.stateStore.providerClass', None)); "
            "print('ROWS', s.range(5).count())")
    env = {**os.environ, "ONCEFLOW_CACHE_DIR": str(cache / "onceflow")}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "no-shipped-jars")], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "ROWS 5" in out
    assert "PROVIDER None" in out or "HDFSBackedStateStoreProvider" in out
    assert "set ONCEFLOW_CACHE_DIR to a writable directory" in out  # the warning says why and what to do


@pytest.mark.long  # ~40 s: make test is near its 30 minutes
@pytest.mark.faults
def test_spark_submit_on_a_standalone_cluster_with_an_executor_killed_mid_write(tmp_path: Path) -> None:
    """Two workers; batch 1's first task attempt SIGKILLs its executor after writing part of its rows.

    Every batch is written by Spark's tasks (``collect_below=0``: scratch files beside the
    database, then one copy with the marker); Spark runs the lost task again on an executor
    it has left, and the table is exact.
    """
    from onceflow.verify.crashes import executor_confs
    from onceflow.verify.standalone import StandaloneCluster

    expected = _orders(tmp_path, n=6_000)
    app = APP.replace('onceflow.sqlite(f"{root}/out.db")',
                      'onceflow.sqlite(f"{root}/out.db", collect_below=0)')
    assert app != APP
    cluster = StandaloneCluster(tmp_path / "cluster", workers=2, cores=1).start()
    try:
        out = _submit(tmp_path, "--driver-memory", "1g", *executor_confs("task_mid_write@0", os.getpid()),
                      master=cluster.master_url, app=app, env={"ONCEFLOW_CRASH_AT": "task_mid_write@0"})
    finally:
        cluster.stop()
    assert "crash point task_mid_write at batch 0" in out or any(
        "crash point task_mid_write" in f.read_text(errors="replace")
        for f in (tmp_path / "cluster").rglob("stderr")), out[-3000:]
    assert _table(tmp_path) == expected
