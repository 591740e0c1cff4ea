#!/usr/bin/env bash
# Install what `cargo build --release --workspace` made (scripts/setup.sh builds it) into a
# prefix where a site expects each part (docs/install.md):
#
#   PREFIX/bin/shoal, PREFIX/bin/shoald                 the command and the server
#   PREFIX/lib/libshoal.so, .a                          the C library
#   PREFIX/include/shoal.h                              its generated header
#   PREFIX/lib/pkgconfig/shoal.pc                       pkg-config --cflags --libs shoal
#   PREFIX/lib/libshoal_container.so, .a                the container library (SIONlib's calls)
#   PREFIX/include/shoal_container.h, shoal_container_mpi.h
#   PREFIX/lib/pkgconfig/shoal_container.pc
#   PREFIX/lib/libshoal_preload.so                      the interception library (LD_PRELOAD)
#   PREFIX/lib/libshoal_audit.so                        the loader hook (LD_AUDIT)
#   PREFIX/sbin/mount.fuse.shoal                        the mount(8) helper, which runs
#                                                       PREFIX/bin/shoal
#   MOUNT_HELPER_DIR/mount.fuse.shoal                   the same, where mount(8) looks for
#                                                       helpers (/sbin): mount -t fuse.shoal, fstab
#   PREFIX/lib/systemd/system/shoald@.service           example units: a server per id, a mount
#   PREFIX/lib/systemd/system/mnt-shoal.mount
#   PREFIX/share/doc/shoal/                             README and docs/*.md (every command's page)
#
# Environment:
#   PREFIX            where to install (default /usr/local)
#   DESTDIR           staging root prepended to every path (packaging; default none)
#   MOUNT_HELPER_DIR  where mount(8) finds helpers (default /sbin when installing as root
#                     into the real root, else none); "" skips it
#   CARGO_TARGET_DIR  where the build is (scripts/env.sh's default)
# Exit status: 0 installed, 1 something to install is missing or could not be written,
# 2 bad usage.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

if [ $# -gt 0 ]; then
  echo "usage: [PREFIX=/usr/local] [DESTDIR=DIR] [MOUNT_HELPER_DIR=/sbin] bash scripts/install.sh" >&2
  exit 2
fi
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
case "$PREFIX" in
  /*) ;;
  *)
    echo "install: PREFIX must be an absolute path (it is '$PREFIX')" >&2
    exit 2
    ;;
esac
if [ -z "${MOUNT_HELPER_DIR+set}" ]; then
  if [ "$(id -u)" -eq 0 ] && [ -z "$DESTDIR" ]; then MOUNT_HELPER_DIR=/sbin; else MOUNT_HELPER_DIR=""; fi
fi
# The build to install: the release profile (SHOAL_BUILD_DIR names another, as the tests do).
BUILD=${SHOAL_BUILD_DIR:-$CARGO_TARGET_DIR/release}
ROOT=$DESTDIR$PREFIX

# Everything must have been built: a half-installed prefix is worse than none.
need=(shoal shoald libshoal.so libshoal.a shoal.pc include/shoal.h
  libshoal_container.so libshoal_container.a shoal_container.pc include/shoal_container.h
  include/shoal_container_mpi.h libshoal_preload.so libshoal_audit.so)
missing=()
for f in "${need[@]}"; do [ -e "$BUILD/$f" ] || missing+=("$f"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install: not built in $BUILD: ${missing[*]} (run: cargo build --release --workspace)" >&2
  exit 1
fi

echo "== installing into $ROOT"
install -d "$ROOT/bin" "$ROOT/sbin" "$ROOT/lib/pkgconfig" "$ROOT/include" \
  "$ROOT/lib/systemd/system" "$ROOT/share/doc/shoal"
install -m 0755 "$BUILD/shoal" "$BUILD/shoald" "$ROOT/bin/"
install -m 0755 "$BUILD/libshoal.so" "$BUILD/libshoal_container.so" "$BUILD/libshoal_preload.so" \
  "$BUILD/libshoal_audit.so" "$ROOT/lib/"
install -m 0644 "$BUILD/libshoal.a" "$BUILD/libshoal_container.a" "$ROOT/lib/"
install -m 0644 "$BUILD/include/shoal.h" "$BUILD/include/shoal_container.h" \
  "$BUILD/include/shoal_container_mpi.h" "$ROOT/include/"

# pkg-config files: the build's point at the target directory; these at the prefix (as
# installed, without DESTDIR).
for pc in shoal shoal_container; do
  sed -e "s|^prefix=.*|prefix=$PREFIX|" -e 's|^libdir=.*|libdir=${prefix}/lib|' \
    -e 's|^includedir=.*|includedir=${prefix}/include|' "$BUILD/$pc.pc" > "$ROOT/lib/pkgconfig/$pc.pc"
  chmod 0644 "$ROOT/lib/pkgconfig/$pc.pc"
done

# The mount helper runs this prefix's shoal when $SHOAL_BIN and PATH do not name one.
sed "s|/usr/local/bin/shoal|$PREFIX/bin/shoal|g" crates/fuse/mount.fuse.shoal > "$ROOT/sbin/mount.fuse.shoal"
chmod 0755 "$ROOT/sbin/mount.fuse.shoal"
if [ -n "$MOUNT_HELPER_DIR" ]; then
  install -d "$DESTDIR$MOUNT_HELPER_DIR"
  install -m 0755 "$ROOT/sbin/mount.fuse.shoal" "$DESTDIR$MOUNT_HELPER_DIR/mount.fuse.shoal"
fi

# Example systemd units, with this prefix's paths.
for unit in shoald@.service mnt-shoal.mount; do
  sed "s|@PREFIX@|$PREFIX|g" "scripts/systemd/$unit" > "$ROOT/lib/systemd/system/$unit"
  chmod 0644 "$ROOT/lib/systemd/system/$unit"
done

install -m 0644 README.md docs/*.md "$ROOT/share/doc/shoal/"

# Let the dynamic loader find the new libraries (only for the real root, as root).
if [ -z "$DESTDIR" ] && [ "$(id -u)" -eq 0 ] && command -v ldconfig > /dev/null; then
  ldconfig
fi

echo "installed: $PREFIX/bin/shoal, $PREFIX/bin/shoald, $PREFIX/lib/libshoal.{so,a}," \
  "libshoal_container.{so,a}, libshoal_preload.so, libshoal_audit.so, $PREFIX/include/shoal*.h," \
  "$PREFIX/lib/pkgconfig/shoal{,_container}.pc, $PREFIX/sbin/mount.fuse.shoal${MOUNT_HELPER_DIR:+ and $MOUNT_HELPER_DIR/mount.fuse.shoal}," \
  "$PREFIX/lib/systemd/system/{shoald@.service,mnt-shoal.mount}, $PREFIX/share/doc/shoal"
case ":${PKG_CONFIG_PATH:-}:$(pkg-config --variable pc_path pkg-config 2> /dev/null || true):" in
  *":$PREFIX/lib/pkgconfig:"*) ;;
  *) echo "note: pkg-config does not search $PREFIX/lib/pkgconfig: export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig" ;;
esac
