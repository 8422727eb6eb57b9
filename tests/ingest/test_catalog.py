"""The dedup catalog: Bloom filters in front of the store, GC watermark, metrics.

The scenario tests run against both stores (SQLite and a real PostgreSQL server).
Property tests (hypothesis) check: no false negative ever, measured FPR within the bound,
offering a batch twice changes nothing the second time, and the GC never lets a duplicate
younger than the watermark through.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rbloom import Bloom

from onceflow.errors import ConfigError
from onceflow.ingest.catalog import CatalogConfig, DedupCatalog, Status
from onceflow.ingest.catalog.bloom import BucketBlooms, bloom_bits
from onceflow.ingest.catalog.pgstore import PostgresStore
from onceflow.ingest.catalog.store import CatalogStore

MIN = 60_000_000  # one minute in microseconds


def _catalog(path: Path | CatalogStore, **kw: float) -> DedupCatalog:
    cfg = CatalogConfig(**{"gc_delay_s": 3600, "bucket_s": 600, "expected_rate_per_s": 10,
                           "bloom_threshold": 5, "max_clock_skew_s": None, **kw})
    return DedupCatalog(path, cfg, now_us=lambda: 0)


Opener = Callable[..., DedupCatalog]


@pytest.fixture(params=["sqlite", "postgres"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens (and reopens, after a close) one catalog on the parametrized store."""
    if request.param == "sqlite":
        return lambda **kw: _catalog(tmp_path / "c.db", **kw)
    dsn = request.getfixturevalue("pg_dsn")
    return lambda **kw: _catalog(PostgresStore(dsn, "t"), **kw)


def test_unbounded_configuration_is_rejected() -> None:
    with pytest.raises(ConfigError, match="GC delay"):
        CatalogConfig(gc_delay_s=None)
    with pytest.raises(ConfigError, match="GC delay"):
        CatalogConfig(gc_delay_s=0)
    with pytest.raises(ConfigError, match="bucket_s"):
        CatalogConfig(gc_delay_s=60, bucket_s=600)


def test_new_duplicate_and_within_batch_repeat(opener: Opener) -> None:
    cat = opener()
    assert cat.offer([("a", MIN), ("b", MIN), ("a", MIN)]) == [Status.NEW, Status.NEW, Status.DUPLICATE]
    assert cat.offer([("a", MIN), ("c", MIN)]) == [Status.DUPLICATE, Status.NEW]
    cat.close()
    again = opener()  # a restart: no start-up scan, the store still knows
    assert again.offer([("b", MIN)]) == [Status.DUPLICATE]
    assert again.metrics.store_reads == 1 and not again.blooms.buckets


def test_bloom_is_built_lazily_and_then_avoids_store_reads(opener: Opener) -> None:
    cat = opener(bloom_threshold=100)
    cat.offer([(f"w{i}", MIN) for i in range(10)])  # an empty store has nothing to read
    assert cat.metrics.store_reads == 0
    cat.offer([(f"x{i}", MIN) for i in range(89)])
    assert cat.blooms.buckets == []  # below the threshold: lookups went to the store
    assert cat.metrics.store_reads == 89
    cat.offer([(f"y{i}", MIN) for i in range(1000)])
    assert cat.blooms.buckets == [0]
    assert cat.metrics.lookups_avoided >= 900
    assert cat.metrics.false_positives < 50  # only a filter's "maybe" that was wrong counts
    assert cat.offer([("x5", MIN), ("y7", MIN), ("w1", MIN)]) == [Status.DUPLICATE] * 3


def test_an_id_sent_again_with_a_later_stamp_is_a_duplicate(opener: Opener) -> None:
    # the application handed its sender the same id twice: the second copy got a new system
    # time in a later bucket, and must still be caught while the first is younger than GC
    cat = opener(bloom_threshold=3)
    cat.offer([(f"a{i}", MIN) for i in range(10)])
    assert cat.offer([("a1", 25 * MIN), ("b", 25 * MIN)]) == [Status.DUPLICATE, Status.NEW]
    for _ in range(3):  # filters of both buckets built: the answer holds
        assert cat.offer([("a2", 31 * MIN), ("b", 45 * MIN)]) == [Status.DUPLICATE] * 2
    assert cat.blooms.buckets == [0, 2]
    cat.advance_gc(now_us=70 * MIN)  # bucket 0 (a*) gone; b's bucket still live
    assert cat.offer([("a3", 69 * MIN), ("b", 69 * MIN)]) == [Status.NEW, Status.DUPLICATE]


