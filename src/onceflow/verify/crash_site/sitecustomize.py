"""Run by Python at the start of every process with this directory on ``PYTHONPATH``.

The verifier (and the tests) put it there for the processes they start and arm with crash points
(:mod:`onceflow.verify.crashes`): the driver, and every Python worker its Spark JVM starts, which
inherit the variable. It installs the crash hook; an environment without onceflow goes on as if
this file were not here.
"""

try:
    from onceflow.verify import crashes
except ImportError:  # another interpreter on the same path (e.g. a tool's venv)
    pass
else:
    crashes.install()
