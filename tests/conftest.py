"""For the whole test run: the call store writes under a temporary folder, never under the user's
own data folder (apps made by the tests, and servers they start, inherit this environment)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from app.redact import VALUE_LOGGERS
from core.private import caller_content, set_caller_content

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


@pytest.fixture(autouse=True)
def _log_privacy_put_back() -> Iterator[None]:
    """An app made by a test sets the process-wide log privacy (server.log_caller_content) and the
    levels of the libraries it holds back: each test gets them back as they were, so no test
    depends on which ran before it."""
    before = caller_content()
    levels = {name: logging.getLogger(name).level for name in VALUE_LOGGERS}
    yield
    set_caller_content(before)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
