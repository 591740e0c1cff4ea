#!/usr/bin/env bash
# Run the external POSIX suites against a real Shoal mount and print their counts:
#
#   pjdfstest (crates.io, the Rust rewrite of the POSIX conformance suite)
#   fsx       (crates.io, the file-system exerciser): every operation type it has,
#             on a file striped over 3 servers in 64 KiB stripes, FSX_OPS operations
#             (default 100000), then FSX_WB_OPS (default 20000) on a write-back-cache mount,
#             then FSX_PRELOAD_OPS (default 20000) with the interception library preloaded
#             (libshoal_preload.so, docs/preload.md): every operation but the mappings,
#             which only the kernel can make; the library's counts show the calls were
#             served in-process (none handed to the kernel)
#
# The tools are installed (once) with `cargo install` into $SHOAL_TOOLS (default
# ~/.cache/shoal/tools). Starts a 3-server cluster and mounts it in a temporary folder;
# cleans up on exit. Exit status 0 only if pjdfstest has no failure outside the expected
# list below and fsx reports no miscompare.
#
# Environment: SHOAL_BIN (the shoal binary; default: build it), SHOAL_PRELOAD_LIB (the
# library; default: beside SHOAL_BIN or in its deps/), FSX_OPS, FSX_WB_OPS,
# FSX_PRELOAD_OPS, SHOAL_TOOLS, KEEP=1 (keep the work folder).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

PJDFSTEST_VERSION=0.2.2
FSX_VERSION=0.3.2
TOOLS=${SHOAL_TOOLS:-$HOME/.cache/shoal/tools}
FSX_OPS=${FSX_OPS:-100000}
FSX_WB_OPS=${FSX_WB_OPS:-20000}
FSX_PRELOAD_OPS=${FSX_PRELOAD_OPS:-20000}

if [ ! -e /dev/fuse ]; then
  echo "posix-suites: SKIPPED: /dev/fuse is absent"
  exit 0
fi

# ---- tools ----
install_tool() {
  local crate=$1 version=$2
  if "$TOOLS/bin/$crate" --version 2>/dev/null | grep -q "$version"; then
    return
  fi
  echo "== installing $crate $version into $TOOLS"
  local t0=$SECONDS
  # Own target folder: the workspace's may be locked by the cargo command running us.
  env -u CARGO_TARGET_DIR cargo install --quiet --locked --root "$TOOLS" --target-dir "$TOOLS/target" \
    --version "$version" "$crate"
  echo "   installed $crate in $((SECONDS - t0)) s"
}
install_tool pjdfstest "$PJDFSTEST_VERSION"
install_tool fsx "$FSX_VERSION"
PJDFSTEST=$TOOLS/bin/pjdfstest
FSX=$TOOLS/bin/fsx

if [ -z "${SHOAL_BIN:-}" ]; then
  cargo build --release --bins -q
  SHOAL_BIN=$CARGO_TARGET_DIR/release/shoal
fi
export SHOAL_BIN
if [ -z "${SHOAL_PRELOAD_LIB:-}" ]; then
  # The newer of the two places cargo leaves it (a dependency's, a workspace build's).
  SHOAL_PRELOAD_LIB=$(ls -t "$(dirname "$SHOAL_BIN")/deps/libshoal_preload.so" \
    "$(dirname "$SHOAL_BIN")/libshoal_preload.so" 2>/dev/null | head -1)
fi

# ---- cluster and mounts ----
WORK=$(mktemp -d /tmp/shoal-suites.XXXXXX)
chmod 755 "$WORK"
CONFIG=$WORK/cluster/cluster.toml
MNT=$WORK/mnt
WB=$WORK/mnt-wb
HELPER_INSTALLED=""
cleanup() {
  set +e
  for m in "$MNT" "$WB"; do
    mountpoint -q "$m" 2>/dev/null && "$SHOAL_BIN" umount --lazy "$m"
  done
  [ -n "$HELPER_INSTALLED" ] && rm -f /sbin/mount.fuse.shoal
  [ -f "$CONFIG" ] && "$SHOAL_BIN" cluster down --dir "$WORK/cluster" >/dev/null 2>&1
  if [ -z "${KEEP:-}" ]; then rm -rf "$WORK"; else echo "kept $WORK"; fi
}
trap cleanup EXIT

