"""Per-batch numbers over Spark Connect equal a classic session's, for a JSON-lines source.

One pipeline written for this test (clicks read from JSON-lines files, one file per batch, a
blank line among them; deduplicated by id within 5 minutes; counted per page into SQLite) runs
once on a classic session and once as a client of a real Connect server, each over its own copy
of the files. On Connect a batch's input rows, late and duplicate rows reach its marker a batch
later from the query's progress, checked against the records of its files counted apart: every
batch's numbers but the last one's (no batch after it) must be the classic run's, and the tables
the same.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from onceflow.verify.connect_server import ConnectServer

pytestmark = pytest.mark.spark

PIPELINE = '''
import sys
import onceflow
from onceflow import Table
from onceflow.runtime.session import session
from pyspark.sql import functions as F

root, url = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
spark = session(remote=url) if url else session()
clicks = (spark.readStream.schema("click_id STRING, page STRING, ts TIMESTAMP")
          .option("maxFilesPerTrigger", 1).json(f"{root}/in"))
clean = onceflow.deduplicate(clicks, id="click_id", event_time="ts", within="5 minutes")
query = onceflow.write_stream(
    clean, sink=onceflow.sqlite(f"{root}/out.db"), checkpoint=f"{root}/ck",
    tables={"per_page": Table(key=["page"], add=["clicks"])},
    per_batch=lambda b: b.groupBy("page").agg(F.count("*").alias("clicks")), once=True)
query.awaitTermination()
'''


def _files(root: Path) -> None:
    start = datetime(2026, 8, 1)

    def line(cid: str, page: int, sec: int) -> str:
        ts = (start + timedelta(seconds=sec)).isoformat()
        return json.dumps({"click_id": cid, "page": f"p{page}", "ts": ts})

    batches = [
        [line(f"a{i}", i % 4, i) for i in range(200)],
        [line(f"b{i}", i % 4, 1_800 + i) for i in range(150)] + [line(f"a{i}", i % 4, i) for i in range(30)],
        [line(f"c{i}", i % 4, 1_900 + i) for i in range(120)] + [""],  # a blank line: no record
        # behind the late watermark (the max event time of the batches before the one before, less
        # 5 minutes: Spark's rule)
        [line(f"d{i}", i % 4, 2_100 + i) for i in range(80)]
        + [line(f"late{i}", 1, 10 + i) for i in range(25)],
        [line(f"e{i}", i % 4, 2_200 + i) for i in range(60)],
    ]
    (root / "in").mkdir(parents=True)
    for n, lines in enumerate(batches):
        path = root / "in" / f"part-{n}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (1_780_000_000 + n, 1_780_000_000 + n))  # Spark reads files oldest first


def _markers(root: Path) -> dict[int, tuple[int | None, ...]]:
    with sqlite3.connect(root / "out.db") as db:
        return {b: tuple(m) for b, *m in db.execute(
            "SELECT batch_id, input_rows, late_dropped, duplicates_dropped FROM onceflow_batches")}


def _table(root: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(root / "out.db") as db:
        return sorted(db.execute("SELECT page, clicks FROM per_page"))


def _run(root: Path, *url: str) -> None:
    (root / "pipeline.py").write_text(PIPELINE)
    env = {**os.environ, **({"SPARK_CONNECT_MODE_ENABLED": "1"} if url else {})}
    done = subprocess.run([sys.executable, str(root / "pipeline.py"), str(root), *url], capture_output=True,
                          text=True, timeout=400, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def test_a_json_sources_markers_on_connect_are_the_classic_ones(tmp_path: Path) -> None:
    classic, remote = tmp_path / "classic", tmp_path / "connect"
    _files(classic)
    shutil.copytree(classic / "in", remote / "in")  # copy2: the times too
    _run(classic)
    with ConnectServer(tmp_path / "server") as server:
        _run(remote, server.url)
    want, got = _markers(classic), _markers(remote)
    data = sorted(b for b, m in want.items() if m[0])
    assert [want[b][0] for b in data] == [200, 180, 120, 105, 60], want  # the blank line is no record
    assert sum(want[b][1] for b in data) == 25 and sum(want[b][2] for b in data) == 30, want
    last = max(got)
    for b in sorted(got):
        if b != last:
            assert got[b] == want[b], (b, got, want)
    assert all(g in (w, None) for g, w in zip(got[last], want[last], strict=True)), (got, want)
    assert _table(remote) == _table(classic)
