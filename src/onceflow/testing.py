"""Prove your own pipeline exactly once in your own tests (pytest-friendly).

The same proof as ``onceflow verify --pipeline``, in a few lines::

    # conftest.py
    pytest_plugins = ["onceflow.testing"]

    # test_orders.py
    from onceflow.testing import explain, verify_pipeline

    def test_orders_exactly_once(tmp_path):
        result = verify_pipeline("pipelines/orders.py:build", "tests/sample_orders", workdir=tmp_path,
                                 rounds=3)
        assert result.proven, explain(result)

``result.proven``: no violation and every round counted (its fault hit a batch with input);
``result.ok`` alone also passes an INCONCLUSIVE run, whose faults proved less than asked.

:func:`verify_pipeline` runs real Spark drivers over the sample (fed in rounds), kills them with
real crash points and SIGKILLs, drains, and judges every table with the pipeline oracle
(:mod:`onceflow.verify.pipeline_oracle`). The plugin's fixtures:

* ``onceflow_sink``: a SQLite sink in the test's temporary directory (for a quick test of the
  pipeline function itself, with ``once=True``);
* ``onceflow_verify``: :func:`verify_pipeline` with ``workdir`` set to the test's temporary
  directory.

This module belongs to the verifier (it runs the auditor); the library never imports it.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from onceflow.verify.chaos import VerifyConfig, VerifyResult, run_verify
from onceflow.verify.fault_kinds import default_faults
from onceflow.verify.report import print_summary, write_reports
from onceflow.verify.sinks import REALTIME

__all__ = ["explain", "verify_pipeline"]


def explain(result: VerifyResult) -> str:
    """The human summary of a result (faults, per-table verdict, violations) as text."""
    from rich.console import Console

    out = io.StringIO()
    print_summary(result, Console(file=out, width=110, color_system=None))
    return out.getvalue()


def verify_pipeline(pipeline: str, input: str | Path, *, workdir: str | Path, rounds: int = 3,  # noqa: A002
                    seed: int = 0, sink: str = "sqlite", faults: str | list[str] = "all",
                    pg_dsn: str | None = None, fast_start: bool = True,
                    say: Callable[[str], None] | None = None, keep_sink: bool = False) -> VerifyResult:
    """Run the pipeline under injected faults and judge its tables (``onceflow verify --pipeline``).

    Args:
        pipeline: ``PATH.py:FUNCTION`` (:mod:`onceflow.api.pipelines`).
        input: Directory of sample files the pipeline reads (with ``sink="realtime"``: the
            JSON-lines records verify produces to the Kafka topic the pipeline reads).
        workdir: Where the run's checkpoint, sink and reports go (``report.html`` there).
        rounds: Fault rounds (each one fault; ``all`` cycles through the crash points, a random
            SIGKILL, an ambiguous commit and a trigger change).
        seed: Seed of the timings.
        sink: ``sqlite``, ``postgres``, ``delta``, a negative control (``naive``...), or
            ``realtime``: a pipeline that writes with :func:`onceflow.write_realtime` (its rounds:
            :mod:`onceflow.verify.realtime_rounds`).
        faults: ``"all"`` or fault names.
        pg_dsn: PostgreSQL server for ``postgres`` sinks (else ``$ONCEFLOW_PG_DSN``).
        fast_start: Start drivers from a class-data archive (faster rounds).
        say: Progress lines (default: none).
        keep_sink: Keep the PostgreSQL schema the run wrote (else dropped once judged).

    Returns:
        The result: ``.proven`` (no violation, every round counted), ``.ok`` (no violation),
        ``.status`` (``OK``, ``INCONCLUSIVE``, ``FAILED``), ``.verdict`` (per table), ``.rounds``;
        :func:`explain` says it in text.

    Raises:
        ConfigError: A bad pipeline spec, sample, sink or fault name.
    """
    names = [faults] if isinstance(faults, str) else list(faults)
    work = Path(workdir).absolute()
    if sink == REALTIME:
        from onceflow.verify import realtime_rounds as rt

        result = rt.run_realtime(work / "work", pipeline, Path(input).absolute(), rounds, names, seed,
                                 pg_dsn, say=say or (lambda _: None), keep_sink=keep_sink)
        write_reports(result, work)
        return result
    if names == ["all"]:
        names = default_faults(sink, pipeline=True)
    cfg = VerifyConfig(workdir=work / "work", rounds=rounds, faults=names, seed=seed, sink=sink,
                       pg_dsn=pg_dsn, fast_start=fast_start, pipeline=pipeline,
                       input_dir=Path(input).absolute(), keep_sink=keep_sink)
    result = run_verify(cfg, say=say or (lambda _: None))
    write_reports(result, work)
    return result


try:  # the pytest plugin (pytest_plugins = ["onceflow.testing"])
    import pytest

    @pytest.fixture()
    def onceflow_sink(tmp_path: Path) -> Any:
        """A SQLite sink in the test's temporary directory."""
        import onceflow

        sink = onceflow.sqlite(tmp_path / "onceflow-sink.db")
        yield sink
        sink.close()

    @pytest.fixture()
    def onceflow_verify(tmp_path: Path) -> Callable[..., VerifyResult]:
        """:func:`verify_pipeline` writing into the test's temporary directory."""
        return functools.partial(verify_pipeline, workdir=tmp_path / "onceflow-verify")
except ImportError:  # pragma: no cover - pytest is not needed to use verify_pipeline
    pass
