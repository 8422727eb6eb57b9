"""A real Spark Connect server in a process of its own, for tests, demos and ``verify --remote``.

PySpark's wheel ships the server (``jars/spark-connect_*.jar``); ``sbin/start-connect-server.sh``
daemonizes it. This starts ``org.apache.spark.sql.connect.service.SparkConnectServer`` through
``spark-submit`` in the foreground, in a process group of its own, so that :meth:`kill` is a
``kill -9`` of the server and every Python worker it started (a machine going away)::

    python -m onceflow.verify.connect_server --workdir /tmp/connect
    # prints: remote sc://127.0.0.1:15002   (runs until interrupted)

The server runs onceflow's Python (``spark.pyspark.python`` is this interpreter) with the settings
:func:`onceflow.session` gives a driver it starts (:func:`onceflow.runtime.session.server_conf`) and,
unless ``onceflow_jars=False``, onceflow's jars on its class path (``--jars``: the id state store
and the local checkpoint file manager), as a server admin would install them (docs/connect.md).
``ONCEFLOW_DRIVER_PID`` in its environment is its own process id, so a crash point armed in its
``foreachBatch`` worker (``ONCEFLOW_CRASH_AT``) kills the server JVM too.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from onceflow.errors import OnceflowError
from onceflow.verify import crashes
from onceflow.verify.standalone import free_port


class ConnectServer:
    """A Spark Connect server on loopback (``local[cores]`` inside it).

    Args:
        workdir: Its log (``connect-server.log``) goes here.
        port: The gRPC port (a free one when None).
        cores: Cores of its local master.
        conf: Extra Spark settings of the server.
        env: Extra environment of the server (e.g. ``ONCEFLOW_CRASH_AT``).
        onceflow_jars: Put onceflow's jars on its class path.
        own_group: Run it in a process group of its own (:meth:`kill` kills the group); False:
            in the caller's group, so a ``kill -9`` of that group takes the server too.
    """

    def __init__(self, workdir: str | os.PathLike[str], port: int | None = None, cores: int = 2,
                 conf: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
                 onceflow_jars: bool = True, own_group: bool = True) -> None:
        self.workdir = Path(workdir)
        self.own_group = own_group
        self.port = port or free_port()
        self.cores, self.conf, self.env = cores, dict(conf or {}), dict(env or {})
        self.onceflow_jars = onceflow_jars
        self.proc: subprocess.Popen[bytes] | None = None
        self.closing = False
        """Set by :meth:`kill`: the server's end is asked for, not a crash."""

    @property
    def url(self) -> str:
        """The ``sc://`` URL clients connect to."""
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        """The server's log file."""
        return self.workdir / "connect-server.log"

    def command(self) -> list[str]:
        """The server's ``spark-submit`` command (:func:`onceflow.runtime.session.server_command`)."""
        from onceflow.runtime.session import server_command

        return server_command("127.0.0.1", self.port, self.cores, "2g", self.onceflow_jars,
                              {"spark.driver.host": "127.0.0.1", **self.conf})

    def start(self, timeout_s: float = 120.0) -> ConnectServer:
        """Start the server and wait until it accepts connections.

        Raises:
            OnceflowError: It exited or did not listen within ``timeout_s`` (the log's tail is in
                the message).
        """
        from onceflow.runtime.session import server_environment

        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**server_environment(), "SPARK_LOCAL_IP": "127.0.0.1", **self.env}
        env = crashes.child_env(env)  # the crash hook in the server's Python workers
        # exec keeps one process id from the shell to the JVM: the server knows it as the driver's
        script = f"export {crashes.DRIVER_PID_ENV}=$$; exec {shlex.join(self.command())}"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(["bash", "-c", script], stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=self.own_group)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise OnceflowError(f"the Spark Connect server exited ({self.proc.returncode}): "
                                    f"{self._tail()}")
            if self._listening():
                return self
            time.sleep(0.3)
        self.kill()
        raise OnceflowError(f"the Spark Connect server did not listen on {self.port} in {timeout_s:.0f} s: "
                            f"{self._tail()}")

    def wait_exit(self, timeout_s: float, unless: Callable[[], bool] | None = None) -> bool:
        """Wait for the server to end on its own (a crash point in its worker kills its JVM).

        Args:
            timeout_s: Longest wait.
            unless: Stop waiting early once this says so (e.g. the client ended: no crash point fired).

        Returns:
            Whether the server has exited.
        """
        deadline = time.monotonic() + timeout_s
        while self.proc is not None and self.proc.poll() is None and time.monotonic() < deadline:
            if unless is not None and unless():
                break
            time.sleep(0.2)
        return self.proc is not None and self.proc.poll() is not None

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL the server's process group (the JVM and its Python workers) and wait for it."""
        if self.proc is None:
            return
        self.closing = True
        try:
            if self.own_group:
                os.killpg(self.proc.pid, signal.SIGKILL)
            else:  # its Python workers end when the JVM's sockets close
                self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)
        self.proc = None

    def __enter__(self) -> ConnectServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.kill()


def private_server(workdir: str | os.PathLike[str]) -> ConnectServer:
    """A server for this process alone (``onceflow run --remote local``), in this process's group.

    The process and its server are one driver, as a classic driver and its JVM are: a ``kill -9``
    of the group takes both, and when the server dies (a crash point in its ``foreachBatch``
    worker, the JVM killed) a watchdog thread SIGKILLs this process too, at once — a Connect
    client would otherwise retry the lost server for minutes.
    """
    server = ConnectServer(workdir, cores=os.cpu_count() or 2, own_group=False).start()
    atexit.register(server.kill)  # a normal exit ends the server, as a classic driver's JVM ends

    def watch() -> None:
        proc = server.proc
        if proc is not None and proc.wait() is not None and not server.closing:
            said = [ln for ln in server._tail(200_000).splitlines() if ln.startswith("onceflow: crash point")]
            for line in dict.fromkeys(said):  # what its worker said as it died, on this driver's stderr
                print(line, file=sys.stderr)
            print(f"onceflow: the Spark Connect server exited ({proc.returncode}): this driver stops with it",
                  file=sys.stderr, flush=True)
            crashes.crash_now()

    threading.Thread(target=watch, name="onceflow-connect-watchdog", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    """Run a server until interrupted, printing its URL."""
    parser = argparse.ArgumentParser(description="A Spark Connect server with onceflow's jars, on loopback.")
    parser.add_argument("--workdir", default="onceflow-connect", help="where its log goes")
    parser.add_argument("--port", type=int, default=15002, help="gRPC port (default 15002, Spark's)")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="cores of its local master")
    parser.add_argument("--without-onceflow-jars", action="store_true",
                        help="leave onceflow's jars off the server (Spark's state store and checkpoint "
                             "manager run)")
    args = parser.parse_args(argv)
    server = ConnectServer(args.workdir, args.port, args.cores, onceflow_jars=not args.without_onceflow_jars)
    server.start()
    print(f"remote {server.url}   (log: {server.log}; Ctrl-C stops it)", flush=True)
    try:
        while server.proc is not None and server.proc.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
