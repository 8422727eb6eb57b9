"""Steps that read Spark's checkpoint, run where the checkpoint is: a Spark Connect server's driver.

Before a query starts, :func:`onceflow.write_stream` checks and mends Spark's checkpoint (its
logs, a first batch killed half-written, that the sink's batches are this checkpoint's) and,
while ``onceflow repair`` restores batches, the query's wait reads it again. On Spark Connect
the client may not see the checkpoint at all — it is a path of the server (its disk, a mount
only the cluster has). There the steps run on the server's driver host, through a batch
Python data source whose planner runs them (:class:`StepsSource`; Spark plans a Python data
source's read in a Python worker of the driver, with the driver's file system). No JVM gateway,
no rows of a batch: one row of the steps' outcome.

:meth:`StepsSource.run` runs the protocol:

1. The client pickles the steps (a function of no arguments; PySpark's cloudpickle, as Spark
   Connect pickles the ``foreachBatch`` function) into an option (:data:`OPTION`) of a read of
   the data source ``onceflow_server_steps``, registered in the session once.
2. Spark plans the read on the server's driver host: the reader runs the steps there, catching
   what they raise and the log lines of onceflow's loggers, and keeps the outcome.
3. The read's one partition yields the outcome as one row; the client collects that row.
4. The client logs the steps' log lines again (as the server's), then raises what the steps
   raised — the same onceflow error, with its message — or returns what they returned.
"""

from __future__ import annotations

import base64
import logging
import pickle
from collections.abc import Callable, Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from onceflow.errors import OnceflowError

NAME = "onceflow_server_steps"
OPTION = "steps_secret"
"""The option holding the pickled steps: a name Spark's redaction (``spark.redaction.regex``)
hides in plans and logs, since the steps carry the sink's arguments (a DSN's password)."""
_REGISTERED: set[str] = set()


def _dumps(value: Any) -> str:
    from pyspark import cloudpickle

    data: bytes = cloudpickle.dumps(value)  # type: ignore[no-untyped-call]
    return base64.b64encode(data).decode("ascii")


class _Lines(logging.Handler):
    """The log lines of onceflow's loggers while the steps run (said again by the client)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[str, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.name, record.levelno, record.getMessage()))


def outcome_of(steps: Callable[[], Any]) -> bytes:
    """Step 2: run ``steps`` here; their result or exception and log lines, pickled.

    An exception that does not pickle, or does not unpickle (its ``__init__`` takes other
    arguments than its ``args``), is kept as an :class:`OnceflowError` naming its class and message.
    """
    lines = _Lines()
    logger = logging.getLogger("onceflow")
    logger.addHandler(lines)
    try:
        outcome: dict[str, Any] = {"result": steps()}
    except Exception as exc:  # noqa: BLE001 - handed to the client, which raises it
        outcome = {"error": exc}
    finally:
        logger.removeHandler(lines)
    outcome["lines"] = lines.lines
    try:
        data = pickle.dumps(outcome)
        pickle.loads(data)  # noqa: S301 - its own bytes: an exception whose __init__ takes other arguments
        return data
    except Exception:  # noqa: BLE001 - an exception or result that does not pickle: its text
        error = outcome.get("error")
        text = f"{type(error).__name__}: {error}" if error is not None else "a result that does not pickle"
        return pickle.dumps({"error": OnceflowError(text), "lines": lines.lines})


class _Reader(DataSourceReader):
    """Runs the steps when Spark plans the read (the driver's host); yields their outcome."""

    def __init__(self, steps: str) -> None:
        from pyspark import cloudpickle

        self.outcome = outcome_of(cloudpickle.loads(base64.b64decode(steps)))

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[bytes]]:
        yield (self.outcome,)


class StepsSource(DataSource):
    """``onceflow_server_steps``: one row, the outcome of the steps in option :data:`OPTION`."""

    @classmethod
    def name(cls) -> str:
        """The format's name."""
        return NAME

    def schema(self) -> str:
        """One binary column: the pickled outcome."""
        return "outcome BINARY"

    def reader(self, schema: Any) -> DataSourceReader:
        """Called where Spark plans the read: the steps run here (step 2)."""
        return _Reader(self.options[OPTION])

    @staticmethod
    def run(spark: Any, steps: Callable[[], Any], what: str) -> Any:
        """Steps 1-4 of the module: ``steps()`` run on the server's driver host.

        Args:
            spark: The (Connect) session.
            steps: A picklable function of no arguments.
            what: What the steps do, for the error when they could not run.

        Returns:
            What ``steps`` returned.

        Raises:
            OnceflowError: What ``steps`` raised (its own class where it pickles), or that they
                could not run on the server (naming ``what`` and Spark's error).
        """
        session_id = str(getattr(spark, "session_id", id(spark)))
        if session_id not in _REGISTERED:
            spark.dataSource.register(StepsSource)
            _REGISTERED.add(session_id)
        try:
            rows = spark.read.format(NAME).option(OPTION, _dumps(steps)).load().collect()
        except Exception as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise OnceflowError(f"{what} on the Spark Connect server's driver failed: {first}") from exc
        outcome = pickle.loads(bytes(rows[0][0]))  # noqa: S301 - the client's own server's answer
        for name, level, message in outcome["lines"]:
            logging.getLogger(name).log(level, "%s (on the server)", message)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]
