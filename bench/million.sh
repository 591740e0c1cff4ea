#!/usr/bin/env bash
# A million files in one shared directory (docs/benchmarks.md, "A million files in one
# directory"): on a fresh 4-server cluster under /tmp, 4 processes each create 250,000 empty
# files in one directory, process 0 lists it once (the run fails unless every name is
# listed exactly once), then the processes stat and remove their files; the same on tmpfs
# and on a local directory (the baselines). Prints the tables, whose column
# "last/first 10%" is the rate of each phase's last 10 % of operations over that of its
# first 10 % (the issue's target for create: at least 0.90), and writes the JSON report.
#
# Usage: bash bench/million.sh [extra `shoal bench md` options, e.g. -T native@16,tmpfs@16]
# Environment:
#   MILLION_FILES    files per process (default 250000; e.g. 2000 for a quick check)
#   MILLION_PROCS    processes (default 4)
#   MILLION_TARGETS  targets (default native,tmpfs,local:<cluster dir>/local)
#   MILLION_JSON     where the JSON report goes (default /tmp/shoal-million.json)
#   MILLION_CLUSTER  the cluster's directory, removed first and at the end (default /tmp/shoal-million)
# Only 127.0.0.1 is used. At full scale this takes a while and about 1 GB in /dev/shm for
# the tmpfs baseline (the files are removed by the unlink phase).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
FILES=${MILLION_FILES:-250000}
PROCS=${MILLION_PROCS:-4}
JSON=${MILLION_JSON:-/tmp/shoal-million.json}
DIR=${MILLION_CLUSTER:-/tmp/shoal-million}
TARGETS=${MILLION_TARGETS:-native,tmpfs,local:$DIR/local}
for n in "$FILES" "$PROCS"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "bench/million.sh: MILLION_FILES and MILLION_PROCS must be positive integers" >&2; exit 2; }
done

cargo build --release -p shoal
SHOAL="$CARGO_TARGET_DIR/release/shoal"
rm -rf "$DIR"
cleanup() {
    # `cluster down` stops the servers by the PIDs `cluster up` recorded.
    if [[ -f "$DIR/cluster.toml" ]]; then
        "$SHOAL" cluster down --dir "$DIR" || echo "bench/million.sh: cluster down failed; servers may remain (see $DIR)" >&2
    fi
    rm -rf "$DIR"
}
trap cleanup EXIT
trap 'echo "bench/million.sh: failed at line $LINENO" >&2' ERR
"$SHOAL" cluster up --servers 4 --dir "$DIR"
mkdir -p "$DIR/local"
echo "== $PROCS processes x $FILES files in one directory: create, list, stat, unlink on $TARGETS"
"$SHOAL" --config "$DIR/cluster.toml" bench md --shared-dir -n "$PROCS" -N "$FILES" \
    --phases create,list,stat,unlink -T "$TARGETS" --json-file "$JSON" -q "$@"
echo "== JSON report: $JSON"
