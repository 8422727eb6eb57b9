"""The ``onceflow`` command line, one module per command."""
