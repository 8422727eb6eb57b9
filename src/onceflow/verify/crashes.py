"""The verifier's crash hook: named steps armed by the environment, processes killed with SIGKILL.

A crash point (:class:`onceflow.faults.CrashPoint`) is armed for a process with the environment
variable ``ONCEFLOW_CRASH_AT=<point>`` or ``ONCEFLOW_CRASH_AT=<point>@<batch_id>`` (the first
batch with an id ``>= batch_id`` that has input). When the process reaches the point, it kills
the Spark JVM that belongs to it and itself, with SIGKILL, so nothing gets to clean up: the same
as ``kill -9`` from outside.

**Installed by the verifier, never by the library.** :class:`EnvHook` is the
:class:`onceflow.faults.Hook` that does this. The processes the verifier and the tests start
(drivers, Spark Connect servers, ingest receivers) get :data:`SITE_DIR` on ``PYTHONPATH``
(:func:`child_env`): its ``sitecustomize`` installs the hook at every Python start there — the
driver and every Python worker Spark starts for it, which inherit the variable. onceflow's
library reads none of these variables.

**A crash point fires on a batch with input only.** Spark runs no-data batches (no new
offsets, only a watermark to advance); a crash there puts no row at risk and proves nothing.
The query's batch writer says, before any crash point of batch N, whether N's planned input
range is empty (:func:`onceflow.faults.planned`); crash points of a noted no-data batch do not
fire and the armed point waits for the next batch with input. The note is a file under the
temporary directory, named after the driver's process id, so that the Python workers of the
driver's JVM (an executor-side writer's ``commit``) see it too; it is written only while a crash
point is armed. Points of processes that run no batches (the ingest receiver's) are not gated.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from onceflow import faults
from onceflow.errors import AmbiguousCommitError, CrashPointError
from onceflow.faults import CrashPoint

CRASH_ENV = "ONCEFLOW_CRASH_AT"
DROP_ACKS_ENV = "ONCEFLOW_INGEST_DROP_ACKS"
"""The share of committed ingest groups whose reply the receiver loses (the network fault)."""
DRIVER_PID_ENV = "ONCEFLOW_DRIVER_PID"
"""The driver's process id, in the driver and in the Python workers its JVM starts."""
WORKER_ENV = "PYTHON_WORKER_FACTORY_SECRET"
"""Set by Spark in every Python worker it starts (executors', a data source's, Connect's)."""

SITE_DIR = Path(__file__).parent / "crash_site"
"""A directory whose ``sitecustomize`` installs :class:`EnvHook` (put first on ``PYTHONPATH``)."""


def child_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with :data:`SITE_DIR` first on ``PYTHONPATH``: a process started with it has the hook.

    Runs in the process that starts a driver, server or receiver, once per process started.
    """
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SITE_DIR)]
    return {**env, "PYTHONPATH": os.pathsep.join([str(SITE_DIR), *paths])}


def armed() -> tuple[CrashPoint, int] | None:
    """The crash point selected by the environment, if any.

    Returns:
        The point and the first batch id it fires at, or None.

    Raises:
        CrashPointError: The variable names no known crash point.
    """
    raw = os.environ.get(CRASH_ENV, "").strip()
    if not raw:
        return None
    name, _, batch = raw.partition("@")
    try:
        point = CrashPoint(name)
    except ValueError:
        known = ", ".join(p.value for p in CrashPoint)
        raise CrashPointError(
            f"{CRASH_ENV}={raw!r} names no crash point; use one of: {known} "
            "(optionally followed by @<batch_id>)"
        ) from None
    try:
        first = int(batch) if batch else 0
    except ValueError:
        raise CrashPointError(f"{CRASH_ENV}={raw!r}: batch id after '@' must be an integer") from None
    return point, first


def _parent(pid: int) -> int:
    """The parent process id of ``pid`` (0 when unknown)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _driver_side_victims() -> list[int]:
    """The processes to kill from a Python worker that Spark's JVM started.

    In such a worker (e.g. a data source's ``commit``), these are the driver and every
    ancestor between it and this process (the JVM, the worker daemon), so that the crash
    takes down the whole driver, as ``kill -9`` of it would. The driver is the Python process
    of a classic session, or the JVM itself (a Spark Connect server, whose ``foreachBatch``
    worker runs the batch).
    """
    driver = int(os.environ.get(DRIVER_PID_ENV, "0") or 0)
    if driver <= 0 or driver == os.getpid():
        return []
    victims: list[int] = []
    pid = _parent(os.getpid())
    while pid > 1 and pid != driver and len(victims) < 8:
        victims.append(pid)
        pid = _parent(pid)
    if pid != driver or not (_is_java(driver) or any(_is_java(v) for v in victims)):
        return []  # not a worker of the driver's JVM (e.g. a child process the driver started)
    return [driver, *victims]


