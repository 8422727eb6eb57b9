"""The dedup catalog: seen record ids in a key/value store, fronted by rolling Bloom filters.

Every record carries a stable ``event_id`` and its sender's system time (from
:class:`onceflow.ingest.clock.SenderClock`; a retry carries the original's time). The catalog
decides per record:

* ``NEW`` — never seen: recorded (store + Bloom) and passed on;
* ``DUPLICATE`` — seen before (or earlier in the same batch): dropped and counted;
* ``TOO_OLD`` — its system time is behind the **GC watermark** (now minus the GC delay, from
  the first record on: also before the GC has run once), whose ids were deleted. In Dataflow
  such a record is a duplicate by construction (the sender had its ack). An external sender
  that kept an event in its outbox longer than the GC delay may still be sending it for the
  first time, so the catalog cannot tell: it answers with this distinct status, counts it,
  and never passes it on silently as new.

Store (:mod:`onceflow.ingest.catalog.store`): SQLite by default, or PostgreSQL
(:class:`onceflow.ingest.catalog.pgstore.PostgresStore`); one table per system-time bucket; an id
lives in the bucket of the system time it first came with, and GC drops whole tables. The
GC watermark is persisted and never moves back.

A record is checked against every live bucket, not only its own: a retry by the sender
carries its original's system time (same bucket), but an application that hands its sender
the same ``event_id`` again gets a new stamp, possibly in a later bucket, and is still a
duplicate as long as the first one is younger than the GC watermark (measured by ``onceflow
verify --ingest`` with producer duplicates: checking only the own bucket let them through).

System times ahead of the catalog's clock by more than ``max_clock_skew_s`` are refused
(:class:`onceflow.errors.ConfigError`; the ingest receiver rejects such events before they
get here): they would create buckets the GC cannot drop, so the number of live buckets is
bounded by ``(gc_delay + max_clock_skew) / bucket + 1``.

Bloom filters: one per bucket, sized from the expected rate and the target false-positive
rate divided by the number of live buckets (a fresh id is checked against all of them, so
the chance that any says "maybe" stays within the target: with one hour and 10-minute
buckets, 7 filters at 1/7 of the target each).
Lazy: nothing is read at start-up; a bucket's filter is built (from that bucket's
table) once ``bloom_threshold`` records were checked against the bucket in this process.
Until every live bucket has its filter, and whenever a filter says "maybe", the store is
read; when all filters say "no" the store is skipped.

Write protocol of :meth:`DedupCatalog.offer` (one batch):

1. Classify every record (Bloom, then the store for the rest); nothing written yet.
2. In one store transaction, insert the ``NEW`` ids into their buckets' tables (ids
   already present are ignored: a concurrent writer that recorded the same id first makes
   it a duplicate on the next batch, never a loss), commit durably.
3. Only then add them to the Bloom filters and return the statuses. A crash before 3 leaves
   the ids recorded and the filters (in memory) gone: they are rebuilt from the store.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np
import pyarrow as pa

from onceflow.errors import ConfigError
from onceflow.ingest.catalog.bloom import BucketBlooms
from onceflow.ingest.catalog.store import CatalogStore, SqliteStore


class Status(str, Enum):
    """The catalog's answer for one record."""

    NEW = "new"
    DUPLICATE = "duplicate"
    TOO_OLD = "too_old"


NEW, DUPLICATE, TOO_OLD = 0, 1, 2
"""The statuses as int8 codes (the columnar entry points)."""
_STATUSES = (Status.NEW, Status.DUPLICATE, Status.TOO_OLD)
_CODES = {s: i for i, s in enumerate(_STATUSES)}