def test_gc_drops_old_buckets_and_answers_too_old(opener: Opener) -> None:
    cat = opener()
    cat.offer([(f"old{i}", MIN) for i in range(10)] + [(f"new{i}", 70 * MIN) for i in range(10)])
    deleted = cat.advance_gc(now_us=80 * MIN)  # watermark 20 min: bucket [0, 10 min) goes
    assert deleted == 10 and cat.metrics.ids_gcd == 10
    assert cat.offer([("old3", MIN)]) == [Status.TOO_OLD]  # cannot be checked any more
    assert cat.offer([("new3", 70 * MIN)]) == [Status.DUPLICATE]
    assert cat.metrics.too_old == 1
    assert cat.system_lag_us(now_us=80 * MIN) == 60 * MIN
    cat.advance_gc(now_us=10 * MIN)  # the watermark never moves back
    assert cat.gc_watermark_us == 20 * MIN
    cat.close()
    again = opener()
    assert again.gc_watermark_us == 20 * MIN  # persisted
    assert again.store.buckets() == {7}  # the dropped bucket's table is gone
    assert again.offer([("new4", 70 * MIN), ("old4", 25 * MIN)]) == [Status.DUPLICATE, Status.NEW]


ids = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=200)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ids)
def test_bloom_never_gives_a_false_negative(keys: list[str]) -> None:
    blooms = BucketBlooms(capacity=50, fpr=0.05)  # overfilled on purpose: still no false negative
    blooms.build(3, keys[: len(keys) // 2])
    blooms.add(3, keys[len(keys) // 2:])
    assert all(blooms.maybe_contains(3, k) for k in keys)


@pytest.mark.parametrize("fpr", [0.01, 0.001])
def test_measured_false_positive_rate_is_within_the_bound(fpr: float) -> None:
    n = 20_000
    bloom = Bloom(n, fpr)
    bloom.update(f"in-{i}" for i in range(n))
    probes = 200_000
    hits = sum(1 for i in range(probes) if f"out-{i}" in bloom)
    assert hits / probes <= fpr * 1.3  # binomial noise: ~1.3x at these sizes
    assert bloom.size_in_bits <= bloom_bits(n, fpr) * 1.05


records = st.lists(st.tuples(st.sampled_from([f"e{i}" for i in range(30)]),
                             st.integers(min_value=0, max_value=5 * MIN)), min_size=1, max_size=60)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records)
def test_offering_a_batch_twice_is_idempotent(batch: list[tuple[str, int]]) -> None:
    # a retried event carries its original's system time: make the id decide it
    batch = [(e, int(e[1:]) * 10_000_000) for e, _ in batch]
    with tempfile.TemporaryDirectory() as d:
        cat = _catalog(Path(d) / "c.db", bloom_threshold=3)
        first = cat.offer(batch)
        assert sum(s is Status.NEW for s in first) == len({e for e, _ in batch})
        tables = cat.store.buckets()
        assert cat.offer(batch) == [Status.DUPLICATE] * len(batch)
        assert cat.store.buckets() == tables
        cat.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=0, max_value=120), min_size=1, max_size=40),
       st.integers(min_value=0, max_value=200))
def test_gc_never_lets_a_duplicate_younger_than_the_watermark_through(
        minutes: list[int], now_min: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        cat = _catalog(Path(d) / "c.db", gc_delay_s=1800, bucket_s=300, bloom_threshold=2)
        batch = [(f"id{i}", m * MIN) for i, m in enumerate(minutes)]
        cat.offer(batch)
        cat.advance_gc(now_us=now_min * MIN)
        again = cat.offer(batch)
        for (_, ts), status in zip(batch, again, strict=True):
            if ts >= cat.gc_watermark_us:
                assert status is Status.DUPLICATE
            else:
                assert status is Status.TOO_OLD  # never NEW
        cat.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([f"e{i}" for i in range(20)]),
                          st.integers(min_value=0, max_value=50)), min_size=1, max_size=80))
def test_each_id_is_new_once_whatever_its_stamps(sends: list[tuple[str, int]]) -> None:
    # within the GC delay, an id is NEW exactly once however its copies are stamped and batched
    with tempfile.TemporaryDirectory() as d:
        cat = _catalog(Path(d) / "c.db", bloom_threshold=4)
        new: list[str] = []
        for i in range(0, len(sends), 7):
            part = [(e, m * MIN) for e, m in sends[i:i + 7]]
            new += [e for (e, _), st_ in zip(part, cat.offer(part), strict=True) if st_ is Status.NEW]
        assert sorted(new) == sorted({e for e, _ in sends})
        cat.close()


