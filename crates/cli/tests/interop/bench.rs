//! `shoal bench`: the benchmark's counts are right (files created equal what it reports,
//! bytes verified on read, one server request per small-file create/stat/unlink), on small
//! configurations against real `shoald` processes and local directories. No timed
//! assertions: only counts, sizes and the servers' own counters.

use serde_json::Value;
use shoal_testkit::Cluster;

fn run_json(c: &Cluster, args: &[&str]) -> Value {
    let (code, out, err) = c.shoal(args);
    assert_eq!(code, 0, "shoal {args:?} failed:\nstdout: {out}\nstderr: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}\nstderr: {err}"))
}

fn runs(report: &Value) -> &Vec<Value> {
    report["runs"].as_array().expect("runs")
}

fn phase<'a>(run: &'a Value, label: &str) -> &'a Value {
    run["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["label"] == label)
        .unwrap_or_else(|| panic!("no phase {label} in {run}"))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Names in a Shoal directory.
fn shoal_ls(c: &Cluster, path: &str) -> Vec<(String, u64)> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = c.uncached_client();
        let mut out = Vec::new();
        for e in client.readdir(path).await.unwrap() {
            let a = client.stat(&format!("{path}/{}", e.name)).await.unwrap();
            out.push((e.name, a.size));
        }
        out.sort();
        out
    })
}

#[test]
fn io_file_per_process_counts_and_verifies_on_native_and_posix() {
    let c = Cluster::start(4);
    let local = tempfile::tempdir().unwrap();
    let posix = format!("posix:{}", local.path().display());
    let r = run_json(
        &c,
        &[
            "bench",
            "io",
            "-T",
            &format!("native,{posix}"),
            "-n",
            "2",
            "-F",
            "-t",
            "64K",
            "-b",
            "1M",
            "-s",
            "2",
            "-e",
            "-R",
            "-C",
            "--stripe-count",
            "-1",
            "--stripe-size",
            "64K",
            "--warm-read",
            "--json",
            "-q",
        ],
    );
    let all = runs(&r);
    assert_eq!(all.len(), 2);
    for run in all {
        let w = phase(run, "write");
        assert_eq!(u(&w["ops"]), 2 * 32, "{run}");
        assert_eq!(u(&w["bytes"]), 4 << 20);
        assert_eq!(u(&w["procs"]), 2);
        for label in ["read", "read-warm"] {
            let rd = phase(run, label);
            assert_eq!(u(&rd["ops"]), 64);
            assert_eq!(u(&rd["verified_bytes"]), 4 << 20, "{label}: every byte read was checked");
            assert_eq!(u(&rd["verify_errors"]), 0);
        }
    }
    // The servers saw the data: at least the bytes written arrived, spread over all four
    // servers (files striped over every server).
    let native = &all[0];
    assert_eq!(native["target"], "native");
    let s = &phase(native, "write")["servers"];
    assert!(f(&s["bytes_received_per_op"]) >= 65536.0, "{s}");
    let per = s["per_server"].as_array().unwrap();
    assert_eq!(per.len(), 4);
    assert!(per.iter().all(|d| u(&d["bytes_received"]) >= (1 << 20)), "{s}");
    assert!(f(&s["ops_per_op"]["write"]) >= 1.0, "{s}");
    let s = &phase(native, "read")["servers"];
    assert!(f(&s["bytes_sent_per_op"]) >= 65536.0, "{s}");
    assert!(all[1]["phases"][0]["servers"].is_null(), "a local directory has no server counters");
    // Cleaned up afterwards, on both targets.
    assert!(shoal_ls(&c, "/shoal-bench").is_empty());
    assert_eq!(std::fs::read_dir(local.path()).unwrap().count(), 0);
}

#[test]
fn io_shared_file_interleaved_random_keeps_exact_sizes() {
    let c = Cluster::start(4);
    // IO500 ior-hard pattern, small: 47,008-byte blocks interleaved, random order.
    let r = run_json(
        &c,
        &[
            "bench", "io", "-T", "native", "-n", "2", "-t", "47008", "-b", "47008", "-s", "6", "-z", "-e", "-R",
            "--keep", "--json", "-q",
        ],
    );
    let run = &runs(&r)[0];
    assert_eq!(u(&phase(run, "write")["bytes"]), 2 * 6 * 47008);
    assert_eq!(u(&phase(run, "read")["verified_bytes"]), 2 * 6 * 47008);
    assert_eq!(u(&phase(run, "read")["verify_errors"]), 0);
    let dirs = shoal_ls(&c, "/shoal-bench");
    assert_eq!(dirs.len(), 1);
    let files = shoal_ls(&c, &format!("/shoal-bench/{}", dirs[0].0));
    assert_eq!(files, vec![("ior.shared".to_string(), 2 * 6 * 47008)]);
}

