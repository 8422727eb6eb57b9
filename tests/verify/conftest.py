"""Fixtures of the verify tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.verify.pipelines import sample


@pytest.fixture(scope="module")
def orders_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four files of 1,500 orders each (resent orders and late ones among them), one per test module."""
    directory = tmp_path_factory.mktemp("orders") / "sample"
    sample.write(directory, files=4, per_file=1500, seed=4)
    return directory
