"""Test helpers: independent expectations computed with pyarrow only (no Spark)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from onceflow.sources.log import EventLog


def distinct_counts(log_dir: str | Path) -> tuple[dict[tuple[str, int], int], dict[int, int]]:
    """Count distinct event_ids per (user, minute) and per minute, straight from the files."""
    seen: set[str] = set()
    users: Counter[tuple[str, int]] = Counter()
    for seg in EventLog(log_dir).segments():
        t = pq.read_table(seg.path, columns=["event_id", "user", "event_time"])
        ids = t.column("event_id").to_pylist()
        us = t.column("user").to_pylist()
        micros = t.column("event_time").cast("int64").to_pylist()
        for eid, user, ts in zip(ids, us, micros, strict=True):
            if eid in seen:
                continue
            seen.add(eid)
            users[(user, (ts // 60_000_000) * 60_000)] += 1
    glob: Counter[int] = Counter()
    for (_, w), c in users.items():
        glob[w] += c
    return dict(users), dict(glob)
