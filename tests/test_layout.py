"""The three wings import one way: library <- ingest service <- verifier <- command line.

``onceflow.testing`` (verify in a user's own tests) is part of the verifier.

Walks every module of the installed package (its source, with ``ast``) and checks that no
module imports a wing it must not see. Imports inside functions count too: a lazy import
is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import onceflow

ROOT = Path(onceflow.__file__).parent


def wing(module: str) -> str:
    """Which wing a module of onceflow belongs to."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] == "testing":  # the verifier's face in the user's tests
        return "verify"
    if len(parts) > 1 and parts[1] in ("verify", "ingest", "cli"):
        return parts[1]
    return "library"


MAY_NOT_IMPORT = {
    "library": {"ingest", "verify", "cli"},
    "ingest": {"verify", "cli"},
    "verify": {"cli"},
    "cli": set(),
}


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("onceflow"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # from onceflow import verify
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("onceflow"))
    return found


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_imports() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(ROOT.rglob("*.py"))}


def violations(modules: dict[str, set[str]]) -> list[str]:
    wings = set(MAY_NOT_IMPORT)
    bad = []
    for mod, imported_names in modules.items():
        for imported in sorted(imported_names):
            target = wing(imported)
            # "from onceflow import x": x is a name of the package, not a wing, unless it is one
            if imported.count(".") == 1 and imported.split(".")[1] not in wings:
                target = "library"
            if target in MAY_NOT_IMPORT[wing(mod)]:
                bad.append(f"{mod} ({wing(mod)}) imports {imported} ({target})")
    return bad


def test_every_module_is_in_a_wing_and_the_walk_sees_them() -> None:
    mods = package_imports()
    assert {"onceflow.api", "onceflow.verify.chaos", "onceflow.ingest.receiver", "onceflow.cli.main"} \
        <= set(mods)
    assert {wing(m) for m in mods} == set(MAY_NOT_IMPORT)
    assert "onceflow.verify.sinks" in mods["onceflow.cli.run"]  # the walk sees real imports


def test_no_wing_imports_one_further_along() -> None:
    assert violations(package_imports()) == []


def test_the_check_can_fail() -> None:
    """A library module that imported the verifier, or ingest the command line, is reported."""
    fake = {**package_imports(), "onceflow.sinks.probe": {"onceflow.verify.sinks"},
            "onceflow.ingest.probe": {"onceflow.cli", "onceflow.sources.log"}}
    assert sorted(violations(fake)) == ["onceflow.ingest.probe (ingest) imports onceflow.cli (cli)",
                                "onceflow.sinks.probe (library) imports onceflow.verify.sinks (verify)"]


def test_no_negative_control_mode_in_the_production_sinks() -> None:
    """``naive`` / ``lossy`` sinks are subclasses in the verifier, not modes of the library's sinks."""
    for path in (ROOT / "sinks").rglob("*.py"):
        text = path.read_text()
        assert "naive" not in text and "lossy" not in text, path
