"""The Apache Iceberg sink (see :mod:`onceflow.sinks.iceberg.sink`)."""

from onceflow.sinks.iceberg.sink import IcebergTablesSink

__all__ = ["IcebergTablesSink"]
