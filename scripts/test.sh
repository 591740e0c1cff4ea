#!/usr/bin/env bash
# Second command of the README: run the whole test suite: Rust (unit, property and
# integration tests; integration tests start real shoald processes on 127.0.0.1), C (the C
# library's tests compile C programs, from cargo's tests) and Python (pytest against a real
# cluster, after the package is built and installed).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
shoal_install_missing
cargo test --release --workspace "$@"
shoal_install_python_package
echo "== pytest (crates/python/tests)"
SHOAL_BIN="$CARGO_TARGET_DIR/release/shoal" python3 -m pytest -q -p no:cacheprovider crates/python/tests
