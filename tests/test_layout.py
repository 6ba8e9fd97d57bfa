"""Dependencies point one way: core/ imports none of the project's other packages, models/ imports
only core/, and pipeline/ never app/."""

from __future__ import annotations

import ast
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


def test_no_class_is_made_of_several_bases() -> None:
    """A part of a call is composed, never mixed in: a class with several bases shares one state
    among them, and a reader following a call loses sight at every hop."""
    mixed = [f"{path.relative_to(ROOT)}:{node.name}"
             for package in PROJECT for path in (ROOT / package).rglob("*.py")
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ClassDef) and len(node.bases) > 1]
    assert not mixed
