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


@pytest.fixture(scope="session")
def pg_server() -> Iterator[object]:
    """One private PostgreSQL server for the whole run (real server, 2PC enabled)."""
    from tests.pg_server import TempPostgres

    server = TempPostgres(max_prepared_transactions=64)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def pg_dsn(pg_server: object) -> str:
    """A fresh, empty database on the test server for one test."""
    return pg_server.new_database()  # type: ignore[attr-defined, no-any-return]
