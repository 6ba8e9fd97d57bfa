#!/usr/bin/env bash
# Set up (scripts/setup.sh) and start the service on the embedded CPU default.
# Extra arguments go to `voice-agent serve` (e.g. --host 0.0.0.0 --port 8080).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The demo's fictional bakery (agent.facts_file, README) unless facts are set otherwise: in the
# environment (VOICE_AGENT_AGENT__FACTS_FILE=, empty, for none) or in a settings file.
if [[ -z "${VOICE_AGENT_CONFIG:-}" && -z "${VOICE_AGENT_AGENT__FACTS_FILE+set}" ]]; then
    export VOICE_AGENT_AGENT__FACTS_FILE="$PWD/deploy/demo_facts.txt"
fi
exec .venv/bin/voice-agent serve "$@"
