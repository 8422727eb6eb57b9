"""Every code block of the guide pages runs: each page's Python blocks, in order, as one script.

The script runs in a fresh directory in its own process (its own SparkSession), as a user
would paste it; a failing block (an exception, a failed ``assert``) fails the test with the
script's output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)

pytestmark = pytest.mark.spark


def blocks(page: str) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block of a docs page."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer((DOCS / page).read_text())]


def run_page(page: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    code = [c for lang, c in blocks(page) if lang == "python"]
    script = cwd / "page.py"
    script.write_text("\n".join(code))
    proc = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, f"{page} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout


@pytest.mark.parametrize("page", ["guide.md", "guide-kafka-postgres.md"])
def test_the_guide_has_only_python_blocks(page: str) -> None:
    """What the test runs is every block of the page (none in a language it would skip)."""
    langs = {lang for lang, _ in blocks(page)}
    assert langs == {"python"}, langs


def test_the_guide_runs(tmp_path: Path) -> None:
    out = run_page("guide.md", tmp_path)
    assert "distinct clicks counted: 1300 late clicks kept: 30" in out


def test_the_kafka_postgres_guide_runs(tmp_path: Path, pg_dsn: str) -> None:
    out = run_page("guide-kafka-postgres.md", tmp_path, {"ONCEFLOW_PG_DSN": pg_dsn})
    assert "quantity sold: 600" in out
