"""Example 5-1 over Spark Connect against a classic session, in one run.

Each variant runs Example 5-1 (``onceflow.examples.user_counts``: dedup, per-batch window deltas
into ``onceflow.sqlite``) over the same event log with a fresh checkpoint and database,
``availableNow`` and ``--files`` segments per micro-batch, in a child process of its own (a
classic session and a Connect client do not share one Python process):

* ``classic``   — ``onceflow.session()`` in the child (``local[2]``, onceflow's jars);
* ``connect``   — a client of a Spark Connect server (``local[2]``) that has onceflow's jars
                  (its id state store and checkpoint file manager);
* ``connect-spark-store`` — a client of a server without them (Spark's state store and
                  checkpoint file manager);
* ``classic-spark-store`` — a classic session with Spark's state store for the ids
                  (``session(id_store=False)``): the classic side of ``connect-spark-store``.

and, as the reference for what Spark itself costs on each side, ``spark-classic`` and
``spark-connect``: the same transform through Spark's own ``foreachBatch`` and nothing else
(Spark's ``dropDuplicatesWithinWatermark``, the batch's window counts fetched with ``toArrow``,
no sink, at least once).

The servers start once, and each is warmed by a child of Spark's own ``foreachBatch`` (two runs,
not timed: the first variant to use a new server was otherwise timed on a colder JVM than those
after it). Each child runs the query ``--rounds`` + 1 times in one session (the first run warms
the JVM that runs the batches — the child's own, or the server's — and is not timed). Two
timings per run: ``wall``, the query alone (from ``start`` to its end, never a
session's start), and ``batches``, the sum of the query's ``triggerExecution`` durations (its
batches, without the query's start: on Connect the start includes Spark's launch of the
``foreachBatch`` Python worker). A ratio is ``median(classic) / median(variant)``, throughput of
the variant against its classic session (>= 0.9 is the target).

Besides the target's ratios, ``classic / spark-classic`` and ``connect / spark-connect`` say what
onceflow costs against Spark's own foreachBatch on each side. ``--repeat K`` runs every variant K
times in turn (a child each), so a slow phase of a shared machine is spread over the variants.

Usage: python benchmarks/bench_connect.py [--events 1000000] [--rounds 2] [--files 4]
       [--variants classic,connect] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = '''
import json, sqlite3, sys, time
import onceflow
from onceflow.examples.user_counts import start, window_deltas
from onceflow.sources.events import EVENT_DDL
from onceflow.runtime.session import session

remote, log, work = sys.argv[1], sys.argv[2], sys.argv[3]
files, runs, plain = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "plain"
if remote.startswith("classic"):  # classic-spark-store: Spark's state store for the ids
    spark = session(master="local[2]", shuffle_partitions=2, id_store=None if remote == "classic" else False)
else:
    spark = session(remote=remote)


def fetch(batch, batch_id):  # Spark's own foreachBatch: the batch's window counts, no sink
    window_deltas(batch).toArrow()


for run in range(runs):  # run 0 warms the JVM (the client's session or the server's) and is not timed
    where = f"{work}/r{run}"  # a directory per run: a stopped query's state files may still land
    t0 = time.perf_counter()
    if plain:
        stream = (spark.readStream.schema(EVENT_DDL).option("maxFilesPerTrigger", files).parquet(log)
                  .select("event_id", "user", "event_time").withWatermark("event_time", "1 minute")
                  .dropDuplicatesWithinWatermark(["event_id"]))
        query = (stream.writeStream.foreachBatch(fetch).option("checkpointLocation", f"{where}/ck")
                 .trigger(availableNow=True).start())
    else:
        sink = onceflow.sqlite(f"{where}/db.sqlite")
        query = start(spark, log, sink, f"{where}/ck", max_files_per_trigger=files, once=True)
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    progress = getattr(query, "query", query).recentProgress
    batches = sum(p.durationMs.get("triggerExecution", 0) for p in progress) / 1000
    counted = None
    if not plain:
        sink.close()
        with sqlite3.connect(f"{where}/db.sqlite") as db:
            counted = db.execute("SELECT coalesce(sum(count), 0) FROM global_counts").fetchone()[0]
    print("RESULT " + json.dumps({"run": run, "seconds": seconds, "batches": batches, "counted": counted}),
          flush=True)
'''


def run_child(target: str, log: Path, work: Path, files: int, runs: int,
              plain: bool) -> list[dict[str, float]]:
    shutil.rmtree(work, ignore_errors=True)  # a --workdir used before: its checkpoints would have no work
    work.parent.mkdir(parents=True, exist_ok=True)
    script = work.parent / "child.py"
    script.write_text(CHILD)
    done = subprocess.run([sys.executable, str(script), target, str(log), str(work), str(files), str(runs),
                           "plain" if plain else "onceflow"],
                          capture_output=True, text=True, timeout=3600, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or len(lines) != runs:
        raise SystemExit(f"{target}: exit {done.returncode}\n{(done.stdout + done.stderr)[-3000:]}")
    return [dict(json.loads(ln[len("RESULT "):])) for ln in lines]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--files", type=int, default=4, help="segments per micro-batch")
    ap.add_argument("--repeat", type=int, default=1,
                    help="turns: each runs every variant (a child each) once more; medians over all turns")
    ap.add_argument("--segment-size", type=int, default=100_000)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--variants", default="classic,connect,classic-spark-store,connect-spark-store,"
                                          "spark-classic,spark-connect",
                    help="comma-separated: which of the module's variants run (a ratio needs both sides)")
    args = ap.parse_args()
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_user_counts import make_log

    from onceflow.verify.connect_server import ConnectServer

    root = Path(args.workdir or tempfile.mkdtemp(prefix="bench-connect-"))
    log = root / "log"
    total = make_log(log, args.events, args.segment_size)
    print(f"log: {total} events in {log}", flush=True)
    servers = {}
    if {"connect", "spark-connect"} & set(chosen):
        servers["connect"] = ConnectServer(root / "server-jars", cores=2)
    if "connect-spark-store" in chosen:
        servers["connect-spark-store"] = ConnectServer(root / "server-plain", cores=2, onceflow_jars=False)
    for key, s in servers.items():
        s.start()
        # a new server's JVM is cold: the variant that used it first was timed on a slower server
        # than those after it; a child of Spark's own foreachBatch warms each (not timed)
        run_child(s.url, log, root / "work" / f"warm-{key}", args.files, 2, plain=True)
    where = {"classic": "classic", "connect": "connect", "connect-spark-store": "connect-spark-store",
             "classic-spark-store": "classic-spark-store", "spark-classic": "classic",
             "spark-connect": "connect"}
    unknown = [v for v in chosen if v not in where]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; the variants are {sorted(where)}")
    variants = {v: where[v] if where[v].startswith("classic") else servers[where[v]].url for v in chosen}
    times: dict[str, dict[str, list[float]]] = {v: {"seconds": [], "batches": []} for v in variants}
    try:
        for turn in range(args.repeat):  # the variants in turn, so a slow phase of the machine hits each
            for name, target in variants.items():
                runs = run_child(target, log, root / "work" / f"{name}-{turn}", args.files, args.rounds + 1,
                                 plain=name.startswith("spark-"))
                for got in runs:
                    warm = " (warm-up)" if got["run"] == 0 else ""
                    print(f"{name} turn {turn} run {got['run']}{warm}: wall {got['seconds']:.1f} s "
                          f"({total / got['seconds']:,.0f} events/s), batches {got['batches']:.1f} s, "
                          f"counted {got['counted']}", flush=True)
                for kind in ("seconds", "batches"):
                    times[name][kind] += [got[kind] for got in runs[1:]]
    finally:
        for s in servers.values():
            s.kill()
    for name, base in (("connect", "classic"), ("connect-spark-store", "classic-spark-store"),
                       ("spark-connect", "spark-classic"), ("classic", "spark-classic"),
                       ("connect", "spark-connect")):
        if name not in times or base not in times:
            continue
        ratios = {kind: statistics.median(times[base][kind]) / statistics.median(times[name][kind])
                  for kind in ("seconds", "batches")}
        print(f"ratio {name} / {base} (throughput, medians of {len(times[name]['seconds'])} runs, "
              "each child's warm-up left out): "
              f"wall {ratios['seconds']:.2f}, batches {ratios['batches']:.2f}")
    print(json.dumps({"events": total, "files_per_batch": args.files, "times": times}))


if __name__ == "__main__":
    main()
