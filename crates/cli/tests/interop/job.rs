//! `shoal job up|down` under `mpirun -np 4` on this one host: every rank is a "node" with
//! its own node-local folder and ports on 127.0.0.1, the shared directory stands for the
//! global file system. Real `shoald` processes, real mpirun, the native client to check.

use shoal_client::{Client, ClientOptions, OpenFlags};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `mpirun -np N shoal` set up for this machine (root, 2 cores), or `None` when not
/// installed (the test is skipped with a note, as the other mpirun tests do).
/// `orte_abort_on_non_zero_status 0` lets every rank finish even when one fails, so that
/// each rank's own line shows; mpirun then exits 0 whatever the ranks did, so each rank
/// runs under `sh`, which prints its exit status ("exit N", see [`exits`]).
fn mpirun(np: usize) -> Option<Command> {
    if Command::new("mpirun").arg("--version").stdin(Stdio::null()).output().is_err() {
        eprintln!("SKIPPED: mpirun is not installed (apt-get install openmpi-bin; scripts/env.sh lists it)");
        return None;
    }
    let mut cmd = Command::new("mpirun");
    cmd.env_remove("SHOAL_CONFIG")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["--oversubscribe", "--tag-output", "--mca", "orte_abort_on_non_zero_status", "0"])
        .arg("-np")
        .arg(np.to_string())
        .args(["sh", "-c", "\"$0\" \"$@\"; echo \"exit $?\" >&2"])
        .arg(env!("CARGO_BIN_EXE_shoal"))
        .stdin(Stdio::null());
    Some(cmd)
}

/// Run to the end, killed after `limit` (a hang is a failure): (exit code, stdout, stderr).
fn run(mut cmd: Command, limit: Duration) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let (o, e) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = cmd
        .stdout(std::fs::File::create(&o).unwrap())
        .stderr(std::fs::File::create(&e).unwrap())
        .spawn()
        .expect("start mpirun");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "still running after {} s:\nstdout: {}\nstderr: {}",
                limit.as_secs(),
                std::fs::read_to_string(&o).unwrap_or_default(),
                std::fs::read_to_string(&e).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status.code().unwrap_or(-1), std::fs::read_to_string(&o).unwrap(), std::fs::read_to_string(&e).unwrap())
}

/// Each rank's exit status, from the "exit N" lines of `mpirun --tag-output`.
fn exits(err: &str, np: u32) -> Vec<i32> {
    (0..np)
        .map(|r| {
            let tag = format!(",{r}]<stderr>:exit ");
            let line = err.lines().find(|l| l.contains(&tag)).unwrap_or_else(|| panic!("no exit of rank {r}:\n{err}"));
            line.rsplit(' ').next().unwrap().trim().parse().unwrap()
        })
        .collect()
}

/// Pids of the `shoald` processes whose command line names a config in `shared`.
fn shoalds_of(shared: &Path) -> Vec<i32> {
    let needle = shared.join("cluster.toml").to_string_lossy().into_owned();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else { continue };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let zombie = std::fs::read_to_string(e.path().join("stat")).map(|s| s.contains(") Z ")).unwrap_or(true);
        if cmd.contains("shoald") && cmd.contains(&needle) && !zombie {
            out.push(pid);
        }
    }
    out
}

/// Whatever happens in the test, no server of the formation outlives it.
struct Reaper(PathBuf);

impl Drop for Reaper {
    fn drop(&mut self) {
        for pid in shoalds_of(&self.0) {
            // SAFETY: kill(2) on a shoald this test's formation started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2654435761).rotate_left(seed as u32 % 31) as u8 ^ seed).collect()
}

/// Every regular file under `root` with its bytes, by relative path; directories as `None`.
fn tree(root: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if e.file_type().unwrap().is_dir() {
                todo.push(p);
                out.push((rel, None));
            } else {
                out.push((rel, Some(std::fs::read(&p).unwrap())));
            }
        }
    }
    out.sort();
    out
}

/// Folders `shoal-job-*/s<r>` under the node-local base.
fn local_dirs(base: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for j in std::fs::read_dir(base).unwrap().flatten() {
        for s in std::fs::read_dir(j.path()).into_iter().flatten().flatten() {
            out.push(s.path());
        }
    }
    out.sort();
    out
}

