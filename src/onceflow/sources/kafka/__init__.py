"""Kafka as a source.

:mod:`~onceflow.sources.kafka.source` (``read_kafka``: Spark's connector, or onceflow's own
reader), :mod:`~onceflow.sources.kafka.native` (onceflow's reader, a Python data source),
:mod:`~onceflow.sources.kafka.read` (reading a partition's span) and
:mod:`~onceflow.sources.kafka.client_log` (the Kafka clients' logs, for sources and sinks).
"""
