"""Apache Iceberg tables through a pyiceberg catalog, each micro-batch exactly once per table.

:class:`onceflow.sinks.iceberg.sink.IcebergTablesSink` (``onceflow.iceberg(...)``): the sink and
its commit protocol; :mod:`onceflow.sinks.iceberg.merge` (keyed tables). The package imports
nothing.
"""