#[test]
fn md_easy_creates_what_it_reports_with_one_request_per_op() {
    let c = Cluster::start(4);
    // Create only, and keep: the files must be there, 150 in each process's directory.
    let r = run_json(
        &c,
        &["bench", "md", "-T", "native", "-n", "2", "-N", "150", "--phases", "create", "--keep", "--json", "-q"],
    );
    let run = &runs(&r)[0];
    assert_eq!(u(&phase(run, "create")["ops"]), 300);
    let dirs = shoal_ls(&c, "/shoal-bench");
    assert_eq!(dirs.len(), 1);
    let root = format!("/shoal-bench/{}", dirs[0].0);
    let per_rank = shoal_ls(&c, &root);
    assert_eq!(per_rank.iter().map(|d| d.0.as_str()).collect::<Vec<_>>(), vec!["d.00000", "d.00001"]);
    for (d, _) in &per_rank {
        let files = shoal_ls(&c, &format!("{root}/{d}"));
        assert_eq!(files.len(), 150, "{d}");
        assert!(files.iter().all(|(_, size)| *size == 0));
    }

    // The whole mdtest-easy cycle, sequential and with 8 in flight: with the default
    // placement a small file's create, stat and unlink are exactly one request to one server,
    // plus, while a directory splits (200 names: over all 4 servers), one more for a request
    // sent with a view from before a split (answered with the new bitmap: `misrouted`).
    let r = run_json(&c, &["bench", "md", "-T", "native,native@8", "-n", "2", "-N", "200", "--json", "-q"]);
    for run in runs(&r) {
        for label in ["create", "stat", "unlink"] {
            let p = phase(run, label);
            assert_eq!(u(&p["ops"]), 400);
            let s = &p["servers"];
            let requests: u64 = s["per_server"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| u(&d["client_requests"]) + u(&d["peer_requests"]))
                .sum();
            let resent = misrouted(s, 400);
            // Requests besides the servers' own steps of splits and of link counts: one per
            // operation, one per request sent again, and for a stat of a name a split moved
            // (its inode stayed where it was made) the `getattr` at the inode's server.
            let steps = count(s, 400, "peer_split_in")
                + count(s, 400, "peer_add_partition")
                + count(s, 400, "peer_partitions")
                + count(s, 400, "peer_link_delta");
            assert_eq!(
                requests - steps,
                400 + resent + count(s, 400, "getattr"),
                "{} {label}: one request per operation: {s}",
                run["target"]
            );
            // At most the requests in flight at a split (3 in each of the 2 directories) are
            // sent with the view from before it.
            let in_flight = if run["target"].as_str().unwrap_or("").contains("@8") { 8 } else { 1 };
            assert!(resent <= 2 * 3 * in_flight, "{} {label}: {resent} requests sent again: {s}", run["target"]);
            let op = match label {
                "stat" => "lookup",
                other => other,
            };
            let ran = (f(&s["ops_per_op"][op]) * 400.0).round() as u64;
            assert!((400..=400 + resent).contains(&ran), "{s}");
        }
    }
    // Everything the benchmark made is gone (the kept run is still there).
    assert_eq!(shoal_ls(&c, "/shoal-bench").len(), 1);
}

/// Requests of a phase of `ops` operations that a server answered with a split directory's
/// bitmap (sent with a stale view; the client sent them again).
fn misrouted(servers: &serde_json::Value, ops: u64) -> u64 {
    count(servers, ops, "misrouted")
}

/// How many `op` the servers counted in a phase of `ops` operations.
fn count(servers: &serde_json::Value, ops: u64, op: &str) -> u64 {
    (servers["ops_per_op"][op].as_f64().unwrap_or(0.0) * ops as f64).round() as u64
}

