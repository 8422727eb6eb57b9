"""Secrets never reach a message: DSN redaction and the command-line warning."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from onceflow.cli.main import cli
from onceflow.errors import OnceflowError
from onceflow.sinks.postgres.conn import connect, redact, scrub


@pytest.mark.parametrize("dsn", [
    "host=h user=u password=PWSECRET sslpassword=SSLSECRET dbname=d",
    "postgresql://u:PWSECRET@h:5432/d?sslpassword=SSLSECRET",
    "postgres://u:PWSECRET@h/d?sslmode=require&sslpassword=SSLSECRET",
])
def test_redact_and_scrub_remove_every_secret(dsn: str) -> None:
    shown = redact(dsn)
    assert "SECRET" not in shown and "user=u" in shown
    assert "SECRET" not in scrub(f"failed for {dsn}: password PWSECRET, key SSLSECRET", dsn)


def test_a_connection_error_shows_no_secret() -> None:
    with pytest.raises(OnceflowError) as info:
        connect("host=127.0.0.1 port=1 user=u password=PWSECRET sslpassword=SSLSECRET connect_timeout=2")
    assert "SECRET" not in str(info.value) and "port=1" in str(info.value)


def test_a_dsn_with_a_password_on_the_command_line_is_warned_about(tmp_path: object) -> None:
    runner = CliRunner()
    args = ["ingest", "serve", "--log", "/nonexistent/x", "--catalog-dsn",
            "host=127.0.0.1 port=1 password=PWSECRET connect_timeout=1"]
    res = runner.invoke(cli, args)
    assert "--catalog-dsn on the command line shows its password" in res.output
    assert "PWSECRET" not in res.output
    quiet = runner.invoke(cli, args[:-2], env={"ONCEFLOW_CATALOG_DSN": args[-1]})
    assert "command line" not in quiet.output  # from the environment: no warning


def test_onceflow_errors_are_unwrapped_from_spark_exceptions() -> None:
    from onceflow.errors import BatchRejectedError, ConfigError, from_spark

    wrapped = RuntimeError(
        "[PYTHON_DATA_SOURCE_ERROR] Failed to initialize Python data source writer: Traceback (most recent "
        "call last):\n  File \"x.py\", line 1, in f\nonceflow.errors.ConfigError: unknown option(s) for the "
        "onceflow_postgres data source: 'protocl' (did you mean 'protocol'?) SQLSTATE: 38000")
    err = from_spark(wrapped)
    assert isinstance(err, ConfigError)
    assert str(err) == ("unknown option(s) for the onceflow_postgres data source: 'protocl' "
                        "(did you mean 'protocol'?)")
    plain = RuntimeError("something else")
    assert from_spark(plain) is plain
    raised = RuntimeError("org.apache.spark.SparkRuntimeException: [USER_RAISED_EXCEPTION] onceflow.errors."
                          "BatchRejectedError: a record with a null id: {\"id\":null} SQLSTATE: P0001")
    assert isinstance(from_spark(raised), BatchRejectedError)
    assert str(from_spark(raised)) == 'a record with a null id: {"id":null}'
    # another failure whose message prints the plan, with a rule's raise_error in it: not that error
    planned = RuntimeError(
        "[CONCURRENT_STREAM_LOG_UPDATE] Concurrent update to the log. Multiple streaming jobs detected "
        "for 0.\n+- Filter CASE WHEN isnull(id#1) THEN cast(raise_error(concat(onceflow.errors."
        "BatchRejectedError: a record with a null id: , to_json(struct(id, id#1), Some(UTC)), . To "
        "route...), NullType) as boolean) ELSE true END")
    assert from_spark(planned) is planned


def test_a_connection_string_that_does_not_parse_fails_at_once() -> None:
    import time

    import onceflow
    from onceflow.errors import ConfigError

    started = time.monotonic()
    for dsn, why in [("host=127.0.0.1 port", 'missing "=" after "port"'),
                     ("host=127.0.0.1 passwrd=hunter2", 'invalid connection option "passwrd"')]:
        with pytest.raises(ConfigError, match=f"the connection string does not parse: {why}") as err:
            onceflow.postgres(dsn)
        assert "hunter2" not in str(err.value)
    assert time.monotonic() - started < 5  # not retried as if the server were down
