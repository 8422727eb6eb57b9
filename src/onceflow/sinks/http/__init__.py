"""Side effects on an HTTP service, exactly once: :mod:`onceflow.sinks.http.sink` and its ledger."""
