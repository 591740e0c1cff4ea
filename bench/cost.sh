#!/usr/bin/env bash
# What a change costs: two builds of Shoal, each with its own 4-server cluster and its own
# client, run io-easy, io-hard and md-easy alternately (old, new, old, new, ...), each run
# with the local directory (io) or tmpfs (md) as a baseline in the same invocation, so a
# change of machine load shows up in the baseline too. Prints medians and new/old ratios
# (docs/benchmarks.md, "Cost of formats and trust"). Needs root (cold reads drop the page
# cache). Only 127.0.0.1 is used.
#
# Usage: bash bench/cost.sh OLD_BIN_DIR NEW_BIN_DIR [REPS] [OUT_DIR]
#   *_BIN_DIR: folders holding `shoal` and `shoald` (e.g. a target/release of each commit).
#   Environment: COST_EXTRA_NEW="--flag ..." extra `cluster up` flags for the new cluster;
#   COST_AUTH_OLD / COST_AUTH_NEW=none|keys: that side's `[security] auth` (same binaries on
#   both sides with COST_AUTH_NEW=none measure what authentication and capabilities cost);
#   COST_IO_EASY_BLOCK (default 256M), COST_IO_HARD_SEGMENTS (1000), COST_MD_FILES (2000).
set -euo pipefail
OLD=${1:?usage: bench/cost.sh OLD_BIN_DIR NEW_BIN_DIR [REPS] [OUT_DIR]}
NEW=${2:?usage: bench/cost.sh OLD_BIN_DIR NEW_BIN_DIR [REPS] [OUT_DIR]}
REPS=${3:-3}
OUT=${4:-/tmp/shoal-cost}
for b in "$OLD" "$NEW"; do
    for x in shoal shoald; do
        [[ -x "$b/$x" ]] || { echo "bench/cost.sh: $b/$x is not an executable" >&2; exit 2; }
    done
done
rm -rf "$OUT"
mkdir -p "$OUT/local"

declare -A BIN=([old]="$OLD" [new]="$NEW")
cleanup() {
    for side in old new; do
        [[ -f "$OUT/$side/cluster.toml" ]] && PATH="${BIN[$side]}:$PATH" "${BIN[$side]}/shoal" cluster down --dir "$OUT/$side" >/dev/null 2>&1 || true
    done
}
trap cleanup EXIT
for side in old new; do
    # `cluster up` starts the `shoald` found next to `shoal` (or on PATH): each side its own.
    extra=""
    [[ $side == new ]] && extra="${COST_EXTRA_NEW:-}"
    # shellcheck disable=SC2086
    PATH="${BIN[$side]}:$PATH" "${BIN[$side]}/shoal" cluster up --servers 4 --dir "$OUT/$side" $extra >/dev/null
    auth_var="COST_AUTH_${side^^}"
    if [[ -n "${!auth_var:-}" ]]; then
        # Restart the cluster under the asked-for mode (`cluster up` reuses DIR/cluster.toml).
        PATH="${BIN[$side]}:$PATH" "${BIN[$side]}/shoal" cluster down --dir "$OUT/$side" >/dev/null
        sed -i "s/^auth = .*/auth = \"${!auth_var}\"/" "$OUT/$side/cluster.toml"
        grep -q "^auth = \"${!auth_var}\"" "$OUT/$side/cluster.toml" || {
            echo "bench/cost.sh: $OUT/$side/cluster.toml has no [security] auth line to set" >&2
            exit 2
        }
        PATH="${BIN[$side]}:$PATH" "${BIN[$side]}/shoal" cluster up --servers 4 --dir "$OUT/$side" >/dev/null
    fi
done

EASY_B=${COST_IO_EASY_BLOCK:-256M}
HARD_S=${COST_IO_HARD_SEGMENTS:-1000}
MD_N=${COST_MD_FILES:-2000}
STRIPES="--stripe-count -1 --stripe-size 1M"
for rep in $(seq 1 "$REPS"); do
    for side in old new; do
        shoal="${BIN[$side]}/shoal"
        cfg="$OUT/$side/cluster.toml"
        echo "rep $rep/$REPS: $side" >&2
        "$shoal" --config "$cfg" bench io -q --json -T "native,local:$OUT/local" -F -t 1M -b "$EASY_B" -e -C \
            --drop-caches --warm-read $STRIPES >"$OUT/io-easy.$side.$rep.json"
        "$shoal" --config "$cfg" bench io -q --json -T "native,local:$OUT/local" -t 47008 -b 47008 -s "$HARD_S" -e -C \
            --drop-caches --warm-read $STRIPES >"$OUT/io-hard.$side.$rep.json"
        "$shoal" --config "$cfg" bench md -q --json -T "native@1,native@16,tmpfs" -N "$MD_N" \
            >"$OUT/md-easy.$side.$rep.json"
    done
done

python3 - "$OUT" "$REPS" <<'EOF'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
rows = {}  # (case, phase, target) -> side -> [metric]
cpu = {}   # (case, phase, target) -> side -> [machine CPU µs per op]
for case in ("io-easy", "io-hard", "md-easy"):
    for side in ("old", "new"):
        for rep in range(1, reps + 1):
            r = json.load(open(f"{out}/{case}.{side}.{rep}.json"))
            for report in r if isinstance(r, list) else [r]:
                for run in report["runs"]:
                    t = run["target"]
                    for ph in run["phases"]:
                        key = (case, ph["label"], t)
                        m = ph["mib_s"] if case.startswith("io") else ph["ops_s"]
                        rows.setdefault(key, {}).setdefault(side, []).append(m)
                        if ph.get("machine_cpu_s") and ph["ops"]:
                            cpu.setdefault(key, {}).setdefault(side, []).append(ph["machine_cpu_s"] * 1e6 / ph["ops"])
print(f"| case | phase | target | old | new | new/old | machine CPU µs/op old → new |")
print("|---|---|---|---:|---:|---:|---|")
for key in sorted(rows, key=lambda k: (k[0], k[2], k[1])):
    s = rows[key]
    if "old" not in s or "new" not in s:
        continue
    o, n = statistics.median(s["old"]), statistics.median(s["new"])
    c = cpu.get(key, {})
    cs = f"{statistics.median(c['old']):.0f} → {statistics.median(c['new']):.0f}" if "old" in c and "new" in c else ""
    unit = "MiB/s" if key[0].startswith("io") else "op/s"
    print(f"| {key[0]} | {key[1]} | {key[2]} | {o:,.0f} {unit} | {n:,.0f} {unit} | {n / o:.2f} | {cs} |")
EOF
