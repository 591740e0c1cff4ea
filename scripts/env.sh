# Shared by setup.sh, test.sh and .ci/run: where to build and what the system must have.
# Build outside the clone so that fresh clones (CI) reuse compiled dependencies.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/shoal/target}"
# The Python extension (crates/python) is built by maturin alone (shoal_install_python_package):
# pyo3's build configuration depends on the environment maturin sets, so a plain cargo build
# of it would rebuild pyo3 each time the other one ran. Cargo commands over the workspace
# leave it out.
export SHOAL_NOT_CARGO="--exclude shoal-python"
# What building and running Shoal needs (scripts/setup.sh):
# librocksdb-dev: RocksDB linked as a system library (rocksdb crate 0.21 with ROCKSDB_LIB_DIR)
# libclang-dev, clang: bindgen for the RocksDB bindings
# gcc, pkg-config: the C libraries' users compile against shoal.h through shoal.pc
# fuse3, libfuse3-dev: the FUSE mount (fusermount3, /dev/fuse's user side)
export SHOAL_DEBIAN_PACKAGES="librocksdb-dev libclang-dev clang gcc pkg-config fuse3 libfuse3-dev"
# What the tests need on top (scripts/test.sh, .ci/run):
# libacl1-dev: needed by pjdfstest
# rsync, sqlite3, git, make: programs the mount tests run on a real mount
# openmpi-bin: mpirun, for the tests of `shoal bench io|md` and `shoal job` under mpirun
# libopenmpi-dev: mpi.h for mpicc, which compiles the container's C example against
#   shoal_container_mpi.h (crates/cli/tests/interop/container_mpi.rs; the Rust code links no MPI)
# chromium: headless, renders the servers' status page in crates/cli/tests/interop/observe.rs
# iproute2, util-linux: network namespaces of the fault tests; unshare and mount for the
#   install test's `mount -t fuse.shoal`
export SHOAL_DEBIAN_TEST_PACKAGES="libacl1-dev rsync sqlite3 git make openmpi-bin libopenmpi-dev chromium iproute2 util-linux"

# Install the Debian packages named (default: $SHOAL_DEBIAN_PACKAGES) that are missing
# (apt-get; sudo when not root).
shoal_install_missing() {
  local need=() pkg
  for pkg in ${*:-$SHOAL_DEBIAN_PACKAGES}; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
  [ ${#need[@]} -gt 0 ] || return 0
  echo "== installing Debian packages: ${need[*]}"
  local sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
}

# cargo-nextest, which runs the test tiers (.config/nextest.toml), pinned: built from
# crates.io once per machine (about 4 minutes on 2 cores) into ~/.cargo/bin.
export SHOAL_NEXTEST_VERSION="0.9.151"

# Everything the tests need that setup does not install: Debian packages, cargo-nextest,
# the Python test packages.
shoal_install_test_tools() {
  shoal_install_missing $SHOAL_DEBIAN_PACKAGES $SHOAL_DEBIAN_TEST_PACKAGES
  if ! cargo nextest --version 2>/dev/null | grep -q "cargo-nextest $SHOAL_NEXTEST_VERSION"; then
    echo "== installing cargo-nextest $SHOAL_NEXTEST_VERSION (cargo install)"
    # Its own target folder: the workspace's stays as the build left it.
    env -u CARGO_TARGET_DIR cargo install --quiet --locked --version "$SHOAL_NEXTEST_VERSION" cargo-nextest
  fi
  shoal_install_python_missing $SHOAL_PYTHON_TEST_PACKAGES
}

# Python packages: maturin builds the wheel of the `shoal` package (pyproject.toml) and
# fsspec is its one dependency (setup); the test packages are what its tests use (pytest,
# pytest-timeout for a per-test timeout) and what its fsspec file system is tested with:
# pandas, pyarrow, Dask (dataframe, bag, array), xarray on zarr and netCDF (scipy for
# netCDF 3, h5netcdf over h5py for netCDF 4). Pinned to the versions tested with Python
# 3.11, numpy 2.4, pandas 3.1 and pyarrow 26; zarr 3 runs a synchronous fsspec file system
# such as shoal:// through fsspec's AsyncFileSystemWrapper. A package already installed
# (any version) is kept. (Dask's "dataframe" extra is numpy, pandas and pyarrow, listed
# here already: no brackets, which the shell would take for a glob.)
export SHOAL_PYTHON_PACKAGES="maturin fsspec"
export SHOAL_PYTHON_TEST_PACKAGES="pytest pytest-timeout numpy pandas pyarrow dask==2026.8.0 xarray==2026.9.0 zarr==3.1.6 scipy==1.17.1 h5netcdf==1.8.2 h5py==3.16.0"

# Install the Python packages named (default: $SHOAL_PYTHON_PACKAGES) that are missing
# (pip, for the python3 on $PATH).
shoal_install_python_missing() {
  local need=() pkg
  # `pip show` takes the bare name, without the version (==...).
  for pkg in ${*:-$SHOAL_PYTHON_PACKAGES}; do python3 -m pip show -q "${pkg%%[=<>]*}" >/dev/null 2>&1 || need+=("$pkg"); done
  [ ${#need[@]} -gt 0 ] || return 0
  echo "== installing Python packages: ${need[*]}"
  python3 -m pip install -q --root-user-action=ignore "${need[@]}"
}

# Build the `shoal` Python package (an abi3 wheel, into $CARGO_TARGET_DIR/wheels) and
# install it for the python3 on $PATH.
shoal_install_python_package() {
  shoal_install_python_missing
  echo "== building and installing the Python package (maturin)"
  rm -f "$CARGO_TARGET_DIR"/wheels/shoal-*.whl
  python3 -m maturin build --release --quiet -o "$CARGO_TARGET_DIR/wheels"
  python3 -m pip install -q --root-user-action=ignore --force-reinstall --no-deps "$CARGO_TARGET_DIR"/wheels/shoal-*.whl
}
