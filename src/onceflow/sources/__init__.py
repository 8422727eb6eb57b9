"""Replayable sources: the event log and Kafka.

The event log is :mod:`~onceflow.sources.log` (its record in :mod:`~onceflow.sources.events`);
Kafka is :mod:`onceflow.sources.kafka`. The package imports nothing; ``onceflow.EventLog`` and
``onceflow.read_kafka`` import their module.
"""
