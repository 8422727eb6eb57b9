"""The executor-side PostgreSQL sink refuses a batch with a null or repeated key before writing.

Both ways it checks are run: a small table's keys on the driver (one job, no shuffle) and a
large one's by a Spark aggregation (``SMALL_CHECK_ROWS`` lowered to 1 to take that path with
a few rows). Real Spark, a real PostgreSQL server.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from onceflow.errors import BatchRejectedError
from onceflow.sinks._core import checks
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.checks import check_frame
from onceflow.sinks._core.tables import Table
from onceflow.sinks.postgres.sink import PostgresFramesSink

SPECS = {"totals": Table(key=["account", "day"], add=["amount"])}
STATS = BatchStats(3, 0, 0)
SCHEMA = "account STRING, day INT, amount LONG"


@pytest.fixture(params=["small", "large"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "large":
        monkeypatch.setattr(checks, "SMALL_CHECK_ROWS", 1)
    return str(request.param)


def _written(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass('totals')").fetchone()
        if exists is None or exists[0] is None:
            return []
        return sorted(conn.execute("SELECT account, day, amount FROM totals").fetchall())


@pytest.mark.parametrize("protocol", ["staged", "2pc"])
def test_null_and_repeated_keys_are_refused_and_nothing_is_written(spark: Any, pg_dsn: str, path: str,
                                                                   protocol: str) -> None:
    sink = PostgresFramesSink(pg_dsn, sink_id="frames", protocol=protocol)
    sink.bind("query-1")

    def commit(rows: list[tuple[Any, ...]]) -> bool:
        return sink.commit_frames(0, {"totals": spark.createDataFrame(rows, SCHEMA)}, SPECS, STATS, len(rows))

    # the null is in the key's second column, after good rows and beside a repeated key
    with pytest.raises(BatchRejectedError, match=r"key column 'day' is null in row \{'account': 'b', "
                                                 r"'day': None, 'amount': 5\}") as err:
        commit([("a", 1, 1), ("a", 1, 2), ("b", None, 5), ("c", 2, 3)])
    assert err.value.row == {"account": "b", "day": None, "amount": 5}
    with pytest.raises(BatchRejectedError, match=r"key \{'account': 'a', 'day': 1, 'count': 2\} appears more "
                                                 r"than once in one batch"):
        commit([("c", 2, 3), ("a", 1, 1), ("b", 1, 5), ("a", 1, 2)])
    assert _written(pg_dsn) == [] and sink.batches() == []
    assert commit([("a", 1, 1), ("a", 2, 2), ("b", 1, 5)])  # fixed: goes through
    assert _written(pg_dsn) == [("a", 1, 1), ("a", 2, 2), ("b", 1, 5)]
    assert [m["batch_id"] for m in sink.batches()] == [0]


def test_key_columns_with_awkward_names_are_checked(spark: Any, path: str) -> None:
    """A key named like the check's own count column, or with a dot in its name."""
    spec = Table(key=["count_all", "a.b"], add=["n"])
    frame = spark.createDataFrame([(1, "x", 1), (2, "x", 1), (1, "x", 5)],
                                  "count_all INT, `a.b` STRING, n INT")
    with pytest.raises(BatchRejectedError, match=r"key \{'count_all': 1, 'a.b': 'x', 'count': 2\} appears"):
        check_frame("odd", spec, frame)
    check_frame("odd", spec, frame.where("n < 5"))  # unique keys: no error
