"""Rejects through every sink: PostgreSQL (driver-side and executor-side) and Delta hold the same answer.

The order pipeline of :mod:`tests.core.orders` (bad records by construction), two runs on one
checkpoint; the tables, the rejects and the markers against the generator's manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import onceflow
from tests.core import orders

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("kind", ["postgres", "postgres-staged", "delta",
                                  pytest.param("iceberg", marks=pytest.mark.long)])  # make test's 30 minutes
def test_rejects_through_every_sink(spark: Any, tmp_path: Path, kind: str,
                                   request: pytest.FixtureRequest) -> None:
    location = request.getfixturevalue("pg_dsn") if kind.startswith("postgres") else str(tmp_path / "lake")
    catalog = f"sqlite:///{tmp_path / 'lake' / 'catalog.db'}"
    sink = (onceflow.delta(location) if kind == "delta"
            else onceflow.iceberg(catalog, tmp_path / "lake" / "warehouse") if kind == "iceberg"
            else onceflow.postgres(location, protocol="staged" if kind == "postgres-staged" else "driver"))
    inputs, manifest = tmp_path / "in", tmp_path / "manifest.jsonl"
    for run in range(2):
        orders.generate(inputs, manifest, run * 400, 400, bad_rate=0.2, seed=21)
        orders.start(spark, inputs, sink, tmp_path / "ck").awaitTermination()
    entries = orders.read_manifest(manifest)
    assert orders.read_sink(kind.split("-")[0], location) == orders.expected(entries)
    markers = sink.batches()
    bad = sum(orders.KINDS[e["kind"]] is not None for e in entries)
    assert sum(m["rejected_rows"] for m in markers) == bad
    assert sum(m["input_rows"] for m in markers) == len(entries)
    if kind == "iceberg":  # onceflow rejects reads an Iceberg sink's table too
        from click.testing import CliRunner

        from onceflow.cli.main import cli

        where = ["--iceberg", catalog, "--warehouse", str(tmp_path / "lake" / "warehouse")]
        listed = CliRunner().invoke(cli, ["rejects", *where, "--records"])
        assert listed.exit_code == 0, listed.output
        assert len(listed.output.splitlines()) == bad
        nowhere = ["--iceberg", "sqlite:////nowhere/c.db", "--warehouse", "w"]
        wrong = CliRunner().invoke(cli, ["rejects", *nowhere])
        assert wrong.exit_code != 0
        assert "no catalog database /nowhere/c.db" in str(wrong.exception or wrong.output)
