#!/usr/bin/env bash
# Renders a dlprobe report to a PNG with headless Chromium (Debian's `chromium`, which
# scripts/setup.sh installs), for docs/: lab/gpu/screenshot.sh REPORT.html OUT.png [HEIGHT]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 REPORT.html OUT.png [HEIGHT]" >&2; exit 2; }
page=$(realpath "$1")
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
  --user-data-dir="$profile" --hide-scrollbars --window-size=1280,"${3:-5200}" \
  --screenshot="$(realpath -m "$2")" "file://$page" 2>/dev/null
echo "wrote $2"
