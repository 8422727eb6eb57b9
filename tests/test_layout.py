"""The house: packages by role along the data path, imports one way, no circles, modules of a readable size.

Walks every module of the installed package (its source, with ``ast``). Imports inside functions
count too: a lazy import is still a dependency. The rules:

* **Direction.** Each package has a rank along the data path; a module imports only modules of
  its own rank or lower (``errors``/``faults`` < ``checkpoint`` < ``runtime`` < ``sources`` <
  ``sinks`` < ``engine`` < ``api`` < the package's face and ``examples`` < ``ingest`` <
  ``verify``/``testing`` < ``cli``). ``from onceflow import Table`` counts as an import of the
  module the name comes from; the bare ``import onceflow`` (the package, for its location) counts
  as nothing.
* **No circles**, between modules of any rank.
* **Sinks**: ``sinks/_core`` imports no system's package; a system imports another only where
  :data:`CROSS_SYSTEM` says why.
* **Size**: no module over :data:`MAX_LINES` lines.
* **The root** holds only :data:`ROOT_MODULES` and the packages of :data:`RANK`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import onceflow

ROOT = Path(onceflow.__file__).parent

RANK = {"errors": 0, "faults": 0, "checkpoint": 1, "runtime": 2, "sources": 3, "sinks": 4, "engine": 5,
        "api": 6, "": 7, "examples": 7, "ingest": 8, "verify": 9, "testing": 9, "cli": 10}
"""Rank along the data path of each top-level part of the package ("": the package's ``__init__``)."""

ROOT_MODULES = {"__init__.py", "errors.py", "faults.py", "testing.py", "py.typed"}

CROSS_SYSTEM = {
    ("http", "sqlite"): "the HTTP sink's ledger is a SQLite database (its connection and registry)",
    ("http", "postgres"): "or a PostgreSQL one (its connection and SQL)",
    ("iceberg", "delta"): "an Iceberg append's files are written by Spark's Parquet writer as Delta's are",
}
"""Sink systems that import another system's modules: (importer, imported) -> why."""

MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def resolve(name: str, modules: dict[str, object]) -> str | None:
    """The module an imported name is (or is in); None for the bare package."""
    if name == "onceflow":
        return None
    while name not in modules:
        head, _, tail = name.rpartition(".")
        if head == "onceflow" and tail in onceflow._WHERE:  # a public name: its module
            return onceflow._WHERE[tail]
        name = head
    return name if name != "onceflow" else None


def imports_of(path: Path) -> set[str]:
    """Every onceflow name a module imports (``from a import b`` gives ``a.b``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("onceflow"):
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("onceflow"))
    return found


def graph(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module -> the modules it imports (resolved; itself and its own packages left out)."""
    out: dict[str, set[str]] = {}
    for mod, names in modules.items():
        targets = {resolve(n, modules) for n in names}
        out[mod] = {t for t in targets if t and t != mod and not mod.startswith(t + ".")}
    return out


def package_imports() -> dict[str, set[str]]:
    return {name: imports_of(path) for name, path in MODULES.items()}


def part(module: str) -> str:
    bits = module.split(".")
    return bits[1] if len(bits) > 1 else ""


def against_the_direction(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} ({part(m) or 'onceflow'}) imports {t} ({part(t)})"
                  for m, ts in edges.items() for t in ts if RANK[part(t)] > RANK[part(m)])


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def sink_system(module: str) -> str | None:
    bits = module.split(".")
    return bits[2] if len(bits) > 2 and bits[1] == "sinks" else None


def across_sinks(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, ts in edges.items():
        mine = sink_system(m)
        for t in ts:
            theirs = sink_system(t)
            if mine is None or theirs is None or mine == theirs or theirs == "_core":
                continue
            if mine == "_core" or (mine, theirs) not in CROSS_SYSTEM:
                bad.append(f"{m} imports {t}")
    return sorted(bad)


def test_the_walk_sees_every_part_and_real_imports() -> None:
    assert {part(m) for m in MODULES} == set(RANK)
    edges = graph(package_imports())
    assert "onceflow.verify.sinks" in edges["onceflow.cli.run"]
    assert "onceflow.sinks._core.tables" in edges["onceflow.api.stream"]  # `from onceflow... import Table`
    assert "onceflow.checkpoint.ranges" in edges["onceflow.engine.batch"]  # a function-level import


def test_every_import_goes_down_the_data_path() -> None:
    assert against_the_direction(graph(package_imports())) == []


def test_no_import_circles() -> None:
    assert circles(graph(package_imports())) == []


def test_sink_systems_share_only_the_core() -> None:
    assert across_sinks(graph(package_imports())) == []


def test_modules_are_of_a_readable_size() -> None:
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_root_holds_the_face_and_the_parts_only() -> None:
    here = {p.name for p in ROOT.iterdir() if not p.name.startswith(("__pycache__", "."))}
    assert here - ROOT_MODULES == {p for p in RANK if p and p not in ("errors", "faults", "testing")}


def test_the_checks_can_fail() -> None:
    """A sink importing the engine, a circle, _core importing a system, or one system another: reported."""
    edges = graph(package_imports())
    edges["onceflow.sinks.sqlite.sink"] = edges["onceflow.sinks.sqlite.sink"] | {"onceflow.engine.batch"}
    assert against_the_direction(edges) == [
        "onceflow.sinks.sqlite.sink (sinks) imports onceflow.engine.batch (engine)"]
    edges = graph(package_imports())
    edges["onceflow.runtime.java"] = edges["onceflow.runtime.java"] | {"onceflow.runtime.session"}
    assert ["onceflow.runtime.java", "onceflow.runtime.session"] in [
        [m for m in c if m in ("onceflow.runtime.java", "onceflow.runtime.session")] for c in circles(edges)]
    edges = graph(package_imports())
    edges["onceflow.sinks._core.base"] = edges["onceflow.sinks._core.base"] | {"onceflow.sinks.sqlite.db"}
    edges["onceflow.sinks.delta.sink"] = edges["onceflow.sinks.delta.sink"] | {"onceflow.sinks.kafka.sink"}
    assert across_sinks(edges) == ["onceflow.sinks._core.base imports onceflow.sinks.sqlite.db",
                                   "onceflow.sinks.delta.sink imports onceflow.sinks.kafka.sink"]


def test_no_negative_control_mode_in_the_production_sinks() -> None:
    """``naive`` / ``lossy`` sinks are subclasses in the verifier, not modes of the library's sinks."""
    for path in (ROOT / "sinks").rglob("*.py"):
        text = path.read_text()
        assert "naive" not in text and "lossy" not in text, path


TEST_HOOKS = ("ONCEFLOW_CRASH_AT", "ONCEFLOW_DRIVER_PID", "ONCEFLOW_INGEST_DROP_ACKS", "CRASH_ENV",
              "DRIVER_PID_ENV", "DROP_ACKS_ENV")


def hook_readers(modules: dict[str, Path]) -> list[str]:
    """Modules outside the verifier (and the command line that runs it) that name a test hook."""
    return sorted(m for m, p in modules.items() if part(m) not in ("verify", "testing", "cli")
                  and any(h in p.read_text() for h in TEST_HOOKS))


def test_no_library_module_reads_a_test_hook() -> None:
    """Crash points are named by the library and armed by the verifier's hook only."""
    assert hook_readers(MODULES) == []
    assert "onceflow.faults" not in graph(package_imports())["onceflow.runtime.session"]  # a session only
    probe = ROOT / "verify" / "crashes.py"
    assert hook_readers({**MODULES, "onceflow.sinks.probe": probe}) == ["onceflow.sinks.probe"]
