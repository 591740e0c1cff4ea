#!/usr/bin/env bash
# Second command of the README: run the whole test suite (unit, property and integration
# tests; integration tests start real shoald processes on 127.0.0.1).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
missing=()
for pkg in $SHOAL_DEBIAN_PACKAGES; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
cargo test --release --workspace "$@"
