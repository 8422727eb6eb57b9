"""Run ``onceflow run`` as a real subprocess and kill it (and its JVM) with SIGKILL.

The driver starts in its own process group, so one ``killpg`` kills the Python driver, its
Spark JVM and the JVM's Python workers together — what ``kill -9`` of a whole job does.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from onceflow.verify.crashes import CRASH_ENV, child_env
from onceflow.verify.resume import PIDS, REGISTRY_ENV, register
from onceflow.verify.sinks import location_flag

RETAIN_ALL = 1_000_000_000
"""Checkpoint history kept for audited runs: the oracle replays from batch 0."""


class ProcessGroup:
    """A ``python -m onceflow.cli.main`` subprocess in its own process group.

    Args:
        args: The command's arguments (after ``onceflow``).
        out: File that receives the process's stdout and stderr (appended to).
        env: Extra environment variables (a crash point is never inherited).
        module: The module run with ``python -m`` (another program's driver, e.g. an example).

    Attributes:
        registry: When set (a verify work directory), every new group's id is recorded
            there, so that a resumed run can kill what the previous one left running.
    """

    registry: Path | None = None

    def __init__(self, args: list[str], out: Path, env: dict[str, str] | None = None,
                 module: str = "onceflow.cli.main") -> None:
        full = os.environ.copy()
        full.pop(CRASH_ENV, None)
        full.update(env or {})
        full.pop(REGISTRY_ENV, None)
        if ProcessGroup.registry is not None:
            full[REGISTRY_ENV] = str(ProcessGroup.registry / PIDS)
        full = child_env(full)  # the crash hook in the process and the Python workers of its JVM
        self.out_path = out
        self._out = open(out, "a")  # noqa: SIM115 - closed in wait()/kill()
        self.proc = subprocess.Popen([sys.executable, "-m", module, *args],
                                     stdout=self._out, stderr=subprocess.STDOUT, env=full,
                                     start_new_session=True)
        if ProcessGroup.registry is not None:
            register(ProcessGroup.registry, self.proc.pid)

    def output(self) -> str:
        """Everything the process printed so far."""
        return self.out_path.read_text()

    def group_alive(self) -> bool:
        """Whether any process of the group is still alive."""
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def kill(self) -> None:
        """SIGKILL the whole process group (a driver and its JVM die together)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self._reap()

    def wait(self, timeout: float = 300, linger_s: float = 20) -> int:
        """Wait for the process to exit and for its group to be gone; return its exit code.

        Args:
            timeout: Longest wait for the process itself.
            linger_s: Longest wait for the rest of its group afterwards (a JVM exits after
                its Python driver).
        """
        rc = self.proc.wait(timeout=timeout)
        self._reap(linger_s)
        return rc

    def _reap(self, linger_s: float = 20) -> None:
        # After a self-kill at a crash point, nothing of the group may survive for long.
        deadline = time.monotonic() + linger_s
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.group_alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise AssertionError(f"processes of the killed process outlived it by {linger_s} s")
        self._out.close()


class Driver(ProcessGroup):
    """One ``onceflow run`` process in its own process group (Python driver + JVM + workers).

    Args:
        log: Event log directory.
        ck: Checkpoint directory.
        db: SQLite database, or the Delta tables' root with a ``delta`` sink (None for a
            PostgreSQL sink, whose DSN comes through ``env``).
        out: File that receives the process's stdout and stderr.
        once: Pass ``--once``.
        crash_at: Value for ``ONCEFLOW_CRASH_AT`` (a crash point), if any.
        sink: A ``onceflow run --sink`` choice.
        max_files: ``--max-files-per-trigger``.
        master: Spark master URL, if not the local default.
        env: Extra environment variables for the process.
        standby: Start as a hot standby released by this file (see :class:`Standby`).
        kafka: ``(bootstrap, topic, rows per file)``: read the topic instead of ``log``, with
            ``max_files`` x rows per file offsets per batch.
        extra_args: More ``onceflow run`` arguments (e.g. the demo service's ``--effects-url``).
        pipeline: ``(PATH.py:FUNCTION, input directory)``: run the user's pipeline over that
            directory instead of Example 5-1 over ``log`` (``max_files`` does not apply).
    """

    def __init__(self, log: Path, ck: Path, db: Path | None, out: Path, *, once: bool = False,
                 crash_at: str | None = None, sink: str = "sqlite", max_files: int = 2,
                 master: str | None = None, env: dict[str, str] | None = None,
                 standby: Path | None = None, kafka: tuple[str, str, int] | None = None,
                 extra_args: list[str] | None = None, pipeline: tuple[str, Path] | None = None) -> None:
        source = ["--log", str(log), "--max-files-per-trigger", str(max_files)]
        if pipeline is not None:
            source = ["--pipeline", pipeline[0], "--input", str(pipeline[1])]
        elif kafka is not None:
            source = ["--kafka", kafka[0], "--topic", kafka[1],
                      "--max-offsets-per-trigger", str(max_files * kafka[2])]
        args = ["run", *source, "--checkpoint", str(ck), "--sink", sink, "--trigger", "200 milliseconds",
                "--retain-batches", str(RETAIN_ALL)]
        if db is not None:
            args += [location_flag(sink), str(db)]
        if once:
            args.append("--once")
        if master:
            args += ["--master", master]
        if standby is not None:
            args += ["--standby", str(standby)]
        args += extra_args or []
        out.write_text("")
        super().__init__(args, out, {**(env or {}), **({CRASH_ENV: crash_at} if crash_at else {})})


class Standby:
    """Hot standby drivers: the next rounds' drivers start while this round's runs.

    Protocol:

    1. :meth:`take` with the spec (tag and :class:`Driver` keywords) of the driver a round
       needs. If the oldest pre-started driver has that spec, its release file is created: it
       has its JVM and SparkSession up and has touched nothing else (not the log, the sink or
       the checkpoint; ``onceflow run --standby``), and now goes on as a fresh
       ``onceflow run`` would — a restart from the checkpoint by a new process. Otherwise
       every pre-started driver is killed and the round's driver is started the normal way.
    2. Right after that, drivers for the ``upcoming`` specs (the next rounds', in order) that
       are not running yet are started as standbys, each in its own process group, so their
       start-up (~5 s of CPU) overlaps the rounds before theirs.
    3. :meth:`close` kills the unused standbys. A standby whose starter dies exits by itself;
       a resumed verify kills listed groups anyway (resume step 2).

    Args:
        make: Starts a driver: ``make(tag, standby=go_file_or_None, **keywords)``.
        outs: Directory for the release files.
    """

    def __init__(self, make: Callable[..., Driver], outs: Path) -> None:
        self._make = make
        self._outs = outs
        self._queue: list[tuple[tuple[str, str], Driver, Path]] = []

    @staticmethod
    def _key(tag: str, kw: dict[str, Any]) -> tuple[str, str]:
        return tag, repr(sorted(kw.items()))

    def take(self, tag: str, upcoming: list[tuple[str, dict[str, Any]]] | None = None,
             **kw: Any) -> Driver:
        """Steps 1 and 2: the driver for ``tag``/``kw``, running; pre-start ``upcoming``."""
        if self._queue and self._queue[0][0] == self._key(tag, kw):
            _, d, go = self._queue.pop(0)
            go.touch()
        else:
            self.close()
            d = self._make(tag, **kw)
        self.prestart(upcoming or [])
        return d

    def prestart(self, upcoming: list[tuple[str, dict[str, Any]]]) -> None:
        """Step 2: start standbys for the specs of ``upcoming`` beyond those already queued."""
        for utag, ukw in upcoming[len(self._queue):]:
            go = self._outs / f"{utag}.go"
            go.unlink(missing_ok=True)
            self._queue.append((self._key(utag, ukw), self._make(utag, standby=go, **ukw), go))

    def close(self) -> None:
        """Step 3: kill the unused standbys."""
        for _, d, _go in self._queue:
            d.kill()
        self._queue = []


def committed_batches(db: Path) -> int:
    """Number of batch markers in a SQLite sink (0 before it exists)."""
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=30) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM onceflow_batches").fetchone()[0])
    except sqlite3.OperationalError:  # schema not created yet
        return 0


