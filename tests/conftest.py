"""Shared fixtures: one SparkSession per test run, temporary work dirs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYSPARK_PYTHON"] = sys.executable

# The verifier's crash hook in this process and in every process the tests start (their Python
# workers too: they inherit PYTHONPATH), as `onceflow verify` puts it in the processes it starts.
from onceflow.verify import crashes  # noqa: E402

os.environ["PYTHONPATH"] = crashes.child_env(dict(os.environ))["PYTHONPATH"]
crashes.install()


pytest_plugins = ["onceflow.testing"]  # onceflow_sink, onceflow_verify (as a user's conftest has)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from onceflow.runtime import idstore, jars
    from onceflow.runtime.jvmstart import JAVA_OPTIONS_ENV
    from onceflow.runtime.session import session

    child_options = os.environ.pop(JAVA_OPTIONS_ENV, None)  # the children's, not this long-lived JVM's
    try:
        # the id store's jar on the classpath: its tests choose the provider per query
        s = session(app_name="onceflow-tests", kafka=bool(jars.fetch(jars.CONNECTOR)),  # read_kafka: Spark's
                    conf={"spark.jars": str(idstore.build())}, id_store=False)
    finally:
        if child_options is not None:
            os.environ[JAVA_OPTIONS_ENV] = child_options
    yield s
    s.stop()


@pytest.fixture
def utc_spark(spark: Any) -> Any:
    """The session with UTC as its time zone (windows and dates as the tests compute them)."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark


@pytest.fixture(scope="session")
def fast_child_drivers(tmp_path_factory: pytest.TempPathFactory) -> str | None:
    """Spark drivers started as child processes start from a class-data archive with the quick JIT.

    What ``onceflow verify --fast-start`` does for its drivers (SparkSession start ~9.7 s -> ~2.9 s
    here, BENCHMARKS.md); it changes nothing a driver computes or commits. The archive is trained
    once per machine (~20 s) and kept in onceflow's cache. The in-process ``spark`` session does
    not use these options: its JVM lives for the whole run, where the full JIT pays.
    """
    from onceflow.runtime.jvmstart import JAVA_OPTIONS_ENV, use_options
    from onceflow.verify.driver import fast_start_archive

    if JAVA_OPTIONS_ENV in os.environ:  # the caller chose the options
        return os.environ[JAVA_OPTIONS_ENV]
    archive = fast_start_archive(tmp_path_factory.mktemp("jvm-training"), lambda _: None)
    os.environ[JAVA_OPTIONS_ENV] = use_options(archive)
    return os.environ[JAVA_OPTIONS_ENV]


@pytest.fixture(autouse=True)
def _children_start_fast(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("spark") is not None:
        request.getfixturevalue("fast_child_drivers")


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Kinds by marker: the ``spark`` fixture needs a JVM; ``pg_dsn`` a server; a Kafka broker a JVM.

    Modules whose tests start Spark in child processes say so with ``pytestmark``; select or
    leave out kinds with ``-m`` (e.g. ``pytest -m "not spark"``: the tests without a JVM).
    """
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "spark" in names:
            item.add_marker(pytest.mark.spark)
        if "pg_dsn" in names or "pg_server" in names:
            item.add_marker(pytest.mark.postgres)
        if "broker" in names or "kafka_broker" in names:  # a real Kafka broker: a JVM
            item.add_marker(pytest.mark.jvm)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config._onceflow_exit = int(exitstatus)  # type: ignore[attr-defined]


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # delta-rs (deltalake) sometimes aborts the interpreter at shutdown ("terminate called without
    # an active exception", delta-io/delta-rs#2184; measured here: 2 of 3 runs of a script that
    # wrote Delta tables). Everything is reported by now: leave without the finalizers.
    if "deltalake" in sys.modules and hasattr(config, "_onceflow_exit"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config._onceflow_exit)
