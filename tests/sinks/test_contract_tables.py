"""One suite, every generic sink backend: modes, replays, refusals, atomic multi-table batches.

SQLite, PostgreSQL (driver side), Delta Lake and the HTTP side-effect sink against the demo
service (a real process): for HTTP a table's rows are what the service applied — ``add`` tables
summed per key from their per-batch deltas, the others the last payload per key. The HTTP sink
names every effect by its key, so its append table has one (every row its own key).
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from onceflow.errors import BatchRejectedError, CheckpointMismatchError, ConfigError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.verify.sinks import NaiveDeltaSink, NaivePostgresSink, NaiveSQLiteSink
from tests.helpers import check_amendments

STATS = BatchStats(10, 1, 0, duplicates=7)
SPECS = {"revenue": Table(key=["account", "window_start"], add=["amount"]), "payments": Table(),
         "latest": Table(key="account")}
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


class Backend:
    def __init__(self, name: str, make: Callable[..., Any], naive: Callable[[], Any],
                 query: Callable[[str], list[tuple[Any, ...]]], ddl: Callable[[str], None],
                 specs: dict[str, Table] | None = None, writes: Callable[[str], int] | None = None) -> None:
        self.name, self.make, self.naive, self.query, self.ddl = name, make, naive, query, ddl
        self.specs = specs or SPECS
        self._writes = writes

    def writes(self, table: str) -> int:
        """How many rows were written to ``table`` (for HTTP: effects applied), replays included."""
        if self._writes is not None:
            return self._writes(table)
        return len(self.query(f"SELECT account FROM {table}"))  # every table here has it

    def rows(self, table: str, columns: str) -> list[tuple[Any, ...]]:
        """The table's rows (the given columns), sorted."""
        return sorted(self.query(f"SELECT {columns} FROM {table}"))

    def needs_sql(self) -> None:
        if self.name in ("delta", "http"):
            pytest.skip(f"{self.name}: tables are not created or constrained by SQL")


def _http_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    from onceflow.sinks.http.sink import HttpEffectsSink
    from onceflow.verify.service import ServiceProcess, read_effects
    from onceflow.verify.sinks import NaiveHttpSink

    # a service that ignores idempotency keys: only the sink's ledger keeps a replay from re-applying
    service = ServiceProcess(tmp_path / "service.db", "--ignore-keys").start()
    request.addfinalizer(service.stop)
    specs = {**SPECS, "payments": Table(key=["account", "amount"])}

    def hq(sql: str) -> list[tuple[Any, ...]]:  # "SELECT a, b FROM t": what the service applied
        cols, table = sql.removeprefix("SELECT ").split(" FROM ")
        spec = specs[table]
        rows: dict[tuple[Any, ...], dict[str, Any]] = {}
        for effect in read_effects(tmp_path / "service.db"):
            if effect["key"].split("/")[1] != table:
                continue
            row = effect["payload"]
            key = tuple(row[k] for k in spec.key)
            if spec.add and key in rows:
                row = {**row, **{c: rows[key][c] + row[c] for c in spec.add}}
            rows[key] = row
        return [tuple(r[c.strip()] for c in cols.split(",")) for r in rows.values()]

    return Backend("http", lambda **kw: HttpEffectsSink(service.effects_url, tmp_path / "ledger.db", **kw),
                   lambda: NaiveHttpSink(service.effects_url, tmp_path / "ledger.db"), hq, lambda sql: None,
                   specs, lambda table: sum(e["key"].split("/")[1] == table
                                            for e in read_effects(tmp_path / "service.db")))


