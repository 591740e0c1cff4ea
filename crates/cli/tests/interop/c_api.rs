//! The C library (`crates/capi`: libshoal.so, libshoal.a, the generated shoal.h and
//! shoal.pc) used by real C programs against real servers: each program under `tests/c/`
//! is compiled with gcc against the header, linked through the pkg-config file (shared)
//! and against the static library, and run with the cluster's configuration.

use shoal_testkit::Cluster;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Build libshoal and return the directory holding libshoal.so, libshoal.a, shoal.pc and
/// include/shoal.h.
fn libshoal() -> PathBuf {
    shoal_testkit::build_c_library("shoal-capi", &["libshoal.so", "libshoal.a", "shoal.pc", "include/shoal.h"])
}

/// Compile `tests/c/<name>.c` into `<into>/<name>-<how>`: `how` "shared" links through
/// pkg-config, "static" against libshoal.a.
fn compile(lib: &Path, name: &str, how: &str, into: &Path) -> PathBuf {
    let src = shoal_testkit::manifest_dir().join("tests/c").join(format!("{name}.c"));
    let exe = into.join(format!("{name}-{how}"));
    let mut cc = Command::new("gcc");
    cc.args(["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror", "-O1", "-o"]).arg(&exe).arg(&src);
    if how == "shared" {
        let pc = Command::new("pkg-config")
            .args(["--cflags", "--libs", "shoal"])
            .env("PKG_CONFIG_PATH", lib)
            .output()
            .expect("run pkg-config");
        assert!(pc.status.success(), "pkg-config shoal: {}", String::from_utf8_lossy(&pc.stderr));
        cc.args(String::from_utf8(pc.stdout).unwrap().split_whitespace());
        cc.arg(format!("-Wl,-rpath,{}", lib.display()));
    } else {
        cc.arg(format!("-I{}", lib.join("include").display())).arg(lib.join("libshoal.a"));
        cc.args(["-lpthread", "-ldl", "-lm"]);
    }
    let out = cc.output().expect("run gcc");
    assert!(out.status.success(), "gcc {name}.c ({how}):\n{}", String::from_utf8_lossy(&out.stderr));
    exe
}

fn run(exe: &Path, config: &Path) {
    let out = Command::new(exe).arg(config).output().expect("run the C program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("ok"),
        "{} failed ({}):\n{stdout}{}",
        exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn c_programs_use_blocking_calls_futures_callbacks_and_errors_on_real_servers() {
    let lib = libshoal();
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::start(4);
    for how in ["shared", "static"] {
        let exe = compile(&lib, "basic", how, tmp.path());
        run(&exe, &c.config);
    }
}

#[test]
fn c_programs_list_link_and_set_attributes_and_extended_attributes() {
    let lib = libshoal();
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::start(4);
    let exe = compile(&lib, "meta", "shared", tmp.path());
    run(&exe, &c.config);
}

#[test]
fn c_programs_move_many_extents_with_list_io() {
    let lib = libshoal();
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::start(4);
    let exe = compile(&lib, "list", "shared", tmp.path());
    run(&exe, &c.config);
}

#[test]
fn c_programs_run_namespace_calls_as_futures() {
    let lib = libshoal();
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::start(4);
    let exe = compile(&lib, "paths_async", "shared", tmp.path());
    run(&exe, &c.config);
}

#[test]
fn c_programs_run_the_other_calls_on_paths_as_futures() {
    let lib = libshoal();
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::start(4);
    let exe = compile(&lib, "meta_async", "shared", tmp.path());
    run(&exe, &c.config);
}

#[test]
fn c_programs_create_files_with_layouts_and_set_directory_defaults() {
    let lib = libshoal();
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::start(4);
    let exe = compile(&lib, "layout", "shared", tmp.path());
    run(&exe, &c.config);
}

#[test]
fn c_programs_search_metadata_with_find_style_tests() {
    let lib = libshoal();
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::start(3);
    let exe = compile(&lib, "find", "shared", tmp.path());
    run(&exe, &c.config);
}

#[test]
fn c_programs_write_read_take_and_watch_tuples() {
    let lib = libshoal();
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::start(3);
    let exe = compile(&lib, "tuples", "shared", tmp.path());
    run(&exe, &c.config);
}

#[test]
fn c_programs_save_micro_checkpoints_and_restart_from_the_newest_committed() {
    let lib = libshoal();
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::start(3);
    let exe = compile(&lib, "checkpoint", "shared", tmp.path());
    run(&exe, &c.config);
}

#[test]
fn c_programs_follow_the_change_log_and_a_consumer_resumes_with_nothing_missed_or_repeated() {
    let lib = libshoal();
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::start(3);
    let exe = compile(&lib, "changes", "shared", tmp.path());
    run(&exe, &c.config);
}

#[test]
fn c_programs_add_up_trees_from_per_directory_usage() {
    let lib = libshoal();
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::start(4);
    let exe = compile(&lib, "du", "shared", tmp.path());
    run(&exe, &c.config);
}
