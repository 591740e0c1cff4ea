# Shared by setup.sh, test.sh and .ci/run: where to build and what the system must have.
# Build outside the clone so that fresh clones (CI) reuse compiled dependencies.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/shoal/target}"
# librocksdb-dev: RocksDB linked as a system library (rocksdb crate 0.21 with ROCKSDB_LIB_DIR)
# libclang-dev, clang: bindgen for the RocksDB bindings
# fuse3, libfuse3-dev: the FUSE mount
# libacl1-dev: needed by pjdfstest
# gcc, pkg-config: the C library's tests compile C programs against shoal.h and shoal.pc
# rsync, sqlite3, git, make: programs the mount tests run on a real mount
# openmpi-bin: mpirun, for the tests of `shoal bench io|md` under mpirun (no MPI library is linked)
# libopenmpi-dev: mpi.h for mpicc, which compiles the container's C example against
#   shoal_container_mpi.h (crates/cli/tests/container_mpi.rs; the Rust code links no MPI)
# chromium: headless, renders the servers' status page in crates/cli/tests/observe.rs
export SHOAL_DEBIAN_PACKAGES="librocksdb-dev libclang-dev clang gcc pkg-config fuse3 libfuse3-dev libacl1-dev rsync sqlite3 git make openmpi-bin libopenmpi-dev chromium"

# Install the Debian packages above that are missing (apt-get; sudo when not root).
shoal_install_missing() {
  local need=() pkg
  for pkg in $SHOAL_DEBIAN_PACKAGES; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
  [ ${#need[@]} -gt 0 ] || return 0
  echo "== installing Debian packages: ${need[*]}"
  local sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
}

# Python packages: maturin builds the wheel of the `shoal` package (pyproject.toml); the
# others are what its tests use (pytest) and what its fsspec file system is tested with:
# pandas, pyarrow, Dask (dataframe, bag, array), xarray on zarr and netCDF (scipy for
# netCDF 3, h5netcdf over h5py for netCDF 4). Pinned to the versions tested with Python
# 3.11, numpy 2.4, pandas 3.1 and pyarrow 26; zarr 3 runs a synchronous fsspec file system
# such as shoal:// through fsspec's AsyncFileSystemWrapper. A package already installed
# (any version) is kept. (Dask's "dataframe" extra is numpy, pandas and pyarrow, listed
# here already: no brackets, which the shell would take for a glob.)
export SHOAL_PYTHON_PACKAGES="maturin pytest fsspec numpy pandas pyarrow dask==2026.8.0 xarray==2026.9.0 zarr==3.1.6 scipy==1.17.1 h5netcdf==1.8.2 h5py==3.16.0"

# Install the Python packages above that are missing (pip, for the python3 on $PATH).
shoal_install_python_missing() {
  local need=() pkg
  # `pip show` takes the bare name, without the version (==...).
  for pkg in $SHOAL_PYTHON_PACKAGES; do python3 -m pip show -q "${pkg%%[=<>]*}" >/dev/null 2>&1 || need+=("$pkg"); done
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
