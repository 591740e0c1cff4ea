//! The install step (`scripts/install.sh`, docs/install.md) into a temporary prefix, used as
//! a site uses an installation: a C program compiled with `pkg-config shoal` from the prefix
//! and run against a real cluster; the container library found by `pkg-config
//! shoal_container`; a mount made by `mount -t fuse.shoal`, which runs the installed helper
//! and through it the installed `shoal`; and `cat` of a file on that mount under `LD_PRELOAD`
//! of the installed interception library, served in-process by the library's own counts.
//!
//! mount(8) looks for helpers in /sbin only, so the `mount -t` part runs in a private mount
//! namespace (`unshare --mount`) where the prefix's `sbin` is laid over /sbin (overlayfs):
//! the machine's own /sbin is never written.

use shoal_testkit::mount::skip_without_fuse;
use shoal_testkit::Cluster;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Install into `prefix` what the tests' own build made (`<target>/<profile>`).
fn install(prefix: &Path) -> String {
    // The C libraries are not dependencies of the tests' package: make sure they are built.
    let build =
        shoal_testkit::build_c_library("shoal-capi", &["libshoal.so", "libshoal.a", "shoal.pc", "include/shoal.h"]);
    shoal_testkit::build_c_library(
        "shoal-container-capi",
        &["libshoal_container.so", "libshoal_container.a", "shoal_container.pc", "include/shoal_container.h"],
    );
    let out = Command::new("bash")
        .arg(shoal_testkit::workspace_root().join("scripts/install.sh"))
        .env("PREFIX", prefix)
        .env("SHOAL_BUILD_DIR", &build)
        .env("MOUNT_HELPER_DIR", "")
        .output()
        .expect("run scripts/install.sh");
    ok("scripts/install.sh", out)
}

/// `pkg-config ARGS` against the prefix's pkg-config files only.
fn pkg_config(prefix: &Path, args: &[&str]) -> Vec<String> {
    let out = Command::new("pkg-config")
        .args(args)
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .env("PKG_CONFIG_LIBDIR", prefix.join("lib/pkgconfig"))
        .output()
        .expect("run pkg-config");
    ok(&format!("pkg-config {}", args.join(" ")), out).split_whitespace().map(str::to_string).collect()
}

/// The real folder behind /sbin (on merged-/usr systems /sbin links to usr/sbin).
fn sbin() -> PathBuf {
    std::fs::canonicalize("/sbin").unwrap_or_else(|_| PathBuf::from("/sbin"))
}

