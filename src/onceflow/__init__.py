"""onceflow: exactly-once stream processing for PySpark Structured Streaming."""

from onceflow.errors import OnceflowError
from onceflow.sources.log import EventLog

__version__ = "0.1.0"

__all__ = ["EventLog", "OnceflowError", "__version__"]
