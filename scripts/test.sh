#!/usr/bin/env bash
# Set up (scripts/setup.sh --test) and run the whole test suite: lint, types, unit tests and the
# end-to-end tests with real models, real sockets and real audio. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
echo "==> ruff"
.venv/bin/ruff check .
echo "==> mypy"
.venv/bin/mypy
echo "==> pip-audit"
.venv/bin/python scripts/audit.py
echo "==> pytest"
exec .venv/bin/pytest -ra "$@"
