"""A child process that commits one batch of charges through the HTTP sink.

``python -m tests.sinks.http_child URL LEDGER BATCH VERSION [--ignore-keys] [--naive]`` commits
batch ``BATCH`` (charges of ``VERSION``: the amounts differ between versions, as a
non-deterministic ``per_batch`` would make them) and prints ``committed`` or ``replayed``;
``ONCEFLOW_CRASH_AT`` from the environment kills it at a crash point.
"""

from __future__ import annotations

import sys

import pyarrow as pa

from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.http.sink import HttpEffectsSink
from onceflow.verify.sinks import NaiveHttpSink

SPECS = {"charges": Table(key=["account", "hour"], mode="append")}  # one effect per key, ever
STATS = BatchStats(10, 0, 0)


def charges(batch: int, version: int = 0, n: int = 20) -> dict[str, pa.Table]:
    """Batch ``batch``'s charges: ``n`` accounts, one hour; ``version`` changes the amounts."""
    return {"charges": pa.table({"account": [f"acct-{i:03d}" for i in range(n)],
                                 "hour": pa.array([batch] * n, pa.int64()),
                                 "amount": pa.array([100 + i + 1000 * version for i in range(n)],
                                                    pa.int64())})}


def main(argv: list[str]) -> None:
    url, ledger, batch, version = argv[0], argv[1], int(argv[2]), int(argv[3])
    cls = NaiveHttpSink if "--naive" in argv else HttpEffectsSink
    sink = cls(url, ledger, idempotent="--ignore-keys" not in argv, timeout_s=2.0)
    sink.bind("q1")
    done = sink.commit_tables(batch, charges(batch, version), SPECS, STATS, 20)
    print("committed" if done else "replayed", flush=True)
    sink.close()


if __name__ == "__main__":
    main(sys.argv[1:])
