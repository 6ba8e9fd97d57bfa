"""scripts/audit.py's verdicts on pip-audit's JSON report: a vulnerability fails, an unreachable
service warns and passes, an ignore entry needs a reason."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest


def audit() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "scripts" / "audit.py"
    spec = importlib.util.spec_from_file_location("audit", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["audit"] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def test_a_known_vulnerability_fails() -> None:
    verdict = audit().judge({"dependencies": [
        {"name": "ok", "version": "1", "vulns": []},
        {"name": "bad", "version": "2", "vulns": [{"id": "GHSA-1", "fix_versions": ["3"]}]},
    ]})
    assert not verdict.ok and "bad 2: GHSA-1 (fixed in 3)" in verdict.message


def test_nothing_audited_warns_and_passes() -> None:
    verdict = audit().judge({"dependencies": [{"name": "x", "version": "1", "skip_reason": "not found"}]})
    assert verdict.ok and "WARNING" in verdict.message and "NOT audited" in verdict.message


def test_clean_packages_pass() -> None:
    verdict = audit().judge({"dependencies": [{"name": "x", "version": "1", "vulns": []},
                                              {"name": "y", "version": "1", "skip_reason": "not found"}]})
    assert verdict.ok and verdict.message.startswith("1 packages audited") and "1 not found" in verdict.message


def test_ignores_need_a_reason() -> None:
    module = audit()
    assert module.read_ignores("# c\nGHSA-1  only the CLI, unused here  # note\n\n") == {
        "GHSA-1": "only the CLI, unused here"}
    with pytest.raises(ValueError, match="no reason"):
        module.read_ignores("GHSA-2\n")