@dataclass(frozen=True)
class CatalogConfig:
    """How the catalog buckets, sizes and forgets.

    Attributes:
        gc_delay_s: How long ids are kept (system time); required — without it the
            catalog would grow forever.
        bucket_s: System-time bucket width (one Bloom filter and one table each).
        expected_rate_per_s: Expected new ids per second (sizes the filters).
        fpr: Target false-positive rate of a fresh id's check (against every live bucket's
            filter: each filter gets ``fpr / live_buckets``).
        bloom_threshold: Records of a bucket seen by this process before its filter is built.
        max_clock_skew_s: How far a system time may be ahead of the catalog's clock; None:
            not checked (the caller bounds system times, e.g. a test's synthetic clock).
    """

    gc_delay_s: float | None
    bucket_s: float = 600.0
    expected_rate_per_s: float = 10_000.0
    fpr: float = 0.01
    bloom_threshold: int = 1_000
    max_clock_skew_s: float | None = 300.0

    def __post_init__(self) -> None:
        if self.gc_delay_s is None or self.gc_delay_s <= 0:
            raise ConfigError(
                "the dedup catalog needs a GC delay > 0 (gc_delay_s): without one it keeps "
                "every id forever. Choose how long senders may retry, e.g. 3600 for an hour."
            )
        if self.bucket_s <= 0 or self.bucket_s > self.gc_delay_s:
            raise ConfigError(f"bucket_s must be in (0, gc_delay_s], got {self.bucket_s}")
        if not 0.0 < self.fpr < 1.0:
            raise ConfigError(f"fpr must be in (0, 1), got {self.fpr}")
        if self.expected_rate_per_s <= 0 or self.bloom_threshold < 0:
            raise ConfigError("expected_rate_per_s must be > 0 and bloom_threshold >= 0")
        if self.max_clock_skew_s is not None and not 0 <= self.max_clock_skew_s <= self.gc_delay_s:
            raise ConfigError(f"max_clock_skew_s must be in [0, gc_delay_s], got {self.max_clock_skew_s}")

    @property
    def live_buckets(self) -> int:
        """Most buckets alive at once.

        Ids younger than the GC delay or up to the clock skew ahead, plus a partial bucket.
        """
        assert self.gc_delay_s is not None
        return math.ceil((self.gc_delay_s + (self.max_clock_skew_s or 0)) / self.bucket_s) + 1


@dataclass
class CatalogMetrics:
    """Counters since the catalog was opened.

    Attributes:
        lookups: Records classified (TOO_OLD ones included).
        lookups_avoided: Records a Bloom filter proved new (no store read).
        false_positives: Filter said "maybe", the store said new.
        store_reads: Records looked up in the store.
        duplicates_dropped: Records answered DUPLICATE.
        too_old: Records answered TOO_OLD.
        ids_gcd: Ids deleted by the GC.
    """

    lookups: int = 0
    lookups_avoided: int = 0
    false_positives: int = 0
    store_reads: int = 0
    duplicates_dropped: int = 0
    too_old: int = 0
    ids_gcd: int = 0


def _wall_us() -> int:
    return time.time_ns() // 1000


