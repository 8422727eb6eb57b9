"""The verifier wing: proof that a pipeline is exactly once under injected faults.

The oracle and the recomputation (:mod:`~onceflow.verify.oracle`, :mod:`~onceflow.verify.recompute`),
the fault rounds (:mod:`~onceflow.verify.chaos`), the rigs they drive (driver processes, a
standalone cluster, a Kafka broker, the demo HTTP service, the ingest service), the
``--sink`` registry with its negative controls (:mod:`~onceflow.verify.sinks`), the input
generator, and the verdict and its report. Nothing in the library or the ingest service
imports this package.
"""
