#!/usr/bin/env bash
# Second command of the README: run the whole test suite (unit, property and integration
# tests; integration tests start real shoald processes on 127.0.0.1).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
shoal_install_missing
cargo test --release --workspace "$@"
