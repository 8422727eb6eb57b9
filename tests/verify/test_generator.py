from __future__ import annotations

from collections import Counter

import pytest

from onceflow.errors import ConfigError
from onceflow.verify.generator import GeneratorConfig, generate_segments, generate_table


def test_same_seed_same_rows_other_seed_other_rows() -> None:
    cfg = GeneratorConfig(events=2000, users=7, duplicates=0.1, late=0.05, seed=3)
    assert generate_table(cfg).equals(generate_table(cfg))
    other = generate_table(GeneratorConfig(events=2000, users=7, duplicates=0.1, late=0.05, seed=4))
    assert not generate_table(cfg).equals(other)


def test_duplicates_are_identical_retries_appended_later() -> None:
    cfg = GeneratorConfig(events=5000, duplicates=0.1, seed=1)
    t = generate_table(cfg)
    assert t.num_rows == 5500
    ids = t.column("event_id").to_pylist()
    counts = Counter(ids)
    assert len(counts) == 5000
    assert sum(1 for c in counts.values() if c == 2) == 500
    rows = t.to_pylist()
    first: dict[str, int] = {}
    for i, row in enumerate(rows):
        if row["event_id"] in first:
            assert rows[first[row["event_id"]]] == row  # same content
            assert i > first[row["event_id"]]  # appended later
        else:
            first[row["event_id"]] = i


def test_on_time_disorder_is_bounded_and_late_events_are_far_behind() -> None:
    cfg = GeneratorConfig(events=20000, minutes=20, late=0.02, seed=2, max_disorder_s=20)
    t = generate_table(cfg)
    et = t.column("event_time").cast("int64").to_pylist()
    st = t.column("system_time").cast("int64").to_pylist()
    lags = [(s - e) / 1e6 for s, e in zip(st, et, strict=True)]
    on_time = [lag for lag in lags if lag < 60]
    late = [lag for lag in lags if lag >= 600]
    assert len(on_time) + len(late) == len(lags)
    assert max(on_time) < 20
    assert 300 < len(late) < 500


def test_segments_cut_at_segment_size() -> None:
    sizes = [s.num_rows for s in generate_segments(GeneratorConfig(events=250, segment_size=100))]
    assert sizes == [100, 100, 50]


@pytest.mark.parametrize("kwargs", [
    {"events": -1}, {"events": 1, "users": 0}, {"events": 1, "duplicates": 1.5},
    {"events": 1, "late": -0.1}, {"events": 1, "segment_size": 0},
])
def test_bad_config_is_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        GeneratorConfig(**kwargs)  # type: ignore[arg-type]
