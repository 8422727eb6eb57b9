"""Builds onceflow's jars into the wheel (the project's metadata is in pyproject.toml).

``build_py`` first compiles the Scala sources of ``src/onceflow/runtime/jvm`` into ``src/onceflow/runtime/jvm/lib``
with the Scala compiler of the PySpark in the build environment (:func:`onceflow.runtime.scalac.build_shipped`;
no network), so an installed onceflow starts a session without compiling and
``onceflow jars path onceflow`` has jars to print for ``spark-submit --jars``. Without Java or
PySpark at build time the wheel carries no jars and says so; they are then compiled on first use.
``ONCEFLOW_BUILD_JARS=0`` skips the step.

``build_py`` also puts :data:`PTH_NAME` at the top of the install (site-packages): a start-up line
that imports onceflow in a Python whose path has the installed PySpark's own zip on it (Spark's
Python workers, ``spark-submit``'s driver), so PySpark is imported from its package, bytecode and
all (see ``onceflow._import_pyspark_from_its_package``). An editable install gets it too.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SRC = Path(__file__).resolve().parent / "src"
PTH_NAME = "onceflow-pyspark.pth"
PTH_LINE = ("import sys; 'pyspark' not in sys.modules and any(p.endswith('pyspark.zip') for p in sys.path)"
            " and __import__('onceflow')\n")
"""One line Python runs at start (a ``.pth`` line that begins with ``import``): a few string
comparisons in every process, and onceflow imported only where Spark put its zip on the path."""


def ship_jars() -> None:
    """Compile the shipped jars in the source tree, or say why the wheel goes without them."""
    if os.environ.get("ONCEFLOW_BUILD_JARS", "1").strip().lower() in ("0", "false", "no"):
        return
    saved = {k: v for k, v in sys.modules.items() if k == "onceflow" or k.startswith("onceflow.")}
    package = types.ModuleType("onceflow")  # the modules the build needs, without onceflow's imports
    package.__path__ = [str(SRC / "onceflow")]
    sys.modules["onceflow"] = package
    try:
        from onceflow.runtime import scalac

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
        """Compile the jars, copy the package (with them) as usual, then write the start-up line.

        A wheel takes the line from ``build_lib``; an editable install (PEP 660) packs only what
        ``install_lib`` holds besides its own path file, so there in that mode.
        """
        ship_jars()
        super().run()
        top = self.build_lib
        if getattr(self, "editable_mode", False):
            top = self.get_finalized_command("install").install_lib
        Path(top).mkdir(parents=True, exist_ok=True)
        Path(top, PTH_NAME).write_text(PTH_LINE, encoding="utf-8")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        """The package's files and the start-up line (so ``install`` and ``bdist_wheel`` list it)."""
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):  # written into the editable wheel itself (run)
            return outputs
        return [*outputs, str(Path(self.build_lib, PTH_NAME))]


setup(cmdclass={"build_py": BuildWithJars})