def _is_java(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
            return f.read().strip() == "java"
    except OSError:
        return False


def _java_descendants(root: int) -> list[int]:
    """The Java processes below ``root`` (a classic driver's JVM: PySpark's gateway and its launcher)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            children.setdefault(_parent(int(entry.name)), []).append(int(entry.name))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if _is_java(pid):
            found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def crash_now() -> None:
    """SIGKILL this driver's JVM (or, in a Spark worker, the driver above it) and then this process.

    Never returns. The driver's JVM is found among this process's descendants (a classic
    session's gateway), so nothing has to be registered when the session starts.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    for pid in [*_java_descendants(os.getpid()), *_driver_side_victims()]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def executor_confs(crash_at: str, driver: int) -> list[str]:
    """``spark-submit`` arguments that arm ``crash_at`` in the executors a cluster's workers start.

    Executors started by a standalone cluster's workers do not inherit the driver's environment;
    ``spark.executorEnv.*`` gives them the armed point, the driver's id (the namespace of the
    notes they share) and the hook (:data:`SITE_DIR`). Runs where the driver is started.
    """
    settings = {CRASH_ENV: crash_at, DRIVER_PID_ENV: str(driver), "PYTHONPATH": str(SITE_DIR)}
    return [a for k, v in settings.items() for a in ("--conf", f"spark.executorEnv.{k}={v}")]


def _to_executors() -> None:
    """:func:`executor_confs` for the JVM this driver is about to launch (``PYSPARK_SUBMIT_ARGS``).

    PySpark hands ``PYSPARK_SUBMIT_ARGS`` to ``spark-submit`` when it starts a session's JVM; a
    driver ``spark-submit`` started (its JVM first) is armed by :func:`executor_confs` instead.
    """
    given = os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell").split()
    confs = executor_confs(os.environ[CRASH_ENV], os.getpid())
    os.environ["PYSPARK_SUBMIT_ARGS"] = " ".join([*confs, *given])


def _notes_dir() -> Path:
    """Where the notes of this driver's batches go (the same path in its JVM's Python workers)."""
    driver = os.environ.get(DRIVER_PID_ENV, "") or str(os.getpid())
    return Path(tempfile.gettempdir()) / f"onceflow-crash-notes-{driver}"


def noted_empty(batch_id: int) -> bool:
    """Whether batch ``batch_id`` was noted as a batch without input (see :meth:`EnvHook.planned`)."""
    try:
        return (_notes_dir() / str(batch_id)).read_text(encoding="ascii") == "0"
    except OSError:
        return False


def _say(message: str) -> None:
    """Print ``message`` on stderr; in a Python worker of the driver's JVM, on the driver's too.

    A worker's stderr reaches the driver's only through a JVM thread that copies it: killed
    with the JVM, the copy may never happen. The driver's own stderr (``/proc/<pid>/fd/2``)
    gets the line directly.
    """
    print(message, file=sys.stderr, flush=True)
    driver = int(os.environ.get(DRIVER_PID_ENV, "0") or 0)
    if driver > 0 and driver != os.getpid():
        try:
            with open(f"/proc/{driver}/fd/2", "a", encoding="utf-8") as out:
                out.write(message + "\n")
        except OSError:
            pass


class EnvHook:
    """The crash hook: the point armed by ``ONCEFLOW_CRASH_AT``, read at each step (see the module).

    Made once per process at its start (``sitecustomize``, or a test's ``conftest``): a process
    that is not one of Spark's Python workers is a driver, and says so in ``ONCEFLOW_DRIVER_PID``
    (inherited by the JVM it starts and that JVM's Python workers).
    """

    def __init__(self) -> None:
        if WORKER_ENV not in os.environ:
            os.environ[DRIVER_PID_ENV] = str(os.getpid())
            if os.environ.get(CRASH_ENV, "").strip():
                _to_executors()

    def armed_for(self, point: CrashPoint, batch_id: int) -> bool:
        """Whether the environment selects ``point`` for batch ``batch_id``.

        True if :meth:`reached` would fire: the point is armed, the batch id is at least the
        armed one, and the batch was not noted as one without input.
        """
        selected = armed()
        if selected is None or selected[0] is not point or batch_id < selected[1]:
            return False
        return point.value.startswith("ingest_") or not noted_empty(batch_id)

    def reached(self, point: CrashPoint, batch_id: int) -> None:
        """Die (or raise, for ``ambiguous_commit``) if the environment selects this point."""
        if self.armed_for(point, batch_id):
            if point is CrashPoint.AMBIGUOUS_COMMIT:
                raise AmbiguousCommitError(
                    f"injected fault: batch {batch_id} committed, reporting failure anyway"
                )
            _say(f"onceflow: crash point {point.value} at batch {batch_id}")
            crash_now()

    def task_reached(self, point: CrashPoint, batch_id: int, attempt: int) -> None:
        """A task's first attempt dies at an armed point; later attempts go on.

        ``task_after_write``: its Python worker; ``task_mid_write``: its executor too, once per batch.
        """
        if point is CrashPoint.TASK_MID_WRITE:
            self._kill_executor(point, batch_id, attempt)
        else:
            self._kill_task(point, batch_id, attempt)

    def _kill_task(self, point: CrashPoint, batch_id: int, attempt: int) -> None:
        """SIGKILL this task's Python worker (only) if the environment selects ``point``, on attempt 0."""
        if attempt == 0 and self.armed_for(point, batch_id):
            _say(f"onceflow: crash point {point.value} at batch {batch_id} (a task's first attempt)")
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def _kill_executor(self, point: CrashPoint, batch_id: int, attempt: int) -> None:
        """SIGKILL this task's executor JVM and its Python worker if the environment selects ``point``.

        Once per batch: the first task attempt 0 that gets here claims the batch with a file in the
        notes directory (a stage Spark runs again after losing the executor's shuffle files numbers
        its attempts from 0 again). The executor is the nearest ancestor JVM that runs Spark's
        executor backend; where there is none (``local[*]``: the driver's JVM runs the tasks) only
        the Python worker dies, as with ``task_after_write``.
        """
        if attempt != 0 or not self.armed_for(point, batch_id):
            return
        notes = _notes_dir()
        notes.mkdir(exist_ok=True)
        try:
            claim = notes / f"killed-{point.value}-{batch_id}"
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:  # this batch's executor was killed already
            return
        _say(f"onceflow: crash point {point.value} at batch {batch_id} "
             "(a task's first attempt: its executor)")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = _parent(os.getpid())
        while pid > 1:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    executor = b"org.apache.spark.executor." in f.read()
            except OSError:
                break
            if executor:
                os.kill(pid, signal.SIGKILL)
                break
            pid = _parent(pid)
        os.kill(os.getpid(), signal.SIGKILL)

    def planned(self, batch_id: int, has_input: bool) -> None:
        """Note whether batch ``batch_id`` has input, before any of its crash points (see the module)."""
        if not os.environ.get(CRASH_ENV, "").strip():
            return
        notes = _notes_dir()
        notes.mkdir(exist_ok=True)
        tmp = notes / f".{batch_id}.{os.getpid()}"
        tmp.write_text("1" if has_input else "0", encoding="ascii")
        os.replace(tmp, notes / str(batch_id))

    def query_listener(self) -> Any:
        """A Spark query listener that fires ``after_commit_log`` once Spark reported a batch.

        None unless that point is armed. Spark reports a batch's progress after it wrote
        ``commits/N``.
        """
        selected = armed()
        if selected is None or selected[0] is not CrashPoint.AFTER_COMMIT_LOG:
            return None
        from pyspark.sql.streaming.listener import StreamingQueryListener

        hook = self

        class CrashAfterCommitLog(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:  # noqa: D102, N802
                pass

            def onQueryProgress(self, event: Any) -> None:  # noqa: D102, N802
                hook.reached(CrashPoint.AFTER_COMMIT_LOG, int(event.progress.batchId))

            def onQueryIdle(self, event: Any) -> None:  # noqa: D102, N802
                pass

            def onQueryTerminated(self, event: Any) -> None:  # noqa: D102, N802
                pass

        return CrashAfterCommitLog()

    def reply_lost(self) -> bool:
        """Whether this committed ingest group's reply is lost (``ONCEFLOW_INGEST_DROP_ACKS``)."""
        share = float(os.environ.get(DROP_ACKS_ENV, "0") or 0)
        return share > 0 and random.random() < share


def install() -> EnvHook:
    """Install :class:`EnvHook` in this process (once, at its start); the hook."""
    hook = EnvHook()
    faults.install(hook)
    return hook
