"""Rejects routing: what ``onceflow.expect`` + ``write_stream(rejects=)`` cost against the query without it.

The order pipeline of the tests (:mod:`tests.core.orders`): ``--records`` JSON-lines records in
``--files`` text files (one file per micro-batch, ``availableNow``), parsed against
``order_id STRING, sku STRING, qty INT, event_ts TIMESTAMP``, deduplicated by ``order_id``
within 10 minutes, the quantity per sku merged (``add``) into SQLite. Two inputs: 0% and 1%
bad records (every kind of :data:`tests.core.orders.KINDS`, 10% resends of good ones).

* **baseline**: the query as a user writes it without rejects: ``from_json`` with the schema, a
  ``where`` that drops the records that would break the rules (silently), ``deduplicate``,
  ``write_stream`` without ``rejects=``; Spark pushes that ``where`` below the projection of
  the parsed fields, so it parses a record once per field it tests;
* **plain** (0% only): the same without the ``where`` (the query as it was before bad records
  were handled: the first bad one stops it);
* **measured**: ``expect(json=, schema=, required=["sku"], checks={"qty_not_negative": ...})``,
  ``deduplicate``, ``write_stream(..., rejects="rejected")``: the bad records counted, and
  (1%) read back from the batch's files and written with their coordinates.

Part ``dedup`` (what every ``deduplicate`` user now pays, with or without ``rejects=``): the
click pipeline of the tests (``--clicks`` clicks in 8 Parquet files, per-page-and-minute
deltas merged into SQLite) with ``onceflow.deduplicate`` on the bare source (its ``id`` /
``event_time`` rules counted and filtered, the count read per batch) vs the same query deduplicated
by Spark's ``withWatermark`` + ``dropDuplicatesWithinWatermark`` directly (no rules).

Ratio = baseline time / measured time (>= 0.95 at 0% is the target). The JVM keeps getting
faster for several runs (BENCHMARKS.md), so ``--warmup`` pairs are not reported and the rounds
alternate their order (baseline first, then measured first: every variant at the same mean
position); the ratio is of the sums over ``--repeat`` rounds, each round's ratio printed.

Usage: python benchmarks/bench_rejects.py [--part rejects|dedup|both] [--records 1000000] [--files 8]
       [--clicks 2000000] [--repeat 4] [--warmup 2]
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


def _plain(spark: Any, inputs: Path, db: Path, ck: Path) -> None:
    _baseline(spark, inputs, db, ck, drop_bad=False)


def _baseline(spark: Any, inputs: Path, db: Path, ck: Path, drop_bad: bool = True) -> None:
    from pyspark.sql import functions as F

    raw = spark.readStream.option("maxFilesPerTrigger", 1).text(str(inputs))
    parsed = raw.select(F.from_json("value", orders.SCHEMA).alias("o")).select("o.*")
    kept = parsed.where("order_id IS NOT NULL AND trim(order_id) != '' AND event_ts IS NOT NULL "
                        "AND sku IS NOT NULL AND qty >= 0") if drop_bad else parsed
    clean = onceflow.deduplicate(kept, id="order_id", event_time="event_ts", within="10 minutes")
    onceflow.write_stream(clean, onceflow.sqlite(db), ck, TABLES, per_batch=_per_batch, once=True) \
        .awaitTermination()


def _measured(spark: Any, inputs: Path, db: Path, ck: Path) -> None:
    raw = spark.readStream.option("maxFilesPerTrigger", 1).text(str(inputs))
    onceflow.write_stream(orders.clean(raw), onceflow.sqlite(db), ck, TABLES, per_batch=_per_batch, once=True,
                          rejects="rejected").awaitTermination()


def _rounds(args: Any, label: str, variants: dict[str, Any]) -> None:
    """Run the two variants (baseline first) in alternating order; print each round and the ratio."""
    (bname, base_fn), (mname, ours_fn) = variants.items()
    base: list[float] = []
    ours: list[float] = []
    for r in range(-args.warmup, args.repeat):
        order = [(bname, base_fn), (mname, ours_fn)]
        timed = {}
        for name, run in (order if r % 2 == 0 else order[::-1]):
            started = time.perf_counter()
            run(f"{label}-{r}-{name}")
            timed[name] = time.perf_counter() - started
        if r < 0:
            continue
        base.append(timed[bname])
        ours.append(timed[mname])
        print(f"{label}, run {r + 1}: {bname} {timed[bname]:.2f} s, {mname} {timed[mname]:.2f} s, "
              f"ratio {timed[bname] / timed[mname]:.3f}", flush=True)
    median = statistics.median(x / y for x, y in zip(base, ours, strict=True))
    print(f"{label}: ratio {bname} / {mname} = {sum(base) / sum(ours):.3f} over {args.repeat} rounds "
          f"(median of rounds {median:.3f})", flush=True)


def dedup_part(spark: Any, root: Path, args: Any) -> None:
    from tests.core import clicks

    inputs = root / "clicks"
    clicks.generate(inputs, args.clicks, per_file=max(args.clicks // 8, 1), step_s=0.01)
    spec = {"clicks": Table(key=clicks.KEY, add=["clicks"], max=["worst_ms"], min=["best_ms"])}

    def run(name: str, rules: bool) -> None:
        if rules:
            clean = clicks._clean(spark, inputs, 1)
        else:
            events = (spark.readStream.schema(clicks.SCHEMA).option("maxFilesPerTrigger", 1)
                      .parquet(str(inputs)))
            clean = events.withWatermark("ts", "1 minute").dropDuplicatesWithinWatermark(["click_id"])
        onceflow.write_stream(clean, onceflow.sqlite(root / f"{name}.db"), root / name, spec,
                              per_batch=clicks._per_batch_deltas, once=True, event_time="ts") \
            .awaitTermination()

    _rounds(args, "dedup", {"spark-dedup": lambda n: run(n, False), "deduplicate": lambda n: run(n, True)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["rejects", "dedup", "both"], default="both")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--clicks", type=int, default=2_000_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    from onceflow.runtime.session import session

    spark = session(app_name="bench-rejects", conf={"spark.sql.session.timeZone": "UTC"})
    root = Path(tempfile.mkdtemp(prefix="bench-rejects-"))
    try:
        if args.part in ("dedup", "both"):
            dedup_part(spark, root, args)
        per_file = args.records // args.files
        for rate in ((0.0, 0.01) if args.part in ("rejects", "both") else ()):
            inputs = root / f"in{rate}"
            for k in range(args.files):
                orders.generate(inputs, root / f"manifest{rate}.jsonl", k * per_file, per_file, bad_rate=rate,
                                seed=1)

            def run(name: str, query: Any, inputs: Path = inputs) -> None:
                query(spark, inputs, root / f"{name}.db", root / f"{name}-ck")

            print(f"{args.records:,} records in {args.files} batches, {rate:.0%} bad:", flush=True)
            if rate == 0:  # the query as it was before rejects: parse, deduplicate (a bad record stops it)
                _rounds(args, "0% bad, no filter", {"plain": lambda n, r=run: r(n, _plain),
                                                    "rejects": lambda n, r=run: r(n, _measured)})
            _rounds(args, f"{rate:.0%} bad", {"baseline": lambda n, r=run: r(n, _baseline),
                                              "rejects": lambda n, r=run: r(n, _measured)})
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
