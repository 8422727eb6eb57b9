"""The commands of BENCHMARKS.md's and RELIABILITY.md's opening tables are taken as written.

Each table ("Where each target stands", "Where each proof stands") names the command behind every
figure. Running them all takes hours (``make test-long`` and the benchmarks do); here each one is
parsed by the program it names — a benchmark's own ``argparse`` parser (its ``main()`` stopped
right after parsing), ``onceflow``'s click command (``make_context``: every option and its type
checked, nothing run), ``make``'s target, a script's shell syntax, a pytest run's files — so a
renamed option, script, test file or sink fails this test.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TABLES = {"BENCHMARKS.md": "## Where each target stands", "RELIABILITY.md": "## Where each proof stands"}


class _Parsed(Exception):
    """Raised by the patched parser once the arguments parsed."""


def commands(page: str) -> list[str]:
    """The backticked commands of the page's opening table (its last column)."""
    text = (ROOT / page).read_text()
    start = text.index(TABLES[page])
    table = text[start:text.index("\n## ", start + 3)]
    found = []
    for line in table.splitlines():
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        last = line.rstrip(" |").rsplit(" | ", 1)[-1]
        found += [c for c in re.findall(r"`([^`]+)`", last)
                  if c.startswith(("onceflow ", ".venv/bin/python ", "make ", "bash scripts/"))]
    return found


def _bench(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    script = ROOT / args[0]
    assert script.is_file(), f"no benchmark {script}"
    spec = importlib.util.spec_from_file_location(f"dashboard_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(script.parent))
    spec.loader.exec_module(module)
    original = argparse.ArgumentParser.parse_args

    def parse(self: argparse.ArgumentParser, *a: Any, **kw: Any) -> Any:
        original(self, *a, **kw)  # SystemExit(2) on an option it does not know
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse)
    monkeypatch.setattr(sys, "argv", [str(script), *args[1:]])
    with pytest.raises(_Parsed):
        module.main()


def _onceflow(args: list[str], tmp_path: Path) -> None:
    from onceflow.cli.main import cli

    args = [str(tmp_path) if a == "SAMPLE_DIR" else a for a in args]  # a directory that exists
    ctx = cli.make_context("onceflow", list(args), resilient_parsing=False)
    name, cmd, rest = cli.resolve_command(ctx, ctx.protected_args + ctx.args)
    assert cmd is not None, f"no command {name}"
    cmd.make_context(str(name), rest, parent=ctx)  # raises click's UsageError on a wrong option or value


@pytest.mark.parametrize("page", list(TABLES))
def test_every_command_of_the_opening_table_parses(page: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    found = commands(page)
    assert len(found) >= 12, found  # the table is there and names its commands
    for command in found:
        args = shlex.split(command)
        if args[0] == "make":
            rc = subprocess.run(["make", "-n", *args[1:]], cwd=ROOT, capture_output=True, text=True)
            assert rc.returncode == 0, f"{command}: {rc.stderr}"
        elif args[0] == "onceflow":
            _onceflow(args[1:], tmp_path)
        elif args[0] == "bash":  # a script of the project: there, and valid shell
            rc = subprocess.run(["bash", "-n", args[1]], cwd=ROOT, capture_output=True, text=True)
            assert rc.returncode == 0, f"{command}: {rc.stderr}"
        elif args[1:3] == ["-m", "pytest"]:  # the test files it names exist
            rest = args[3:]
            valued = {"-m", "-k", "-p"}  # pytest options that take the next word
            files = [a.split("::")[0] for i, a in enumerate(rest)
                     if not a.startswith("-") and (i == 0 or rest[i - 1] not in valued)]
            assert files and all((ROOT / f).is_file() for f in files), command
        else:
            with monkeypatch.context() as patch:
                _bench(args[1:], patch)
