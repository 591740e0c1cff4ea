//! The container's C library (`crates/container-capi`: libshoal_container.so and .a, the
//! generated shoal_container.h and the header-only MPI adapter shoal_container_mpi.h) from
//! a real MPI program: `crates/container-capi/examples/checkpoint.c` is compiled with
//! `mpicc` against the header (through the pkg-config file, and statically) and run under
//! `mpirun -np 4`, on a local temporary directory and on a real Shoal cluster. The program
//! writes a container from 4 ranks (data larger than each chunk: new blocks), reads it back
//! with 4 ranks checking every byte, and checks the serial API from rank 0; any wrong byte
//! or failed check aborts the MPI job, which fails the test.

use shoal_testkit::Cluster;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Build libshoal_container and return the directory holding the libraries,
/// shoal_container.pc and include/.
fn libshoal_container() -> PathBuf {
    shoal_testkit::build_c_library(
        "shoal-container-capi",
        &[
            "libshoal_container.so",
            "libshoal_container.a",
            "shoal_container.pc",
            "include/shoal_container.h",
            "include/shoal_container_mpi.h",
        ],
    )
}

/// Whether MPI's compiler wrapper is installed; if not the tests are skipped, as the other
/// mpirun tests are (scripts/env.sh installs openmpi-bin and libopenmpi-dev).
fn have_mpi() -> bool {
    let ok = |p: &str| Command::new(p).arg("--version").stdin(Stdio::null()).output().is_ok_and(|o| o.status.success());
    if !(ok("mpicc") && ok("mpirun")) {
        eprintln!("SKIPPED: mpicc or mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)");
        return false;
    }
    true
}

/// Compile checkpoint.c into `<into>/checkpoint-<how>` with mpicc: `how` "shared" links
/// through pkg-config, "static" against libshoal_container.a.
fn compile(lib: &Path, how: &str, into: &Path) -> PathBuf {
    let src = shoal_testkit::manifest_dir().join("../container-capi/examples/checkpoint.c");
    let exe = into.join(format!("checkpoint-{how}"));
    let mut cc = Command::new("mpicc");
    cc.args(["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror", "-O1", "-o"]).arg(&exe).arg(&src);
    if how == "shared" {
        let pc = Command::new("pkg-config")
            .args(["--cflags", "--libs", "shoal_container"])
            .env("PKG_CONFIG_PATH", lib)
            .output()
            .expect("run pkg-config");
        assert!(pc.status.success(), "pkg-config shoal_container: {}", String::from_utf8_lossy(&pc.stderr));
        cc.args(String::from_utf8(pc.stdout).unwrap().split_whitespace());
        cc.arg(format!("-Wl,-rpath,{}", lib.display()));
    } else {
        cc.arg(format!("-I{}", lib.join("include").display())).arg(lib.join("libshoal_container.a"));
        cc.args(["-lpthread", "-ldl", "-lm"]);
    }
    let out = cc.output().expect("run mpicc");
    assert!(
        out.status.success(),
        "mpicc checkpoint.c ({how}) failed (no mpi.h? apt-get install libopenmpi-dev):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// The mpirun job, stopped (SIGTERM, then SIGKILL) if the test ends while it runs.
struct Job(Child);

impl Drop for Job {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: kill(2) on the pid of our own child, not yet reaped. SIGTERM first:
            // mpirun then stops its ranks, which SIGKILL would leave running.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let t0 = Instant::now();
            while matches!(self.0.try_wait(), Ok(None)) && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `mpirun -np 4 exe args…` to its end; the job must succeed and rank 0 print "ok".
fn mpirun(exe: &Path, args: &[&str], shoal_config: Option<&Path>, dir: &Path) {
    let mut cmd = Command::new("mpirun");
    cmd.stdin(Stdio::null())
        // Open MPI refuses root without these, and 4 ranks on fewer cores without
        // --oversubscribe; --timeout ends a hung job (it stops the ranks itself).
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        // Only loopback: one host, no traffic leaves it.
        .env("OMPI_MCA_btl_tcp_if_include", "lo")
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .env_remove("SHOAL_CONFIG")
        .args(["--oversubscribe", "--timeout", "240", "-np", "4"]);
    if let Some(c) = shoal_config {
        // For the parallel opens of shoal:// names, which take the cluster from here.
        cmd.env("SHOAL_CONFIG", c).args(["-x", "SHOAL_CONFIG"]);
    }
    cmd.arg(exe).args(args);
    let (out, err) = (dir.join("mpirun.out"), dir.join("mpirun.err"));
    cmd.stdout(std::fs::File::create(&out).unwrap()).stderr(std::fs::File::create(&err).unwrap());
    let mut job = Job(cmd.spawn().expect("start mpirun"));
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = job.0.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "mpirun still running after 300 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (std::fs::read_to_string(out).unwrap(), std::fs::read_to_string(err).unwrap());
    assert!(
        status.success() && stdout.trim_end().ends_with("ok"),
        "{} {args:?} failed ({status}):\n{stdout}{stderr}",
        exe.display()
    );
}

#[test]
fn the_c_checkpoint_example_runs_under_mpirun_on_a_local_directory() {
    if !have_mpi() {
        return;
    }
    let lib = libshoal_container();
    let tmp = tempfile::tempdir().unwrap();
    // Shared library with two physical files, static library with one.
    for (how, nfiles) in [("shared", "2"), ("static", "1")] {
        let exe = compile(&lib, how, tmp.path());
        let data = tmp.path().join(format!("data-{how}"));
        std::fs::create_dir(&data).unwrap();
        let (name, serial) = (data.join("ckpt"), data.join("ckpt-serial"));
        mpirun(&exe, &[name.to_str().unwrap(), serial.to_str().unwrap(), nfiles], None, tmp.path());
        assert!(name.exists() && serial.exists());
        assert_eq!(data.join("ckpt.000001").exists(), nfiles == "2", "physical files of {how}");
    }
}

#[test]
fn the_c_checkpoint_example_runs_under_mpirun_on_shoal() {
    if !have_mpi() {
        return;
    }
    let lib = libshoal_container();
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::start(4);
    let exe = compile(&lib, "shared", tmp.path());
    // Parallel opens: shoal://ckpt through $SHOAL_CONFIG; serial calls: Shoal paths with the
    // configuration file given.
    mpirun(&exe, &["shoal://ckpt", "/ckpt-serial", "2", c.config.to_str().unwrap()], Some(&c.config), tmp.path());

    // Two physical files, each on one server of its own (multi-file mode on Shoal), striped
    // at the 4 KiB block size the program asked for.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = c.uncached_client();
    let servers: Vec<_> = rt.block_on(async {
        let mut servers = Vec::new();
        for path in ["/ckpt", "/ckpt.000001"] {
            let f = client.open(path, shoal_client::OpenFlags::read_only()).await.unwrap();
            assert_eq!(f.layout().stripe_size, 4096, "{path}");
            assert_eq!(f.layout().servers.len(), 1, "{path}");
            servers.push(f.layout().servers[0]);
            f.close().await.unwrap();
        }
        assert!(client.stat("/ckpt-serial").await.unwrap().size > 0);
        servers
    });
    assert_ne!(servers[0], servers[1], "the physical files share a server");
}
