"""onceflow's SQLite format as a Spark Declarative Pipelines sink, run by ``onceflow pipelines run``.

The pipeline is written for this test (and is the example of docs/connect.md): a streaming flow
of Parquet orders appended into ``create_sink(format="onceflow_sqlite")``. Run twice over the same
storage, with a new file between the runs: each run exits 0, every input row is in the table
once, and each batch has its marker. The control: PySpark's own ``spark-pipelines`` exits 1
after a completed run of a pipeline whose sink is a plain Python data source without onceflow
(the reproduction in docs/connect.md), and ``onceflow pipelines run`` exits 0 on it; a pipeline
that fails still fails under it.
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

pytestmark = [pytest.mark.spark, pytest.mark.long]  # ~45 s; make test reached 30:52 (2026-11-28)

SPEC = """name: orders
storage: file://{root}/storage
libraries:
  - glob:
      include: transformations/**
"""

FLOW = '''from pyspark import pipelines as dp
from pyspark.sql import SparkSession

from onceflow.sinks.sqlite.datasource import register

spark = SparkSession.active()
register(spark)  # onceflow_sqlite, a Python data source: its writers run on the server
dp.create_sink("orders_sink", format="onceflow_sqlite",
               options={{"db": "{root}/out.db", "table": "orders", "sink_id": "sdp_orders"}})


@dp.append_flow(target="orders_sink")
def orders():
    return (spark.readStream.schema("order_id STRING, customer STRING, qty BIGINT, ts TIMESTAMP")
            .parquet("{root}/in"))
'''


def _file(root: Path, n: int, rows: int) -> None:
    start = datetime(2026, 7, 1) + timedelta(hours=n)
    ids = [f"f{n}-{i}" for i in range(rows)]
    pq.write_table(pa.table({"order_id": ids, "customer": [f"c{i % 4}" for i in range(rows)],
                             "qty": pa.array(range(rows), pa.int64()),
                             "ts": [start + timedelta(seconds=i) for i in range(rows)]}),
                   root / "in" / f"part-{n}.parquet")


def _runner(root: Path, *runner: str) -> subprocess.CompletedProcess[str]:
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    return subprocess.run([*runner, "run", "--spec", str(root / "pipeline.yml")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def _run(root: Path) -> str:
    done = _runner(root, str(Path(sys.executable).parent / "onceflow"), "pipelines")
    out = done.stdout + done.stderr
    assert "Run is COMPLETED" in out and done.returncode == 0, out[-4000:]
    return out


def _pipeline(root: Path, flow: str) -> None:
    (root / "in").mkdir()
    (root / "transformations").mkdir()
    (root / "pipeline.yml").write_text(SPEC.format(root=root))
    (root / "transformations" / "flow.py").write_text(flow.format(root=root))


NULL_SINK = '''from pyspark import pipelines as dp
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage


class NullWriter(DataSourceStreamWriter):
    def write(self, iterator):
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages, batchId):
        pass


class NullSink(DataSource):
    @classmethod
    def name(cls):
        return "null_sink"

    def streamWriter(self, schema, overwrite):
        return NullWriter()


spark = SparkSession.active()
spark.dataSource.register(NullSink)
dp.create_sink("out", format="null_sink", options={{}})


@dp.append_flow(target="out")
def rows():
    return spark.readStream.schema("{columns}").parquet("{root}/in")
'''
"""The reproduction of docs/connect.md: a Python sink without onceflow that writes nothing."""


def test_sparks_runner_fails_a_completed_python_sink_and_onceflows_does_not(tmp_path: Path) -> None:
    onceflow_cli = str(Path(sys.executable).parent / "onceflow")
    good = tmp_path / "good"
    good.mkdir()
    columns = "order_id STRING, customer STRING, qty BIGINT, ts TIMESTAMP"
    _pipeline(good, NULL_SINK.replace("{columns}", columns))
    _file(good, 0, 50)
    spark_own = _runner(good, str(Path(sys.executable).parent / "spark-pipelines"))
    out = spark_own.stdout + spark_own.stderr
    assert "Run is COMPLETED" in out and spark_own.returncode != 0, out[-4000:]
    assert "UNKNOWN_RESPONSE" in out and "__python_accumulator__" in out, out[-4000:]
    _run(good)  # the same pipeline on the same storage: 0
    bad = tmp_path / "bad"  # a run that fails still fails: the files' qty is no string
    bad.mkdir()
    _pipeline(bad, NULL_SINK.replace("{columns}", "order_id STRING, qty STRING"))
    _file(bad, 0, 50)
    failed = _runner(bad, onceflow_cli, "pipelines")
    out = failed.stdout + failed.stderr
    assert failed.returncode != 0 and "Run is COMPLETED" not in out, out[-4000:]


def test_onceflow_sqlite_as_a_declarative_pipelines_sink_writes_each_row_once(tmp_path: Path) -> None:
    _pipeline(tmp_path, FLOW)
    _file(tmp_path, 0, 700)
    _file(tmp_path, 1, 300)
    _run(tmp_path)
    _file(tmp_path, 2, 250)  # new input between the runs: only it is written by the second
    _run(tmp_path)
    with sqlite3.connect(tmp_path / "out.db") as db:
        rows, distinct, qty = db.execute("SELECT count(*), count(DISTINCT order_id), sum(qty) "
                                         "FROM orders").fetchone()
        markers = db.execute("SELECT batch_id, rows_written FROM onceflow_batches WHERE sink_id = ? "
                             "ORDER BY batch_id", ("sdp_orders",)).fetchall()
    assert (rows, distinct) == (1_250, 1_250)
    assert qty == sum(range(700)) + sum(range(300)) + sum(range(250))
    assert sum(n for _, n in markers) == 1_250 and len(markers) >= 2
