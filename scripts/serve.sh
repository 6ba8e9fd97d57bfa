#!/usr/bin/env bash
# Set up (scripts/setup.sh) and start the service on the embedded CPU default.
# Extra arguments go to `voice-agent serve` (e.g. --host 0.0.0.0 --port 8080).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/voice-agent serve "$@"
