"""Dependencies point one way: core/ imports none of the project's other packages, models/ imports
only core/, and pipeline/ never app/."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {"core": {"core"}, "models": {"core", "models"}, "pipeline": {"core", "models", "pipeline"}}
PROJECT = {"app", "core", "models", "pipeline"}


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & PROJECT


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_what_is_below_it(package: str) -> None:
    wrong = {str(p.relative_to(ROOT)): sorted(imported_packages(p) - ALLOWED[package])
             for p in (ROOT / package).rglob("*.py")}
    assert not {k: v for k, v in wrong.items() if v}


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


# Inside a package, folders that must not reach into others (module prefix -> prefixes it must not import).
# app/main.py wires the routes: it alone, outside app/transports, imports a transport.
FOLDERS_BELOW = {
    "app": ("app.transports",),
    "models.packs": ("models.llm", "models.speech", "models.speculative", "models.registry"),
    "models.speech": ("models.llm", "models.speculative"),
}
WIRING = {"app.main"}


@pytest.mark.parametrize("folder", sorted(FOLDERS_BELOW))
def test_folders_inside_a_package_import_only_what_is_below_them(folder: str) -> None:
    wrong = {}
    for path in (ROOT / folder.replace(".", "/")).rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if module in WIRING or any(module.startswith(f"{below}.") for below in FOLDERS_BELOW[folder]):
            continue  # (a transport may import another module of its own folder, and app.transports itself)
        bad = sorted(m for m in imported_modules(path)
                     if any(m == below or m.startswith(f"{below}.") for below in FOLDERS_BELOW[folder]))
        if bad:
            wrong[module] = bad
    assert not wrong


def test_no_class_is_made_of_several_bases() -> None:
    """A part of a call is composed, never mixed in: a class with several bases shares one state
    among them, and a reader following a call loses sight at every hop."""
    mixed = [f"{path.relative_to(ROOT)}:{node.name}"
             for package in PROJECT for path in (ROOT / package).rglob("*.py")
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ClassDef) and len(node.bases) > 1]
    assert not mixed


def _sleeps(node: ast.stmt) -> bool:
    call = node.value if isinstance(node, ast.Expr) else None
    call = call.value if isinstance(call, ast.Await) else call
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "sleep"
            and isinstance(call.func.value, ast.Name) and call.func.value.id in ("time", "asyncio"))


def _elapsed(node: ast.AST) -> bool:
    """`time.<clock>() - something`: a duration measured on the wall clock."""
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub) and isinstance(n.left, ast.Call)
               and isinstance(n.left.func, ast.Attribute) and isinstance(n.left.func.value, ast.Name)
               and n.left.func.value.id == "time" for n in ast.walk(node))


def test_unit_tests_wait_for_events_not_for_time() -> None:
    """A unit test never sleeps and then asserts that something happened or did not (a slow machine
    passes it, or fails it), and never bounds a duration read from the wall clock: it waits for the
    event, or moves a fake clock. (End-to-end and deployment tests run real servers and may wait.)"""
    found = []
    for path in (ROOT / "tests").rglob("test_*.py"):
        if {"e2e", "deploy"} & set(path.relative_to(ROOT / "tests").parts):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            body = getattr(node, "body", None)
            if not isinstance(body, list):
                continue
            found += [f"{path.relative_to(ROOT)}:{b.lineno}: asserts after a sleep"
                      for a, b in itertools.pairwise(body) if _sleeps(a) and isinstance(b, ast.Assert)]
            found += [f"{path.relative_to(ROOT)}:{n.lineno}: bounds a wall-clock duration"
                      for n in body if isinstance(n, ast.Assert) and _elapsed(n)]
    assert not found
