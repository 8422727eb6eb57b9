"""Deterministic synthetic events for Example 5-1: users, bytes, retries, late data.

The stream advances uniformly through ``minutes`` of event time. On-time events
are out of order by less than ``max_disorder``; keep that below the pipeline's
allowed lateness and no on-time event is ever dropped as late. Producer retries
(``duplicates``) re-append an already written event, identical in every field,
a little later in the log. Late events (``late``) carry an event time
``late_lag`` or more behind the stream, so they arrive after the watermark
passed them (unless they land in the very first micro-batch, where Spark's
watermark is still 0).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from onceflow.errors import ConfigError
from onceflow.sources.events import EVENT_SCHEMA

DEFAULT_START = datetime(2026, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class GeneratorConfig:
    """What to generate.

    Attributes:
        events: Distinct events (each with its own ``event_id``).
        users: Distinct users.
        minutes: Event-time span of the stream, in minutes.
        duplicates: Fraction of events re-appended as producer retries.
        late: Fraction of events emitted far behind the stream.
        seed: Random seed; the same config always gives the same rows.
        segment_size: Rows per segment file.
        max_disorder_s: Out-of-orderness bound of on-time events, in seconds.
        late_lag_s: How far behind the stream late events are, in seconds.
        start: Event time of the first event.
    """

    events: int
    users: int = 100
    minutes: float = 10.0
    duplicates: float = 0.0
    late: float = 0.0
    seed: int = 0
    segment_size: int = 100_000
    max_disorder_s: float = 20.0
    late_lag_s: float = 600.0
    start: datetime = DEFAULT_START

    def __post_init__(self) -> None:
        if self.events < 0:
            raise ConfigError(f"events must be >= 0, got {self.events}")
        if self.users < 1:
            raise ConfigError(f"users must be >= 1, got {self.users}")
        if self.minutes <= 0:
            raise ConfigError(f"minutes must be > 0, got {self.minutes}")
        for name in ("duplicates", "late"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"{name} is a fraction in [0, 1], got {v}")
        if self.segment_size < 1:
            raise ConfigError(f"segment_size must be >= 1, got {self.segment_size}")
        if self.max_disorder_s < 0 or self.late_lag_s < 0:
            raise ConfigError("max_disorder_s and late_lag_s must be >= 0")
        if self.start.tzinfo is None:
            raise ConfigError("start must be timezone-aware (UTC)")


def generate_table(cfg: GeneratorConfig) -> pa.Table:
    """Generate every row of the stream, in log order.

    Args:
        cfg: What to generate.

    Returns:
        ``cfg.events`` distinct events plus the duplicate rows, in the order a
        producer appends them.
    """
    rng = np.random.default_rng(cfg.seed)
    n = cfg.events
    start_us = int(cfg.start.timestamp() * 1_000_000)
    span_us = int(cfg.minutes * 60_000_000)
    pos = np.arange(n, dtype=np.int64)
    base = start_us + (pos * span_us) // max(n, 1)
    disorder = rng.integers(0, max(int(cfg.max_disorder_s * 1_000_000), 1), n)
    event_time = base - disorder
    late = rng.random(n) < cfg.late
    late_extra = rng.integers(0, 60_000_000, n)
    event_time = np.where(late, base - int(cfg.late_lag_s * 1_000_000) - late_extra, event_time)
    users = rng.integers(0, cfg.users, n)
    nbytes = rng.integers(1, 10_000, n)

    # Producer retries: re-append chosen events a little later in the log.
    n_dup = int(round(n * cfg.duplicates))
    dup_src = np.sort(rng.choice(n, size=n_dup, replace=False)) if n_dup else np.empty(0, np.int64)
    dup_delay = rng.integers(1, max(min(n // 50, 5_000), 2), n_dup)
    order_key = np.concatenate([pos * 2, (dup_src + dup_delay) * 2 + 1])
    src_index = np.concatenate([pos, dup_src])
    rows = src_index[np.argsort(order_key, kind="stable")]

    ids = pc.binary_join_element_wise(
        pa.scalar(f"ev-{cfg.seed}-"), pc.cast(pa.array(pos), pa.string()), ""
    )
    user_names = pc.binary_join_element_wise(
        "user-", pc.utf8_lpad(pc.cast(pa.array(users), pa.string()), 5, "0"), ""
    )
    table = pa.table(
        {
            "event_id": ids,
            "user": user_names,
            "event_time": pa.array(event_time, pa.timestamp("us", tz="UTC")),
            "system_time": pa.array(base, pa.timestamp("us", tz="UTC")),
            "bytes": pa.array(nbytes, pa.int64()),
        },
        schema=EVENT_SCHEMA,
    )
    return table.take(pa.array(rows))


def generate_segments(cfg: GeneratorConfig) -> Iterator[pa.Table]:
    """Generate the stream cut into segment-sized tables.

    Args:
        cfg: What to generate.

    Yields:
        Tables of at most ``cfg.segment_size`` rows, in log order.
    """
    table = generate_table(cfg)
    for offset in range(0, table.num_rows, cfg.segment_size):
        yield table.slice(offset, cfg.segment_size)
