"""The README's pipeline, as printed, run where users run it: ``spark-submit`` and Spark Connect.

The README's first Python block is the application, word for word but for its session line,
which takes a Connect URL when one is given (``session(remote=url)``, the change the README
names for Connect, with its paths absolute). It runs in a fresh directory, reading
``payments/`` and writing ``app.db`` and ``ck/``, with its own trigger (no ``once``): it runs
until killed.

Payments arrive a file at a time (the next once the last is in ``payments``, so each file is a
micro-batch of its own); some are sent twice, and the last file holds payments an hour behind
the rest (late under Spark's watermark whichever earlier batches it counts). A crash point
kills the driver (spark-submit: the application and its JVM; Connect: the server's JVM) between
the sink's commit and Spark's commit log of a batch with data; the application is started
again, is given the rest, and is killed with SIGKILL at the end, as the README says a user may.
The tables are compared with a recomputation from the files here (pyarrow and plain Python,
never onceflow's write path): every payment once in ``payments``, every sum in ``revenue``
counting it once, every late payment once in ``late_payments``.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
SESSION_LINE = "spark = session()"

pytestmark = [pytest.mark.spark, pytest.mark.faults]

T0 = datetime(2026, 10, 1, 9, 0)
LATE = T0 + timedelta(seconds=5)


def readme_app(absolute: Path | None = None) -> str:
    """The README's first Python block, its session line taking ``sys.argv[1]`` as a Connect URL.

    With ``absolute``, its relative paths are made absolute under that directory: a Connect
    server resolves paths in its own working directory, as the README says.
    """
    code = re.search(r"^```python\n(.*?)^```", README.read_text(), re.M | re.S)
    assert code is not None, "README.md has no Python block"
    app = code.group(1)
    assert app.count(SESSION_LINE) == 1, f"README's block no longer has one {SESSION_LINE!r}"
    for path in ("payments/", "app.db", "ck/") if absolute else ():
        assert app.count(f'"{path}"') == 1, f"README's block no longer has one {path!r}"
        app = app.replace(f'"{path}"', f'"{absolute / path}"')
    return "import sys\n" + app.replace(
        SESSION_LINE, "spark = session(remote=sys.argv[1]) if len(sys.argv) > 1 else session()")


def payments_file(n: int) -> list[tuple[str, str, int, datetime]]:
    """File ``n``'s payments: 0-2 on time (2 repeats 40 of 1's ids), 3 on time and late ones."""
    base = T0 + timedelta(hours=n)
    rows = [(f"p{n}-{i}", f"acct{i % 3}", 100 * n + i + 1, base + timedelta(seconds=7 * i))
            for i in range(60)]
    if n == 2:
        rows += [(f"p1-{i}", f"acct{i % 3}", 100 + i + 1, T0 + timedelta(hours=1, seconds=7 * i))
                 for i in range(40)]
    if n == 3:
        rows += [(f"late{i}", f"acct{i % 3}", 5_000 + i, LATE + timedelta(seconds=i)) for i in range(25)]
    return rows


def write_file(root: Path, n: int) -> None:
    rows = payments_file(n)
    cols = list(zip(*rows, strict=True))
    (root / "payments").mkdir(exist_ok=True)
    table = pa.table({"payment_id": list(cols[0]), "account": list(cols[1]),
                      "amount_cents": pa.array(cols[2], pa.int64()),
                      "ts": pa.array(cols[3], pa.timestamp("us"))})
    tmp = root / f".part-{n}.parquet"  # whole files only: written beside, then renamed in
    pq.write_table(table, tmp)
    tmp.rename(root / "payments" / f"part-{n}.parquet")


Revenue = dict[tuple[str, str], tuple[int, int]]
"""(account, window start) -> (amount_cents, payments)."""


def expected(files: int) -> tuple[set[tuple[str, str, int]], Revenue, set[str]]:
    """(payments once, revenue per account and 5-minute window, late payment ids) of files 0..files-1.

    A payment is late when its event time is at or below every watermark Spark could apply to
    its batch (the latest event time of the files before it, less 10 minutes, with or without
    the batch just before); else counted once, by id.
    """
    once: dict[str, tuple[str, int, datetime]] = {}
    late: set[str] = set()
    for n in range(files):
        earlier = [r[3] for k in range(max(0, n - 1)) for r in payments_file(k)]
        for pid, acct, cents, ts in payments_file(n):
            if earlier and ts <= max(earlier) - timedelta(minutes=10):
                late.add(pid)
            else:
                once.setdefault(pid, (acct, cents, ts))
    revenue: Revenue = {}
    for acct, cents, ts in once.values():
        window = (acct, ts.replace(minute=ts.minute - ts.minute % 5, second=0).isoformat(sep=" "))
        total, count = revenue.get(window, (0, 0))
        revenue[window] = (total + cents, count + 1)
    return {(p, a, c) for p, (a, c, _) in once.items()}, revenue, late


def tables(root: Path) -> tuple[list[tuple[str, str, int]], Revenue, list[str]]:
    with sqlite3.connect(root / "app.db") as db:
        payments = sorted(db.execute("SELECT payment_id, account, amount_cents FROM payments"))
        revenue = {(a, str(w)[:19]): (c, k) for a, w, c, k in db.execute(
            "SELECT account, window_start, amount_cents, payments FROM revenue")}
        late = sorted(p for (p,) in db.execute("SELECT payment_id FROM late_payments"))
    return payments, revenue, late


def wait_for(root: Path, files: int, alive: Callable[[], bool], timeout_s: float = 240) -> None:
    """Until the tables hold files 0..files-1 (as many payments and late ones as expected)."""
    want, _, late = expected(files)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        try:
            with sqlite3.connect(root / "app.db") as db:
                got = db.execute("SELECT count(*) FROM payments").fetchone()[0]
                got_late = db.execute("SELECT count(*) FROM late_payments").fetchone()[0] if late else 0
            if (got, got_late) == (len(want), len(late)):
                return
        except sqlite3.Error:  # not made yet
            pass
        time.sleep(0.3)
    raise AssertionError(f"files 0..{files - 1} not in the tables in {timeout_s:.0f} s (alive: {alive()})")


def check(root: Path) -> None:
    payments, revenue, late = tables(root)
    want, want_revenue, want_late = expected(4)
    assert len(payments) == len({p for p, _, _ in payments})  # each payment once
    assert set(payments) == want
    assert revenue == want_revenue
    assert late == sorted(want_late) and len(want_late) == 25


def _kill(proc: subprocess.Popen[str]) -> str:
    os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    return out


@pytest.mark.long  # ~1 min; make test runs spark-submit (test_spark_submit.py) and this shape's crashes
def test_the_readme_pipeline_under_spark_submit_survives_a_crash_and_kill_9(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(readme_app())
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    jars = subprocess.run([str(bin_dir / "onceflow"), "jars", "path", "onceflow"], capture_output=True,
                          text=True, check=True).stdout.strip()  # as docs/cluster.md shows
    cmd = [str(bin_dir / "spark-submit"), "--master", "local[2]", "--driver-memory", "2g", "--jars", jars,
           "app.py"]

    def start(crash: str | None = None) -> subprocess.Popen[str]:
        armed = {"ONCEFLOW_CRASH_AT": crash} if crash else {}
        return subprocess.Popen(cmd, cwd=tmp_path, env={**env, **armed}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    app = start("after_sink_commit@1")
    write_file(tmp_path, 0)
    wait_for(tmp_path, 1, lambda: app.poll() is None)
    write_file(tmp_path, 1)  # its batch is the first with data after batch 0: the crash point's
    out, _ = app.communicate(timeout=240)
    assert "crash point after_sink_commit" in out, out[-4000:]
    commits = {int(p.name) for p in (tmp_path / "ck" / "commits").iterdir() if p.name.isdigit()}
    offsets = {int(p.name) for p in (tmp_path / "ck" / "offsets").iterdir() if p.name.isdigit()}
    assert max(offsets) not in commits  # the sink has the batch, Spark's commit log not
    app = start()
    wait_for(tmp_path, 2, lambda: app.poll() is None)  # the batch again: written once
    for n in (2, 3):
        write_file(tmp_path, n)
        wait_for(tmp_path, n + 1, lambda: app.poll() is None)
    _kill(app)
    check(tmp_path)


@pytest.mark.long  # a server started twice (~1 min); tests/core/test_connect.py kills its pipeline there
def test_the_readme_pipeline_over_spark_connect_survives_a_killed_server_and_client(tmp_path: Path) -> None:
    from onceflow.verify.connect_server import ConnectServer

    (tmp_path / "app.py").write_text(readme_app(absolute=tmp_path))

    def client(url: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "app.py", url], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    with ConnectServer(tmp_path / "server1", env={"ONCEFLOW_CRASH_AT": "after_sink_commit@1"}) as server:
        app = client(server.url)
        write_file(tmp_path, 0)
        wait_for(tmp_path, 1, lambda: app.poll() is None)
        write_file(tmp_path, 1)
        assert server.wait_exit(240), "the crash point left the server"
        _kill(app)  # Connect's client retries a lost server for minutes
    assert "crash point after_sink_commit" in (tmp_path / "server1" / "connect-server.log").read_text()
    with ConnectServer(tmp_path / "server2") as server:
        app = client(server.url)
        wait_for(tmp_path, 2, lambda: app.poll() is None)
        for n in (2, 3):
            write_file(tmp_path, n)
            wait_for(tmp_path, n + 1, lambda: app.poll() is None)
        out = _kill(app)
    assert "Traceback" not in out, out[-4000:]
    check(tmp_path)
