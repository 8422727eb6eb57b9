"""Kafka topics, each micro-batch exactly once for read_committed consumers.

:mod:`~onceflow.sinks.kafka.sink` (the driver side: the batch in one transaction with its marker
record), :mod:`~onceflow.sinks.kafka.tasks` (large batches produced by Spark's tasks, each in a
transaction of its own), :mod:`~onceflow.sinks.kafka.records` (reading the topics back) and
:mod:`~onceflow.sinks.kafka.owners` (which sink writes a topic).
"""
