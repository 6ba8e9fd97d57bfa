#!/usr/bin/env bash
# Set up everything on a fresh Debian machine with Python 3.11: Debian packages, a virtualenv with
# llama.cpp built for this CPU and the project, and the default model packs (fetched, verified,
# cached in ~/.cache/voice-agent or $VOICE_AGENT_CACHE).
#   scripts/setup.sh          what the service needs (no PyTorch)
#   scripts/setup.sh --test   plus what the test suite needs (the CPU build of PyTorch for the
#                             reference runtime, Chromium, promtool, test tools)
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-serve}
packages=(espeak-ng sox libspeexdsp1 cmake ninja-build build-essential)
if [ "$mode" = "--test" ]; then
  packages+=(chromium chromium-driver prometheus flite sip-tester baresip-core kamailio redis-server postgresql haproxy docker.io mmdebstrap)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing Debian packages: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  if [[ " ${missing[*]} " == *" kamailio "* ]] && command -v systemctl >/dev/null && systemctl is-active -q kamailio; then
    echo "==> stopping the kamailio service Debian started (the tests run their own; it would hold port 5060)"
    $sudo systemctl disable --now kamailio
  fi
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
scripts/build-llama-cpp.sh .venv/bin/python
echo "==> installing the project"
if [ "$mode" = "--test" ]; then
  # The CPU build of PyTorch first: a plain `torch` requirement would pull a CUDA build of several GB.
  if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "==> installing torch==2.13.0 (CPU)"
    .venv/bin/python -m pip install -q torch==2.13.0
  fi
  .venv/bin/python -m pip install -q -e ".[test]"
else
  .venv/bin/python -m pip install -q -e ".[llama]"
fi

echo "==> fetching the default models"
.venv/bin/voice-agent models fetch
if [ "$mode" = "--test" ]; then
  # another vocabulary, for the test that refuses a draft of another family
  .venv/bin/voice-agent models fetch smollm2-135m-instruct-q4_1
fi
