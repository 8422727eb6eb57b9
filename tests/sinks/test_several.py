"""Several sinks in one query (``write_stream(df, {table: sink})``): the source read once, each table
exactly once in its own sink, a crash between the sinks' commits finished on replay, a restored sink
refused and repaired.

The pipelines are written for these tests: sensor readings (raw rows appended to Iceberg, per-device
sums added in SQLite) and the transfers of :mod:`tests.core.transfers` (transfers upserted in Iceberg,
balances added in PostgreSQL). The oracles compute the answer from the input files with pyarrow and
Python alone; the sinks are read with sqlite3, psycopg and pyiceberg.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import onceflow
from onceflow.errors import ConfigError, OutOfStepError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.several import SeveralSinks
from onceflow.sinks._core.tables import Table
from tests.core import transfers
from tests.helpers import killed_then_restarted

pytestmark = pytest.mark.spark

SCHEMA = "reading_id LONG, device STRING, watts LONG"


def _readings(folder: Path, part: int, first: int, count: int) -> None:
    """Input file ``part``: readings ``first``.., device ``d<id % 5>``; mtimes in file order (Spark's)."""
    import os

    folder.mkdir(exist_ok=True)
    ids = list(range(first, first + count))
    path = folder / f"part-{part}.parquet"
    pq.write_table(pa.table({"reading_id": ids, "device": [f"d{i % 5}" for i in ids],
                             "watts": [i * 3 % 101 for i in ids]}), path)
    os.utime(path, (1_700_000_000 + part, 1_700_000_000 + part))


def _want(folder: Path) -> tuple[list[int], dict[str, tuple[int, int]]]:
    """The oracle: every reading id, and each device's (sum of watts, readings), from the files."""
    ids, sums = [], {}
    for path in sorted(folder.glob("part-*.parquet")):
        for r in pq.read_table(path).to_pylist():
            ids.append(r["reading_id"])
            total, n = sums.get(r["device"], (0, 0))
            sums[r["device"]] = (total + r["watts"], n + 1)
    return ids, sums


def _stored(tmp: Path) -> tuple[list[int], dict[str, tuple[int, int]]]:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("onceflow", uri=f"sqlite:///{tmp / 'catalog.db'}", warehouse=(tmp / "wh").as_uri())
    ids = catalog.load_table(("onceflow", "readings")).scan().to_arrow().column("reading_id").to_pylist()
    with sqlite3.connect(tmp / "devices.db") as conn:
        sums = {d: (w, n) for d, w, n in conn.execute("SELECT device, watts, n FROM devices")}
    return ids, sums


PIPELINE = """
from pyspark.sql import functions as F

def per_batch(df):
    return {"devices": df.groupBy("device").agg(F.sum("watts").alias("watts"), F.count("*").alias("n")),
            "readings": df}

tables = {"devices": Table(key="device", add=["watts", "n"]), "readings": Table()}
sinks = {"readings": onceflow.iceberg(f"sqlite:///{tmp / 'catalog.db'}", tmp / "wh"),
         "devices": onceflow.sqlite(tmp / "devices.db")}
"""


def test_each_table_goes_once_to_its_own_sink(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "in"
    _readings(src, 0, 0, 400)
    _readings(src, 1, 400, 300)
    scope: dict[str, Any] = {"onceflow": onceflow, "Table": Table, "tmp": tmp_path}
    exec(PIPELINE, scope)  # the pipeline the child driver below runs too
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
    onceflow.write_stream(stream, scope["sinks"], tmp_path / "ck", scope["tables"], scope["per_batch"],
                          once=True).awaitTermination()
    ids, sums = _stored(tmp_path)
    want_ids, want_sums = _want(src)
    assert Counter(ids) == Counter(want_ids) and sums == want_sums
    lake, db = scope["sinks"]["readings"], scope["sinks"]["devices"]
    assert [m["batch_id"] for m in lake.batches()] == [0, 1] == [m["batch_id"] for m in db.batches()]
    assert [m["input_rows"] for m in db.batches()] == [400, 300]  # one batch, the same numbers in each sink


def test_routes_that_cannot_work_are_refused_before_anything_runs(spark: Any, tmp_path: Path) -> None:
    db = onceflow.sqlite(tmp_path / "a.db")
    lake = onceflow.iceberg(f"sqlite:///{tmp_path / 'catalog.db'}", tmp_path / "wh")
    stream = spark.readStream.schema(f"{SCHEMA}, ts TIMESTAMP").parquet(str(tmp_path))
    tables = {"devices": Table(key="device", add=["watts"]), "readings": Table()}

    def per_batch(df: Any) -> dict[str, Any]:
        return {"devices": df.select("device", "watts"), "readings": df}

    with pytest.raises(ConfigError, match=r"table\(s\) \['readings'\] go to no sink"):
        onceflow.write_stream(stream, {"devices": db}, tmp_path / "ck", tables, per_batch)
    deduplicated = onceflow.deduplicate(stream, "reading_id", "ts", within="1 hour")
    with pytest.raises(ConfigError, match=r"holds only \['late'\].*route one of per_batch's tables"):
        onceflow.write_stream(deduplicated, {"devices": db, "readings": db, "late": lake}, tmp_path / "ck",
                              tables, per_batch, late="late")
    with pytest.raises(ConfigError, match=r"sink ids \['a', 'default'\]: give them one sink_id"):
        SeveralSinks({"devices": onceflow.sqlite(tmp_path / "b.db", sink_id="a"), "readings": lake})
    with pytest.raises(ConfigError, match="not an onceflow sink"):
        SeveralSinks({"devices": "postgresql://x"})


def test_a_driver_killed_between_the_sinks_commits_leaves_both_exact(tmp_path: Path) -> None:
    """SIGKILL at ``after_sink_commit@1``: the first sink (Iceberg) has batch 1, the second (SQLite) not —
    seen before the restart; the restart's replay skips Iceberg by its marker and writes SQLite."""
    src = tmp_path / "in"
    for part, first in enumerate((0, 400, 700)):
        _readings(src, part, first, 300 if part else 400)
    script = "\n".join([
        "import sys", "from pathlib import Path", "import onceflow",
        "from onceflow.runtime.session import session",
        "from onceflow.sinks._core.tables import Table", "tmp = Path(sys.argv[1])",
        "spark = session(app_name='several-crash', shuffle_partitions=2)", PIPELINE,
        f"stream = spark.readStream.schema({SCHEMA!r}).option('maxFilesPerTrigger', 1)",
        "stream = stream.parquet(str(tmp / 'in'))",
        "onceflow.write_stream(stream, sinks, tmp / 'ck', tables, per_batch, once=True).awaitTermination()",
        "print('done')"])
    seen: list[tuple[list[int], list[int]]] = []

    def between(_: subprocess.CompletedProcess[str]) -> None:  # after the kill, before the restart
        db = onceflow.sqlite(tmp_path / "devices.db")
        lake = onceflow.iceberg(f"sqlite:///{tmp_path / 'catalog.db'}", tmp_path / "wh")
        seen.append(([m["batch_id"] for m in db.batches()], [m["batch_id"] for m in lake.batches()]))

    killed_then_restarted(script, tmp_path, "after_sink_commit@1", between=between)
    assert seen == [([0], [0, 1])]  # the crash fell between the two sinks' commits of batch 1
    ids, sums = _stored(tmp_path)
    want_ids, want_sums = _want(src)
    assert Counter(ids) == Counter(want_ids) and sums == want_sums


def test_one_sink_restored_from_a_backup_is_refused_then_repaired(spark: Any, tmp_path: Path,
                                                                 pg_server: Any) -> None:
    """Transfers in Iceberg, balances in PostgreSQL; PostgreSQL's database restored from a backup taken a
    run earlier: the next start is refused naming both sinks in the repair command; after ``onceflow repair``
    with both sinks the missing batches go to PostgreSQL only, and both are exact."""
    import psycopg

    dsn = pg_server.new_database()
    name = dsn.rsplit("dbname=", 1)[1]
    catalog = f"sqlite:///{tmp_path / 'catalog.db'}"

    def sinks() -> dict[str, Any]:
        lake = onceflow.iceberg(catalog, tmp_path / "wh")
        return {"balances": onceflow.postgres(dsn), "transfers": lake}

    def run(checkpoint: str = "ck") -> None:
        routes = sinks()
        try:
            transfers.start(spark, tmp_path / "in", routes, tmp_path / checkpoint).awaitTermination()
        finally:
            for sink in routes.values():
                sink.close()

    def admin(sql: str) -> None:
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(sql)

    transfers.put(tmp_path / "in", 0)
    run()
    admin(f"CREATE DATABASE {name}_bak TEMPLATE {name}")
    transfers.put(tmp_path / "in", 1)
    run()
    admin(f"DROP DATABASE {name} WITH (FORCE)")
    admin(f"CREATE DATABASE {name} TEMPLATE {name}_bak")
    transfers.put(tmp_path / "in", 2)
    with pytest.raises(OutOfStepError) as refused:
        run()
    message = str(refused.value)
    assert "the sink lacks batches 2-3" in message and "--iceberg" in message and "--dsn" in message
    # a rewind by hand (Spark then plans batch 2 over two files; Iceberg has it over one): refused, unwritten
    shutil.copytree(tmp_path / "ck", tmp_path / "by-hand")
    for b in (3, 2):
        for log in ("commits", "offsets"):
            for name in (str(b), f".{b}.crc"):
                (tmp_path / "by-hand" / log / name).unlink(missing_ok=True)
    with pytest.raises(OutOfStepError, match=r"batch 2 is in the sink onceflow\.iceberg.* over another"):
        run("by-hand")
    with psycopg.connect(dsn) as conn:
        written = conn.execute("SELECT max(batch_id) FROM onceflow_batches").fetchone()[0]
    assert written == 1  # nothing of the refused batch
    repair = [sys.executable, "-m", "onceflow.cli.main", "repair", "--checkpoint", str(tmp_path / "ck"),
              "--dsn", dsn, "--iceberg", catalog, "--warehouse", str(tmp_path / "wh")]
    fixed = subprocess.run(repair, capture_output=True, text=True, timeout=120)
    assert fixed.returncode == 0 and "goes back to batch 1" in fixed.stdout, fixed.stdout + fixed.stderr
    run()
    want = transfers.expected(tmp_path / "in")
    with psycopg.connect(dsn) as conn:
        balances = {a: (c, n) for a, c, n in conn.execute("SELECT account, cents, n FROM balances")}
    from pyiceberg.catalog.sql import SqlCatalog

    lake = SqlCatalog("onceflow", uri=catalog, warehouse=(tmp_path / "wh").as_uri())
    stored = lake.load_table(("onceflow", "transfers")).scan().to_arrow().to_pylist()
    assert len(stored) == len({r["tx_id"] for r in stored})
    assert {r["tx_id"]: (r["account"], r["cents"]) for r in stored} == want["transfers"]
    assert balances == want["balances"]


def test_a_small_batch_goes_collected_to_a_collecting_sink_and_as_frames_to_the_lake(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite (collect_below=50) gets 5 rows as Arrow and 60 as DataFrames; Iceberg always DataFrames."""
    db = onceflow.sqlite(tmp_path / "devices.db", collect_below=50)
    lake = onceflow.iceberg(f"sqlite:///{tmp_path / 'catalog.db'}", tmp_path / "wh")
    both = SeveralSinks({"devices": db, "readings": lake})
    calls: list[str] = []

    def counted(kind: str) -> Any:
        original = getattr(type(db), kind)

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append(kind)
            return original(self, *args, **kwargs)
        return call

    for kind in ("commit_tables", "commit_frames"):
        monkeypatch.setattr(type(db), kind, counted(kind))
    frame = spark.range(60).selectExpr("id AS reading_id", "concat('d', id % 5) AS device", "id AS watts")
    specs = {"devices": Table(key="device", add="watts"), "readings": Table()}
    few = frame.groupBy("device").sum("watts").withColumnRenamed("sum(watts)", "watts")
    many = frame.selectExpr("concat('e', reading_id) AS device", "watts")
    assert both.commit_frames(0, {"devices": few, "readings": frame}, specs, BatchStats(60, 0, 0), 60,
                              written={"devices": 5, "readings": 60})
    assert both.commit_frames(1, {"devices": many, "readings": frame}, specs, BatchStats(60, 0, 0), 60,
                              written={"devices": 60, "readings": 60})
    assert calls == ["commit_tables", "commit_frames"]
    assert [m["batch_id"] for m in both.batches()] == [0, 1]
    with sqlite3.connect(tmp_path / "devices.db") as conn:
        assert conn.execute("SELECT count(*), sum(watts) FROM devices").fetchone() == (65, 2 * sum(range(60)))
