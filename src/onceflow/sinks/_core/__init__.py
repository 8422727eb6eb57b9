"""What every sink shares.

:mod:`~onceflow.sinks._core.base` (the contract as types: the commit steps every sink numbers
the same), :mod:`~onceflow.sinks._core.marker` (the row each batch's commit writes),
:mod:`~onceflow.sinks._core.tables` (``Table``: write modes, keys, the checks of a batch),
:mod:`~onceflow.sinks._core.tasks` (executors write, the driver commits: the task framework),
:mod:`~onceflow.sinks._core.owners` (a table knows which sink writes it),
:mod:`~onceflow.sinks._core.several` (several sinks of one query) and
:mod:`~onceflow.sinks._core.retry` (short outages retried inside the batch).

Imports one way: ``_core`` imports no sink system's package.
"""
