import pytest

from onceflow.api.durations import parse_duration
from onceflow.errors import ConfigError


@pytest.mark.parametrize(("text", "seconds"), [
    ("1m", 60.0), ("90s", 90.0), ("500ms", 0.5), ("2h", 7200.0), ("1.5m", 90.0), ("7", 7.0), (3, 3.0),
    ("1 minute", 60.0), ("10 minutes", 600.0), ("1 Second", 1.0), ("2 hours", 7200.0),
    ("250 milliseconds", 0.25),
])
def test_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10 fortnights", "-1s", "m", "1 minute ago"])
def test_reject(text: str) -> None:
    with pytest.raises(ConfigError, match="invalid duration"):
        parse_duration(text)
