"""Rejects routing: what ``onceflow.expect`` + ``write_stream(rejects=)`` cost against the query without it.

The order pipeline of the tests (:mod:`tests.core.orders`): ``--records`` JSON-lines records in
``--files`` text files (one file per micro-batch, ``availableNow``), parsed against
``order_id STRING, sku STRING, qty INT, event_ts TIMESTAMP``, deduplicated by ``order_id``
within 10 minutes, the quantity per sku merged (``add``) into SQLite. Two inputs: 0% and 1%
bad records (every kind of :data:`tests.core.orders.KINDS`, 10% resends of good ones).

* **baseline**: the query as a user writes it without rejects: ``from_json`` with the schema, a
  ``where`` that drops the records that would break the rules (silently), ``deduplicate``,
  ``write_stream`` without ``rejects=``;
* **measured**: ``expect(json=, schema=, required=["sku"], checks={"qty_not_negative": ...})``,
  ``deduplicate``, ``write_stream(..., rejects="rejected")``: the bad records counted, and
  (1%) read back from the batch's files and written with their coordinates.

Ratio = baseline time / measured time (>= 0.95 at 0% is the target). The JVM keeps getting
faster for several runs (BENCHMARKS.md), so ``--warmup`` pairs are not reported and the rounds
alternate their order (baseline first, then measured first: every variant at the same mean
position); the ratio is of the sums over ``--repeat`` rounds, each round's ratio printed.

Usage: python benchmarks/bench_rejects.py [--records 1000000] [--files 8] [--repeat 4] [--warmup 2]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onceflow  # noqa: E402
from onceflow import Table  # noqa: E402
from tests.core import orders  # noqa: E402

TABLES = {"sku_qty": Table(key=["sku"], add=["qty"])}


def _per_batch(batch: Any) -> Any:
    from pyspark.sql import functions as F

    return batch.groupBy("sku").agg(F.sum("qty").cast("long").alias("qty"))


def _baseline(spark: Any, inputs: Path, db: Path, ck: Path) -> None:
    from pyspark.sql import functions as F

    raw = spark.readStream.option("maxFilesPerTrigger", 1).text(str(inputs))
    parsed = raw.select(F.from_json("value", orders.SCHEMA).alias("o")).select("o.*")
    kept = parsed.where("order_id IS NOT NULL AND trim(order_id) != '' AND event_ts IS NOT NULL "
                        "AND sku IS NOT NULL AND qty >= 0")
    clean = onceflow.deduplicate(kept, id="order_id", event_time="event_ts", within="10 minutes")
    onceflow.write_stream(clean, onceflow.sqlite(db), ck, TABLES, per_batch=_per_batch, once=True) \
        .awaitTermination()


def _measured(spark: Any, inputs: Path, db: Path, ck: Path) -> None:
    raw = spark.readStream.option("maxFilesPerTrigger", 1).text(str(inputs))
    onceflow.write_stream(orders.clean(raw), onceflow.sqlite(db), ck, TABLES, per_batch=_per_batch, once=True,
                          rejects="rejected").awaitTermination()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    from onceflow.spark import session

    spark = session(app_name="bench-rejects", conf={"spark.sql.session.timeZone": "UTC"})
    root = Path(tempfile.mkdtemp(prefix="bench-rejects-"))
    try:
        per_file = args.records // args.files
        for rate in (0.0, 0.01):
            inputs = root / f"in{rate}"
            for k in range(args.files):
                orders.generate(inputs, root / f"manifest{rate}.jsonl", k * per_file, per_file, bad_rate=rate,
                                seed=1)
            base: list[float] = []
            ours: list[float] = []
            for r in range(-args.warmup, args.repeat):
                run = root / f"run{rate}-{r}"
                timed = {}
                order = [("b", _baseline), ("m", _measured)]
                for name, query in (order if r % 2 == 0 else order[::-1]):
                    started = time.perf_counter()
                    query(spark, inputs, run / f"{name}.db", run / f"{name}ck")
                    timed[name] = time.perf_counter() - started
                b, m = timed["b"], timed["m"]
                if r < 0:
                    continue
                base.append(b)
                ours.append(m)
                print(f"{rate:.0%} bad, run {r + 1}: baseline {b:.2f} s, rejects {m:.2f} s, "
                      f"ratio {b / m:.3f}", flush=True)
            median = statistics.median(x / y for x, y in zip(base, ours, strict=True))
            print(f"{rate:.0%} bad: ratio baseline / rejects = {sum(base) / sum(ours):.3f} over "
                  f"{args.repeat} rounds (median of rounds {median:.3f}; {args.records:,} records, "
                  f"{args.files} batches)", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
