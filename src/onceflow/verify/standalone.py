"""A real multi-process Spark cluster on loopback: a standalone master and workers.

The pip wheel of PySpark has ``bin/spark-class`` but no ``start-master.sh``; this starts
``org.apache.spark.deploy.master.Master`` and ``org.apache.spark.deploy.worker.Worker``
directly, each in a process group of its own (a worker's executors are its children, so
killing the group is a machine going away)::

    python -m onceflow.verify.standalone --workers 2
    # prints: master spark://127.0.0.1:41234   (runs until interrupted)
    onceflow run --master spark://127.0.0.1:41234 --log LOG --checkpoint CK --db counts.db

Every process must see the same paths: the event log, the checkpoint, the stable-input copies
and SQLite files are read and written by the driver *and* the executors. On one machine any
local path will do; across machines they must be on storage all of them mount at the same
path (NFS, a cluster file system) or on a Hadoop-compatible URI, and the driver's host must be
reachable from the workers (``SPARK_LOCAL_IP`` / ``spark.driver.host``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from onceflow.errors import OnceflowError
from onceflow.verify import crashes
from onceflow.verify.driver import cpu_ticks, group_pids

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_class() -> Path:
    """``bin/spark-class`` of the installed PySpark."""
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StandaloneCluster:
    """A standalone master and ``workers`` workers, each its own process group.

    Args:
        workdir: Logs (``<name>.log``) and the workers' work directories go here.
        workers: Number of workers.
        cores: Cores each worker offers.
        memory: Memory each worker offers (an executor takes 1 GiB by default).
    """

    def __init__(self, workdir: Path, workers: int = 2, cores: int = 1, memory: str = "1536m") -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cores, self.memory = cores, memory
        self.port, self.ui_port = free_port(), free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes] | None] = [None] * workers

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
               "SPARK_HOME": str(spark_class().parent.parent)}
        env = crashes.child_env(env)  # the crash hook in its executors' Python workers
        with (self.workdir / f"{name}.log").open("ab") as out:
            return subprocess.Popen([str(spark_class()), *args], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def start(self, timeout_s: float = 120.0) -> StandaloneCluster:
        """Start the master and every worker; return once all workers are registered."""
        self.master = self._spawn("master", [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.port),
                                             "--webui-port", str(self.ui_port)])
        for i in range(len(self.workers)):
            self.start_worker(i, wait=False)
        self.wait_workers(len(self.workers), timeout_s)
        return self

    def start_worker(self, i: int, wait: bool = True, timeout_s: float = 120.0) -> None:
        """(Re)start worker ``i``; with ``wait``, until the master lists it alive."""
        alive = self.alive_workers() if wait else 0
        work = self.workdir / f"worker-{i}"
        work.mkdir(exist_ok=True)
        self.workers[i] = self._spawn(f"worker-{i}", [
            WORKER_CLASS, self.master_url, "--host", "127.0.0.1", "--cores", str(self.cores),
            "--memory", self.memory, "--webui-port", str(free_port()), "--work-dir", str(work)])
        if wait:
            self.wait_workers(alive + 1, timeout_s)

    def alive_workers(self) -> int:
        """Workers the master lists as ALIVE (0 while its UI is not up)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
                state = json.loads(r.read())
        except (OSError, ValueError):
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def wait_workers(self, n: int, timeout_s: float) -> None:
        """Wait until ``n`` workers are alive.

        Raises:
            OnceflowError: They were not, within ``timeout_s`` (naming the logs to read).
        """
        deadline = time.monotonic() + timeout_s
        while self.alive_workers() < n:
            if time.monotonic() > deadline:
                raise OnceflowError(f"the standalone cluster has {self.alive_workers()} of {n} workers "
                                    f"alive after {timeout_s:.0f} s; see the logs in {self.workdir}")
            time.sleep(0.5)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i`` and its executors (its whole process group), like a lost machine."""
        proc = self.workers[i]
        if proc is not None and proc.poll() is None:
            _kill_group(proc)
        self.workers[i] = None

    def busy_worker(self, timeout_s: float, interval: float = 0.05) -> int | None:
        """Wait until a worker's executor runs tasks; its index, or None.

        Busy: the worker's executor JVM and its Python workers (everything in the worker's
        process group but the worker itself) used more than ~60% of a core in each of three
        consecutive ``interval`` s (a burst of garbage collection or JIT is shorter).
        """
        hz = os.sysconf("SC_CLK_TCK")
        deadline = time.monotonic() + timeout_s
        last: dict[int, int] = {}
        streak: dict[int, int] = {}
        while time.monotonic() < deadline:
            time.sleep(interval)
            for i, proc in enumerate(self.workers):
                if proc is None or proc.poll() is not None:
                    continue
                now = sum(cpu_ticks(pid) for pid in group_pids(proc.pid) if pid != proc.pid)
                busy = i in last and now - last[i] > 0.6 * hz * interval
                streak[i] = streak.get(i, 0) + 1 if busy else 0
                last[i] = now
                if streak[i] >= 3:
                    return i
        return None

    def tasks_cut_off(self, i: int) -> list[str]:
        """Tasks worker ``i``'s newest executor started and never finished (from its log).

        Call after :meth:`kill_worker`: these ran when it was killed (``task 1.0 in stage 3.0``).
        """
        logs = sorted((self.workdir / f"worker-{i}").glob("app-*/*/stderr"), key=lambda p: p.stat().st_mtime)
        if not logs:
            return []
        text = logs[-1].read_text(errors="replace")
        started = re.findall(r"Running (task \S+ in stage \S+) \(TID (\d+)\)", text)
        finished = set(re.findall(r"Finished task \S+ in stage \S+ \(TID (\d+)\)", text))
        return [name for name, tid in started if tid not in finished]

    def stop(self) -> None:
        """Kill every worker and the master."""
        for i in range(len(self.workers)):
            self.kill_worker(i)
        if self.master is not None and self.master.poll() is None:
            _kill_group(self.master)
        self.master = None

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def main(argv: list[str] | None = None) -> int:
    """Run a cluster until interrupted (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m onceflow.verify.standalone",
                                     description="A Spark standalone master and workers on loopback.")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--memory", default="1536m")
    parser.add_argument("--workdir", type=Path, default=Path("spark-standalone"))
    args = parser.parse_args(argv)
    with StandaloneCluster(args.workdir, args.workers, args.cores, args.memory) as cluster:
        print(f"master {cluster.master_url}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
