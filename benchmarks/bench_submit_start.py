"""The start of a PySpark application: ``spark-submit app.py`` against ``python app.py``.

Issue 50's target: a spark-submit run starts no slower than ``python app.py``. Three ways:
``python app.py``; ``spark-submit app.py`` (``session()`` adds onceflow's jars to the running
driver); ``spark-submit --jars <onceflow's jars> app.py`` (the way docs/cluster.md shows). Both
spark-submit ways pass the driver's heap and collector that ``session()`` starts its own drivers
with (``--driver-memory``, ``--driver-java-options -XX:+UseParallelGC``), as docs/cluster.md does. The
application imports onceflow, gets its session with ``onceflow.session()`` and runs one job
(``range(10).count()``); it prints the seconds from the moment the launching shell took its
time stamp (passed as an argument) to the job's end, so each number holds the whole start: the
interpreter, the imports, the launcher's JVM that builds the driver's command line, the driver
JVM, the session and the first job.

The ways run in turn, ``--rounds`` times each (the first round of each is a warm-up of the file
cache and not counted); the result is each way's median and its ratio to ``python app.py``.

Usage: python benchmarks/bench_submit_start.py [--rounds 6] [--driver-memory 4g]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

APP = '''
import sys, time
import onceflow
from onceflow.runtime.session import session

spark = session(master="local[2]", shuffle_partitions=2)
spark.range(10).count()
print("STARTED", time.time() - float(sys.argv[1]), flush=True)
spark.stop()
'''


def timed(cmd: list[str], app: Path) -> float:
    """Seconds from before the command's start to its first job's end, as the application says."""
    done = subprocess.run([*cmd, str(app), f"{time.time():.6f}"], capture_output=True, text=True,
                          timeout=600, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("STARTED "):
            return float(line.split()[1])
    raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{(done.stdout + done.stderr)[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--driver-memory", default="4g",
                    help="spark-submit's --driver-memory (session()'s default)")
    args = ap.parse_args()
    import pyspark

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("SPARK_HOME", str(Path(pyspark.__file__).parent))  # as a user's PATH finds it
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    submit = Path(sys.executable).parent / "spark-submit"
    from onceflow.runtime.scalac import shipped_jars

    own = ",".join(str(p) for p in shipped_jars())  # what `onceflow jars path onceflow` prints
    submit_cmd = [str(submit), "--master", "local[2]", "--driver-memory", args.driver_memory,
                  "--driver-java-options", "-XX:+UseParallelGC"]  # what session() gives a driver it starts
    ways = {"python app.py": [sys.executable], "spark-submit app.py": submit_cmd,
            "spark-submit --jars app.py": [*submit_cmd, "--jars", own]}
    app = Path(tempfile.mkdtemp(prefix="bench-submit-")) / "app.py"
    app.write_text(APP)
    got: dict[str, list[float]] = {w: [] for w in ways}
    for r in range(args.rounds + 1):
        for way, cmd in ways.items():
            seconds = timed(cmd, app)
            print(f"round {r}{' (warm-up)' if r == 0 else ''}: {way} {seconds:.2f} s", flush=True)
            if r:
                got[way].append(seconds)
    medians = {w: statistics.median(v) for w, v in got.items()}
    for way in ways:
        ratio = medians[way] / medians["python app.py"]
        print(f"{way}: median {medians[way]:.2f} s, / python app.py {ratio:.3f}")
    print(json.dumps({"rounds": args.rounds, "seconds": got}))


if __name__ == "__main__":
    main()