class DedupCatalog:
    """Seen ids with rolling Bloom filters and a GC watermark (see the module).

    Not thread-safe: one caller at a time (the ingest receiver serializes its group commits
    and its GC under one lock).

    Args:
        store: A SQLite file for the embedded store, or a :class:`CatalogStore`.
        cfg: Bucketing, sizing and GC.
        now_us: Clock for the GC watermark (microseconds); the wall clock by default.
    """

    def __init__(self, store: str | Path | CatalogStore, cfg: CatalogConfig,
                 now_us: Callable[[], int] = _wall_us) -> None:
        assert cfg.gc_delay_s is not None  # checked by CatalogConfig
        self.cfg = cfg
        self.bucket_us = int(cfg.bucket_s * 1_000_000)
        self.gc_delay_us = int(cfg.gc_delay_s * 1_000_000)
        self.skew_us = None if cfg.max_clock_skew_s is None else int(cfg.max_clock_skew_s * 1_000_000)
        self.now_us = now_us
        self.metrics = CatalogMetrics()
        self.store = store if isinstance(store, CatalogStore) else SqliteStore(store)
        self.gc_watermark_us = self.store.watermark()
        capacity = max(int(cfg.expected_rate_per_s * cfg.bucket_s), 1)
        # a fresh id is checked against every live filter: split the false-positive budget
        self.blooms = BucketBlooms(capacity, cfg.fpr / cfg.live_buckets)
        self._checked: dict[int, int] = {}

    def bucket_of(self, system_time_us: int) -> int:
        """The bucket a system time falls in."""
        return system_time_us // self.bucket_us

    def _demand(self, buckets: Sequence[int], n: int) -> None:
        """Count ``n`` more records checked against each bucket; build filters due now."""
        for b in buckets:
            before = self._checked.get(b, 0)
            self._checked[b] = before + n
            if not self.blooms.has(b) and before + n >= self.cfg.bloom_threshold:
                self.blooms.build(b, self.store.scan(b))

    def classify(self, records: Sequence[tuple[str, int]]) -> list[Status]:
        """Step 1: the status of every record, writing nothing.

        An id is a DUPLICATE when any live bucket holds it, whatever the record's own system
        time: a sender's retry carries its original's time, but an application that sends the
        same id again gets a new stamp from its sender, and is still caught within the GC delay.

        Args:
            records: ``(event_id, system_time_us)`` pairs.

        Returns:
            One status per record; a repeat within ``records`` is a DUPLICATE.
        """
        ids = [r[0] for r in records]
        codes = self.classify_codes(ids, np.fromiter((r[1] for r in records), np.int64, len(records)))
        return [_STATUSES[c] for c in codes.tolist()]

    def classify_codes(self, ids: list[str], times_us: np.ndarray) -> np.ndarray:
        """:meth:`classify` on columns (the receiver's fast path).

        Args:
            ids: The event ids.
            times_us: Their system times (int64 microseconds), same length.

        Returns:
            int8 codes: :data:`NEW`, :data:`DUPLICATE` or :data:`TOO_OLD` per record.
        """
        n = len(ids)
        now = self.now_us()
        if n and self.skew_us is not None and int(times_us.max()) > now + self.skew_us:
            raise ConfigError(f"{int((times_us > now + self.skew_us).sum())} system times are more than "
                              f"{self.skew_us / 1e6:.0f} s ahead of the catalog's clock; a sender's clock "
                              "is wrong (such ids would outlive the GC delay)")
        self.metrics.lookups += n
        codes = np.full(n, NEW, np.int8)
        old = times_us < max(self.gc_watermark_us, now - self.gc_delay_us)
        codes[old] = TOO_OLD
        pend = np.flatnonzero(~old)
        pids = ids if len(pend) == n else [ids[i] for i in pend.tolist()]
        live = sorted(self.store.buckets())  # the buckets that hold ids
        self._demand(live, len(pids))
        unfiltered = [b for b in live if not self.blooms.has(b)]
        maybe = np.zeros(len(pids), bool)
        hits: dict[int, np.ndarray] = {}
        for b in live:
            f = self.blooms.get(b)
            if f is not None:
                hit = np.fromiter(map(f.__contains__, pids), bool, len(pids))
                if hit.any():
                    hits[b] = np.flatnonzero(hit)
                    maybe |= hit
        if live and not unfiltered:
            self.metrics.lookups_avoided += int(len(pids) - maybe.sum())  # every filter said "no"
        self.metrics.store_reads += len(pids) if unfiltered else int(maybe.sum())
        seen = np.zeros(len(pids), bool)
        everything = np.arange(len(pids))
        for b in sorted(set(unfiltered) | set(hits)):
            idx = everything if b in unfiltered else hits[b]
            sub = pids if b in unfiltered else [pids[i] for i in idx.tolist()]
            stored = self.store.stored(b, sub)
            if stored:
                seen[idx[np.fromiter(map(stored.__contains__, sub), bool, len(sub))]] = True
        self.metrics.false_positives += int((maybe & ~seen).sum())
        codes[pend[seen]] = DUPLICATE
        fresh = np.flatnonzero(codes == NEW)
        if len(fresh):  # a repeat within the batch: only its first copy is new
            enc = pa.array([ids[i] for i in fresh.tolist()] if len(fresh) < n else ids,
                           pa.string()).dictionary_encode().indices.to_numpy(zero_copy_only=False)
            first = np.zeros(len(fresh), bool)
            first[np.unique(enc, return_index=True)[1]] = True
            codes[fresh[~first]] = DUPLICATE
        self.metrics.duplicates_dropped += int((codes == DUPLICATE).sum())
        self.metrics.too_old += int(old.sum())
        return codes

    def record(self, records: Sequence[tuple[str, int]], statuses: Sequence[Status],
               pending: tuple[str, str] | None = None) -> None:
        """Steps 2-3: durably insert the NEW ids, then add them to the filters.

        Args:
            records: As given to :meth:`classify`.
            statuses: What :meth:`classify` returned for them.
            pending: A ``(token, file)`` row committed in the same transaction (the ingest
                receiver's pending segment, so ids and segment are recorded together).
        """
        codes = np.fromiter((_CODES[s] for s in statuses), np.int8, len(statuses))
        self.record_codes([r[0] for r in records],
                          np.fromiter((r[1] for r in records), np.int64, len(records)), codes, pending)

    def record_codes(self, ids: list[str], times_us: np.ndarray, codes: np.ndarray,
                     pending: tuple[str, str] | None = None) -> None:
        """:meth:`record` on columns (the receiver's fast path).

        Args:
            ids: The event ids.
            times_us: Their system times (int64 microseconds).
            codes: What :meth:`classify_codes` returned for them.
            pending: As in :meth:`record`.
        """
        new = np.flatnonzero(codes == NEW)
        buckets = times_us[new] // self.bucket_us
        by_bucket: dict[int, list[str]] = {}
        for b in np.unique(buckets).tolist():
            sel = new[buckets == b]
            by_bucket[int(b)] = ids if len(sel) == len(ids) else [ids[i] for i in sel.tolist()]
        if not by_bucket and pending is None:
            return
        self.store.insert(by_bucket, pending)
        for bucket, bucket_ids in by_bucket.items():
            self.blooms.add(bucket, bucket_ids)

    def offer(self, records: Sequence[tuple[str, int]]) -> list[Status]:
        """Classify and record a batch (the whole protocol of the module).

        Args:
            records: ``(event_id, system_time_us)`` pairs.

        Returns:
            One status per record.
        """
        statuses = self.classify(records)
        self.record(records, statuses)
        return statuses

    def advance_gc(self, now_us: int | None = None) -> int:
        """Move the GC watermark to ``now - gc_delay`` (never back); drop what it passed.

        Args:
            now_us: The current time; the catalog's clock when None.

        Returns:
            Ids deleted.
        """
        now = self.now_us() if now_us is None else now_us
        mark = max(self.gc_watermark_us, now - self.gc_delay_us)
        # a bucket goes once all of it is behind the watermark
        gone = sorted(b for b in self.store.buckets() if (b + 1) * self.bucket_us <= mark)
        deleted = self.store.advance(mark, gone)
        self.gc_watermark_us = mark
        self.blooms.drop_before(mark // self.bucket_us)
        for b in [b for b in self._checked if (b + 1) * self.bucket_us <= mark]:
            del self._checked[b]
        self.metrics.ids_gcd += deleted
        return deleted

    def reset_filters(self) -> None:
        """Forget every Bloom filter (rebuilt from the store on demand).

        After a write whose outcome is unknown (a commit that raised), the store may hold
        ids the filters lack; a filter's "certainly not seen" would then be wrong.
        """
        self.blooms.drop_before(2**62)
        self._checked.clear()

    def system_lag_us(self, now_us: int | None = None) -> int:
        """Now minus the GC watermark (how far back duplicates are still caught)."""
        return (self.now_us() if now_us is None else now_us) - self.gc_watermark_us

    def close(self) -> None:
        """Close the store."""
        self.store.close()
