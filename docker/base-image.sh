#!/usr/bin/env bash
# Build the CPU image's base without an image registry: Debian bookworm with Python 3.11, made from
# this machine's own Debian mirror (the one apt is configured with) by mmdebstrap, and imported into
# the local container engine. It stands in for python:3.11-slim-bookworm: `python` and `pip` are on
# PATH (a virtualenv in /opt/python, so pip may install into it), apt reads the same mirror, and the
# certificate authorities this machine added to its own trust (/usr/local/share/ca-certificates: a
# company proxy's, say) are trusted inside too, by apt, pip and Python alike.
#
#   docker/base-image.sh                      # imports voice-agent-base:bookworm-py3.11
#   docker/base-image.sh my/base:tag          # another name
#   VOICE_AGENT_BASE_IMAGE=voice-agent-base:bookworm-py3.11 docker compose --profile cpu build voice-agent-cpu
#
# Needs root (mmdebstrap's root mode), mmdebstrap, and a running Docker engine. DEBIAN_MIRROR
# overrides the mirror read from apt's sources.
set -euo pipefail

tag=${1:-voice-agent-base:bookworm-py3.11}
suite=bookworm

mirror_from_apt() {
  # The first http(s) URI of a Debian suite in apt's sources: deb822 (.sources) or one-line (.list).
  local files=(/etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list /etc/apt/sources.list)
  local f
  for f in "${files[@]}"; do
    [ -f "$f" ] || continue
    if [[ "$f" == *.sources ]]; then
      awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/ && $i !~ /security/) {print $i; exit}}' "$f"
    else
      awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/ && $i !~ /security/) {print $i; exit}}' "$f"
    fi
  done | head -n 1
}

mirror=${DEBIAN_MIRROR:-$(mirror_from_apt)}
if [ -z "$mirror" ]; then
  echo "error: no Debian mirror found in apt's sources; set DEBIAN_MIRROR to one" >&2
  exit 2
fi
for tool in mmdebstrap docker; do
  command -v "$tool" >/dev/null || { echo "error: $tool is not installed (Debian: apt-get install mmdebstrap docker.io)" >&2; exit 2; }
done
docker info >/dev/null 2>&1 || { echo "error: no Docker engine answers (start dockerd, or set DOCKER_HOST)" >&2; exit 2; }

echo "==> building $tag: Debian $suite with Python 3.11 from $mirror"
start=$(date +%s)
# minbase plus Python; the virtualenv gets pip from Debian's python3-venv (ensurepip's bundled wheel).
# Docs, man pages and apt's lists are left out, as in the slim images.
local_cas=/usr/local/share/ca-certificates
hooks=()
if compgen -G "$local_cas/*.crt" >/dev/null; then
  echo "    trusting this machine's own certificate authorities: $(cd "$local_cas" && echo *.crt)"
  hooks+=(--customize-hook="copy-in $local_cas /usr/local/share" --customize-hook='chroot "$1" update-ca-certificates')
fi
mmdebstrap --variant=minbase --mode=root --format=tar \
  --include=ca-certificates,python3,python3-venv,python3-dev,tzdata \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='chroot "$1" python3 -m venv /opt/python' \
  "${hooks[@]}" \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  "$suite" - "$mirror" \
  | docker import \
      --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' \
      --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
      --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
      --change 'ENV REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt' \
      --change 'CMD ["python"]' \
      - "$tag" >/dev/null
echo "==> $tag imported in $(( $(date +%s) - start )) s: $(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1 / 1e6}')"
