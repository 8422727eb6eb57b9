"""Delta Lake tables, each micro-batch exactly once per table (delta-rs, no JVM).

:class:`DeltaTablesSink` (``onceflow.delta(...)``): the sink and its commit protocol
(:mod:`onceflow.sinks.delta.sink`); large batches written by Spark's tasks and committed by the
driver (:mod:`onceflow.sinks.delta.files`), also as the ``onceflow_delta`` format
(:mod:`onceflow.sinks.delta.source`).
"""

from onceflow.sinks.delta.sink import DeltaTablesSink

__all__ = ["DeltaTablesSink"]
