"""Driver start-up: plain JVM vs onceflow's fast start (class-data archive + quick JIT).

Each sample is a fresh Python process that builds onceflow's SparkSession and runs one small
streaming micro-batch of Example 5-1 (``onceflow run --once`` on a 2,000-event log), the
work a restarted driver does before its first commit. The variants alternate, in one run:

* ``plain`` — the JVM as Spark starts it;
* ``fast``  — ``-XX:SharedArchiveFile=<trained archive> -XX:TieredStopAtLevel=1
  -XX:+UseSerialGC`` (:mod:`onceflow.runtime.jvmstart`), what ``onceflow verify`` uses by default;
* ``user``  — ``onceflow.session(fast_start=True)``: the archive alone, Spark's own JIT
  and onceflow's collector (what a user's long-running driver opts into).

Usage: python benchmarks/bench_fast_start.py [--samples 3]
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

from onceflow.runtime.jvmstart import JAVA_OPTIONS_ENV, use_options
from onceflow.sources.log import EventLog
from onceflow.verify.driver import fast_start_archive
from onceflow.verify.generator import GeneratorConfig, generate_segments

PROBE = """
import json, os, sys, time
t0 = time.perf_counter()
from onceflow.runtime.session import session
import onceflow
from onceflow.examples.user_counts import start
from pathlib import Path
spark = session(fast_start=sys.argv[3] == "user")
t1 = time.perf_counter()
work = Path(sys.argv[2])
sink = onceflow.sqlite(work / "db.sqlite")
start(spark, Path(sys.argv[1]), sink, work / "ck", once=True).awaitTermination()
t2 = time.perf_counter()
pid = spark.sparkContext._gateway.proc.pid
fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
print(json.dumps({"session_s": t1 - t0, "first_batch_s": t2 - t1, "total_s": t2 - t0, "jvm_cpu_s": cpu}))
"""


def sample(log: Path, options: str | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != JAVA_OPTIONS_ENV}
    if options and options != "user":
        env[JAVA_OPTIONS_ENV] = options
    work = Path(tempfile.mkdtemp(prefix="bench-start-"))
    try:
        out = subprocess.run([sys.executable, "-c", PROBE, str(log), str(work), str(options)], env=env,
                             capture_output=True, text=True, timeout=600, check=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        archive = fast_start_archive(Path(tmp) / "training")
        print(f"archive: {archive}")
        log = EventLog(Path(tmp) / "log")
        for t in generate_segments(GeneratorConfig(events=2_000, users=20, minutes=2, seed=3,
                                                   segment_size=1_000)):
            log.append(t)
        variants = {"plain": None, "fast": use_options(archive), "user": "user"}
        results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        for i in range(args.samples):
            order = list(variants.items())
            for name, opts in (order if i % 2 == 0 else order[::-1]):
                r = sample(log.directory, opts)
                results[name].append(r)
                print(f"sample {i + 1} {name:5s} session {r['session_s']:5.2f} s  "
                      f"first batch {r['first_batch_s']:5.2f} s  total {r['total_s']:5.2f} s  "
                      f"JVM CPU {r['jvm_cpu_s']:5.1f} s")
    print()
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in results.items()}
    for key in ("session_s", "first_batch_s", "total_s", "jvm_cpu_s"):
        p, f, u = med["plain"][key], med["fast"][key], med["user"][key]
        print(f"median {key:14s} plain {p:6.2f}  fast {f:6.2f} ({p / f:4.2f}x)  "
              f"user {u:6.2f} ({p / u:4.2f}x)")


if __name__ == "__main__":
    main()
