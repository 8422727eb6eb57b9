"""What users call: the face of onceflow.

:mod:`~onceflow.api.stream` (``write_stream``, ``deduplicate`` and the sink constructors),
:mod:`~onceflow.api.query` (the running query), :mod:`~onceflow.api.realtime` (Real-Time Mode's
face), :mod:`~onceflow.api.pipelines` (a user's pipeline as ``PATH.py:FUNCTION``) and
:mod:`~onceflow.api.durations`. The package imports nothing: ``onceflow``'s own names
(``onceflow.write_stream``, ...) import their module when first used.

Imports one way: ``api`` may import ``engine``, ``sinks``, ``sources``, ``runtime`` and
``checkpoint``; none of them imports ``api`` (``tests/test_layout.py``).
"""
