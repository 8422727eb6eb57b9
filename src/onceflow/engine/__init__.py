"""One micro-batch on the driver, and the checks before the start, in step order.

:mod:`~onceflow.engine.start` (``write_stream``'s options and its numbered start),
:mod:`~onceflow.engine.startup` (what the start checks before Spark starts the query),
:mod:`~onceflow.engine.batch` (the ``foreachBatch`` function: bind, guard, stabilize, write,
commit), :mod:`~onceflow.engine.stable` (stable input), :mod:`~onceflow.engine.contract` (which
records are bad), :mod:`~onceflow.engine.rejects` (the bad records read back),
:mod:`~onceflow.engine.progress` (batch metrics on Spark Connect) and
:mod:`~onceflow.engine.serverside` (steps run where the checkpoint is).

Imports one way: ``engine`` may import ``sinks``, ``sources``, ``runtime`` and ``checkpoint``.
"""
