"""Delta maintenance: files after 1,000 small batches, without it and with ``maintain_every``.

Each variant commits the same ``--batches`` batches through ``DeltaTablesSink.commit_tables`` (the
path a small micro-batch takes: collected to the driver, one Delta commit per table and batch
with its app transaction) into a fresh root: an ``append`` table of the batch's events and an
``add`` table of per-key counts. Variants:

* ``none``: no maintenance (what a Delta sink leaves today);
* ``every-N``: ``maintain_every=N`` with ``retention_hours=0`` (compaction and vacuum in the
  driver after every N-th batch);
* ``once``: no maintenance during the run, then ``onceflow maintain --delta ROOT --retention 0``.

Printed per variant: the data files of the events table's current version, the data files and
bytes on disk (the vacuum deletes the replaced ones), the time to read the table back with
deltalake, and the batches' commit time. Every variant's tables are checked against the input
(the events' count and the counts' sum).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa


def _batch(b: int, rows: int) -> dict[str, pa.Table]:
    ks = [(b * rows + i) % 50 for i in range(rows)]
    per_k: dict[int, int] = {}
    for k in ks:
        per_k[k] = per_k.get(k, 0) + 1
    ids = [f"{b}-{i}" for i in range(rows)]
    events = pa.table({"id": ids, "k": ks, "cents": [i * 7 for i in range(rows)]})
    return {"events": events,
            "counts": pa.table({"k": list(per_k), "n": list(per_k.values())})}


def run(variant: str, root: Path, batches: int, rows: int) -> dict[str, float]:
    """One variant's run; its figures."""
    from deltalake import DeltaTable

    from onceflow import Table
    from onceflow.sinks._core.marker import BatchStats
    from onceflow.sinks.delta.maintain import maintain
    from onceflow.sinks.delta.sink import DeltaTablesSink

    every = int(variant.split("-", 1)[1]) if variant.startswith("every-") else None
    sink = DeltaTablesSink(root, sink_id="bench", maintain_every=every, retention_hours=0)
    specs = {"events": Table(), "counts": Table(key="k", add=["n"])}
    started = time.perf_counter()
    for b in range(batches):
        sink.commit_tables(b, _batch(b, rows), specs, BatchStats(rows, 0, 0), rows)
    commit_s = time.perf_counter() - started
    maintain_s = 0.0
    if variant == "once":
        began = time.perf_counter()
        maintain(root, retention_hours=0)
        maintain_s = time.perf_counter() - began
    events = DeltaTable(str(root / "events"))
    began = time.perf_counter()
    table = events.to_pyarrow_table()
    read_s = time.perf_counter() - began
    counts = DeltaTable(str(root / "counts")).to_pyarrow_table()
    assert table.num_rows == batches * rows, table.num_rows
    assert sum(counts["n"].to_pylist()) == batches * rows
    on_disk = [p for p in (root / "events").glob("*.parquet")]
    return {"version_files": len(events.file_uris()), "disk_files": len(on_disk),
            "disk_mb": sum(p.stat().st_size for p in on_disk) / 1e6, "read_s": read_s,
            "commit_s": commit_s, "maintain_s": maintain_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=100, help="events per batch")
    ap.add_argument("--variants", default="none,every-100,once")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="onceflow-bench-delta-maintain-"))
    try:
        print(f"{args.batches} batches of {args.rows} events; events table:")
        print(f"{'variant':<10} {'files (version)':>16} {'files (disk)':>13} {'MB (disk)':>10} {'read s':>8} "
              f"{'commits s':>10} {'maintain s':>11}")
        for variant in args.variants.split(","):
            got = run(variant, work / variant, args.batches, args.rows)
            print(f"{variant:<10} {got['version_files']:>16} {got['disk_files']:>13} {got['disk_mb']:>10.2f} "
                  f"{got['read_s']:>8.3f} {got['commit_s']:>10.1f} {got['maintain_s']:>11.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