"$SHOAL_BIN" cluster up --servers 3 --dir "$WORK/cluster" >/dev/null
mkdir -p "$MNT" "$WB"
"$SHOAL_BIN" --config "$CONFIG" mount "$MNT" -o allow_other --log "$WORK/mount.log"
"$SHOAL_BIN" --config "$CONFIG" mount "$WB" -o allow_other,writeback_cache --log "$WORK/mount-wb.log"

# pjdfstest's EROFS tests remount the file system read-only with mount(8), which runs the
# fuse.shoal helper. Install it for the run if we may and it is not there.
ALLOW_REMOUNT=false
if [ "$(id -u)" -eq 0 ]; then
  if [ ! -e /sbin/mount.fuse.shoal ]; then
    install -m 0755 crates/fuse/mount.fuse.shoal /sbin/mount.fuse.shoal && HELPER_INSTALLED=1
  fi
  [ -x /sbin/mount.fuse.shoal ] && ALLOW_REMOUNT=true
fi

# ---- pjdfstest ----
# Users the suite switches to: unprivileged ones every Debian system has.
pjd_config() {
  cat <<EOF
[features]
posix_fallocate = {}
utime_now = {}
utimensat = {}

[settings]
naptime = 0.001
allow_remount = $1
# Expected failures (name: reason). None at present; see docs/mount.md.
expected_failures = []

[dummy_auth]
entries = [
  ["nobody", "nogroup"],
  ["daemon", "daemon"],
]
EOF
}
# Two passes: pjdfstest 0.2.2 leaks a descriptor open for writing in
# posix_fallocate::affected_only_create_flags, after which no file system can be remounted
# read-only (EBUSY); so the EROFS tests run on their own, first.
strip() { sed 's/\x1b\[[0-9;]*m//g'; }
pjd_rc=0
declare -A PJD
run_pjd() {
  local name=$1 remount=$2; shift 2
  pjd_config "$remount" > "$WORK/pjdfstest-$name.toml"
  mkdir -p "$MNT/pjdfstest-$name"
  local t0=$SECONDS rc
  set +e
  "$PJDFSTEST" -c "$WORK/pjdfstest-$name.toml" -p "$MNT/pjdfstest-$name" -s "$WORK/secondary" "$@" \
    > "$WORK/pjdfstest-$name.log" 2>&1
  rc=$?
  set -e
  local summary
  summary=$(grep -a "^Summary" "$WORK/pjdfstest-$name.log" | strip || true)
  echo "pjdfstest ($name): ${summary:-no summary} ($((SECONDS - t0)) s)"
  strip < "$WORK/pjdfstest-$name.log" | grep -a -E "(FAILED|skipped)$" | sed 's/  */ /g' || true
  if [ $rc -ne 0 ]; then
    strip < "$WORK/pjdfstest-$name.log" | grep -a -A3 "FAILED$" | head -100
    pjd_rc=1
  fi
  # failed skipped passed expected-failures total
  PJD[$name]=$(echo "$summary" | sed -E 's/Summary: ([0-9]+) failed, ([0-9]+) skipped, ([0-9]+) passed, ([0-9]+) expected failures, ([0-9]+) total/\1 \2 \3 \4 \5/')
}
mkdir -p "$WORK/secondary"
echo "== pjdfstest $PJDFSTEST_VERSION (as uid $(id -u))"
EROFS=0
if [ "$ALLOW_REMOUNT" = true ]; then
  run_pjd erofs true erofs
  EROFS=1
fi
run_pjd all false
read -r f s p x t <<< "${PJD[all]:-0 0 0 0 0}"
if [ $EROFS = 1 ]; then
  read -r ef es ep ex et <<< "${PJD[erofs]:-0 0 0 0 0}"
  # The EROFS tests were skipped in the full pass; count their own run instead.
  s=$((s - et + es)); f=$((f + ef)); p=$((p + ep)); x=$((x + ex))
fi
PJD_SUMMARY="$t tests: $p passed, $f failed, $x expected failures, $s skipped"

