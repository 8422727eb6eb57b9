"""A real ``onceflow ingest serve`` process on loopback for tests, and raw HTTP against it."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from onceflow.ingest.auth import write_token_file
from onceflow.sources.log import EventLog
from onceflow.verify.crashes import CRASH_ENV


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """An ``onceflow`` subprocess in its own process group, output to a file."""

    def __init__(self, args: list[str], out: Path, env: dict[str, str] | None = None) -> None:
        full = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
        full.update(env or {})
        self.out = out
        self._f = open(out, "a")  # noqa: SIM115
        self.p = subprocess.Popen([sys.executable, "-m", "onceflow.cli.main", *args], env=full,
                                  stdout=self._f, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait(timeout=30)

    def wait(self, timeout: float) -> int:
        return self.p.wait(timeout=timeout)

    def rss_mb(self) -> float:
        """Resident memory of the process (MB)."""
        for line in Path(f"/proc/{self.p.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0


def health(port: int, timeout: float = 2.0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=timeout) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def write_tokens(folder: Path, *senders: str) -> dict[str, str]:
    """``folder/tokens`` granting each sender one token; returns sender -> token."""
    return write_token_file(folder / "tokens", list(senders))


class Receiver:
    """One receiver life: started, waited for, killed."""

    def __init__(self, log: Path, catalog: Path | None, out: Path, *extra: str,
                 env: dict[str, str] | None = None, wait: bool = True) -> None:
        """``catalog`` None: the catalog DSN comes from ``ONCEFLOW_CATALOG_DSN`` in ``env``."""
        self.port = free_port()
        self.log, self.catalog = log, catalog
        where = ["--catalog", str(catalog)] if catalog else []
        self.proc = Proc(["ingest", "serve", "--log", str(log), *where, "--port", str(self.port), *extra],
                         out, env)
        if wait:
            deadline = time.monotonic() + 60
            while health(self.port) is None:
                assert self.proc.p.poll() is None, out.read_text()
                assert time.monotonic() < deadline, "receiver did not start"
                time.sleep(0.1)

    def post(self, body: bytes, token: str | None = None, headers: dict[str, str] | None = None,
             timeout: float = 60) -> tuple[int, dict[str, Any]]:
        """POST raw bytes to /v1/events; (status, JSON answer or {})."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        try:
            conn.request("POST", "/v1/events", body=body, headers=hdrs)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, {}

    def health(self) -> dict[str, Any] | None:
        return health(self.port)

    def kill(self) -> None:
        self.proc.kill()


def event(eid: str, sender: str, now_us: int | None = None, **kw: Any) -> dict[str, Any]:
    now = time.time_ns() // 1000 if now_us is None else now_us
    return {"event_id": eid, "sender": sender, "system_time": now, "user": "u", "event_time": now - 1_000_000,
            "bytes": 1, **kw}


def body(*events: dict[str, Any]) -> bytes:
    return json.dumps({"events": list(events)}).encode()


def log_ids(log: Path) -> list[str]:
    """Every event id in the log, in order; each segment must be fully valid UTF-8."""
    ids: list[str] = []
    for seg in EventLog(log).segments():
        t = pq.read_table(seg.path)
        t.validate(full=True)
        ids += t.column("event_id").to_pylist()
    return ids


def catalog_ids(catalog: Path) -> list[str]:
    """Every id the SQLite catalog holds."""
    conn = sqlite3.connect(catalog)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                            "AND name GLOB 'dedup_b[0-9]*'")]
        return [r[0] for n in names for r in conn.execute(f"SELECT event_id FROM {n}")]
    finally:
        conn.close()
