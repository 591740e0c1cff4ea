#!/usr/bin/env bash
# Run `shoal bench suite` on a fresh 4-server cluster on this machine and rewrite
# docs/benchmarks.md. Usage: bash bench/run-suite.sh [extra suite options, e.g. --reps 1]
# Needs root for dropping the page cache (cold reads) and /dev/fuse for the FUSE target.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo build --release -p shoal
SHOAL="$CARGO_TARGET_DIR/release/shoal"
DIR="${SHOAL_BENCH_CLUSTER:-/tmp/benchcluster}"
rm -rf "$DIR"
"$SHOAL" cluster up --servers 4 --dir "$DIR"
trap '"$SHOAL" cluster down --dir "$DIR"; rm -rf "$DIR"' EXIT
# The local baseline lives on the same disk as the servers' data.
mkdir -p "$DIR/local"
"$SHOAL" --config "$DIR/cluster.toml" bench suite --local-dir "$DIR/local" "$@"
