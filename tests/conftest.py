"""For the whole test run: the call store writes under a temporary folder, never under the user's
own data folder (apps made by the tests, and servers they start, inherit this environment)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_VARIABLE = "VOICE_AGENT_STORAGE__DATA_DIR"
_made: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get(_VARIABLE):
        folder = tempfile.mkdtemp(prefix="voice-agent-test-data-")
        _made.append(folder)
        os.environ[_VARIABLE] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    for folder in _made:
        shutil.rmtree(folder, ignore_errors=True)
