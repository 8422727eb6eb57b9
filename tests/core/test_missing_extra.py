"""Without the postgres extra, every PostgreSQL path says which extra to install (no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("args", [
    ["verify", "--sink", "postgres", "--rounds", "1", "--report", "{tmp}/v"],
    ["run", "--log", "{tmp}/log", "--checkpoint", "{tmp}/ck", "--sink", "postgres-2pc", "--once"],
    ["ingest", "serve", "--log", "{tmp}/log", "--catalog-dsn-file", "{tmp}/dsn"],
])
def test_no_psycopg_names_the_extra(tmp_path: Path, args: list[str]) -> None:
    fake = tmp_path / "site" / "psycopg"  # shadows the installed psycopg: importing it fails
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ModuleNotFoundError("No module named psycopg", '
                                      'name="psycopg")\n')
    (tmp_path / "dsn").write_text("host=127.0.0.1 dbname=x\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "ONCEFLOW_PG_DSN": "host=127.0.0.1"}
    res = subprocess.run([sys.executable, "-m", "onceflow.cli.main", *(a.format(tmp=tmp_path) for a in args)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode in (1, 2)
    assert "pip install 'onceflow[postgres]'" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("args", [
    ["verify", "--sink", "delta", "--rounds", "1", "--report", "{tmp}/v"],
    ["run", "--log", "{tmp}/log", "--checkpoint", "{tmp}/ck", "--sink", "delta", "--delta", "{tmp}/t",
     "--once"],
])
def test_no_deltalake_names_the_extra(tmp_path: Path, args: list[str]) -> None:
    fake = tmp_path / "site" / "deltalake"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ModuleNotFoundError("No module named deltalake", '
                                      'name="deltalake")\n')
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    res = subprocess.run([sys.executable, "-m", "onceflow.cli.main", *(a.format(tmp=tmp_path) for a in args)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode in (1, 2)
    assert "pip install 'onceflow[delta]'" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_delta_sink_without_its_directory_says_so(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "onceflow.cli.main", "run", "--log", str(tmp_path / "log"),
                          "--checkpoint", str(tmp_path / "ck"), "--sink", "delta", "--once"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode in (1, 2)
    assert "--sink delta writes Delta tables: pass --delta DIR" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def _shadowed(tmp_path: Path, module: str) -> dict[str, str]:
    """An environment where importing ``module`` fails as if it were not installed."""
    fake = tmp_path / "site" / module
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f'raise ModuleNotFoundError("No module named {module}", '
                                      f'name="{module}")\n')
    return {**os.environ, "PYTHONPATH": str(tmp_path / "site")}


def test_no_aiohttp_names_the_http_extra(tmp_path: Path) -> None:
    code = ("import onceflow\n"
            "try:\n"
            f"    onceflow.http('http://127.0.0.1:9/x', ledger={str(tmp_path / 'l.db')!r})\n"
            "except onceflow.ConfigError as exc:\n"
            "    print(exc)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_shadowed(tmp_path, "aiohttp"), timeout=120)
    assert "pip install 'onceflow[http]'" in res.stdout, res.stdout + res.stderr
    ok = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout == "", ok.stdout + ok.stderr  # the control: installed, made


@pytest.mark.parametrize("module", ["rbloom", "aiohttp"])
def test_no_ingest_dependency_names_the_ingest_extra(tmp_path: Path, module: str) -> None:
    res = subprocess.run([sys.executable, "-m", "onceflow.cli.main", "ingest", "serve", "--log",
                          str(tmp_path / "log"), "--port", "0"],
                         capture_output=True, text=True, env=_shadowed(tmp_path, module), timeout=120)
    assert res.returncode in (1, 2)
    assert "pip install 'onceflow[ingest]'" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
