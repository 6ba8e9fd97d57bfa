"""Fuzz tests count their cases here; the total is printed at the end of the run (docs/reliability.md)."""

from __future__ import annotations

from typing import Any

from tests.fuzz.harness import CASES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if CASES:
        parts = ", ".join(f"{name} {n}" for name, n in sorted(CASES.items()))
        terminalreporter.write_line(f"fuzz: {sum(CASES.values())} cases ({parts})")
