"""One batch into an Iceberg table: onceflow's sink beside a plain pyiceberg append of the same rows.

Input: ``--rows`` rows of ~108 bytes (the schema of ``bench_backlog.py``: an id, an account, an
amount, a timestamp, a note) as Parquet files, made once per size. In one Spark session
(``local[2]``, onceflow's defaults), each round times, in alternating order, appends of the same
rows to fresh tables of one pyiceberg SQL catalog on SQLite:

* ``pyiceberg``: what a ``foreachBatch`` writer does without onceflow — the batch collected to the
  driver (``df.toArrow()``) and ``table.append`` (pyiceberg writes the Parquet files from the
  driver's memory; no marker, at least once);
* ``pyiceberg-arrow``: ``table.append`` of the rows already in the driver's memory (read with
  pyarrow, not timed): the floor of a pyiceberg append;
* ``onceflow``: ``IcebergTablesSink.commit_frames`` — Spark's tasks write the Parquet files, the
  driver adds them with the batch's marker in one Iceberg commit.

Prints each variant's seconds per round, the rows read back (checked = N) and the ratios of
throughput onceflow / pyiceberg and onceflow / pyiceberg-arrow (target >= 0.9).

Usage: python benchmarks/bench_iceberg.py [--rows 5000000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_backlog import SCHEMA, make_input  # noqa: E402


def main() -> None:
    """Run the rounds and print the times and ratios."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import pyarrow as pa
    import pyarrow.dataset as ds

    from onceflow.runtime.session import session
    from onceflow.sinks._core.base import BatchStats
    from onceflow.sinks._core.tables import Table
    from onceflow.sinks.iceberg.sink import IcebergTablesSink

    source = Path(tempfile.gettempdir()) / f"onceflow-backlog-{args.rows}"
    make_input(source, args.rows)
    work = Path(tempfile.mkdtemp(prefix="onceflow-bench-iceberg-"))
    spark = session(app_name="bench-iceberg")
    frame = spark.read.schema(SCHEMA).parquet(str(source))
    sink = IcebergTablesSink(f"sqlite:///{work / 'catalog.db'}", work / "warehouse", namespace="bench")
    catalog = sink.catalog
    arrow = ds.dataset(str(source)).to_table()  # Spark's INT96 times read as ns: Iceberg's are micros
    arrow = arrow.set_column(arrow.schema.get_field_index("at"), "at",
                             arrow.column("at").cast(pa.timestamp("us", tz="UTC")))
    times: dict[str, list[float]] = {"pyiceberg": [], "pyiceberg-arrow": [], "onceflow": []}
    order = list(times)
    for r in range(args.rounds):
        for variant in order if r % 2 == 0 else order[::-1]:
            name = f"{variant.replace('-', '_')}_{r}"
            started = time.perf_counter()
            if variant == "onceflow":
                sink.commit_frames(0, {name: frame}, {name: Table()}, BatchStats(args.rows, 0, 0), args.rows,
                                   written={name: args.rows})
            else:
                rows = frame.toArrow() if variant == "pyiceberg" else arrow
                table = catalog.create_table(("bench", name), schema=rows.schema)
                table.append(rows)
                del rows
            times[variant].append(time.perf_counter() - started)
            got = catalog.load_table(("bench", name)).scan().count()
            assert got == args.rows, (variant, got)
            print(f"round {r} {variant:16s} {times[variant][-1]:7.2f} s  {got:,} rows", flush=True)
    best = {v: statistics.median(t) for v, t in times.items()}
    print(f"median: {', '.join(f'{v} {t:.2f} s' for v, t in best.items())}")
    print(f"ratio onceflow / pyiceberg (throughput, >= 0.9): {best['pyiceberg'] / best['onceflow']:.2f}")
    print(f"ratio onceflow / pyiceberg-arrow (throughput): {best['pyiceberg-arrow'] / best['onceflow']:.2f}")
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
