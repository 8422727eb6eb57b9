"""Spark's streaming checkpoint, read in one place.

:mod:`~onceflow.checkpoint.logs` (the offset, commit and source logs: which input and watermark
each batch had), :mod:`~onceflow.checkpoint.ranges` (a batch's input range, kept in its marker),
:mod:`~onceflow.checkpoint.logcheck` (the logs checked before a start),
:mod:`~onceflow.checkpoint.guard` (the sink and the checkpoint in step, at every start and batch)
and :mod:`~onceflow.checkpoint.repair` (``onceflow repair``).

Imports one way: ``checkpoint`` imports only :mod:`onceflow.errors`.
"""
