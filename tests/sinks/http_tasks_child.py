"""A child process that commits batches of charges through the HTTP sink's tasks path.

``python -m tests.sinks.http_tasks_child URL LEDGER MASTER BATCH [BATCH ...]`` commits each batch
(:func:`frames`: charges and per-account counts, as Spark DataFrames) with ``collect_below=0`` on
Spark's master ``MASTER`` (``local[2,2]``: a failed task is tried again) and prints ``committed N``
or ``replayed N``; ``ONCEFLOW_CRASH_AT`` from the environment kills it (or its tasks) at a crash
point.
"""

from __future__ import annotations

import sys
from typing import Any

from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.http.sink import HttpEffectsSink

SPECS = {"charges": Table(key=["account", "hour"], mode="append"), "counts": Table(key="account", add="n")}
ROWS = 3000


def rows(batch: int) -> list[tuple[str, int, int]]:
    """Batch ``batch``'s charges: ``(account, hour, amount)``, 300 accounts, one hour per batch."""
    return [(f"acct-{i % 300:03d}", batch * 100 + i // 300, 100 + i) for i in range(ROWS)]


def frames(spark: Any, batch: int) -> dict[str, Any]:
    """The batch as the two tables' DataFrames (charges over 4 partitions: several tasks)."""
    charges = spark.createDataFrame(rows(batch), "account STRING, hour LONG, amount LONG").repartition(4)
    counts = charges.groupBy("account").count().withColumnRenamed("count", "n")
    return {"charges": charges, "counts": counts}


def main(argv: list[str]) -> None:
    from onceflow.runtime.session import session

    url, ledger, master = argv[0], argv[1], argv[2]
    spark = session(master, app_name="http-tasks-child", shuffle_partitions=2)
    sink = HttpEffectsSink(url, ledger, timeout_s=5.0, collect_below=0)
    sink.check(SPECS, {})
    sink.bind("q1")
    for batch in (int(b) for b in argv[3:]):
        done = sink.commit_frames(batch, frames(spark, batch), SPECS, BatchStats(ROWS, 0, 0), ROWS)
        print(f"{'committed' if done else 'replayed'} {batch}", flush=True)
    sink.close()


if __name__ == "__main__":
    main(sys.argv[1:])
