"""Sinks that commit every micro-batch exactly once: one folder per system.

What every sink shares is in :mod:`onceflow.sinks._core` (the contract, the marker, table specs,
the task framework). Systems: :mod:`~onceflow.sinks.sqlite`, :mod:`~onceflow.sinks.postgres`,
:mod:`~onceflow.sinks.delta`, :mod:`~onceflow.sinks.iceberg`, :mod:`~onceflow.sinks.kafka` and
:mod:`~onceflow.sinks.http`; each has ``sink.py`` (the driver side) and, where Spark's tasks
write, its task module and data source. Users make them with :func:`onceflow.sqlite`,
:func:`onceflow.postgres`, :func:`onceflow.delta`, :func:`onceflow.iceberg`,
:func:`onceflow.kafka` and :func:`onceflow.http`.

The packages import nothing: a Spark worker running one sink's task imports that task's modules
only.
"""
