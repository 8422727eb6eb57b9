"""The PostgreSQL sinks: driver-side and executor-side (:mod:`onceflow.sinks.postgres.sink`)."""
