"""Option types shared by several commands."""

from __future__ import annotations

from typing import Any

import click

from onceflow.api.durations import parse_duration
from onceflow.errors import ConfigError, nearest


class Duration(click.ParamType):  # type: ignore[type-arg]
    """A duration such as ``1m``, ``90s`` or ``500ms``, converted to seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """Parse the value or fail with click's usage error."""
        try:
            return parse_duration(value)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


class SinkKind(click.ParamType):  # type: ignore[type-arg]
    """A ``--sink`` choice, or several joined by ``+`` for a pipeline of several sinks.

    A misspelt name gets a "did you mean" (``postgress`` -> ``postgres``); several sinks are
    checked as :func:`onceflow.verify.sinks.parts` checks them.

    Args:
        choices: The single choices.
    """

    name = "sink"

    def __init__(self, choices: list[str]) -> None:
        self.choices = choices

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:  # noqa: D102
        return "KIND[+KIND...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """The value, or click's usage error naming the closest choice."""
        if value in self.choices:
            return str(value)
        if "+" in str(value):
            from onceflow.verify.sinks import parts

            try:
                parts(str(value))
            except ConfigError as exc:
                self.fail(str(exc), param, ctx)
            return str(value)
        near = nearest(str(value), self.choices)
        self.fail(f"{value!r} is not a sink" + (f" (did you mean {near!r}?)" if near else "")
                  + f"; choose from {', '.join(self.choices)}", param, ctx)


def fraction(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """Validate a fraction in [0, 1]."""
    if not 0.0 <= value <= 1.0:
        raise click.BadParameter(f"must be a fraction between 0 and 1, got {value}")
    return value


def secret_dsn(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A DSN option: warn when it came on the command line with a password (``ps`` shows it)."""
    from click.core import ParameterSource

    if value and ctx.get_parameter_source(str(param.name)) is ParameterSource.COMMANDLINE:
        try:
            from psycopg.conninfo import conninfo_to_dict

            secret = any(k in conninfo_to_dict(value) for k in ("password", "sslpassword"))
        except Exception:  # unparsable or psycopg missing: assume the worst
            secret = True
        if secret:
            env = param.envvar if isinstance(param.envvar, str) else "the environment"
            click.echo(f"onceflow: warning: {param.opts[0]} on the command line shows its password to every "
                       f"user of this machine (ps); set {env} or use a ~/.pgpass file instead", err=True)
    return value


def read_secret_file(path: str | None, what: str) -> str | None:
    """The stripped content of a secret file (a DSN or a token), or None without a path.

    Raises:
        click.BadParameter: The file cannot be read or is empty.
    """
    if path is None:
        return None
    try:
        text = open(path, encoding="utf-8").read().strip()  # noqa: SIM115
    except OSError as exc:
        raise click.BadParameter(f"cannot read {what} from {path}: {exc.strerror}") from None
    if not text:
        raise click.BadParameter(f"{path} is empty; it should hold {what}")
    return text
