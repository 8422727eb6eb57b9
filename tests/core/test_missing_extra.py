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