@pytest.fixture(params=["sqlite", "postgres", "delta", "http"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "http":
        return _http_backend(request, tmp_path)
    if request.param == "sqlite":
        from onceflow.sinks.sqlite.sink import SQLiteTablesSink

        db = tmp_path / "app.db"

        def q(sql: str) -> list[tuple[Any, ...]]:
            with sqlite3.connect(db) as c:
                return c.execute(sql).fetchall()

        def ddl(sql: str) -> None:
            with sqlite3.connect(db) as c:
                c.execute(sql)

        return Backend("sqlite", lambda **kw: SQLiteTablesSink(db, **kw), lambda: NaiveSQLiteSink(db), q, ddl)
    if request.param == "delta":
        from deltalake import DeltaTable

        from onceflow.sinks.delta.sink import DeltaTablesSink

        def dq(sql: str) -> list[tuple[Any, ...]]:  # "SELECT a, b FROM t" only
            cols, table = sql.removeprefix("SELECT ").split(" FROM ")
            path = tmp_path / "delta" / table
            if not (path / "_delta_log").exists():
                return []
            t = DeltaTable(str(path)).to_pyarrow_table()
            return list(zip(*(t.column(c.strip()).to_pylist() for c in cols.split(",")), strict=True))

        return Backend("delta", lambda **kw: DeltaTablesSink(tmp_path / "delta", **kw),
                       lambda: NaiveDeltaSink(tmp_path / "delta"), dq, lambda sql: None)
    import psycopg

    from onceflow.sinks.postgres.sink import PostgresTablesSink

    dsn = request.getfixturevalue("pg_dsn")

    def pq_(sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(dsn) as c:
            return [tuple(float(v) if hasattr(v, "is_integer") else v for v in r) for r in c.execute(sql)]

    def pddl(sql: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql)

    return Backend("postgres", lambda **kw: PostgresTablesSink(dsn, **kw), lambda: NaivePostgresSink(dsn),
                   pq_, pddl)


def batch(rows: list[tuple[Any, int, Any]]) -> dict[str, pa.Table]:
    accounts = [r[0] for r in rows]
    starts = pa.array([T0 + dt.timedelta(minutes=r[1]) for r in rows], pa.timestamp("us", tz="UTC"))
    amounts = pa.array([r[2] for r in rows], pa.float64())
    return {"revenue": pa.table({"account": accounts, "window_start": starts, "amount": amounts}),
            "payments": pa.table({"account": accounts, "amount": amounts}),
            "latest": pa.table({"account": accounts, "amount": amounts})}


def test_modes_replays_and_markers(backend: Backend) -> None:
    sink = backend.make()
    sink.bind("q1")
    assert sink.commit_tables(0, batch([("a", 0, 1.5), ("b", 5, 2.0)]), backend.specs, STATS, 2)
    assert not sink.commit_tables(0, batch([("a", 0, 1.5), ("b", 5, 2.0)]), backend.specs, STATS, 2)
    assert sink.commit_tables(1, batch([("a", 0, 3.0), ("c", 5, 1.0)]), backend.specs, STATS, 2)
    sink.flush()  # SQLite: batch 1 was staged, applied beside the caller
    assert backend.rows("revenue", "account, amount") == [("a", 4.5), ("b", 2.0), ("c", 1.0)]
    assert sorted(a for _, a in backend.rows("payments", "account, amount")) == [1.0, 1.5, 2.0, 3.0]
    # upsert: a later batch's new value for a known key replaces it in every sink (HTTP: it is sent)
    assert backend.rows("latest", "account, amount") == [("a", 3.0), ("b", 2.0), ("c", 1.0)]
    markers = sink.batches()
    assert [m["batch_id"] for m in markers] == [0, 1]
    assert markers[0]["duplicates_dropped"] == 7 and markers[0]["events_counted"] == 2
    with pytest.raises(CheckpointMismatchError):
        sink.bind("another-checkpoint")
    sink.close()


def test_bad_batches_write_nothing(backend: Backend) -> None:
    sink = backend.make()
    with pytest.raises(BatchRejectedError, match=r"key column 'account' is null in row 1"):
        sink.commit_tables(0, batch([("a", 0, 1.0), (None, 5, 2.0)]), backend.specs, STATS, 2)
    with pytest.raises(BatchRejectedError, match="appears more than once"):
        sink.commit_tables(0, batch([("a", 0, 1.0), ("a", 0, 2.0)]), backend.specs, STATS, 2)
    assert sink.batches() == []
    assert sink.commit_tables(0, batch([("a", 0, 1.0)]), backend.specs, STATS, 1)  # fixed: goes through
    sink.close()


def test_a_constraint_of_the_users_table_rolls_back_the_batch(backend: Backend) -> None:
    backend.needs_sql()
    sink = backend.make()
    backend.ddl("CREATE TABLE latest(account TEXT PRIMARY KEY, amount REAL CHECK (amount < 100))")
    with pytest.raises(BatchRejectedError, match="table 'latest': the batch breaks a constraint"):
        sink.commit_tables(0, batch([("a", 0, 1.0), ("b", 0, 500.0)]), backend.specs, STATS, 2)
    assert sink.batches() == [] and backend.query("SELECT count(*) FROM latest") == [(0,)]
    assert sink.commit_tables(0, batch([("a", 0, 1.0)]), backend.specs, STATS, 1)  # fixed: goes through
    sink.close()


def test_a_table_that_does_not_fit_is_refused(backend: Backend) -> None:
    backend.needs_sql()
    backend.ddl("CREATE TABLE revenue(account TEXT PRIMARY KEY, window_start TEXT, total REAL)")
    sink = backend.make()
    with pytest.raises(ConfigError, match=r"has no column\(s\) \['amount'\]"):
        sink.commit_tables(0, batch([("a", 0, 1.0)]), backend.specs, STATS, 1)
    backend.ddl("ALTER TABLE revenue ADD COLUMN amount REAL")
    with pytest.raises(ConfigError, match="primary key"):
        sink.commit_tables(0, batch([("a", 0, 1.0)]), backend.specs, STATS, 1)
    assert sink.batches() == []
    sink.close()


def test_the_naive_control_writes_a_replay_twice(backend: Backend) -> None:
    sink = backend.naive()
    one = {"payments": batch([("a", 0, 1.0)])["payments"]}
    for _ in range(2):
        sink.commit_tables(0, one, {"payments": backend.specs["payments"]}, STATS, 1)
    assert backend.writes("payments") == 2
    sink.close()


def _merged_expected(batches: list[list[tuple[str, Any, Any, Any]]]) -> list[tuple[Any, ...]]:
    """Per key: the sum, max and min over every batch with nulls ignored (an independent fold)."""
    seen: dict[str, list[list[Any]]] = {}
    for rows in batches:
        for key, n, hi, lo in rows:
            cols = seen.setdefault(key, [[], [], []])
            for values, v in zip(cols, (n, hi, lo), strict=True):
                if v is not None:
                    values.append(v)
    return sorted((k, sum(n) if n else None, max(hi) if hi else None, min(lo) if lo else None)
                  for k, (n, hi, lo) in seen.items())


def test_merge_tables_add_max_and_min_across_batches_ignoring_nulls(backend: Backend) -> None:
    if backend.name == "http":
        pytest.skip("http: a merge table's rows are per-batch effects, summed by the service")
    spec = {"stats": Table(key="page", add=["clicks"], max=["worst"], min=["best"])}
    batches = [[("a", 3, 5.0, 1.0), ("b", 1, None, 2.0)],
               [("a", 2, 9.0, 0.5), ("b", None, 4.0, None), ("c", 1, 1.0, 1.0)],
               [("a", 1, 7.0, 3.0), ("c", 4, None, None)]]
    sink = backend.make()
    sink.bind("q1")
    for i, rows in enumerate(batches):
        table = pa.table({"page": [r[0] for r in rows], "clicks": pa.array([r[1] for r in rows], pa.int64()),
                          "worst": pa.array([r[2] for r in rows], pa.float64()),
                          "best": pa.array([r[3] for r in rows], pa.float64())})
        assert sink.commit_tables(i, {"stats": table}, spec, STATS, len(rows))
        assert not sink.commit_tables(i, {"stats": table}, spec, STATS, len(rows))  # a replay merges nothing
    sink.flush()
    got = [tuple(v if v is None or j == 0 else int(v) if j == 1 else float(v) for j, v in enumerate(r))
           for r in backend.rows("stats", "page, clicks, worst, best")]
    assert got == _merged_expected(batches)
    assert got[0] == ("a", 6, 9.0, 0.5) and got[1] == ("b", 1, 4.0, 2.0)
    sink.close()


def test_a_batchs_metrics_known_only_after_it_reach_its_marker(backend: Backend) -> None:
    """Spark Connect's per-batch metrics arrive with the next batch (marker.Amend): every sink keeps them."""
    sink = backend.make()
    sink.bind("q1")
    one = batch([("a", 0, 1.0)])
    check_amendments(lambda b, stats: sink.commit_tables(b, one, backend.specs, stats, 1), sink.batches)
    sink.close()
