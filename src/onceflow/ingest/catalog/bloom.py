"""Rolling Bloom filters, one per system-time bucket.

A Bloom filter answers "certainly not seen" or "maybe seen" for an id. The catalog keeps one
per bucket of sender system time (Dataflow: 10-minute buckets), so dropping a bucket behind
the GC watermark drops its filter whole. A fresh id is checked against the filter of every
live bucket (``gc_delay / bucket + 1`` of them, 7 with Dataflow's 10 minutes and an hour).

The filters are ``rbloom.Bloom`` (Rust): several times faster than a numpy bit array with xxhash
double hashing at the same size and false-positive rate (BENCHMARKS.md, "Ingest"). rbloom hashes with
Python's ``hash()``, which differs between processes; that is fine because filters are never
persisted: they are rebuilt from the store (lazily, see the catalog).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from onceflow.errors import ConfigError

try:
    from rbloom import Bloom
except ImportError:
    raise ConfigError("the ingest service's catalog needs rbloom, which is not installed: "
                      "pip install 'onceflow[ingest]'") from None


def bloom_bits(expected: int, fpr: float) -> int:
    """Bits a Bloom filter needs for ``expected`` ids at false-positive rate ``fpr``.

    Args:
        expected: Ids the filter will hold.
        fpr: Target false-positive rate, in (0, 1).

    Returns:
        ``-n ln p / (ln 2)^2`` bits.
    """
    return math.ceil(-max(expected, 1) * math.log(fpr) / math.log(2) ** 2)


class BucketBlooms:
    """One Bloom filter per system-time bucket, built on demand.

    Args:
        capacity: Ids expected per bucket (sizes each filter).
        fpr: Target false-positive rate of each filter.

    Raises:
        ConfigError: Capacity < 1 or fpr outside (0, 1).
    """

    def __init__(self, capacity: int, fpr: float) -> None:
        if capacity < 1 or not 0.0 < fpr < 1.0:
            raise ConfigError(f"Bloom capacity must be >= 1 and fpr in (0, 1), got {capacity}, {fpr}")
        self.capacity = capacity
        self.fpr = fpr
        self._filters: dict[int, Bloom] = {}

    def has(self, bucket: int) -> bool:
        """Whether ``bucket`` has a filter."""
        return bucket in self._filters

    def build(self, bucket: int, ids: Iterable[str]) -> None:
        """Create the filter of ``bucket`` holding ``ids``.

        Args:
            bucket: The bucket.
            ids: Every id the store holds for it.
        """
        bloom = Bloom(self.capacity, self.fpr)
        bloom.update(ids)
        self._filters[bucket] = bloom

    def add(self, bucket: int, ids: Iterable[str]) -> None:
        """Add ids to the bucket's filter, if it has one."""
        bloom = self._filters.get(bucket)
        if bloom is not None:
            bloom.update(ids)

    def get(self, bucket: int) -> Bloom | None:
        """The bucket's filter (``event_id in filter`` is False when certainly not seen)."""
        return self._filters.get(bucket)

    def maybe_contains(self, bucket: int, event_id: str) -> bool | None:
        """``False``: certainly not seen; ``True``: maybe; ``None``: the bucket has no filter."""
        bloom = self._filters.get(bucket)
        return None if bloom is None else event_id in bloom

    def drop_before(self, bucket: int) -> int:
        """Drop the filters of buckets ``< bucket``; return how many were dropped."""
        old = [b for b in self._filters if b < bucket]
        for b in old:
            del self._filters[b]
        return len(old)

    @property
    def nbytes(self) -> int:
        """Memory of all filters' bit arrays."""
        return sum(b.size_in_bits // 8 for b in self._filters.values())

    @property
    def buckets(self) -> list[int]:
        """Buckets that have a filter, ascending."""
        return sorted(self._filters)