#[test]
fn job_up_stages_in_and_down_stages_out_the_tree_with_results() {
    let Some(mut up) = mpirun(4) else { return };
    let t = tempfile::tempdir().unwrap();
    let (shared, local, src, dst) =
        (t.path().join("shared"), t.path().join("local"), t.path().join("src"), t.path().join("dst"));
    let _reaper = Reaper(shared.clone());
    std::fs::create_dir_all(src.join("nested/deeper")).unwrap();
    std::fs::create_dir_all(src.join("empty-dir")).unwrap();
    std::fs::create_dir_all(&local).unwrap();
    std::fs::write(src.join("small.txt"), b"hello formation\n").unwrap();
    std::fs::write(src.join("zero"), b"").unwrap();
    // Larger than a stripe (64 KiB) and than --split-size (256 KiB): four ranks write its ranges.
    std::fs::write(src.join("nested/big.bin"), pattern((1 << 20) + 12345, 7)).unwrap();
    std::fs::write(src.join("nested/deeper/mid.bin"), pattern(100_000, 3)).unwrap();

    up.args(["job", "up", "--dir"]).arg(&shared).arg("--local").arg(&local);
    up.args(["--bind", "127.0.0.1", "--stripe-size", "64K", "--split-size", "256K", "--wait", "120", "--stage-in"]);
    up.arg(&src);
    let (code, out, err) = run(up, Duration::from_secs(240));
    assert_eq!(code, 0, "job up failed\nstdout: {out}\nstderr: {err}");
    assert_eq!(exits(&err, 4), vec![0; 4], "{err}");
    let config = shared.join("cluster.toml");
    assert!(out.contains(&format!("export SHOAL_CONFIG={}", config.canonicalize().unwrap().display())), "{out}");
    assert!(err.contains("staged in 4 files and 4 directories"), "{err}");
    // The formation outlived mpirun: four servers, each with its own node-local folder.
    assert_eq!(shoalds_of(&shared).len(), 4, "servers after job up");
    assert_eq!(local_dirs(&local).len(), 4, "{:?}", local_dirs(&local));
    // Every server's HTTP port, from the formation's map, answers.
    let map = shoal_placement::ClusterMap::load(&config).unwrap();
    for s in &map.servers {
        let url =
            format!("http://{}/health", s.http.as_deref().expect("the formation gives every server an HTTP port"));
        let out = Command::new("curl").args(["-sf", "--max-time", "10", &url]).output().expect("curl");
        assert!(out.status.success(), "{url}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let key = std::fs::metadata(shared.join("cluster.key")).unwrap();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&key.permissions()) & 0o777, 0o600);

    // The staged tree through the native client, and a result written by "the job".
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = Client::from_config(&config, ClientOptions::default()).unwrap();
        for rel in ["small.txt", "zero", "nested/big.bin", "nested/deeper/mid.bin"] {
            let want = std::fs::read(src.join(rel)).unwrap();
            let f = c.open(&format!("/{rel}"), OpenFlags::read_only()).await.unwrap();
            let got = f.read_at(0, want.len() + 10).await.unwrap();
            assert!(got[..] == want[..], "/{rel}: {} bytes read, {} expected", got.len(), want.len());
        }
        let big = c.stat("/nested/big.bin").await.unwrap();
        assert_eq!(big.size, (1 << 20) + 12345);
        assert!(c.stat("/empty-dir").await.unwrap().kind == shoal_client::FileKind::Dir);
        c.mkdir("/results", 0o755).await.unwrap();
        let f = c.create("/results/out.dat", 0o644, None).await.unwrap();
        f.write_at(0, &pattern(300_000, 11)).await.unwrap();
        f.close().await.unwrap();
    });
    drop(rt);

    let mut st = Command::new(env!("CARGO_BIN_EXE_shoal"));
    st.args(["job", "status", "--dir"]).arg(&shared);
    let (code, out, err) = run(st, Duration::from_secs(30));
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().filter(|l| l.contains("answers, pid")).count(), 4, "{out}");

    let mut down = mpirun(4).unwrap();
    down.args(["job", "down", "--dir"]).arg(&shared).args(["--split-size", "256K", "--stage-out"]).arg(&dst);
    let (code, out, err) = run(down, Duration::from_secs(240));
    assert_eq!(code, 0, "job down failed\nstdout: {out}\nstderr: {err}");
    assert_eq!(exits(&err, 4), vec![0; 4], "{err}");
    let mut want = tree(&src);
    want.push(("results".into(), None));
    want.push(("results/out.dat".into(), Some(pattern(300_000, 11))));
    want.sort();
    let got = tree(&dst);
    let names = |v: &[(String, Option<Vec<u8>>)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&got), names(&want));
    assert!(got == want, "stage-out bytes differ from the source and the result");
    // Nothing left: no server, no node-local data, no formation files.
    assert!(shoalds_of(&shared).is_empty(), "servers still running: {:?}", shoalds_of(&shared));
    assert!(local_dirs(&local).is_empty(), "{:?}", local_dirs(&local));
    assert!(std::fs::read_dir(&local).unwrap().next().is_none(), "node-local job folders left");
    assert!(!shared.exists(), "shared directory left: {:?}", std::fs::read_dir(&shared).map(|d| d.count()));
}

