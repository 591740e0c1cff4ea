#!/usr/bin/env bash
# Second command of the README: the tests, in tiers (docs/testing.md, "Tiers").
#
#   bash scripts/test.sh           fast, then system: every test CI runs (after fmt and clippy)
#   bash scripts/test.sh fast      unit, property and in-process tests: after every change
#   bash scripts/test.sh system    real shoald processes, FUSE mounts, C, MPI, Python, short fault runs
#   bash scripts/test.sh soak      10-minute history runs, long fsx, a million files in one
#                                  directory: before a release or after a change of recovery
#
# Arguments after the tier go to cargo-nextest: `bash scripts/test.sh system -E 'test(/tls/)'`.
# Every tier prints where its time went and its slowest tests at the end. Tests run under
# cargo-nextest (.config/nextest.toml: per-test timeouts, tests that need the machine to
# themselves); pytest runs the Python package's tests with a per-test timeout too.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

tier=${1:-all}
[ $# -gt 0 ] && shift
EXTRA_ARGS=$#
case "$tier" in
  all | fast | system | soak) ;;
  *)
    echo "scripts/test.sh: unknown tier '$tier' (fast, system, soak, or none for fast + system)" >&2
    exit 2
    ;;
esac

shoal_install_missing
shoal_install_test_tools

# Reports of this run: one JUnit file per test run, read at the end for the slowest tests.
REPORTS=$CARGO_TARGET_DIR/test-reports
rm -rf "$REPORTS"
mkdir -p "$REPORTS"

# nextest PROFILE NAME CARGO-ARGS...: run tests under nextest, keep its JUnit report as NAME.
nextest() {
  local profile=$1 name=$2
  shift 2
  local rc=0 no_tests=()
  # With a filter given by hand, one of a tier's runs may match nothing: not an error.
  [ $EXTRA_ARGS -eq 0 ] || no_tests=(--no-tests=warn)
  rm -f "target/nextest/$profile/junit.xml"
  cargo nextest run --release --profile "$profile" "${no_tests[@]}" "$@" || rc=$?
  # nextest keeps its store in the clone (target/nextest, its default), not in the
  # cargo target folder.
  cp "target/nextest/$profile/junit.xml" "$REPORTS/$name.xml" 2>/dev/null || true
  return $rc
}

# The artefacts every tier uses: binaries, the C libraries, the preload and audit libraries
# (the Python extension is maturin's to build: scripts/env.sh, SHOAL_NOT_CARGO).
build() {
  cargo build --release --workspace $SHOAL_NOT_CARGO
}

fast() {
  # Everything but the `shoal` package's integration tests (crates/cli/tests: the system
  # tier), then the unit tests of the `shoal` binaries, then the examples in the docs.
  # (Called as `phase ... || rc`, where `set -e` is off: each step's failure is kept.)
  local rc=0
  nextest fast fast-workspace --workspace --exclude shoal $SHOAL_NOT_CARGO "$@" || rc=1
  nextest fast fast-cli -p shoal --bins "$@" || rc=1
  cargo test --release --workspace $SHOAL_NOT_CARGO --doc --quiet || rc=1
  return $rc
}

system() {
  # crates/cli/tests/{system,mount,faults,interop}: one binary per group; then pytest.
  local rc=0
  # fsx shorter than scripts/posix-suites.sh's own default (the soak tier runs a million
  # operations); pjdfstest whole.
  FSX_OPS=${FSX_OPS:-30000} FSX_WB_OPS=${FSX_WB_OPS:-10000} FSX_PRELOAD_OPS=${FSX_PRELOAD_OPS:-10000} \
    nextest system system -p shoal --test system --test mount --test faults --test interop "$@" || rc=1
  shoal_install_python_package || return 1
  echo "== pytest (crates/python/tests)"
  SHOAL_BIN="$CARGO_TARGET_DIR/release/shoal" python3 -m pytest -q -p no:cacheprovider \
    --timeout 300 --durations 5 --junitxml "$REPORTS/pytest.xml" crates/python/tests || rc=1
  return $rc
}

soak() {
  local rc=0
  # The history runs (with faults, with partitions) at 10 minutes each, and the POSIX
  # suites with a million fsx operations: one at a time (profile soak).
  SHOAL_HISTORY_SECS=${SHOAL_HISTORY_SECS:-600} FSX_OPS=${FSX_OPS:-1000000} \
    FSX_WB_OPS=${FSX_WB_OPS:-200000} FSX_PRELOAD_OPS=${FSX_PRELOAD_OPS:-200000} \
    nextest soak soak -p shoal --test faults --test mount \
    -E 'test(/^(history|partition)::/) | test(/^fuse_suites::/)' "$@" || rc=1
  # A million files in one shared directory, listed exactly once (bench/million.sh).
  bash bench/million.sh || rc=1
  return $rc
}

# Run each phase, timed; the summary at the end says where the time went.
TIMES=()
FAILED=()
phase() {
  local name=$1
  shift
  local t0=$SECONDS rc=0
  echo "== $name"
  "$@" || rc=$?
  TIMES+=("$(printf '%-8s %6d s  %s' "$name" $((SECONDS - t0)) "$([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)")")")
  [ $rc -eq 0 ] || FAILED+=("$name")
}

phase build build
if [ ${#FAILED[@]} -eq 0 ]; then
  case "$tier" in
    all)
      phase fast fast "$@"
      phase system system "$@"
      ;;
    fast) phase fast fast "$@" ;;
    system) phase system system "$@" ;;
    soak) phase soak soak "$@" ;;
  esac
fi

echo "== where the time went (scripts/test.sh $tier)"
printf '%s\n' "${TIMES[@]}"
python3 scripts/slowest-tests.py "$REPORTS" 10 || true
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "scripts/test.sh: failed: ${FAILED[*]}" >&2
  exit 1
fi
