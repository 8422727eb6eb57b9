"""The pipeline oracle's own rules (no JVM): deduplication and lateness, the table folds, the compare.

These are the oracle's implementation of the documented semantics, written apart from the
sinks; each case is worked out by hand here.
"""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa

from onceflow.sinks._core.tables import Table
from onceflow.verify.pipeline_oracle import Captured, Deduplication
from onceflow.verify.pipeline_verdict import Folded, canon, compare_table, fold, unmarked

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _rows(*rows: tuple[str, int]) -> pa.Table:
    times = [T0 + dt.timedelta(seconds=r[1]) for r in rows]
    return pa.table({"id": [r[0] for r in rows], "ts": pa.array(times, pa.timestamp("us", "UTC"))})


def _ms(seconds: int) -> int:
    return int((T0 + dt.timedelta(seconds=seconds)).timestamp() * 1000)


def test_late_rows_are_at_or_before_the_watermark_and_duplicates_are_remembered_ids() -> None:
    d = Deduplication(ids=["id"], event_time="ts", within_us=60_000_000)
    kept = d.apply(_rows(("a", 100), ("b", 100), ("a", 101)), 0, 0)  # a twice in one batch: once
    assert kept.column("id").to_pylist() == ["a", "b"]
    kept = d.apply(_rows(("c", 50), ("d", 49), ("b", 200), ("e", 150)), 1, _ms(50))
    assert kept.column("id").to_pylist() == ["e"]  # c at the watermark: late; d before: late; b: a duplicate
    assert [r["id"] for r in d.late] == ["c", "d"] and {r["batch_id"] for r in d.late} == {1}
    d.evict(_ms(160))  # a and b expire at 160 s (event time + 60 s): at the watermark, forgotten; e at 210
    assert set(d.expiry) == {("e",)}
    kept = d.apply(_rows(("a", 400)), 2, _ms(160))
    assert kept.column("id").to_pylist() == ["a"]  # a forgotten id arriving on time counts again


def test_null_or_empty_ids_and_null_times_are_never_kept() -> None:
    d = Deduplication(ids=["id"], event_time="ts", within_us=60_000_000)
    rows = pa.table({"id": ["x", None, ""], "ts": pa.array([T0, T0, None], pa.timestamp("us", "UTC"))})
    assert d.apply(rows, 0, 0).column("id").to_pylist() == ["x"]


def test_the_folds_follow_the_table_modes() -> None:
    merge = Folded(Table(key="k", add="n", max="hi", min="lo"))
    merge.add([{"k": 1, "n": 2, "hi": 5, "lo": 5, "note": "a"}])
    merge.add([{"k": 1, "n": 3, "hi": 4, "lo": 1, "note": "b"}, {"k": 2, "n": None, "hi": None, "lo": 7,
                                                                "note": "c"}])
    merge.add([{"k": 2, "n": 4, "hi": 9, "lo": None, "note": "d"}])
    assert merge.keyed == {(1,): {"k": 1, "n": 5, "hi": 5, "lo": 1, "note": "b"},
                           (2,): {"k": 2, "n": 4, "hi": 9, "lo": 7, "note": "d"}}  # nulls ignored
    upsert = Folded(Table(key="k"))
    upsert.add([{"k": 1, "v": 1}])
    upsert.add([{"k": 1, "v": 2}])
    assert upsert.keyed == {(1,): {"k": 1, "v": 2}}
    append = Folded(Table())
    append.add([{"v": 1}, {"v": 1}])
    append.add([{"v": 1}])
    assert append.rows() == 3


def test_fold_takes_batches_in_order_and_leaves_out_the_late_table() -> None:
    specs = {"t": Table(key="k"), "late": Table(key="id")}
    first = Captured(specs, {"t": pa.table({"k": [1], "v": [1]})}, "late", "append")
    second = Captured(specs, {"t": pa.table({"k": [1], "v": [2]})}, "late", "append")
    folded = fold([(0, first), (1, second)])
    assert set(folded) == {"t"} and folded["t"].keyed == {(1,): {"k": 1, "v": 2}}


def test_values_compare_in_one_form() -> None:
    assert canon(dt.datetime(2026, 1, 1, 10, tzinfo=dt.timezone(dt.timedelta(hours=1)))) == \
        "2026-01-01 09:00:00.000000" == canon(dt.datetime(2026, 1, 1, 9))
    assert canon(decimal.Decimal("1.10")) == canon(1.1) == 1.1
    assert canon(True) == 1 and canon(dt.date(2026, 1, 2)) == "2026-01-02"


def test_the_compare_says_lost_duplicated_and_extra() -> None:
    want = Folded(Table(key="k", add="n"))
    want.add([{"k": 1, "n": 2}, {"k": 2, "n": 2}, {"k": 3, "n": 2}])
    found = [{"k": 1, "n": 2}, {"k": 2, "n": 4}, {"k": 4, "n": 1}]  # 2 doubled, 3 lost, 4 invented
    violations: list[str] = []
    d = compare_table("t", want, found, violations)
    assert (d.missing_rows, d.too_high, d.extra_rows, d.lost_events, d.duplicated_events) == (1, 1, 1, 1, 1)
    assert len(violations) == 3
    exact: list[str] = []
    assert compare_table("t", want, [{"k": k, "n": 2} for k in (1, 2, 3)], exact).exact and not exact
    rows = Folded(Table())
    rows.add([{"v": 1}, {"v": 2}])
    bad: list[str] = []
    d = compare_table("a", rows, [{"v": 1}, {"v": 1}], bad)
    assert (d.lost_events, d.duplicated_events) == (1, 1)


def test_a_committed_batch_without_a_marker_is_named() -> None:
    markers = [{"batch_id": 0}, {"batch_id": 2}]
    assert unmarked([0, 1, 2, 3], markers) == [1, 3]
    assert unmarked([0, 2], markers) == []
