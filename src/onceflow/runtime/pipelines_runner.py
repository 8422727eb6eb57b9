"""Spark Declarative Pipelines' runner, with the one change a run with a Python sink needs.

``spark-pipelines run`` (PySpark 4.1-4.3) streams the run's events through
``SparkConnectClient.execute_command_as_iterator``, which raises ``[UNKNOWN_RESPONSE]`` on any
response that is not a dict. A flow whose sink (or any step) is a Python data source or a Python
UDF makes the server send the run's Python accumulator updates as observed metrics named
``__python_accumulator__`` — not a dict — so the runner exits 1 *after* "Run is COMPLETED", with
every row written. Nothing of onceflow is needed for it: a pipeline whose sink is a Python data
source that writes nothing does it too (docs/connect.md has the reproduction).

This module is the runner's own ``cli.py`` run with that call tolerating them (observed metrics are
passed over, as ``execute_command`` already does for them): ``onceflow pipelines run`` starts it
the way ``spark-pipelines`` starts Spark's, so a run that completes exits 0 and a failed one
still fails. It runs in the runner's Python process (started by ``spark-submit``), once per run;
it changes that process alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SPARK_MAIN = "org.apache.spark.deploy.SparkPipelines"
"""The JVM class ``spark-pipelines`` starts: it runs a Connect server and then the given Python file."""


def _events(client: Any, command: Any, observations: Any = None) -> Iterator[dict[str, Any]]:
    """``execute_command_as_iterator`` passing over observed metrics instead of raising on them."""
    request = client._execute_plan_request_with_metadata()
    client._set_command_in_plan(request.plan, command)
    for response in client._execute_and_fetch_as_iterator(request, observations or {}):
        if isinstance(response, dict):
            yield response


def tolerate_observed_metrics() -> None:
    """Make this process's Connect client pass over observed metrics in a command's responses."""
    from pyspark.sql.connect.client.core import SparkConnectClient

    SparkConnectClient.execute_command_as_iterator = _events  # type: ignore[method-assign, assignment]


def command(args: list[str]) -> list[str]:
    """The command that runs ``spark-pipelines ARGS`` through this module (PySpark's ``spark-class``).

    Raises:
        ConfigError: PySpark has no pipelines runner (before 4.1) or no ``spark-class``.
    """
    import pyspark

    from onceflow.errors import ConfigError

    home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)
    spark_class = home / "bin" / "spark-class"
    if not (Path(pyspark.__file__).parent / "pipelines" / "cli.py").exists():
        raise ConfigError(f"PySpark {pyspark.__version__} has no Declarative Pipelines runner "
                          "(pyspark.pipelines, PySpark 4.1 and later)")
    if not spark_class.exists():
        raise ConfigError(f"{spark_class} does not exist: set SPARK_HOME to a Spark installation "
                          "(or unset it to use PySpark's own)")
    return [str(spark_class), SPARK_MAIN, str(Path(__file__).resolve()), *args]


def environment() -> dict[str, str]:
    """The runner's environment: PySpark's home and this interpreter as the Python it runs."""
    import pyspark

    env = dict(os.environ)
    env.setdefault("SPARK_HOME", str(Path(pyspark.__file__).parent))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


if __name__ == "__main__":  # started by spark-submit (SparkPipelines), as Spark's cli.py is
    here = Path(__file__).resolve().parent  # a script's folder leads sys.path: not a package's
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    tolerate_observed_metrics()
    from pyspark.pipelines.cli import main

    main()
