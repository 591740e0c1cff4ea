#!/usr/bin/env bash
# First command of the README: install what is missing, build, and run Shoal's main job
# (`shoal demo`) on an embedded 4-server cluster. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

need=()
for pkg in $SHOAL_DEBIAN_PACKAGES; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing Debian packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust (https://rustup.rs) and run this again" >&2
  exit 1
fi

echo "== building (release) into $CARGO_TARGET_DIR"
cargo build --release --workspace --bins
echo "== running the demo"
"$CARGO_TARGET_DIR/release/shoal" demo "$@"
