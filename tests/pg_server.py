"""A private, throwaway PostgreSQL server for tests (real server, no mocks).

Runs ``initdb`` + ``pg_ctl`` from the installed server binaries into a temporary directory,
on a free loopback port, with ``max_prepared_transactions`` > 0 for two-phase commit. As root
the server runs as the ``postgres`` system user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl:
        return Path(pg_ctl).parent
    raise RuntimeError("PostgreSQL server binaries not found: run scripts/ensure_postgres.sh")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TempPostgres:
    """One temporary PostgreSQL cluster; ``dsn`` is set after :meth:`start`."""

    def __init__(self, max_prepared_transactions: int = 20) -> None:
        self.bindir = _bindir()
        self.root = Path(tempfile.mkdtemp(prefix="onceflow-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.max_prepared = max_prepared_transactions
        self.dsn = ""
        self._as_root = os.geteuid() == 0

    def _run(self, *args: str) -> None:
        cmd = list(args)
        if self._as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)

    def start(self) -> str:
        if self._as_root:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "onceflow",
                  "--auth=trust", "-E", "UTF8")
        self._pg_ctl_start()
        self.dsn = f"host=127.0.0.1 port={self.port} user=onceflow dbname=postgres"
        return self.dsn

    def _pg_ctl_start(self) -> None:
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                f"-c max_prepared_transactions={self.max_prepared}")
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", opts,
                  "-l", str(self.root / "server.log"), "-w", "start")

    def halt(self, mode: str = "fast") -> None:
        """Stop the server (``pg_ctl stop -m fast|immediate``): every connection is cut."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def resume(self) -> None:
        """Start the stopped server again on the same port and data."""
        self._pg_ctl_start()

    def new_database(self) -> str:
        """Create an empty database and return its DSN."""
        import uuid

        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"host=127.0.0.1 port={self.port} user=onceflow dbname={name}"

    def password_role(self, database_dsn: str, role: str = "pw_user", password: str = "right") -> str:
        """A role that must give its password (scram) over TCP; a DSN of it with the *right* password.

        The server trusts every other connection; this one line of ``pg_hba.conf`` in front
        makes the role's connections check the password (a test swaps it for a wrong one).
        """
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")
            conn.execute(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD '{password}'")
            hba = self.data / "pg_hba.conf"
            line = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
            if self._as_root:
                subprocess.run(["runuser", "-u", "postgres", "--", "sh", "-c",
                                f"printf '%s' '{line}' | cat - {hba} > {hba}.new && mv {hba}.new {hba}"],
                               check=True, timeout=30)
            else:
                hba.write_text(line + hba.read_text())
            conn.execute("SELECT pg_reload_conf()")
        base = database_dsn.replace("user=onceflow", f"user={role}")
        return f"{base} password={password}"

    def stop(self) -> None:
        try:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