#[test]
fn job_up_with_a_missing_stage_in_source_fails_on_every_rank_and_leaves_nothing_running() {
    let Some(mut up) = mpirun(4) else { return };
    let t = tempfile::tempdir().unwrap();
    let (shared, local) = (t.path().join("shared"), t.path().join("local"));
    let _reaper = Reaper(shared.clone());
    std::fs::create_dir_all(&local).unwrap();
    up.args(["job", "up", "--dir"]).arg(&shared).arg("--local").arg(&local);
    up.args(["--bind", "127.0.0.1", "--wait", "60", "--stage-in"]).arg(t.path().join("no-such-source"));
    let (code, out, err) = run(up, Duration::from_secs(180));
    assert_eq!(code, 0, "mpirun itself: stdout: {out}\nstderr: {err}");
    assert_eq!(exits(&err, 4), vec![1; 4], "{err}");
    // One line from each rank (mpirun --tag-output: "[job,rank]<stderr>:"), naming the cause.
    for rank in 0..4 {
        let tag = format!(",{rank}]<stderr>:");
        let lines: Vec<&str> = err.lines().filter(|l| l.contains(&tag) && l.contains("shoal:")).collect();
        assert_eq!(lines.len(), 1, "rank {rank}:\n{err}");
        assert!(lines[0].contains("no-such-source") && lines[0].contains("rank "), "{}", lines[0]);
    }
    assert!(shoalds_of(&shared).is_empty(), "servers still running after the failure");
    assert!(local_dirs(&local).is_empty(), "{:?}", local_dirs(&local));

    // A second `job up` is refused until the failed formation is cleaned up ...
    let mut again = mpirun(4).unwrap();
    again.args(["job", "up", "--dir"]).arg(&shared).arg("--local").arg(&local).args([
        "--bind",
        "127.0.0.1",
        "--wait",
        "60",
    ]);
    let (code, _, err) = run(again, Duration::from_secs(180));
    assert_eq!(code, 0, "{err}");
    assert_eq!(exits(&err, 4), vec![1; 4], "{err}");
    assert!(err.contains("holds a formation already"), "{err}");
    assert!(shoalds_of(&shared).is_empty());
    // ... which `job down` without a launcher does.
    let mut down = Command::new(env!("CARGO_BIN_EXE_shoal"));
    down.args(["job", "down", "--dir"]).arg(&shared);
    let (code, out, err) = run(down, Duration::from_secs(60));
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(!shared.exists());
}

#[test]
fn job_up_without_a_launcher_is_a_usage_error() {
    let t = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["job", "up", "--dir"])
        .arg(t.path())
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("SLURM_PROCID")
        .env_remove("PMI_RANK")
        .env_remove("PMIX_RANK")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("runs under a launcher"), "{err}");
}

#[test]
fn job_down_whose_stage_out_fails_keeps_the_servers_and_cleanup_without_a_launcher_stops_them() {
    let Some(mut up) = mpirun(4) else { return };
    let t = tempfile::tempdir().unwrap();
    let (shared, local) = (t.path().join("shared"), t.path().join("local"));
    let _reaper = Reaper(shared.clone());
    std::fs::create_dir_all(&local).unwrap();
    up.args(["job", "up", "--dir"]).arg(&shared).arg("--local").arg(&local);
    up.args(["--bind", "127.0.0.1", "--wait", "60"]);
    let (code, out, err) = run(up, Duration::from_secs(180));
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert_eq!(exits(&err, 4), vec![0; 4], "{err}");
    assert_eq!(shoalds_of(&shared).len(), 4);

    // A destination below a regular file cannot be made: every rank fails, nothing stops,
    // because the results are not safe yet.
    let blocker = t.path().join("a-file");
    std::fs::write(&blocker, b"x").unwrap();
    let mut down = mpirun(4).unwrap();
    down.args(["job", "down", "--dir"]).arg(&shared).args(["--wait", "60", "--stage-out"]).arg(blocker.join("out"));
    let (code, _, err) = run(down, Duration::from_secs(180));
    assert_eq!(code, 0, "{err}");
    assert_eq!(exits(&err, 4), vec![1; 4], "{err}");
    assert!(err.contains("stage-out failed; the formation still runs"), "{err}");
    assert_eq!(shoalds_of(&shared).len(), 4, "servers stopped although the stage-out failed");
    assert_eq!(local_dirs(&local).len(), 4);

    // Clean-up without a launcher: every server of this node stopped, everything removed.
    let mut cleanup = Command::new(env!("CARGO_BIN_EXE_shoal"));
    cleanup.args(["job", "down", "--dir"]).arg(&shared);
    let (code, out, err) = run(cleanup, Duration::from_secs(120));
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("stopped 4 servers"), "{out}");
    assert!(shoalds_of(&shared).is_empty(), "servers still running: {:?}", shoalds_of(&shared));
    assert!(std::fs::read_dir(&local).unwrap().next().is_none(), "node-local data left");
    assert!(!shared.exists());
}
