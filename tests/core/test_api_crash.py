"""The payments example (public API, generic SQLite sink) under real SIGKILLs while files arrive.

One pipeline, many driver lives: killed at random moments after a commit, then at named crash
points of the sink protocol in turn, while a feeder keeps writing payment files; a last life
drains. SQLite goes through every point (also ``apply_pending`` of its staged path); the
PostgreSQL (driver, staged, two-phase) and Delta sinks through the two that decide between a
replay and a loss (inside the transaction, after the commit). ``before_sink_write`` (before a
sink touched anything) and ``after_commit_log`` (after it returned and Spark logged the batch) do
not depend on the sink and run with SQLite; ``ambiguous_commit`` of the two-phase and Delta
sinks runs in the verify tests (``tests/verify/test_verify.py``), inside/after of every
PostgreSQL protocol also in ``tests/sinks/test_contract_example51.py``.
The tables must equal a Spark batch recomputation of all the files, exactly, and every batch
must have exactly one marker.
Negative controls: the same crash against the naive sink (no marker check) duplicates, against
the lossy one (marker before rows) loses.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from onceflow.examples import payments
from onceflow.verify.driver import ProcessGroup, wait_until
from tests.core.payments_oracle import actual, expected

pytestmark = [pytest.mark.spark, pytest.mark.faults]

POINTS = ["before_sink_write", "inside_sink_txn", "after_sink_commit", "ambiguous_commit", "after_commit_log"]
DECIDING = ["inside_sink_txn", "after_sink_commit"]
FULL = {"sqlite": [*POINTS, "apply_pending"]}
"""The backends that go through every crash point (the others: random kills and :data:`DECIDING`)."""


def _markers(db: Path, dsn: str | None = None) -> list[int]:
    # one marker per batch: the driver-side sinks' own, or the first table's (executor side);
    # SQLite: also the batches durably staged and not applied yet (the sink has them)
    sql = ("SELECT DISTINCT batch_id FROM onceflow_batches "
           "WHERE sink_id IN ('default', 'default.revenue') ORDER BY batch_id")
    if db.name == "delta":  # the Delta sink's root
        from onceflow.sinks.delta.sink import DeltaTablesSink

        return [int(m["batch_id"]) for m in DeltaTablesSink(db).batches()]
    if dsn is not None:
        import psycopg

        try:
            with psycopg.connect(dsn) as c:
                return [int(r[0]) for r in c.execute(sql)]
        except psycopg.errors.UndefinedTable:
            return []
    try:
        with sqlite3.connect(db) as c:
            staged = [r[0] for r in c.execute(
                "SELECT batch_id FROM onceflow_staged WHERE sink_id = 'default'")]
            return sorted({*(r[0] for r in c.execute(sql)), *staged})
    except sqlite3.OperationalError:
        return []


def _driver(tmp: Path, name: str, mode: str = "exactly_once", crash_at: str | None = None,
            once: bool = False, dsn: str | None = None, backend: str | None = None) -> ProcessGroup:
    backend = backend or ("postgres" if dsn else "sqlite")  # postgres-staged / -2pc: given
    db = tmp / ("delta" if backend.startswith("delta") else "app.db")
    args = [str(tmp / "in"), str(db), str(tmp / "ck"), mode, backend,
            *(["--once"] if once else [])]
    env = {"ONCEFLOW_CRASH_AT": crash_at} if crash_at else {}
    if dsn:
        env["ONCEFLOW_PG_DSN"] = dsn
    return ProcessGroup(args, tmp / f"{name}.out", env, module="tests.core.payments_driver")


@pytest.mark.slow
@pytest.mark.parametrize("backend", [  # long: make test-long (make test's 30 minutes)
    pytest.param("sqlite", marks=pytest.mark.long), pytest.param("postgres", marks=pytest.mark.long),
    pytest.param("postgres-staged", marks=pytest.mark.long),
    pytest.param("postgres-2pc", marks=pytest.mark.long), pytest.param("delta", marks=pytest.mark.long),
    pytest.param("delta-tasks", marks=pytest.mark.long),
    pytest.param("sqlite-tasks", marks=pytest.mark.long),  # since 2026-11-28 (make test reached 30:52)
    pytest.param("postgres-tasks", marks=pytest.mark.long)])
def test_every_crash_point_and_random_kills_leave_exact_tables(spark: Any, tmp_path: Path, backend: str,
                                                              request: pytest.FixtureRequest) -> None:
    dsn = request.getfixturevalue("pg_dsn") if backend.startswith("postgres") else None
    seed = int(time.time()) % 10_000
    rng = random.Random(seed)
    payments.generate(tmp_path / "in", 2_000, per_file=500, duplicates=0.1, seed=seed)
    stop = threading.Event()
    fed, lock = [2_000], threading.Lock()

    def feed_one() -> None:
        with lock:
            payments.generate(tmp_path / "in", 500, per_file=500, duplicates=0.1, seed=seed, first=fed[0])
            fed[0] += 500

    def feed() -> None:  # files keep arriving while drivers live and die
        while not stop.is_set() and fed[0] < 14_000:
            feed_one()
            time.sleep(1.5)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    db = tmp_path / ("delta" if backend.startswith("delta") else "app.db")
    try:
        for life in range(2 if backend in FULL else 1):  # SIGKILL of driver and JVM at a random moment
            before = len(_markers(db, dsn))
            d = _driver(tmp_path, f"random{life}", dsn=dsn, backend=backend)
            wait_until(lambda b=before: len(_markers(db, dsn)) > b, 180, f"a commit in life {life}")
            time.sleep(rng.uniform(0.0, 2.0))
            d.kill()
        for point in FULL.get(backend, DECIDING):
            target = (max(_markers(db, dsn)) + 1) if _markers(db, dsn) else 0
            if point == "apply_pending":  # dies at the flush after a staged batch: one batch is enough
                feed_one()
            d = _driver(tmp_path, point, crash_at=f"{point}@{target}", dsn=dsn, backend=backend,
                        once=point == "apply_pending")
            rc = d.wait(timeout=300)
            if point == "ambiguous_commit":
                assert rc not in (0, -9), d.output()  # the query failed with the "lost" ack
            else:
                assert rc == -9, d.output()
                assert f"crash point {point} at batch" in d.output(), d.output()[-2000:]
            committed = (tmp_path / "ck" / "commits" / str(target)).exists()
            marked = target in _markers(db, dsn)
            partial = backend.startswith("delta")  # Delta commits table by table: the first has the batch
            expect = {"before_sink_write": (False, False), "inside_sink_txn": (False, partial),
                      "after_sink_commit": (False, True), "ambiguous_commit": (False, True),
                      "after_commit_log": (True, True), "apply_pending": (True, True)}[point]
            assert (committed, marked) == expect, (point, target)
        if backend == "delta-tasks":
            _task_killed_after_writing(tmp_path, db)
        if backend in ("sqlite-tasks", "postgres-tasks"):
            _task_killed_then_retried(tmp_path, db, backend, dsn)
    finally:
        stop.set()
        feeder.join(timeout=60)
    final = _driver(tmp_path, "final", once=True, dsn=dsn, backend=backend)
    assert final.wait(timeout=300) == 0, final.output()[-3000:]
    rev, pays = expected(spark, tmp_path / "in")
    got_rev, got_pays, rows = actual(db, dsn)
    assert rows == len(pays), f"seed={seed}: {rows} payment rows for {len(pays)} payments"
    assert got_pays == pays and got_rev == rev, f"seed={seed}"
    markers = _markers(db, dsn)
    assert markers == list(range(len(markers)))  # one marker per batch, none twice


def _task_killed_after_writing(tmp: Path, root: Path) -> None:
    """Every task's first attempt wrote its file and died; the retries wrote again; one file counts."""
    from deltalake import DeltaTable

    target = max(_markers(root)) + 1
    d = _driver(tmp, "task", crash_at=f"task_after_write@{target}", backend="delta-tasks")
    def done() -> bool:  # both tables (each commits on its own: the marker is in the first's commit)
        return all((DeltaTable(str(root / t)).transaction_version("onceflow:default") or -1) >= target
                   for t in ("revenue", "payments"))

    wait_until(done, 180, f"batch {target} committed after its tasks died")
    d.kill()
    assert f"crash point task_after_write at batch {target}" in d.output(), d.output()[-3000:]
    live = set(pa.table(DeltaTable(str(root / "payments")).get_add_actions(flatten=True)).column("path")
               .to_pylist())
    # an append table is written by Spark's own Parquet writer (part-<batch>-<token>-<partition>-spark-
    # <uuid>): a killed attempt's file never reaches the table; one live file per task
    names = sorted(p.name for p in (root / "payments").glob(f"part-{target:05d}-*"))
    parts = [n.split("-")[3] for n in names if n in live]
    assert parts and len(parts) == len(set(parts)), (names, live)
    stage = root / "_onceflow" / "stage" / "revenue"  # the merge table's staged files are gone
    assert not [d for d in stage.glob("*") if int(d.name.split("-")[0]) <= target], list(stage.glob("*"))


