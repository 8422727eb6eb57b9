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
