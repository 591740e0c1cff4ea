#!/usr/bin/env bash
# First command of the README: install what is missing, build every artefact the docs
# promise, install them (scripts/install.sh, into PREFIX, default /usr/local), install the
# Python package, and run Shoal's main job (`shoal demo`) on an embedded 4-server cluster.
# Safe to run again. Arguments go to `shoal demo` (`--servers 8`, say).
#
# Environment: PREFIX (default /usr/local; SKIP_INSTALL=1 installs nothing there),
# CARGO_TARGET_DIR (default ~/.cache/shoal/target), MOUNT_HELPER_DIR (scripts/install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
t0=$SECONDS

shoal_install_missing
if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust (https://rustup.rs) and run this again" >&2
  exit 1
fi

# One build of the whole workspace: the binaries, the C and container libraries (shared and
# static, with their generated headers and pkg-config files), the preload and audit
# libraries. Every package resolves its dependencies' features as the workspace does
# (crates/workspace-hack), so the wheel below and any later `cargo build -p` reuse it; the
# Python extension itself is built once, by maturin (SHOAL_NOT_CARGO).
echo "== building (release) into $CARGO_TARGET_DIR"
cargo build --release --workspace $SHOAL_NOT_CARGO
shoal_install_python_package

if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  prefix=${PREFIX:-/usr/local}
  sudo=""
  if ! { [ -w "$prefix" ] || { [ ! -e "$prefix" ] && [ -w "$(dirname "$prefix")" ]; }; }; then
    sudo="sudo"
  fi
  $sudo env PREFIX="$prefix" CARGO_TARGET_DIR="$CARGO_TARGET_DIR" ${MOUNT_HELPER_DIR+MOUNT_HELPER_DIR="$MOUNT_HELPER_DIR"} \
    bash scripts/install.sh
fi

echo "== running the demo"
"$CARGO_TARGET_DIR/release/shoal" demo "$@"
echo "setup: done in $((SECONDS - t0)) s"