def group_pids(group: int) -> list[int]:
    """Processes of a process group (from ``/proc``), by pid."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == group:
                    pids.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
    return sorted(pids)


def executor_pids(group: int) -> list[int]:
    """Spark executor JVMs (``CoarseGrainedExecutorBackend``) in a process group."""
    pids = []
    for pid in group_pids(group):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if b"CoarseGrainedExecutorBackend" in cmdline:
            pids.append(pid)
    return pids


def cpu_ticks(pid: int) -> int:
    """User + system CPU ticks a process has used (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0
    return int(fields[11]) + int(fields[12])


def busy_executor(group: int, timeout: float, interval: float = 0.05) -> int | None:
    """Wait until an executor JVM of ``group`` is running tasks (CPU use > ~60%).

    Returns:
        Its pid, or None if none became busy within ``timeout`` seconds.
    """
    hz = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + timeout
    last = {pid: cpu_ticks(pid) for pid in executor_pids(group)}
    while time.monotonic() < deadline:
        time.sleep(interval)
        for pid in executor_pids(group):
            now = cpu_ticks(pid)
            if pid in last and now - last[pid] > 0.6 * hz * interval:
                return pid
            last[pid] = now
    return None


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, poll_s: float = 0.2) -> None:
    """Poll ``predicate`` every ``poll_s`` seconds.

    Raises:
        AssertionError: It stayed false for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def fast_start_archive(scratch: Path, say: Callable[[str], None] = print) -> Path | None:
    """The driver class-data archive, trained first if this machine has none yet.

    Training runs the real pipeline once (``onceflow run --once`` on a small generated log
    into a scratch SQLite sink) in a JVM that dumps the classes it loaded when it exits.

    Args:
        scratch: A directory for the training run's log, checkpoint and database (removed).
        say: Progress output.

    Processes that need the archive at once (verifies or test workers started together) train it
    once: the first holds a lock file beside the archive while it trains, the others wait for
    it and then use what it published. Runs on the machine that starts the drivers, once per
    run.

    Returns:
        The archive (see :func:`onceflow.runtime.jvmstart.archive_path`), or None when training
        failed to produce one (drivers then start the normal way).
    """
    import fcntl

    from onceflow.runtime.jvmstart import archive_path

    archive = archive_path()
    if archive.exists():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    with open(archive.parent / f".{archive.name}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if archive.exists():  # trained by another process while this one waited
            return archive
        return _train_archive(archive, scratch, say)


def _train_archive(archive: Path, scratch: Path, say: Callable[[str], None]) -> Path | None:
    """Train and publish ``archive`` (:func:`fast_start_archive` holds the lock)."""
    import shutil

    from onceflow.runtime.jvmstart import JAVA_OPTIONS_ENV, dump_options, publish
    from onceflow.sources.log import EventLog
    from onceflow.verify.generator import GeneratorConfig, generate_segments

    say(f"fast start: training the driver class-data archive {archive} (once per machine)")
    scratch.mkdir(parents=True, exist_ok=True)
    log = EventLog(scratch / "log")
    for t in generate_segments(GeneratorConfig(events=3_000, users=5, minutes=3, seed=1,
                                               duplicates=0.05, late=0.02, segment_size=1_000)):
        log.append(t)
    tmp = archive.parent / f".{archive.name}.{os.getpid()}.tmp"
    d = Driver(scratch / "log", scratch / "ck", scratch / "sink.db", scratch / "train.out", once=True,
               max_files=1, env={JAVA_OPTIONS_ENV: dump_options(tmp)})
    try:
        rc = d.wait(timeout=600, linger_s=300)  # the JVM writes the archive as it exits
    except (subprocess.TimeoutExpired, AssertionError):
        d.kill()
        rc = None
    ok = rc == 0 and publish(tmp, archive)
    tmp.unlink(missing_ok=True)
    if not ok:
        say(f"fast start: no archive (training exit code {rc}, see {scratch / 'train.out'}); "
            "drivers start the normal way")
        return None
    shutil.rmtree(scratch / "log")
    shutil.rmtree(scratch / "ck", ignore_errors=True)
    return archive
