"""Delta Lake tables, each micro-batch exactly once per table (delta-rs, no JVM).

:class:`onceflow.sinks.delta.sink.DeltaTablesSink` (``onceflow.delta(...)``): the sink and its
commit protocol; large batches written by Spark's tasks and committed by the driver
(:mod:`onceflow.sinks.delta.files`, :mod:`onceflow.sinks.delta.spark_files`), also as the
``onceflow_delta`` format (:mod:`onceflow.sinks.delta.datasource`); compaction and vacuum
(:mod:`onceflow.sinks.delta.maintain`). The package imports nothing: a task imports its modules.
"""