# ---- fsx ----
cat > "$WORK/fsx.toml" <<EOF
# Every operation fsx has; sizes up to 256 KiB over a 4 MiB file.
flen = 4194304
[opsize]
max = 262144
min = 0
align = 1
[weights]
close_open = 1
read = 10
write = 10
mapread = 10
mapwrite = 10
invalidate = 1
truncate = 2
fsync = 1
fdatasync = 1
posix_fallocate = 2
punch_hole = 2
sendfile = 2
posix_fadvise = 1
copy_file_range = 2
EOF
"$SHOAL_BIN" --config "$CONFIG" mkdir /fsx
"$SHOAL_BIN" --config "$CONFIG" setstripe -c 3 -S 64K /fsx >/dev/null
run_fsx() {
  local name=$1 file=$2 ops=$3
  local t0=$SECONDS
  set +e
  "$FSX" -f "$WORK/fsx.toml" -N "$ops" -S 42 -P "$WORK" "$file" > "$WORK/fsx-$name.log" 2>&1
  local rc=$?
  set -e
  if [ $rc -eq 0 ] && grep -q "All operations completed A-OK" "$WORK/fsx-$name.log"; then
    echo "fsx ($name): $ops operations, no miscompare ($((SECONDS - t0)) s)"
    return 0
  fi
  echo "fsx ($name): FAILED (exit $rc) after $((SECONDS - t0)) s:"
  # What fsx found wrong (its lines other than the history of operations), then the last
  # operations before it.
  grep -v '^\[ERROR fsx\] *[0-9]' "$WORK/fsx-$name.log" | head -40
  tail -20 "$WORK/fsx-$name.log"
  return 1
}
echo "== fsx $FSX_VERSION"
fsx_rc=0
run_fsx striped "$MNT/fsx/file" "$FSX_OPS" || fsx_rc=1
run_fsx writeback "$WB/fsx/file-wb" "$FSX_WB_OPS" || fsx_rc=1

# Under the interception library: the same operations but mapread, mapwrite and
# invalidate (mappings are the kernel's: the library would hand the descriptor to it and
# the run would test the mount again). The library's counts must show reads and writes
# served in-process and nothing handed to the kernel.
PRELOAD_SUMMARY="not run (no libshoal_preload.so)"
if [ -n "$SHOAL_PRELOAD_LIB" ] && [ -f "$SHOAL_PRELOAD_LIB" ]; then
  sed -e 's/^mapread = .*/mapread = 0/; s/^mapwrite = .*/mapwrite = 0/; s/^invalidate = .*/invalidate = 0/' \
    "$WORK/fsx.toml" > "$WORK/fsx-preload.toml"
  FSX_CONF=$WORK/fsx-preload.toml
  t0=$SECONDS
  set +e
  LD_PRELOAD=$SHOAL_PRELOAD_LIB SHOAL_PRELOAD_MOUNTS=$MNT SHOAL_PRELOAD_STATS=$WORK/preload-stats \
    "$FSX" -f "$FSX_CONF" -N "$FSX_PRELOAD_OPS" -S 42 -P "$WORK" "$MNT/fsx/file-preload" > "$WORK/fsx-preload.log" 2>&1
  rc=$?
  set -e
  stats=$(grep -a "^shoal-preload" "$WORK/preload-stats" 2>/dev/null | tail -1)
  native=${stats#* native }; native=${native%% kernel*}
  kernel=${stats##* kernel}
  reads=$(grep -o ' read=[0-9]*' <<< " $native" | cut -d= -f2)
  writes=$(grep -o ' write=[0-9]*' <<< " $native" | cut -d= -f2)
  if [ $rc -eq 0 ] && grep -q "All operations completed A-OK" "$WORK/fsx-preload.log" \
      && [ "${reads:-0}" -gt 0 ] && [ "${writes:-0}" -gt 0 ] && [ -z "${kernel// /}" ]; then
    echo "fsx (preload): $FSX_PRELOAD_OPS operations, no miscompare ($((SECONDS - t0)) s); served in-process:$native; handed to the kernel: none"
    PRELOAD_SUMMARY="$FSX_PRELOAD_OPS operations with the library preloaded: no miscompare, every call served in-process"
  else
    echo "fsx (preload): FAILED (exit $rc) after $((SECONDS - t0)) s; library counts: ${stats:-none}"
    tail -40 "$WORK/fsx-preload.log"
    PRELOAD_SUMMARY="FAILED"
    fsx_rc=1
  fi
fi

echo "== summary"
echo "pjdfstest: $PJD_SUMMARY"
echo "fsx: $FSX_OPS operations (striped, default mount) + $FSX_WB_OPS (writeback_cache mount): $([ $fsx_rc -eq 0 ] && echo 'no miscompare' || echo FAILED)"
echo "fsx preload: $PRELOAD_SUMMARY"
[ $pjd_rc -eq 0 ] && [ $fsx_rc -eq 0 ]
