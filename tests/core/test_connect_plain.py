"""onceflow through Spark Connect servers without onceflow's jars, or without onceflow at all.

A server admin who installs onceflow's Python but not its jars gets Spark's state store for the
ids and Spark's checkpoint file manager, each said in one line; the query is exactly once all the
same. For a checkpoint both sides see (a local file system), ``write_stream`` starts the query
with Spark's ``FileSystemBasedCheckpointFileManager`` (``remote.start_local``) instead of Spark's
default, whose renames run ``readlink`` in child processes of the server's JVM: the server runs
with a ``readlink`` on its ``PATH`` that logs each call, so the test sees which manager wrote the
checkpoint (a query whose session names Spark's default is the control: it does call readlink).
What a server must have, onceflow in its Python, is checked: a server whose Python lacks it is
refused at the client's session, the interpreter named.

The pipeline is written for this test: meter readings (some sent twice) deduplicated by id and
summed per meter into SQLite; the expected sums are computed here from the files.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from onceflow.verify.connect_server import ConnectServer

pytestmark = [pytest.mark.spark]

CLIENT = '''
import sys
import onceflow
from onceflow import Table
from onceflow.runtime.session import session
from pyspark.sql import functions as F

url, root, name, manager = sys.argv[1:5]
spark = session(remote=url)
if manager != "-":  # the user names a checkpoint file manager: onceflow leaves it
    spark.conf.set("spark.sql.streaming.checkpointFileManagerClass", manager)
readings = (spark.readStream.schema("reading_id STRING, meter STRING, wh BIGINT, ts TIMESTAMP")
            .option("maxFilesPerTrigger", 1).parquet(f"{root}/in"))
clean = onceflow.deduplicate(readings, id="reading_id", event_time="ts", within="30 minutes")
query = onceflow.write_stream(
    clean, sink=onceflow.sqlite(f"{root}/{name}.db"), checkpoint=f"{root}/{name}",
    tables={"per_meter": Table(key=["meter"], add=["wh", "readings"])},
    per_batch=lambda b: b.groupBy("meter").agg(F.sum("wh").alias("wh"), F.count("*").alias("readings")),
    once=True)
print("SETTING", spark.conf.get("spark.sql.streaming.checkpointFileManagerClass", None), flush=True)
query.awaitTermination()
print("PROVIDER", spark.conf.get("spark.sql.streaming.stateStore.providerClass", None))
'''

FILE_CONTEXT = "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plain")


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[ConnectServer]:
    """A server without onceflow's jars whose ``readlink`` logs each call to ``readlink.log``."""
    wrap = root / "bin"
    wrap.mkdir()
    real = shutil.which("readlink")
    assert real is not None
    (wrap / "readlink").write_text(f'#!/bin/sh\necho "$*" >> "{root}/readlink.log"\nexec {real} "$@"\n')
    (wrap / "readlink").chmod(0o755)
    path = os.pathsep.join([str(wrap), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    with ConnectServer(root / "server", onceflow_jars=False, env={"PATH": path}) as s:
        yield s


def _write(root: Path, n: int) -> None:
    """File ``n``: 200 readings, ids of file n-1 sent again (the first 50)."""
    start = datetime(2026, 9, 1) + timedelta(minutes=n)
    ids = [f"r{n}-{i}" for i in range(200)] + ([f"r{n - 1}-{i}" for i in range(50)] if n else [])
    wh = [int(i[1:].split("-")[0]) * 100 + int(i.split("-")[1]) for i in ids]  # a copy has its original's
    (root / "in").mkdir(exist_ok=True)
    pq.write_table(pa.table({"reading_id": ids, "meter": [f"m{int(i.split('-')[1]) % 4}" for i in ids],
                             "wh": pa.array(wh, pa.int64()),
                             "ts": [start + timedelta(seconds=k % 40) for k in range(len(ids))]}),
                   root / "in" / f"part-{n}.parquet")


def _expected(root: Path) -> dict[str, tuple[int, int]]:
    """Per meter (wh, readings), each id once, from the files."""
    once: dict[str, tuple[str, int]] = {}
    for f in sorted((root / "in").glob("*.parquet")):
        for row in pq.read_table(f).to_pylist():
            once.setdefault(row["reading_id"], (row["meter"], row["wh"]))
    sums: dict[str, tuple[int, int]] = {}
    for meter, wh in once.values():
        total, count = sums.get(meter, (0, 0))
        sums[meter] = (total + wh, count + 1)
    return sums


def _run(server: ConnectServer, root: Path, name: str, manager: str = "-") -> str:
    (root / "client.py").write_text(CLIENT)
    done = subprocess.run([sys.executable, str(root / "client.py"), server.url, str(root), name, manager],
                          capture_output=True, text=True, timeout=600, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    return out


def _readlinks(root: Path, name: str) -> list[str]:
    log = root / "readlink.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [ln for ln in lines if f"{root}/{name}/" in ln]


def _sums(root: Path, name: str) -> dict[str, tuple[int, int]]:
    with sqlite3.connect(root / f"{name}.db") as db:
        return {m: (w, r) for m, w, r in db.execute("SELECT meter, wh, readings FROM per_meter")}


def test_a_server_without_onceflows_jars_runs_sparks_own_exactly_once(server: ConnectServer,
                                                                      root: Path) -> None:
    for n in range(3):
        _write(root, n)
    out = _run(server, root, "ck")
    # one line each for what the server lacks
    assert out.count("lacks onceflow's id state store") == 1, out[-4000:]
    assert out.count("lacks onceflow's checkpoint file manager") == 1, out[-4000:]
    assert "PROVIDER None" in out or "HDFSBackedStateStoreProvider" in out, out[-4000:]
    assert "SETTING None" in out  # the session is left as it was once the query started
    assert _sums(root, "ck") == _expected(root)
    assert (root / "ck" / "commits" / "2").exists()
    # the checkpoint's files (offsets, commits, the file source's log, state) were renamed into
    # place without a readlink process
    assert _readlinks(root, "ck") == []
    _write(root, 3)  # the query again, from its checkpoint, with a new file
    _run(server, root, "ck")
    assert _sums(root, "ck") == _expected(root)
    assert (root / "ck" / "commits" / "3").exists()
    assert _readlinks(root, "ck") == []


def test_a_session_that_names_sparks_default_manager_keeps_it(server: ConnectServer, root: Path) -> None:
    for n in range(2):
        if not (root / "in" / f"part-{n}.parquet").exists():
            _write(root, n)
    out = _run(server, root, "ck-context", FILE_CONTEXT)
    assert f"SETTING {FILE_CONTEXT}" in out
    assert _sums(root, "ck-context") == _expected(root)
    # the control: Spark's default manager renames through FileContext, which runs readlink
    called = _readlinks(root, "ck-context")
    assert any("/commits/" in ln for ln in called), called[:20]
    assert any("/sources/" in ln for ln in called), called[:20]


def test_a_server_whose_python_lacks_onceflow_is_refused_naming_it(tmp_path: Path) -> None:
    """The server runs clients' functions with a Python that has PySpark's dependencies but not
    onceflow (a venv that sees this one's site-packages as a plain path, without its start-up
    files, where onceflow's install lives): the client's session is refused before any query,
    saying which interpreter to install into."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    site = next(p for p in sys.path if p.endswith("site-packages"))
    (next((bare / "lib").glob("python3*")) / "site-packages" / "deps.pth").write_text(site + "\n")
    python = str(bare / "bin" / "python")
    probe = "import pyarrow, pandas, pyspark\ntry:\n    import onceflow\nexcept ImportError:\n    print('NO')"
    check = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
    assert check.stdout.strip() == "NO", check.stdout + check.stderr  # the control: deps, no onceflow
    client = ("import sys\nfrom onceflow.runtime.session import session\n"
              "try:\n    session(remote=sys.argv[1])\n"
              "except Exception as exc:\n    print('REFUSED', type(exc).__name__, exc)\n")
    with ConnectServer(tmp_path / "server", cores=1, env={"PYSPARK_PYTHON": python},
                       conf={"spark.pyspark.python": python}) as s:
        done = subprocess.run([sys.executable, "-c", client, s.url], capture_output=True, text=True,
                              timeout=300, check=False)
    out = done.stdout + done.stderr
    assert "REFUSED ConfigError" in out, out[-4000:]
    assert "cannot import onceflow" in out and "PYSPARK_PYTHON" in out, out[-4000:]
    assert f"its spark.pyspark.python is {python}" in out, out[-4000:]
