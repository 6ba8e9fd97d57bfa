"""What a test needs from the machine that the set-up installs (scripts/setup.sh --test): a server
(PostgreSQL, Redis, HAProxy, SeaweedFS, a Docker engine), a tool (kubectl, promtool, Docker Compose)
or a browser. Where one is missing, the test is skipped on a developer's machine; under CI (CI=true,
as .ci/run sets it) the set-up ran, so a missing one means it broke: the test fails and says what."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing(what: str) -> NoReturn:
    """Skip the test for want of `what`, or under CI fail it."""
    if under_ci():
        pytest.fail(f"{what} (CI=true: the set-up should have installed it, so the run fails instead of skipping)",
                    pytrace=False)
    pytest.skip(what)
