"""Short outages retried inside the batch: the query carries on, the tables are exact, the retries logged.

The transfer pipeline of :mod:`tests.core.transfers` runs continuously; batch 0 commits, then
the outage starts, then new input arrives (so the batch that meets the outage has data), then
the outage ends. The query must commit that batch once the sink is back, without a restart:

* PostgreSQL stopped (``fast`` and ``immediate``) and started again — a server of this module's
  own (the session's shared server is not stopped);
* a SQLite database locked by another process (``BEGIN EXCLUSIVE``) for longer than a
  statement waits for a lock.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import onceflow
from onceflow.checkpoint import ranges
from tests.core import transfers

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def own_pg() -> Iterator[Any]:
    from tests.pg_server import TempPostgres

    server = TempPostgres()
    server.start()
    yield server
    server.stop()


def _until(what: str, check: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _committed(sink: Any) -> int:
    try:
        return sum(m["input_rows"] or 0 for m in sink.batches())
    except Exception:  # the database is down
        return -1


def _retries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "onceflow.retry"]


def _outage(spark: Any, tmp: Path, sink: Any, watcher: Any, begin: Callable[[], None],
            end: Callable[[], None], caplog: pytest.LogCaptureFixture, feed: bool = False) -> list[str]:
    """Batch 0, the outage, new input, a retry seen, the end of the outage; the retries logged.

    With ``feed``, another input file arrives after each batch committed without a retry (an
    outage that is a race, not a stop, may miss a batch).
    """
    caplog.set_level(logging.WARNING, logger="onceflow.retry")
    transfers.put(tmp / "in", 0)
    query = transfers.start(spark, tmp / "in", sink, tmp / "ck", once=False, trigger="0.5 seconds",
                            retry_for="3 minutes")
    try:
        _until("batch 0", lambda: _committed(watcher) == transfers.PER_FILE)
        _until("the no-data batch after it", lambda: len(watcher.batches()) >= 2)  # the outage meets data
        begin()
        files = 2
        transfers.put(tmp / "in", 1)
        deadline = time.monotonic() + 60
        while not _retries(caplog):  # a race (Delta) may need more batches than one to be met
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting for a retry")
            if feed and _committed(watcher) == files * transfers.PER_FILE:
                transfers.put(tmp / "in", files)
                files += 1
            time.sleep(0.2)
        end()
        _until("the batches after the outage", lambda: _committed(watcher) == files * transfers.PER_FILE)
        assert query.isActive, "the query stopped instead of retrying"
    finally:
        query.stop()
    return _retries(caplog)


def _batch(message: str) -> int:
    return int(message.split("batch ", 1)[1].split(":", 1)[0])


def _hit_data(tmp: Path, retried: list[str]) -> None:
    """A batch that met the outage read input (a fault on a no-data batch proves nothing)."""
    batches = sorted({_batch(r) for r in retried if "batch " in r})
    assert any(any(ranges.read(tmp / "ck", b).files.values()) for b in batches), \
        f"batches {batches} read no file"


@pytest.mark.parametrize(("mode", "protocol"), [("fast", "driver"), ("immediate", "driver"),
                                                ("fast", "staged")])
def test_postgres_restarted_mid_stream(spark: Any, tmp_path: Path, own_pg: Any, mode: str, protocol: str,
                                       caplog: pytest.LogCaptureFixture) -> None:
    dsn = own_pg.new_database()
    sink, watcher = onceflow.postgres(dsn, protocol=protocol), onceflow.postgres(dsn)
    retried = _outage(spark, tmp_path, sink, watcher, lambda: own_pg.halt(mode), own_pg.resume, caplog)
    assert transfers.read_sink("postgres", dsn) == transfers.expected(tmp_path / "in")
    _hit_data(tmp_path, retried)
    assert any("retry 1" in r for r in retried), retried
    sink.close()


def test_sqlite_locked_by_another_process(spark: Any, tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "out.db"
    sink = onceflow.sqlite(db)
    holder: list[subprocess.Popen[str]] = []
    hold = ("import sqlite3, sys, time\n"
            f"c = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); sys.stdin.readline()\n"
            "c.execute('COMMIT')\n")

    def lock() -> None:
        p = subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "locked"
        holder.append(p)

    def unlock() -> None:
        p = holder[0]
        assert p.stdin is not None
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.wait(timeout=30) == 0

    retried = _outage(spark, tmp_path, sink, onceflow.sqlite(db), lock, unlock, caplog)
    sink.close()
    assert transfers.read_sink("sqlite", str(db)) == transfers.expected(tmp_path / "in")
    assert any("locked" in r for r in retried), retried
    _hit_data(tmp_path, retried)


WRITER = """
import sys, time
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
import select
path = sys.argv[1]
row = pa.table({"account": ["other"], "cents": pa.array([1], pa.int64()), "n": pa.array([1], pa.int64())})
print("writing", flush=True)
while not select.select([sys.stdin], [], [], 0)[0]:  # until told to stop
    try:  # an append, then a compaction that rewrites the files onceflow's MERGE reads
        write_deltalake(path, row.cast(pa.schema(DeltaTable(path).schema().to_arrow())), mode="append")
        DeltaTable(path).optimize.compact()
    except Exception as exc:  # its own commit lost to onceflow's: try again
        print("lost", type(exc).__name__, file=sys.stderr, flush=True)
"""


def test_delta_with_a_concurrent_writer(spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lake = tmp_path / "lake"
    sink = onceflow.delta(lake)
    writers: list[subprocess.Popen[str]] = []

    def begin() -> None:  # another job appends to the balances table without pause
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(lake / "balances")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "writing"
        writers.append(p)

    def end() -> None:
        p = writers[0]
        assert p.stdin is not None
        p.stdin.write("stop\n")
        p.stdin.flush()
        assert p.wait(timeout=60) == 0

    retried = _outage(spark, tmp_path, sink, onceflow.delta(lake), begin, end, caplog, feed=True)
    got = transfers.read_sink("delta", str(lake))
    other = got["balances"].pop("other")
    assert other[0] == other[1] > 0  # the other writer's rows stay theirs
    assert got == transfers.expected(tmp_path / "in")
    assert any("concurrent Delta commit" in r for r in retried), retried
    _hit_data(tmp_path, retried)
