"""Option types shared by several commands."""

from __future__ import annotations

from typing import Any

import click

from onceflow.durations import parse_duration
from onceflow.errors import ConfigError


class Duration(click.ParamType):  # type: ignore[type-arg]
    """A duration such as ``1m``, ``90s`` or ``500ms``, converted to seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """Parse the value or fail with click's usage error."""
        try:
            return parse_duration(value)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


def fraction(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """Validate a fraction in [0, 1]."""
    if not 0.0 <= value <= 1.0:
        raise click.BadParameter(f"must be a fraction between 0 and 1, got {value}")
    return value
