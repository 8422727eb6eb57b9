"""The embedded SQLite sink: :class:`onceflow.sinks.sqlite.sink.SQLiteTablesSink`."""
