"""Every stored value is the value given, or the batch is refused — awkward values through every backend.

Hypothesis draws batches of rows with NaN, -0.0, infinities, subnormals, int64 limits, decimals
past a double's digits, NUL and long non-ASCII strings, timestamps in several time zones from year
1 to 9999, far dates and raw bytes. Each batch goes through a real backend (a SQLite file, a
PostgreSQL server, a Delta table, an HTTP service process, a Kafka broker), read back by that
backend's own client. The test's model says, per backend, which values it cannot hold: the sink
must refuse exactly those batches (``BatchRejectedError``, nothing written) and store every other
one as given.
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import json
import math
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from onceflow.errors import BatchRejectedError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table

UTC = dt.timezone.utc
I64 = (-(2**63), 2**63 - 1)
DEC = pa.decimal128(18, 4)
SPEC = {"t": Table(key="k")}
STATS = BatchStats(1, 0, 0)
_names = itertools.count()

SPECIAL = [math.nan, -0.0, 0.0, math.inf, -math.inf, 5e-324, -1.7976931348623157e308]
floats = st.one_of(st.sampled_from(SPECIAL), st.floats(width=64))
ints = st.one_of(st.sampled_from([*I64, 0, -1]), st.integers(*I64))
decimals = st.decimals(min_value=-(10**13), max_value=10**13, places=4, allow_nan=False, allow_infinity=False)
texts = st.one_of(st.sampled_from(["a\x00b", "ü" * 1500, "tab\tnl\n\"q\"\\", ""]),
                  st.text(st.characters(codec="utf-8"), max_size=12))
zones = st.sampled_from([UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)),
                         dt.timezone(-dt.timedelta(hours=8))])
times = st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30), timezones=zones)
dates = st.dates()
blobs = st.one_of(st.binary(max_size=8), st.sampled_from([b"\xff\xfe", "ü".encode()]))


@st.composite
def batches(draw: Any, binary: bool = True) -> pa.Table:
    n = draw(st.integers(1, 4))
    col = {"k": pa.array(range(n), pa.int64()),
           "f": pa.array([draw(st.none() | floats) for _ in range(n)], pa.float64()),
           "i": pa.array([draw(st.none() | ints) for _ in range(n)], pa.int64()),
           "d": pa.array([draw(st.none() | decimals) for _ in range(n)], DEC),
           "s": pa.array([draw(st.none() | texts) for _ in range(n)], pa.string()),
           "t": pa.array([draw(st.none() | times) for _ in range(n)], pa.timestamp("us", tz="UTC")),
           "dt": pa.array([draw(st.none() | dates) for _ in range(n)], pa.date32())}
    if binary:
        col["b"] = pa.array([draw(st.none() | blobs) for _ in range(n)], pa.binary())
    return pa.table(col)


def _values(rows: pa.Table, col: str) -> list[Any]:
    return rows.column(col).to_pylist() if col in rows.column_names else []


def _neg_zero(x: Any) -> bool:
    return isinstance(x, float) and x == 0.0 and math.copysign(1.0, x) < 0


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN, and -0.0 apart from 0.0."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return bool(a == b) and type(a) is type(b)


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _json_refused(rows: pa.Table) -> bool:
    """What JSON cannot hold: NaN or infinity, bytes that are not UTF-8."""
    return any(x is not None and not math.isfinite(x) for x in _values(rows, "f")) or \
        any(x is not None and not _utf8(x) for x in _values(rows, "b"))


def _expect_json(rows: pa.Table, when: Callable[[dt.datetime], str],
                 day: Callable[[dt.date], str]) -> list[dict]:
    out = []
    for r in rows.to_pylist():
        out.append({**r, "d": None if r["d"] is None else str(r["d"]),
                    "t": None if r["t"] is None else when(r["t"]),
                    "dt": None if r["dt"] is None else day(r["dt"]),
                    "b": None if r.get("b") is None else r["b"].decode()})
    return out


def _check_rows(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(sorted(got, key=lambda r: r["k"]), want, strict=True):
        assert set(g) == set(w), (g, w)
        for c in w:
            assert _same(g[c], w[c]), (c, g[c], w[c])


def _commit(sink: Any, rows: pa.Table, name: str, refused: bool) -> bool:
    """Commit one batch; True if it was stored (False: refused, as the model said)."""
    event("refused" if refused else "stored")
    if refused:
        with pytest.raises(BatchRejectedError):
            sink.commit_tables(0, {name: rows}, {name: SPEC["t"]}, STATS, rows.num_rows)
        assert sink.batches() == []
        return False
    assert sink.commit_tables(0, {name: rows}, {name: SPEC["t"]}, STATS, rows.num_rows)
    sink.flush()
    return True


def profile(examples: int) -> settings:
    """Seeded (the same examples every run) and without a deadline: each example is a real round trip."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@profile(60)
