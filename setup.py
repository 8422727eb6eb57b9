"""Builds onceflow's jars into the wheel (the project's metadata is in pyproject.toml).

``build_py`` first compiles the Scala sources of ``src/onceflow/jvm`` into ``src/onceflow/jvm/lib``
with the Scala compiler of the PySpark in the build environment (:func:`onceflow.scalac.build_shipped`;
no network), so an installed onceflow starts a session without compiling and
``onceflow jars path onceflow`` has jars to print for ``spark-submit --jars``. Without Java or
PySpark at build time the wheel carries no jars and says so; they are then compiled on first use.
``ONCEFLOW_BUILD_JARS=0`` skips the step.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SRC = Path(__file__).resolve().parent / "src"


def ship_jars() -> None:
    """Compile the shipped jars in the source tree, or say why the wheel goes without them."""
    if os.environ.get("ONCEFLOW_BUILD_JARS", "1").strip().lower() in ("0", "false", "no"):
        return
    saved = {k: v for k, v in sys.modules.items() if k == "onceflow" or k.startswith("onceflow.")}
    package = types.ModuleType("onceflow")  # the modules the build needs, without onceflow's imports
    package.__path__ = [str(SRC / "onceflow")]
    sys.modules["onceflow"] = package
    try:
        from onceflow import scalac

        for jar in scalac.build_shipped():
            print(f"onceflow: shipping {jar.relative_to(SRC)}")
    except Exception as exc:  # noqa: BLE001 - any reason: the wheel still works, compiling on first use
        print(f"onceflow: WARNING: the wheel carries no prebuilt jars ({type(exc).__name__}: {exc}); "
              "they will be compiled on first use", file=sys.stderr)
    finally:
        for k in [k for k in sys.modules if k == "onceflow" or k.startswith("onceflow.")]:
            del sys.modules[k]
        sys.modules.update(saved)


class BuildWithJars(build_py):
    """``build_py`` that compiles onceflow's jars first."""

    def run(self) -> None:
        """Compile the jars, then copy the package (with them) as usual."""
        ship_jars()
        super().run()


setup(cmdclass={"build_py": BuildWithJars})