def _task_killed_then_retried(tmp: Path, db: Path, backend: str, dsn: str | None) -> None:
    """Each task's first attempt wrote (a scratch file, staged rows) and died; the retries count once."""
    target = max(_markers(db, dsn)) + 1
    d = _driver(tmp, "task", crash_at=f"task_after_write@{target}", dsn=dsn, backend=backend)
    wait_until(lambda: target in _markers(db, dsn), 180, f"batch {target} committed after its tasks died")
    d.kill()
    assert f"crash point task_after_write at batch {target}" in d.output(), d.output()[-3000:]
    if dsn is None:  # the attempt's scratch files, the killed attempts' too, are gone
        from onceflow.sinks.sqlite.tasks import stage_root

        left = [p for p in stage_root(db, "default").glob("*") if int(p.name.split("-")[0]) <= target]
        assert not left, left
        return
    import psycopg

    with psycopg.connect(dsn) as c:  # the staged rows of the batch, the killed attempts' too, are gone
        for table in ("revenue", "payments"):
            assert c.execute(f"SELECT count(*) FROM {table}_onceflow_stage WHERE _of_batch <= %s",
                             (target,)).fetchone()[0] == 0, table


@pytest.mark.parametrize(("mode", "point", "wrong"), [  # make test-long: make test has verify catching
    # a naive sink (tests/verify/test_verify.py, tests/sinks/test_kafka_sink.py) and a lossy one
    # (test_verify.py's negative control: the marker before the rows, killed in the transaction)
    pytest.param("naive", "after_sink_commit", "duplicated", marks=pytest.mark.long),
    pytest.param("lossy", "inside_sink_txn", "lost", marks=pytest.mark.long)])
def test_negative_controls_are_caught(spark: Any, tmp_path: Path, mode: str, point: str, wrong: str) -> None:
    payments.generate(tmp_path / "in", 3_000, per_file=500, duplicates=0.05, seed=7)
    d = _driver(tmp_path, "crash", mode=mode, crash_at=f"{point}@1")
    assert d.wait(timeout=300) == -9, d.output()
    final = _driver(tmp_path, "final", mode=mode, once=True)
    assert final.wait(timeout=300) == 0, final.output()[-3000:]
    _, pays = expected(spark, tmp_path / "in")
    _, got_pays, rows = actual(tmp_path / "app.db")
    if wrong == "duplicated":
        assert rows > len(pays)
    else:
        assert rows < len(pays) and set(got_pays) < set(pays)