@given(rows=batches())
def test_sqlite(rows: pa.Table, tmp_path: Path) -> None:
    from onceflow.sinks.sqlite.sink import SQLiteTablesSink

    db = tmp_path / f"v{next(_names)}.db"
    sink = SQLiteTablesSink(db)
    sink.bind("q")

    def fits(d: decimal.Decimal) -> bool:  # what a double holds, at the column's scale
        return decimal.Decimal(float(d)).quantize(decimal.Decimal("0.0001")) == d

    refused = any(x is not None and (math.isnan(x) or _neg_zero(x)) for x in _values(rows, "f")) or \
        any(x is not None and not fits(x) for x in _values(rows, "d"))
    if _commit(sink, rows, "t", refused):
        conn = sqlite3.connect(db)
        conn.row_factory = sqlite3.Row
        got = [dict(r) for r in conn.execute("SELECT * FROM t")]
        conn.close()
        def text(t: dt.datetime | dt.date, rest: str) -> str:  # the year in four digits, as SQLite sorts it
            return f"{t.year:04d}-{t.strftime(rest)}"

        want = [{**r, "d": None if r["d"] is None else float(r["d"]),
                 "t": None if r["t"] is None else text(r["t"].astimezone(UTC), "%m-%d %H:%M:%S.%f"),
                 "dt": None if r["dt"] is None else text(r["dt"], "%m-%d")}
                for r in rows.to_pylist()]
        _check_rows(got, want)
    sink.close()


@pytest.fixture(scope="module")
def pg(pg_server: Any) -> str:
    return pg_server.new_database()  # type: ignore[no-any-return]


@profile(30)
@given(rows=batches(binary=False))
def test_postgres(rows: pa.Table, pg: str) -> None:
    import psycopg
    from psycopg.rows import dict_row

    from onceflow.sinks.postgres.sink import PostgresTablesSink

    name = f"v{next(_names)}"
    sink = PostgresTablesSink(pg, sink_id=name)
    sink.bind(name)
    refused = any(x is not None and "\x00" in x for x in _values(rows, "s"))
    if _commit(sink, rows, name, refused):
        with psycopg.connect(pg) as conn:
            got = conn.cursor(row_factory=dict_row).execute(f"SELECT * FROM {name}").fetchall()
        want = rows.to_pylist()
        for g in got:
            g["t"] = g["t"] and g["t"].astimezone(UTC)
        _check_rows(got, [{**w, "t": w["t"] and w["t"].astimezone(UTC)} for w in want])
    sink.close()


@profile(30)
@given(rows=batches())
def test_delta(rows: pa.Table, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from onceflow.sinks.delta.sink import DeltaTablesSink

    root = tmp_path / f"lake{next(_names)}"
    sink = DeltaTablesSink(root)
    sink.bind("q")
    assert _commit(sink, rows, "t", refused=False)  # Parquet holds every one of these values
    back = DeltaTable(str(root / "t")).to_pyarrow_table()
    assert back.schema.equals(rows.schema, check_metadata=False), back.schema
    _check_rows(back.to_pylist(), rows.to_pylist())


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from onceflow.verify.service import ServiceProcess

    with ServiceProcess(tmp_path_factory.mktemp("svc") / "service.db") as s:
        yield s


@profile(20)
@given(rows=batches())
def test_http(rows: pa.Table, service: Any, tmp_path: Path) -> None:
    from onceflow.sinks.http.sink import HttpEffectsSink
    from onceflow.verify.service import read_effects

    name = f"v{next(_names)}"
    sink = HttpEffectsSink(service.effects_url, tmp_path / f"{name}.db", sink_id=name)
    sink.bind("q")
    if _commit(sink, rows, "t", _json_refused(rows)):
        got = [e["payload"] for e in read_effects(service.db) if e["key"].startswith(f"{name}/")]
        _check_rows(got, _expect_json(rows, lambda t: t.isoformat(), lambda d: d.isoformat()))
    sink.close()


@pytest.fixture(scope="module")
def broker() -> Iterator[Any]:
    from onceflow.verify.kafka_server import KafkaServer

    with KafkaServer() as b:
        yield b


@profile(15)
@given(rows=batches())
def test_kafka(rows: pa.Table, broker: Any) -> None:
    from onceflow.sinks.kafka.sink import KafkaTopicsSink
    from onceflow.verify.kafka_rig import read_records

    name = f"v{next(_names)}"
    sink = KafkaTopicsSink(broker.bootstrap, sink_id=name)
    sink.bind("q")
    if _commit(sink, rows, name, _json_refused(rows)):
        deadline = time.monotonic() + 30  # a new topic's metadata may lag its first transaction
        records = read_records(broker.bootstrap, name)
        while len(records) < rows.num_rows and time.monotonic() < deadline:
            time.sleep(0.2)
            records = read_records(broker.bootstrap, name)
        got = [json.loads(v or b"{}") for _, v in records]
        assert [json.loads(k or b"{}") for k, _ in records] == [{"k": r["k"]} for r in got]
        _check_rows(got, _expect_json(rows, str, str))
    sink.close()
