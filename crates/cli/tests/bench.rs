//! `shoal bench`: the benchmark's counts are right (files created equal what it reports,
//! bytes verified on read, one server request per small-file create/stat/unlink), on small
//! configurations against real `shoald` processes and local directories. No timed
//! assertions: only counts, sizes and the servers' own counters.

mod common;

use common::Cluster;
use serde_json::Value;

fn run_json(c: &Cluster, args: &[&str]) -> Value {
    let (code, out, err) = c.shoal(args);
    assert_eq!(code, 0, "shoal {args:?} failed:\nstdout: {out}\nstderr: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}\nstderr: {err}"))
}

fn runs(report: &Value) -> &Vec<Value> {
    report["runs"].as_array().expect("runs")
}

fn phase<'a>(run: &'a Value, label: &str) -> &'a Value {
    run["phases"].as_array().unwrap().iter().find(|p| p["label"] == label).unwrap_or_else(|| panic!("no phase {label} in {run}"))
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
        &["bench", "io", "-T", &format!("native,{posix}"), "-n", "2", "-F", "-t", "64K", "-b", "1M", "-s", "2", "-e", "-R", "-C", "--stripe-count", "-1", "--stripe-size", "64K", "--warm-read", "--json", "-q"],
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
        &["bench", "io", "-T", "native", "-n", "2", "-t", "47008", "-b", "47008", "-s", "6", "-z", "-e", "-R", "--keep", "--json", "-q"],
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
    let r = run_json(&c, &["bench", "md", "-T", "native", "-n", "2", "-N", "150", "--phases", "create", "--keep", "--json", "-q"]);
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
    // placement a small file's create, stat and unlink are exactly one request to one server.
    let r = run_json(&c, &["bench", "md", "-T", "native,native@8", "-n", "2", "-N", "200", "--json", "-q"]);
    for run in runs(&r) {
        for label in ["create", "stat", "unlink"] {
            let p = phase(run, label);
            assert_eq!(u(&p["ops"]), 400);
            let s = &p["servers"];
            let total: u64 = s["per_server"].as_array().unwrap().iter().map(|d| u(&d["client_requests"]) + u(&d["peer_requests"])).sum();
            assert_eq!(total, 400, "{} {label}: one request per operation: {s}", run["target"]);
            let op = match label {
                "stat" => "lookup",
                other => other,
            };
            assert_eq!(f(&s["ops_per_op"][op]), 1.0, "{s}");
        }
    }
    // Everything the benchmark made is gone (the kept run is still there).
    assert_eq!(shoal_ls(&c, "/shoal-bench").len(), 1);
}

#[test]
fn md_hard_shared_directory_reads_back_every_byte() {
    let c = Cluster::start(3);
    let local = tempfile::tempdir().unwrap();
    let r = run_json(
        &c,
        &[
            "bench", "md", "-T", &format!("native,posix:{}", local.path().display()), "-n", "3", "-N", "40", "--shared-dir", "--size", "3901",
            "--shift", "--verify", "--dirs", "--json", "-q",
        ],
    );
    for run in runs(&r) {
        let labels: Vec<&str> = run["phases"].as_array().unwrap().iter().map(|p| p["label"].as_str().unwrap()).collect();
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
        &["bench", "md", "-T", &targets, "--compare", "--reps", "2", "-n", "1", "-N", "30", "--plot", svg.to_str().unwrap(), "--json", "-q"],
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
        "bench", "io", "-T", "native", "-n", "1", "-F", "-b", "256K", "-R", "--sweep", "transfer=16K,64K,256K", "--plot", png.to_str().unwrap(), "-q",
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
    let (code, _, err) = common::shoal_cmd(None, &["bench", "md", "-N", "1"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn quick_suite_writes_the_report() {
    let c = Cluster::start(4);
    let tmp = tempfile::tempdir().unwrap();
    let doc = tmp.path().join("benchmarks.md");
    std::fs::write(&doc, "old\n<!-- Everything below this line is kept when `shoal bench suite` rewrites this file. -->\nmy notes\n").unwrap();
    let shm = tmp.path().join("shm");
    std::fs::create_dir_all(&shm).unwrap();
    let targets = format!("native,local:{},tmpfs:{}", tmp.path().display(), shm.display());
    let save = tmp.path().join("suite.json");
    let (code, out, err) = c.shoal(&[
        "bench", "suite", "--scale", "quick", "--reps", "1", "-T", &targets, "--doc", doc.to_str().unwrap(), "--save", save.to_str().unwrap(), "-q",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let md = std::fs::read_to_string(&doc).unwrap();
    for needle in ["# Benchmarks", "## Machine", "## io-easy", "## io-hard", "## md-easy", "## md-hard", "Targets of issue #4", "Per server, `native`"] {
        assert!(md.contains(needle), "{needle} missing from:\n{md}");
    }
    assert!(!md.starts_with("old"), "rewritten");
    assert!(md.trim_end().ends_with("my notes"), "the kept section survives:\n{md}");
    let all: Value = serde_json::from_str(&std::fs::read_to_string(&save).unwrap()).unwrap();
    // The single-request criterion is measured and met (not a timing: a count).
    let checks = all["checks"].as_array().unwrap();
    let single: Vec<&Value> = checks.iter().filter(|c| c["what"].as_str().unwrap().contains("server requests per op")).collect();
    assert_eq!(single.len(), 3);
    for c in single {
        assert_eq!(c["met"], true, "{c}");
    }
    assert_eq!(all["cases"].as_array().unwrap().len(), 4);
}
