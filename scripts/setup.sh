#!/usr/bin/env bash
# First command of the README: install what is missing, build, and run Shoal's main job
# (`shoal demo`) on an embedded 4-server cluster. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

shoal_install_missing
if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust (https://rustup.rs) and run this again" >&2
  exit 1
fi

echo "== building (release) into $CARGO_TARGET_DIR"
cargo build --release --workspace --bins
shoal_install_python_package
echo "== running the demo"
"$CARGO_TARGET_DIR/release/shoal" demo "$@"
