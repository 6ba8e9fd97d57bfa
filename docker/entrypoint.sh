#!/bin/sh
# Entry point of the voice-agent images (docker/Dockerfile, docker/Dockerfile.cuda).
#
#   (no arguments)        fetch the model packs the settings need, then serve (the images set
#                         VOICE_AGENT_SERVER__HOST=0.0.0.0 and VOICE_AGENT_SERVER__PORT=8000)
#   serve [options]       the same, with `voice-agent serve` options
#   models fetch|list ... any other `voice-agent` command, as is
#   anything else         run as a command (e.g. `bash`)
#
# Packs are fetched into VOICE_AGENT_CACHE (/models, a volume) once; later starts find them there.
# Set VOICE_AGENT_SKIP_FETCH=1 to skip the check (the service then says which pack is missing).
set -eu

if [ "$#" -eq 0 ]; then
    set -- serve
fi

if [ "$1" = "serve" ] && [ "${VOICE_AGENT_SKIP_FETCH:-0}" != "1" ]; then
    # The packs that these settings load (app/needed_packs.py): the ASR and end-of-turn models, and
    # the LLMs only when the embedded engine runs.
    packs=$(python -c 'from app.needed_packs import needed_packs; from app.settings import Settings; print(" ".join(needed_packs(Settings())))')
    if [ -n "$packs" ]; then
        # shellcheck disable=SC2086  # one word per pack name
        voice-agent models fetch $packs
    fi
fi

case "$1" in
    serve | models) exec voice-agent "$@" ;;
    *) exec "$@" ;;
esac
