"""How long a Connect client waits for a server that stopped answering (no server: the policy alone).

The policy is Spark's own retry machinery (``pyspark.sql.connect.client.retries``) run on a call
that fails as a gRPC call to a dead server fails (``UNAVAILABLE``); the real server killed under
a waiting client is ``tests/core/test_connect.py``.
"""

from __future__ import annotations

import time

import grpc
import pytest
from pyspark.sql.connect.client.retries import DefaultPolicy, Retrying

from onceflow.errors import ConfigError, ServerLostError
from onceflow.runtime import connect


class _Refused(grpc.RpcError):
    """What a call to a server that is gone raises."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "failed to connect to all addresses; Connection refused"

    def trailing_metadata(self) -> tuple[()]:
        return ()


def _call_until_given_up(policy: object) -> tuple[int, float]:
    calls, started = 0, time.monotonic()
    with pytest.raises(_Refused):
        for attempt in Retrying([policy]):  # type: ignore[list-item]
            with attempt:
                calls += 1
                raise _Refused()
    return calls, time.monotonic() - started


def test_a_bounded_policy_gives_up_at_its_bound_where_sparks_would_go_on() -> None:
    calls, took = _call_until_given_up(connect._deadline_policy(DefaultPolicy(), 1.5))
    assert 1.4 < took < 3.0 and calls >= 4, (calls, took)  # Spark's backoffs, cut at the bound
    spark_own = DefaultPolicy().to_state()  # the control: Spark's waits add up to ten minutes
    waits = [spark_own.next_attempt() for _ in range(15)]
    assert sum(w for w in waits if w is not None) / 1000 >= 600


def test_lowering_the_bound_ends_a_call_that_is_retrying_now() -> None:
    import threading

    bounded = connect._deadline_policy(DefaultPolicy(), 120)
    threading.Timer(1.0, lambda: setattr(bounded, "seconds", connect.AFTER_LOSS_S)).start()
    _, took = _call_until_given_up(bounded)
    assert took < 10, took


def test_the_wait_is_given_or_from_the_environment_or_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(connect.SERVER_WAIT_ENV, raising=False)
    assert connect.server_wait_s() == 60
    monkeypatch.setenv(connect.SERVER_WAIT_ENV, "12.5")
    assert connect.server_wait_s() == 12.5
    assert connect.server_wait_s(3) == 3
    monkeypatch.setenv(connect.SERVER_WAIT_ENV, "soon")
    with pytest.raises(ConfigError, match=r"\$ONCEFLOW_CONNECT_SERVER_WAIT='soon'.*positive number"):
        connect.server_wait_s()
    with pytest.raises(ConfigError, match=r"server_wait=0: .*positive number"):
        connect.server_wait_s(0)


def test_a_gone_server_is_named_with_what_grpc_said() -> None:
    try:
        try:
            raise _Refused()
        except _Refused as inner:
            raise RuntimeError("the wait failed") from inner
    except RuntimeError as exc:
        wrapped = exc
    assert connect.is_server_gone(wrapped)
    assert not connect.is_server_gone(RuntimeError("a batch failed"))

    class _Session:
        class client:  # noqa: N801 - the attribute a Connect session has
            pass

    err = connect.server_lost(_Session(), 8, wrapped)
    assert isinstance(err, ServerLostError) and isinstance(err, ConnectionError)
    assert "has not answered for 8 s (UNAVAILABLE: failed to connect to all addresses" in str(err)
    assert "run this pipeline again" in str(err) and connect.SERVER_WAIT_ENV in str(err)
