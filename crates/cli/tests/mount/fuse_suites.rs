//! The external POSIX suites from crates.io against a real mount: pjdfstest (no failure
//! outside the documented expected list) and fsx (100,000 operations of every kind it has,
//! no miscompare; then with the interception library preloaded, every call served
//! in-process). `scripts/posix-suites.sh` does the work (installing the tools on first
//! use); this test runs it with the binaries just built and shows its counts.

use std::process::Command;

#[test]
fn pjdfstest_and_fsx_pass() {
    if shoal_testkit::mount::skip_without_fuse() {
        return;
    }
    let root = shoal_testkit::manifest_dir().join("../..");
    let start = std::time::Instant::now();
    let out = Command::new("bash")
        .arg(root.join("scripts/posix-suites.sh"))
        .env("SHOAL_BIN", env!("CARGO_BIN_EXE_shoal"))
        .env("SHOAL_PRELOAD_LIB", shoal_testkit::mount::preload_library())
        .current_dir(&root)
        .output()
        .expect("run scripts/posix-suites.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    println!("posix suites took {:?}", start.elapsed());
    assert!(out.status.success(), "posix-suites.sh failed ({}):\n{stdout}\n{stderr}", out.status);
    let summary = stdout.lines().skip_while(|l| *l != "== summary").collect::<Vec<_>>().join("\n");
    assert!(summary.contains(" 0 failed"), "{summary}");
    assert!(summary.contains("no miscompare"), "{summary}");
    assert!(summary.contains("every call served in-process"), "{summary}");
}
