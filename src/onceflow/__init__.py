"""onceflow: exactly-once stream processing for PySpark Structured Streaming.

The names a user needs::

    import onceflow
    clean = onceflow.deduplicate(events, id="payment_id", event_time="ts", within="10 minutes")
    query = onceflow.write_stream(clean, sink=onceflow.sqlite("app.db"), checkpoint="ck/",
                                  tables={"revenue": onceflow.Table(key=["account"], add=["amount"])},
                                  per_batch=to_revenue)
"""

from onceflow.api import deduplicate, delta, http, kafka, postgres, sqlite, write_stream
from onceflow.contract import expect
from onceflow.errors import BatchRejectedError, ConfigError, OnceflowError
from onceflow.query import OnceQuery
from onceflow.realtime import write_realtime
from onceflow.sources.kafka import read_kafka
from onceflow.sources.log import EventLog
from onceflow.tables import Table

__version__ = "0.1.0"

__all__ = ["BatchRejectedError", "ConfigError", "EventLog", "OnceQuery", "OnceflowError", "Table",
           "__version__", "deduplicate", "delta", "expect", "http", "kafka", "postgres", "read_kafka",
           "sqlite", "write_realtime", "write_stream"]
