"""The sample input of the orders pipeline: JSON lines files with resends and late orders."""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path

START = dt.datetime(2026, 3, 1, 9, 0, tzinfo=dt.timezone.utc)


def write(directory: Path, files: int = 12, per_file: int = 400, seed: int = 1) -> int:
    """Write ``files`` files of orders; 8% resend an earlier order, 3% are an hour behind.

    Returns:
        The number of distinct order ids.
    """
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    sent: list[dict[str, object]] = []
    n = 0
    for f in range(files):
        lines = []
        for _ in range(per_file):
            if sent and rng.random() < 0.08:
                order = rng.choice(sent[-300:])  # a resend: the same order again
            else:
                ts = START + dt.timedelta(seconds=n * 3 - (3600 if rng.random() < 0.03 else 0))
                order = {"order_id": f"o{n}", "customer": f"c{rng.randrange(40)}",
                         "cents": rng.randrange(100, 50_000), "ts": ts.isoformat()}
                n += 1
                sent.append(order)
            lines.append(json.dumps(order))
        (directory / f"orders-{f:03d}.json").write_text("\n".join(lines) + "\n")
    return n


BAD = [  # (a bad line, the rule it breaks, the column): one of each rule of an input contract
    ("not json at all", "parse", "value"),
    ('{"order_id": "bad-cents", "customer": "c1", "cents": "three", "ts": "2026-03-01T09:00:00+00:00"}',
     "parse", "cents"),
    ('{"order_id": "bad-customer", "cents": 5, "ts": "2026-03-01T09:00:00+00:00"}', "required", "customer"),
    ('{"order_id": "bad-negative", "customer": "c1", "cents": -5, "ts": "2026-03-01T09:00:00+00:00"}',
     "check", "cents_not_negative"),
    ('{"order_id": "  ", "customer": "c1", "cents": 5, "ts": "2026-03-01T09:00:00+00:00"}', "id", "order_id"),
    ('{"order_id": "bad-ts", "customer": "c1", "cents": 5}', "event_time", "ts"),
]
"""Lines the orders pipeline's input contract (``orders.build_rejects``) must send to its rejects."""


def add_bad_lines(directory: Path, seed: int = 1) -> list[tuple[str, int, str, str]]:
    """Put each line of :data:`BAD` into a random file of the sample, at a random line.

    Returns:
        ``(file, line number from 1, rule, column)`` of each.
    """
    rng = random.Random(seed)
    files = sorted(directory.glob("*.json"))
    placed = []
    for i, (line, rule, column) in enumerate(BAD):
        path = files[i % len(files)]
        lines = path.read_text().splitlines()
        at = rng.randrange(len(lines) + 1)
        lines.insert(at, line.replace("bad-", f"bad{i}-"))
        path.write_text("\n".join(lines) + "\n")
        placed = [(f, n + 1 if f == str(path) and n >= at else n, r, c) for f, n, r, c in placed]
        placed.append((str(path), at + 1, rule, column))
    return placed
