"""Sinks that commit every micro-batch exactly once.

The contract every sink keeps is in :mod:`onceflow.sinks.base`; the marker row each commit
writes in :mod:`onceflow.sinks.marker`. Backends: :mod:`onceflow.sinks.sqlite`,
:mod:`onceflow.sinks.postgres`, :mod:`onceflow.sinks.delta`, :mod:`onceflow.sinks.http`.
Users make them with :func:`onceflow.sqlite`, :func:`onceflow.postgres`, :func:`onceflow.delta`
and :func:`onceflow.http`.
"""
