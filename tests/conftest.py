"""Shared fixtures: one SparkSession per test run, temporary work dirs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYSPARK_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from onceflow.spark import session

    s = session(app_name="onceflow-tests")
    yield s
    s.stop()