#[test]
fn an_installed_prefix_builds_c_programs_mounts_with_mount_t_and_preloads() {
    let tmp = tempfile::tempdir().unwrap();
    let prefix = tmp.path().join("prefix");
    let said = install(&prefix);
    assert!(said.contains("installed:"), "{said}");
    for f in [
        "bin/shoal",
        "bin/shoald",
        "lib/libshoal.so",
        "lib/libshoal.a",
        "include/shoal.h",
        "lib/pkgconfig/shoal.pc",
        "lib/libshoal_container.so",
        "lib/libshoal_container.a",
        "include/shoal_container.h",
        "include/shoal_container_mpi.h",
        "lib/pkgconfig/shoal_container.pc",
        "lib/libshoal_preload.so",
        "lib/libshoal_audit.so",
        "sbin/mount.fuse.shoal",
        "lib/systemd/system/shoald@.service",
        "lib/systemd/system/mnt-shoal.mount",
        "share/doc/shoal/install.md",
        "share/doc/shoal/mount.md",
    ] {
        assert!(prefix.join(f).is_file(), "{f} is not in the installed prefix");
    }
    // The units and the helper name this prefix's programs.
    let unit = std::fs::read_to_string(prefix.join("lib/systemd/system/shoald@.service")).unwrap();
    assert!(unit.contains(&format!("ExecStart={}/bin/shoald --config", prefix.display())), "{unit}");
    let helper = std::fs::read_to_string(prefix.join("sbin/mount.fuse.shoal")).unwrap();
    assert!(helper.contains(&format!("{}/bin/shoal", prefix.display())), "{helper}");

    // pkg-config points into the prefix, not into the build.
    let flags = pkg_config(&prefix, &["--cflags", "--libs", "shoal"]);
    assert_eq!(
        flags,
        [format!("-I{}/include", prefix.display()), format!("-L{}/lib", prefix.display()), "-lshoal".into()]
    );
    let flags = pkg_config(&prefix, &["--cflags", "--libs", "shoal_container"]);
    assert!(flags.contains(&"-lshoal_container".to_string()), "{flags:?}");

    // A C program built against the installed library, run against real servers.
    let c = Cluster::start(4);
    let src = shoal_testkit::manifest_dir().join("tests/c/basic.c");
    let exe = tmp.path().join("basic");
    let mut cc = Command::new("gcc");
    cc.args(["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror", "-O1", "-o"]).arg(&exe).arg(&src);
    cc.args(pkg_config(&prefix, &["--cflags", "--libs", "shoal"]));
    cc.arg(format!("-Wl,-rpath,{}/lib", prefix.display()));
    ok("gcc basic.c with pkg-config shoal", cc.output().expect("run gcc"));
    // Test runners put the build's folders on LD_LIBRARY_PATH; a site's programs find the
    // installed library through the rpath alone.
    let ldd = ok("ldd", Command::new("ldd").arg(&exe).env_remove("LD_LIBRARY_PATH").output().expect("run ldd"));
    assert!(
        ldd.contains(&format!("{}/lib/libshoal.so", prefix.display())),
        "not linked to the installed library:\n{ldd}"
    );
    let out = ok(
        "the C program",
        Command::new(&exe).arg(&c.config).env_remove("LD_LIBRARY_PATH").output().expect("run the C program"),
    );
    assert!(out.trim_end().ends_with("ok"), "{out}");

    if skip_without_fuse() {
        return;
    }
    // `mount -t fuse.shoal` with the installed helper, then `cat` under the installed
    // preload library, in a private mount namespace. The helper finds `shoal` by the
    // prefix written into it: PATH names no shoal here.
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let stats = tmp.path().join("preload-stats");
    let script = r#"
        set -eu
        mount -t overlay shoal-install-test -o "lowerdir=$HELPERS:$SBIN" "$SBIN"
        mount -t fuse.shoal "$CONFIG" "$MNT" -o allow_other
        grep -q " $MNT fuse.shoal " /proc/mounts
        echo "written through mount -t fuse.shoal" > "$MNT/installed.txt"
        LD_PRELOAD="$PREFIX/lib/libshoal_preload.so" SHOAL_PRELOAD_MOUNTS="$MNT" SHOAL_PRELOAD_STATS="$STATS" \
            cat "$MNT/installed.txt"
        umount "$MNT"
    "#;
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .env("HELPERS", prefix.join("sbin"))
        .env("SBIN", sbin())
        .env("CONFIG", &c.config)
        .env("MNT", &mnt)
        .env("PREFIX", &prefix)
        .env("STATS", &stats)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("SHOAL_BIN")
        .output()
        .expect("run unshare");
    let out = ok("mount -t fuse.shoal and cat under LD_PRELOAD", out);
    assert_eq!(out, "written through mount -t fuse.shoal\n");
    // The preloaded `cat` was served in-process (open and read by the native client).
    let counts = std::fs::read_to_string(&stats).expect("the preload library wrote its counts");
    let native = counts.split(" native ").nth(1).unwrap_or("");
    assert!(native.contains("open=") && native.contains("read="), "cat was not served in-process: {counts}");
    // The file is on the cluster, as every client sees it.
    let (code, text, err) = c.shoal(&["cat", "/installed.txt"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(text, "written through mount -t fuse.shoal\n");
}
