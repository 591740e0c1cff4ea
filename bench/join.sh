#!/usr/bin/env bash
# A fifth server joins four that hold 4 GiB (docs/benchmarks.md, "A server joins"): on a
# fresh cluster of 4 servers with 16 slots under /tmp, 4 GiB of files striped over every
# slot; io-easy (`shoal bench io -F`) is measured on the quiet cluster (with the local
# directory and tmpfs baselines), then again while `shoal server add --start` and
# `shoal server rebalance` move slots to a fifth server. Prints the share of the data the
# moves copied (bytes of the new server's data directory over all the data before), the
# io-easy rates and their ratio (the issue's targets: 15–25 % moved, io-easy ≥ 0.7×).
#
# Usage: bash bench/join.sh
# Environment:
#   JOIN_GIB      GiB written before the join (default 4)
#   JOIN_CLUSTER  the cluster's directory, removed first and at the end (default /tmp/shoal-join)
#   JOIN_JSON     where the JSON summary goes (default /tmp/shoal-join.json)
#   JOIN_RESYNC_MB_S  the servers' resync rate, MiB/s (shoald --resync-mb-s; default 32)
#   JOIN_RESYNC_BUSY_MB_S  the same while clients use a server (--resync-busy-mb-s; default 8)
# Only 127.0.0.1 is used. Needs about twice JOIN_GIB of free disk under /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
GIB=${JOIN_GIB:-4}
DIR=${JOIN_CLUSTER:-/tmp/shoal-join}
JSON=${JOIN_JSON:-/tmp/shoal-join.json}
[[ "$GIB" =~ ^[1-9][0-9]*$ ]] || { echo "bench/join.sh: JOIN_GIB must be a positive integer" >&2; exit 2; }

cargo build --release -p shoal
SHOAL="$CARGO_TARGET_DIR/release/shoal"
rm -rf "$DIR"
cleanup() {
    # `cluster down` stops the servers by the PIDs `cluster up` and `server add --start` recorded.
    if [[ -f "$DIR/cluster.toml" ]]; then
        "$SHOAL" cluster down --dir "$DIR" || echo "bench/join.sh: cluster down failed; servers may remain (see $DIR)" >&2
    fi
    rm -rf "$DIR"
}
trap cleanup EXIT

# Every shoald started below (cluster up, server add --start) reads it.
export SHOALD_RESYNC_MB_S=${JOIN_RESYNC_MB_S:-32}
export SHOALD_RESYNC_BUSY_MB_S=${JOIN_RESYNC_BUSY_MB_S:-8}
"$SHOAL" cluster up -n 4 --slots 16 --dir "$DIR" >/dev/null
export SHOAL_CONFIG="$DIR/cluster.toml"
echo "== filling: ${GIB} GiB in 4 files striped over all 16 slots"
"$SHOAL" bench io -T native -F -n 4 -t 1M -b "$((GIB * 256))M" --stripe-count -1 --phases write --keep \
    --base /fill -q >/dev/null
before=$(du -sb "$DIR"/s[0-3] | awk '{s += $1} END {print s}')

IO=(bench io -F -n 2 -t 1M -b 512M --stripe-count -1 -q)
echo "== io-easy on the quiet cluster (with the local and tmpfs baselines)"
"$SHOAL" "${IO[@]}" -T native,local:"$DIR/local",tmpfs --reps 3 --json-file "$DIR/quiet.json"

echo "== io-easy while a fifth server joins and takes its slots"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$SHOAL" server add 16 --addr "127.0.0.1:$port" --data-dir "$DIR/s16" --start >/dev/null
started=$(date +%s.%N)
"$SHOAL" server rebalance --json >"$DIR/moves.json" &
rebalance=$!
# io-easy again and again until the moves are done, so that the rate covers all of them.
runs=0
while (( runs == 0 )) || kill -0 "$rebalance" 2>/dev/null; do
    runs=$((runs + 1))
    "$SHOAL" "${IO[@]}" -T native --json-file "$DIR/during-$runs.json"
done
wait "$rebalance"
took=$(echo "$(date +%s.%N) - $started" | bc)
jq -s '{runs: [.[].runs[]]}' "$DIR"/during-*.json >"$DIR/during.json"
moved=$(du -sb "$DIR/s16" | awk '{print $1}')

rate() { jq "[.runs[] | select(.target == \"native\") | .phases[] | select(.label == \"$2\") | .mib_s] | add / length" "$1"; }
qw=$(rate "$DIR/quiet.json" write); qr=$(rate "$DIR/quiet.json" read)
dw=$(rate "$DIR/during.json" write); dr=$(rate "$DIR/during.json" read)
jq -n --argjson before "$before" --argjson moved "$moved" --argjson qw "$qw" --argjson qr "$qr" \
    --argjson dw "$dw" --argjson dr "$dr" --argjson took "$took" --slurpfile moves "$DIR/moves.json" '{
      data_bytes: $before, moved_bytes: $moved, moved_share: ($moved / $before),
      rebalance_s: $took, moves: $moves[0], io_easy_runs_during: '"$runs"',
      io_easy_mib_s: {quiet: {write: $qw, read: $qr}, during: {write: $dw, read: $dr}},
      ratio: {write: ($dw / $qw), read: ($dr / $qr)}}' | tee "$JSON"
