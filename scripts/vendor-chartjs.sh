#!/usr/bin/env bash
# Vendor Chart.js for the call QA dashboard (docs/qa.md, "Dashboard"): fetch the npm package of the
# given version through npm's configured registry, copy its UMD build and licence into
# app/static/vendor/, and pin version and sha256 in app/static/vendor/manifest.json. The page never
# loads anything from the network; tests/app/test_qa_pages.py checks the file against the manifest.
#   scripts/vendor-chartjs.sh 4.4.9
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:?usage: scripts/vendor-chartjs.sh VERSION (such as 4.4.9)}"
vendor=app/static/vendor
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

tarball="$(cd "$work" && npm pack --silent "chart.js@$version")"
tar -xzf "$work/$tarball" -C "$work"
got="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' "$work/package/package.json")"
[ "$got" = "$version" ] || { echo "npm gave chart.js $got, not $version" >&2; exit 1; }
cp "$work/package/dist/chart.umd.js" "$vendor/chart.umd.js"
cp "$work/package/LICENSE.md" "$vendor/chart.js.LICENSE.md"

python3 - "$vendor" "$version" "$work/$tarball" <<'PY'
import base64, hashlib, json, pathlib, sys
vendor, version, tarball = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
manifest = {
    "chart.umd.js": {
        "package": "chart.js",
        "version": version,
        "from": "dist/chart.umd.js",
        "license": "MIT",
        "license_file": "chart.js.LICENSE.md",
        "sha256": hashlib.sha256((vendor / "chart.umd.js").read_bytes()).hexdigest(),
        "npm_integrity": "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode(),
    }
}
(vendor / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
print(json.dumps(manifest, indent=2))
PY
