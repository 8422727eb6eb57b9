"""``onceflow connect-server``: a Spark Connect server from a pip install, with onceflow's settings.

The command runs in the foreground as a user runs it (a process group of its own here, killed at
the end); a client in another process connects with ``onceflow.session(remote=...)``, which checks
that the server's Python imports onceflow and that the server loads onceflow's id state store, and
runs a deduplication there. ``--print`` gives the same command as text, runnable as it is.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onceflow.verify.standalone import free_port

pytestmark = pytest.mark.spark

CLIENT = """
import sys
from onceflow import session
spark = session(remote=sys.argv[1])
print("PROVIDER", spark.conf.get("spark.sql.streaming.stateStore.providerClass"))
print("ROWS", spark.range(10).selectExpr("id % 3 AS k").dropDuplicates().count())
"""


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_the_command_starts_a_server_a_client_uses_with_onceflows_parts(tmp_path: Path) -> None:
    onceflow_cli = str(Path(sys.executable).parent / "onceflow")
    port = free_port()
    command = [onceflow_cli, "connect-server", "--port", str(port), "--memory", "1g"]
    printed = subprocess.run([*command, "--print"], capture_output=True, text=True, check=True).stdout
    assert f"spark.connect.grpc.binding.port={port}" in printed and "onceflow-idstore" in printed, printed
    assert shlex.split(printed)[0] == f"PYSPARK_PYTHON={sys.executable}"
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 (the server writes it)
    server = subprocess.Popen([*command, "--cores", "2"], stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not _listening(port):
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()[-3000:]
            time.sleep(0.5)
        client = subprocess.run([sys.executable, "-c", CLIENT, f"sc://127.0.0.1:{port}"], capture_output=True,
                                text=True, timeout=300, env={**os.environ, "SPARK_CONNECT_MODE_ENABLED": "1"})
        out = client.stdout + client.stderr
        assert client.returncode == 0, out[-3000:]
        assert "PROVIDER org.apache.spark.sql.onceflow.IdStateStoreProvider" in out, out[-3000:]
        assert "ROWS 3" in out
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=60)
        log.close()
    with pytest.raises(subprocess.CalledProcessError) as bad:
        subprocess.run([onceflow_cli, "connect-server", "--conf", "no-equals-sign", "--print"],
                       capture_output=True, text=True, check=True)
    assert "'no-equals-sign': expected KEY=VALUE" in bad.value.stderr