def test_pending_rows_commit_with_the_ids(opener: Opener) -> None:
    cat = opener()
    cat.record([("p1", MIN)], [Status.NEW], pending=("tok", ".ingest-tok.parquet.tmp"))
    assert cat.store.pending() == [("tok", ".ingest-tok.parquet.tmp")]
    cat.store.pending_done("tok")
    cat.store.pending_done("tok")  # twice: a no-op
    assert cat.store.pending() == []
    assert cat.offer([("p1", MIN)]) == [Status.DUPLICATE]


def test_postgres_catalog_is_one_process_at_a_time(pg_dsn: str) -> None:
    first = PostgresStore(pg_dsn, "solo")
    with pytest.raises(ConfigError, match="in use by another process"):
        PostgresStore(pg_dsn, "solo")
    other = PostgresStore(pg_dsn, "other")  # another catalog in the same database is fine
    first.close()
    PostgresStore(pg_dsn, "solo").close()  # released with the connection
    other.close()
    with pytest.raises(ConfigError, match="catalog name"):
        PostgresStore(pg_dsn, "Bad-Name")


def test_fresh_ids_stay_within_the_fpr_across_all_live_buckets(tmp_path: Path) -> None:
    # a fresh id is checked against every live bucket's filter: the configured FPR must bound
    # the whole check, not each filter (7 filters at 1% each would send ~7% to the store)
    cat = _catalog(tmp_path / "c.db", expected_rate_per_s=5, fpr=0.01, bloom_threshold=1)
    assert cat.cfg.live_buckets == 7
    for b in range(6):  # six full buckets of 3,000 ids (the filters' capacity)
        cat.offer([(f"b{b}-{i}", b * 10 * MIN + i) for i in range(3_000)])
    before = cat.metrics.store_reads
    probes = 30_000
    statuses = cat.offer([(f"fresh-{i}", 55 * MIN) for i in range(probes)])
    assert all(s is Status.NEW for s in statuses)
    assert cat.blooms.buckets == list(range(6))  # the last one built lazily, by these probes
    assert (cat.metrics.store_reads - before) / probes <= 0.01 * 1.3


def test_ids_are_stored_and_found_byte_exactly(opener: Opener) -> None:
    # SQLite's json_each cut strings at NUL: "a\x00b" was stored as "a", and then "a" was
    # answered DUPLICATE although it had never been sent (a silent loss)
    cat = opener(bloom_threshold=10_000)  # every lookup goes to the store
    sep = "\x00"
    if isinstance(cat.store, PostgresStore):  # text cannot hold NUL: refused, nothing written
        with pytest.raises(ConfigError, match="NUL"):
            cat.offer([("fine", MIN), ("a\x00b", MIN)])
        assert cat.offer([("fine", MIN)]) == [Status.NEW]
        sep = "\x01"
    stored = [f"a{sep}b", f"a{sep}c", sep, "x\u2028y", "é", "e\u0301", "a" * 300]
    assert cat.offer([(t, MIN) for t in stored]) == [Status.NEW] * 7
    assert cat.offer([(t, MIN) for t in [*stored, "a"]]) == [Status.DUPLICATE] * 7 + [Status.NEW]
    assert set(stored) <= set(cat.store.scan(0))


def test_too_old_from_the_first_record_and_far_future_refused(tmp_path: Path) -> None:
    now = 1_000 * 60 * MIN
    cfg = CatalogConfig(gc_delay_s=3600, bucket_s=600, max_clock_skew_s=300)
    cat = DedupCatalog(tmp_path / "c.db", cfg, now_us=lambda: now)
    assert cat.gc_watermark_us == 0  # the GC never ran: the floor still holds
    assert cat.offer([("ancient", 1), ("fresh", now)]) == [Status.TOO_OLD, Status.NEW]
    assert cat.offer([("soon", now + 5 * MIN)]) == [Status.NEW]
    with pytest.raises(ConfigError, match="ahead of the catalog's clock"):
        cat.offer([("far", now + 6 * MIN), ("ok", now)])
    assert cat.offer([("ok", now)]) == [Status.NEW]  # nothing of the refused batch was recorded
    assert cfg.live_buckets == 8  # (1 h + 5 min) / 10 min, plus a partial bucket


def test_unrecord_takes_back_exactly_the_ids_of_a_pending_row(opener: Opener) -> None:
    cat = opener()
    cat.offer([("kept", MIN)])
    cat.record([("lost1", MIN), ("lost2", 20 * MIN)], [Status.NEW] * 2, pending=("tok", ".x.tmp"))
    assert cat.store.unrecord("tok") == 2
    assert cat.store.pending() == []
    cat.reset_filters()
    assert cat.offer([("lost1", MIN), ("lost2", 20 * MIN), ("kept", MIN)]) == [
        Status.NEW, Status.NEW, Status.DUPLICATE]
    assert cat.store.unrecord("tok") == 0  # twice: a no-op