/// `native#B`: B operations per request. 200 files per process in batches of 16 (the last
/// one 8): every file made, stated and removed, each operation counted once by name; the
/// 13 calls per process and phase go as one batch request to each server holding names of
/// the call (the directories split over the 4 servers as they grow).
#[test]
fn md_easy_in_batches_counts_every_file_and_one_request_per_batch() {
    let c = Cluster::start(4);
    let r = run_json(&c, &["bench", "md", "-T", "native#16,native#16@3", "-n", "2", "-N", "200", "--json", "-q"]);
    for run in runs(&r) {
        for label in ["create", "stat", "unlink"] {
            let p = phase(run, label);
            assert_eq!(u(&p["ops"]), 400, "{} {label}", run["target"]);
            let s = &p["servers"];
            let requests: u64 = s["per_server"].as_array().unwrap().iter().map(|d| u(&d["client_requests"])).sum();
            let resent = misrouted(s, 400);
            // A call's batch is sent again to the right server for its misrouted names; a stat
            // of a name a split moved asks the inode's server too.
            assert!(
                (2 * 13..=2 * 13 * 4 + resent + count(s, 400, "getattr")).contains(&requests),
                "{} {label}: one request per server and batch: {s}",
                run["target"]
            );
            let op = if label == "stat" { "lookup" } else { label };
            let ran = (f(&s["ops_per_op"][op]) * 400.0).round() as u64;
            assert!((400..=400 + resent).contains(&ran), "{s}");
        }
    }
    assert_eq!(shoal_ls(&c, "/shoal-bench").len(), 0, "the runs cleaned up");
    // Batches are a native client feature.
    let (code, out, err) = c.shoal(&["bench", "md", "-T", "tmpfs#4", "-N", "10"]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(err.contains("native client feature"), "{err}");
}

#[test]
fn md_hard_shared_directory_reads_back_every_byte() {
    let c = Cluster::start(3);
    let local = tempfile::tempdir().unwrap();
    let r = run_json(
        &c,
        &[
            "bench",
            "md",
            "-T",
            &format!("native,posix:{}", local.path().display()),
            "-n",
            "3",
            "-N",
            "40",
            "--shared-dir",
            "--size",
            "3901",
            "--shift",
            "--verify",
            "--dirs",
            "--json",
            "-q",
        ],
    );
    for run in runs(&r) {
        let labels: Vec<&str> =
            run["phases"].as_array().unwrap().iter().map(|p| p["label"].as_str().unwrap()).collect();
        assert_eq!(labels, vec!["mkdir", "create", "stat", "read", "unlink", "rmdir"]);
        for p in run["phases"].as_array().unwrap() {
            assert_eq!(u(&p["ops"]), 120, "{p}");
        }
        let rd = phase(run, "read");
        assert_eq!(u(&rd["verified_bytes"]), 120 * 3901);
        assert_eq!(u(&rd["verify_errors"]), 0);
        assert_eq!(u(&phase(run, "create")["bytes"]), 120 * 3901);
    }
    assert_eq!(std::fs::read_dir(local.path()).unwrap().count(), 0);
}

/// The `list` phase lists every name once (shared directory: process 0 lists it; else each
/// process its own) and counts entries; every phase reports the rates of its first and last
/// 10 % of operations and their ratio, per run and as a median per target.
#[test]
fn md_list_phase_and_the_rates_of_the_first_and_last_tenth() {
    let c = Cluster::start(4);
    let local = tempfile::tempdir().unwrap();
    for shared in [true, false] {
        let targets = format!("native,native@4,posix:{}", local.path().display());
        let mut args = vec!["bench", "md", "-T", &targets, "-n", "2", "-N", "300"];
        args.extend(["--phases", "create,list,stat,unlink", "--json", "-q"]);
        if shared {
            args.push("--shared-dir");
        }
        let r = run_json(&c, &args);
        assert_eq!(runs(&r).len(), 3);
        for run in runs(&r) {
            let labels: Vec<&str> =
                run["phases"].as_array().unwrap().iter().map(|p| p["label"].as_str().unwrap()).collect();
            assert_eq!(labels, vec!["create", "list", "stat", "unlink"], "{}", run["target"]);
            for p in run["phases"].as_array().unwrap() {
                // The list phase's operations are the entries listed: every file once.
                assert_eq!(u(&p["ops"]), 600, "shared {shared}: {p}");
                let d = &p["deciles"];
                for key in ["first_ops_s", "last_ops_s", "last_over_first"] {
                    let v = d[key].as_f64().unwrap_or(f64::NAN);
                    assert!(v.is_finite() && v > 0.0, "shared {shared}, {}: {key} = {v} in {p}", run["target"]);
                }
                let ratio = f(&d["last_ops_s"]) / f(&d["first_ops_s"]);
                assert!((ratio - f(&d["last_over_first"])).abs() <= 1e-9 * ratio, "{d}");
            }
            if run["target"] != "posix" {
                // Listing is ReadDir requests, a page (up to 4,096 entries) per partition at most.
                let list = &phase(run, "list")["servers"];
                assert!(f(&list["ops_per_op"]["readdir"]) > 0.0, "{list}");
            }
        }
        let summary = r["summary"].as_array().unwrap();
        assert_eq!(summary.len(), 4 * 3);
        for row in summary {
            let v = f(&row["last_over_first"]);
            assert!(v.is_finite() && v > 0.0, "{row}");
        }
    }
    assert_eq!(shoal_ls(&c, "/shoal-bench").len(), 0, "the runs cleaned up");
    assert_eq!(std::fs::read_dir(local.path()).unwrap().count(), 0);
    // The table shows the column; list is a phase name `--help` knows.
    let (code, out, err) =
        c.shoal(&["bench", "md", "-T", "native", "-n", "2", "-N", "50", "--phases", "create,list,unlink", "-q"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("last/first 10%") && out.contains("list"), "{out}");
    let (code, _, err) = c.shoal(&["bench", "md", "--phases", "create,lst"]);
    assert_eq!(code, 2);
    assert!(err.contains("list"), "{err}");
}

#[test]
fn compare_sweep_and_plots() {
    let c = Cluster::start(2);
    let tmp = tempfile::tempdir().unwrap();
    let local = tmp.path().join("local");
    let shm = tmp.path().join("shm");
    std::fs::create_dir_all(&local).unwrap();
    std::fs::create_dir_all(&shm).unwrap();
    let targets = format!("native,local:{},tmpfs:{}", local.display(), shm.display());
    let svg = tmp.path().join("md.svg");
    let r = run_json(
        &c,
        &[
            "bench",
            "md",
            "-T",
            &targets,
            "--compare",
            "--reps",
            "2",
            "-n",
            "1",
            "-N",
            "30",
            "--plot",
            svg.to_str().unwrap(),
            "--json",
            "-q",
        ],
    );
    // Alternating: native, local, tmpfs, native, local, tmpfs.
    let order: Vec<&str> = runs(&r).iter().map(|r| r["target"].as_str().unwrap()).collect();
    assert_eq!(order, vec!["native", "local", "tmpfs", "native", "local", "tmpfs"]);
    let summary = r["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 3 * 3);
    for row in summary {
        assert_eq!(u(&row["runs"]), 2);
        assert!(row["vs_local"].is_number() && row["vs_tmpfs"].is_number(), "{row}");
        if row["target"] == "tmpfs" {
            assert_eq!(f(&row["vs_tmpfs"]), 1.0);
        }
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.contains("native"), "{text}");

    // A sweep of the transfer size, charted as PNG; the human table on the terminal.
    let png = tmp.path().join("bw.png");
    let (code, out, err) = c.shoal(&[
        "bench",
        "io",
        "-T",
        "native",
        "-n",
        "1",
        "-F",
        "-b",
        "256K",
        "-R",
        "--sweep",
        "transfer=16K,64K,256K",
        "--plot",
        png.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(out.matches("target native").count(), 3, "{out}");
    assert!(out.contains("MiB/s") && out.contains("servers during write"), "{out}");
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
}

#[test]
fn usage_errors_exit_2() {
    let c = Cluster::start(1);
    for args in [
        vec!["bench", "io", "-T", "nfs:/x"],
        vec!["bench", "io", "-t", "3M", "-b", "4M"],
        vec!["bench", "md", "--phases", "create,dance"],
        vec!["bench", "io", "--sweep", "colour=1,2"],
    ] {
        let (code, _, err) = c.shoal(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.starts_with("shoal: "), "{err}");
    }
    // No cluster at all for a native target: a usage error too.
    let (code, _, err) = shoal_testkit::shoal_cmd(None, &["bench", "md", "-N", "1"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn quick_suite_writes_the_report() {
    let c = Cluster::start(4);
    let tmp = tempfile::tempdir().unwrap();
    let doc = tmp.path().join("benchmarks.md");
    std::fs::write(
        &doc,
        "old\n<!-- Everything below this line is kept when `shoal bench suite` rewrites this file. -->\nmy notes\n",
    )
    .unwrap();
    let shm = tmp.path().join("shm");
    std::fs::create_dir_all(&shm).unwrap();
    let targets = format!("native,local:{},tmpfs:{}", tmp.path().display(), shm.display());
    let save = tmp.path().join("suite.json");
    let (code, out, err) = c.shoal(&[
        "bench",
        "suite",
        "--scale",
        "quick",
        "--reps",
        "1",
        "-T",
        &targets,
        "--doc",
        doc.to_str().unwrap(),
        "--save",
        save.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let md = std::fs::read_to_string(&doc).unwrap();
    for needle in [
        "# Benchmarks",
        "## Machine",
        "## io-easy",
        "## io-hard",
        "## md-easy",
        "## md-hard",
        "## pxfs-64k",
        "## pxfs-1m",
        "Targets of issues #4, #12 and #13",
        "Per server, `native`",
    ] {
        assert!(md.contains(needle), "{needle} missing from:\n{md}");
    }
    assert!(!md.starts_with("old"), "rewritten");
    assert!(md.trim_end().ends_with("my notes"), "the kept section survives:\n{md}");
    let all: Value = serde_json::from_str(&std::fs::read_to_string(&save).unwrap()).unwrap();
    // The single-request criterion is measured and met (not a timing: a count).
    let checks = all["checks"].as_array().unwrap();
    let single: Vec<&Value> =
        checks.iter().filter(|c| c["what"].as_str().unwrap().contains("server requests per op")).collect();
    assert_eq!(single.len(), 3);
    for c in single {
        assert_eq!(c["met"], true, "{c}");
    }
    assert_eq!(all["cases"].as_array().unwrap().len(), 6);
    // The PXFS cases compare the synchronous and the asynchronous client.
    let pxfs = checks.iter().filter(|c| c["what"].as_str().unwrap().starts_with("pxfs-64k")).count();
    assert_eq!(pxfs, 2);
}

// ------------------------------------------------------------------ under mpirun

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `mpirun` with what it needs on this kind of machine, or `None` (the test is skipped)
/// when it is not installed. Open MPI refuses root without --allow-run-as-root (given here
/// through its two environment variables) and more ranks than cores without
/// --oversubscribe; no MPI library is involved (`shoal` does not call MPI_Init).
fn mpirun() -> Option<Command> {
    let out = match Command::new("mpirun").arg("--version").stdin(Stdio::null()).output() {
        Ok(o) => o,
        Err(_) => {
            eprintln!("SKIPPED: mpirun is not installed (apt-get install openmpi-bin; scripts/env.sh lists it)");
            return None;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let mut cmd = Command::new("mpirun");
    // The ranks pick their rendezvous address themselves (loopback: one host).
    cmd.env_remove("SHOAL_CONFIG").env_remove("SHOAL_BENCH_ADDR").stdin(Stdio::null());
    if text.contains("Open MPI") || text.contains("OpenRTE") {
        cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1").arg("--oversubscribe");
    }
    Some(cmd)
}

/// Children killed when the test ends, whatever happened.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Start `cmd` with its output in files under `dir`.
fn start(cmd: &mut Command, dir: &std::path::Path, name: &str) -> Child {
    let out = std::fs::File::create(dir.join(format!("{name}.out"))).unwrap();
    let err = std::fs::File::create(dir.join(format!("{name}.err"))).unwrap();
    cmd.stdout(out).stderr(err).spawn().unwrap_or_else(|e| panic!("cannot start {name}: {e}"))
}

/// Wait for a child, killing it after `limit` (a hang is a failure, not a stuck test).
fn finish(child: &mut Child, dir: &std::path::Path, name: &str, limit: Duration) -> (i32, String, String) {
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{name} still running after {} s:\nstdout: {}\nstderr: {}",
                limit.as_secs(),
                std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap_or_default(),
                std::fs::read_to_string(dir.join(format!("{name}.err"))).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status.code().unwrap_or(-1),
        std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap(),
        std::fs::read_to_string(dir.join(format!("{name}.err"))).unwrap(),
    )
}

/// `mpirun -np N shoal --config C ARGS…` to its end: (exit code, stdout, stderr).
fn mpirun_shoal(c: &Cluster, np: usize, args: &[&str], env: &[(&str, &str)]) -> Option<(i32, String, String)> {
    let mut cmd = mpirun()?;
    cmd.arg("-np").arg(np.to_string()).arg(env!("CARGO_BIN_EXE_shoal")).arg("--config").arg(&c.config).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = start(&mut cmd, dir.path(), "mpirun");
    Some(finish(&mut child, dir.path(), "mpirun", Duration::from_secs(300)))
}

/// Entries of a Shoal directory (names only; empty when it does not exist).
fn shoal_names(c: &Cluster, path: &str) -> Vec<String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        c.uncached_client().readdir(path).await.map(|v| v.into_iter().map(|e| e.name).collect()).unwrap_or_default()
    })
}

#[test]
fn mpirun_ranks_are_the_benchmark_processes() {
    if mpirun().is_none() {
        return;
    }
    let c = Cluster::start(3);
    // mdtest-easy, create only, kept: 3 ranks, 3 directories of 60 files, one report.
    let (code, out, err) =
        mpirun_shoal(&c, 3, &["bench", "md", "-N", "60", "--phases", "create", "--keep", "--json", "-q"], &[]).unwrap();
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert_eq!(out.matches("\"summary\"").count(), 1, "exactly one rank prints: {out}");
    let r: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not one JSON document ({e}): {out}"));
    assert_eq!(u(&r["procs"]), 3);
    let mpi = &r["mpi"];
    assert_eq!(u(&mpi["ranks"]), 3, "{mpi}");
    // Every rank runs on this host (the launcher says so): rank 0 listened on, and
    // published, a loopback address; nothing went to the host's other addresses.
    let listen: std::net::SocketAddr = mpi["listen"].as_str().unwrap().parse().unwrap();
    assert!(
        matches!(listen.ip(), std::net::IpAddr::V4(ip) if ip.is_loopback()),
        "rank 0 listened on {listen}, not on 127.0.0.0/8: {mpi}"
    );
    let hosts: Vec<&str> = mpi["hosts"].as_array().unwrap().iter().map(|h| h.as_str().unwrap()).collect();
    assert_eq!(hosts.len(), 3);
    assert!(
        hosts.iter().all(|h| !hosts.iter().filter(|o| o == &h).skip(1).any(|_| true)),
        "one process per rank: {hosts:?}"
    );
    let run = &runs(&r)[0];
    let p = phase(run, "create");
    assert_eq!((u(&p["ops"]), u(&p["procs"])), (180, 3));
    let dirs = shoal_names(&c, "/shoal-bench");
    assert_eq!(dirs.len(), 1);
    let root = format!("/shoal-bench/{}", dirs[0]);
    let mut per_rank = shoal_names(&c, &root);
    per_rank.sort();
    assert_eq!(per_rank, vec!["d.00000", "d.00001", "d.00002"]);
    for d in &per_rank {
        assert_eq!(shoal_names(&c, &format!("{root}/{d}")).len(), 60, "{d}");
    }
    // The rendezvous file (next to the cluster configuration) is gone.
    let left: Vec<String> = std::fs::read_dir(c.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("rendezvous"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // The whole cycle with the human report, -n given as the MPI size: one rank prints it,
    // and every operation is one request (30 files a directory: below the split threshold).
    let (code, out, err) = mpirun_shoal(&c, 3, &["bench", "md", "-n", "3", "-N", "30", "-q"], &[]).unwrap();
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert_eq!(out.matches("mdtest: 3 processes").count(), 1, "{out}");
    assert_eq!(out.matches("mpirun: 3 ranks").count(), 1, "{out}");
    assert_eq!(out.matches("target native").count(), 1, "{out}");
    for label in ["create", "stat", "unlink"] {
        assert!(
            out.contains(&format!("servers during {label}: per operation 1.00 client + 0.00 peer requests")),
            "{out}"
        );
    }

    // IOR, file per process, reads shifted to the next rank, every byte checked; clocks
    // placed by ping-pong (forced: on one machine they would be taken as one clock).
    let (code, out, err) = mpirun_shoal(
        &c,
        3,
        &["bench", "io", "-F", "-t", "64K", "-b", "1M", "-s", "2", "-e", "-R", "-C", "--json", "-q"],
        &[("SHOAL_BENCH_CLOCK", "measure")],
    )
    .unwrap();
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    let r: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not one JSON document ({e}): {out}"));
    let run = &runs(&r)[0];
    assert_eq!(u(&phase(run, "write")["bytes"]), 3 * (2 << 20));
    assert_eq!(u(&phase(run, "write")["procs"]), 3);
    let rd = phase(run, "read");
    assert_eq!((u(&rd["ops"]), u(&rd["verified_bytes"]), u(&rd["verify_errors"])), (96, 3 * (2 << 20), 0));
    let clocks: Vec<&str> = r["mpi"]["clock"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    assert_eq!(clocks, vec!["rank 0", "ping-pong", "ping-pong"]);

    // IOR, one shared file interleaved in random order (ior-hard), and two targets in a
    // row over the same connections.
    let local = tempfile::tempdir().unwrap();
    let targets = format!("native,posix:{}", local.path().display());
    let (code, out, err) = mpirun_shoal(
        &c,
        3,
        &["bench", "io", "-T", &targets, "-t", "47008", "-b", "47008", "-s", "4", "-z", "-R", "--json", "-q"],
        &[],
    )
    .unwrap();
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(runs(&r).len(), 2);
    for run in runs(&r) {
        let rd = phase(run, "read");
        assert_eq!((u(&rd["verified_bytes"]), u(&rd["verify_errors"])), (3 * 4 * 47008, 0), "{}", run["target"]);
    }
    // Cleaned up (the kept md run is still there).
    assert_eq!(shoal_names(&c, "/shoal-bench").len(), 1);
    assert_eq!(std::fs::read_dir(local.path()).unwrap().count(), 0);

    // SHOAL_BENCH_ADDR names where rank 0 listens (here another loopback address).
    let (code, out, err) = mpirun_shoal(
        &c,
        3,
        &["bench", "md", "-N", "5", "--phases", "create", "--json", "-q"],
        &[("SHOAL_BENCH_ADDR", "127.0.0.2")],
    )
    .unwrap();
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    let r: Value = serde_json::from_str(&out).unwrap();
    let listen: std::net::SocketAddr = r["mpi"]["listen"].as_str().unwrap().parse().unwrap();
    assert_eq!(listen.ip().to_string(), "127.0.0.2", "{}", r["mpi"]);

    // -n other than the MPI size is a usage error.
    let (code, _, err) = mpirun_shoal(&c, 3, &["bench", "md", "-n", "2", "-N", "5", "-q"], &[]).unwrap();
    assert_ne!(code, 0);
    assert!(err.contains("-n 2 under mpirun with 3 ranks"), "{err}");
}

/// A rank started by hand as rank `rank` of `size` (what mpirun's environment says), with
/// its output in files under `dir`.
fn start_rank(c: &Cluster, dir: &std::path::Path, job: &str, rank: usize, size: usize, args: &[&str]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shoal"));
    cmd.env_remove("SHOAL_CONFIG")
        .env_remove("SHOAL_BENCH_ADDR")
        .stdin(Stdio::null())
        .env("OMPI_COMM_WORLD_RANK", rank.to_string())
        .env("OMPI_COMM_WORLD_SIZE", size.to_string())
        .env("OMPI_COMM_WORLD_LOCAL_SIZE", size.to_string())
        .env("PMIX_NAMESPACE", job)
        .arg("--config")
        .arg(&c.config)
        .args(args);
    start(&mut cmd, dir, &format!("rank{rank}"))
}

/// Wait (bounded) until rank `rank`'s mdtest directory of the one run has `n` entries.
fn wait_for_files(c: &Cluster, rank: usize, n: usize) {
    let t0 = Instant::now();
    loop {
        if let Some(run) = shoal_names(c, "/shoal-bench").into_iter().find(|d| d.starts_with("shoal-bench.")) {
            if shoal_names(c, &format!("/shoal-bench/{run}/d.{rank:05}")).len() >= n {
                return;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "rank {rank} never created {n} files");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn mpirun_rank_missing_or_gone_fails_the_run_naming_it() {
    let Some(mut cmd) = mpirun() else { return };
    let c = Cluster::start(2);
    let tmp = tempfile::tempdir().unwrap();
    let limit = Duration::from_secs(120);

    // Under mpirun: the third rank is not shoal at all, so it never arrives.
    cmd.arg("-np")
        .arg("2")
        .arg(env!("CARGO_BIN_EXE_shoal"))
        .arg("--config")
        .arg(&c.config)
        .args(["bench", "md", "-N", "10", "-q", "--rendezvous-timeout", "5"])
        .args([":", "-np", "1", "sleep", "600"]);
    let mut child = start(&mut cmd, tmp.path(), "mpirun");
    let mut procs = Procs(Vec::new());
    let (code, out, err) = finish(&mut child, tmp.path(), "mpirun", limit);
    assert_ne!(code, 0, "{out}\n{err}");
    // (Rank 1 is named too if this machine was too busy to start it within the time.)
    assert!(
        err.contains("shoal: rank 2 did not arrive within 5 s")
            || err.contains("shoal: ranks 1, 2 did not arrive within 5 s"),
        "{err}"
    );

    // By hand (the launcher's variables set for each process), so that a rank can be
    // killed in the middle of a phase without the launcher stopping the others first.
    let big =
        ["bench", "md", "-N", "10000000", "--phases", "create", "-q", "--rendezvous", "", "--rendezvous-timeout", "60"];
    let with_file = |name: &str| -> Vec<String> {
        let f = tmp.path().join(name).display().to_string();
        big.iter().map(|a| if a.is_empty() { f.clone() } else { a.to_string() }).collect()
    };
    let args = with_file("rv1");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Rank 2 dies in the middle of the create phase: rank 0 fails the run naming it, and
    // rank 1 stops when rank 0 goes.
    for r in 0..3 {
        procs.0.push(start_rank(&c, tmp.path(), "job-a", r, 3, &args));
    }
    wait_for_files(&c, 2, 20);
    procs.0[2].kill().unwrap();
    procs.0[2].wait().unwrap();
    let (code, _, err) = finish(&mut procs.0[0], tmp.path(), "rank0", limit);
    assert_eq!(code, 1, "{err}");
    let line = err.lines().find(|l| l.starts_with("shoal: ")).unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(line.contains("phase create: rank 2 (") && line.contains("connection closed"), "{err}");
    let (code, _, err) = finish(&mut procs.0[1], tmp.path(), "rank1", limit);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("rank 1: lost the connection to rank 0"), "{err}");
    procs.0.clear();

    // Rank 0 dies: every other rank stops with an error, in the middle of its phase.
    let args = with_file("rv2");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async { c.client().remove_all("/shoal-bench").await.unwrap() });
    for r in 0..3 {
        procs.0.push(start_rank(&c, tmp.path(), "job-b", r, 3, &args));
    }
    wait_for_files(&c, 1, 20);
    procs.0[0].kill().unwrap();
    procs.0[0].wait().unwrap();
    for r in 1..3 {
        let (code, _, err) = finish(&mut procs.0[r], tmp.path(), &format!("rank{r}"), limit);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(&format!("rank {r}: lost the connection to rank 0")), "{err}");
    }
    procs.0.clear();

    // Rank 0 never comes: the others give up after their rendezvous timeout, naming the file.
    let f = tmp.path().join("rv3").display().to_string();
    let mut lone = start_rank(
        &c,
        tmp.path(),
        "job-c",
        1,
        2,
        &["bench", "md", "-N", "10", "-q", "--rendezvous", &f, "--rendezvous-timeout", "2"],
    );
    let (code, _, err) = finish(&mut lone, tmp.path(), "rank1", limit);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("rank 1: could not join rank 0 within 2 s through the rendezvous file") && err.contains("rv3"),
        "{err}"
    );
}

/// `shoal bench container`: every layout on the native client and a local directory writes,
/// reads back (each task's bytes checked: a wrong byte fails the run) and reports its bytes
/// on disk; coalescing packs 1 KiB tasks into little more than their data.
#[test]
fn container_benchmark_runs_every_layout_on_native_and_posix() {
    let c = Cluster::start(4);
    let local = tempfile::tempdir().unwrap();
    let posix = format!("posix:{}", local.path().display());
    let r =
        run_json(&c, &["bench", "container", "-T", &format!("native,{posix}"), "-N", "24", "-s", "1K,96K", "--json"]);
    let rows = r["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2 * 2 * 4, "{r}");
    for row in rows {
        let data = u(&row["data_bytes"]);
        assert_eq!(data, 24 * u(&row["size"]), "{row}");
        assert!(f(&row["create_s"]) > 0.0 && f(&row["write_mib_s"]) > 0.0 && f(&row["read_mib_s"]) > 0.0, "{row}");
        let size = u(&row["size_bytes"]);
        assert!(size >= data, "files smaller than the data: {row}");
        if row["target"] == "posix" {
            assert!(u(&row["disk_bytes"]) >= data, "less on disk than the data: {row}");
        } else {
            assert!(row["disk_bytes"].is_null(), "{row}");
        }
        if row["layout"] == "coalesced" && row["size"] == 1024 && row["target"] == "posix" {
            // Groups of tasks fill one 4 KiB block each; plus the header's and the tail's
            // blocks. (On Shoal the blocks are 1 MiB stripes: 24 tasks fill a fortieth.)
            assert!(size <= 2 * data, "coalesced container of {size} bytes for {data}: {row}");
        }
    }
    // The run directories are gone.
    assert!(shoal_ls(&c, "/shoal-bench").is_empty());
    assert_eq!(std::fs::read_dir(local.path()).unwrap().count(), 0);
    let (code, _, err) = c.shoal(&["bench", "container", "-T", &posix, "-L", "sion,nope"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unknown layout \"nope\""), "{err}");
}
