//! `shoal sim`: the placement simulator, run as a user runs it, at a scale that takes well
//! under a second of CPU. Its figures are checked against what placement promises, with
//! bounds that a broken placement (partitions not spread, inodes not with their entries,
//! rendezvous moving more than its share) would fail.

use std::process::{Command, Output};

fn shoal_sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shoal")).arg("sim").args(args).output().expect("run shoal sim")
}

fn json_reports(args: &[&str]) -> Vec<serde_json::Value> {
    let mut all = args.to_vec();
    all.push("--json");
    let out = shoal_sim(&all);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout).expect("--json prints a JSON array")
}

fn spread<'a>(r: &'a serde_json::Value, kind: &str) -> &'a serde_json::Value {
    r["spread"].as_array().unwrap().iter().find(|k| k["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"))
}

fn moved<'a>(r: &'a serde_json::Value, change: &str) -> &'a serde_json::Value {
    r["moved"].as_array().unwrap().iter().find(|m| m["change"] == change).unwrap()
}

/// 1,000 directories of 100 files and a shared directory of 100,000 on 10 servers: every
/// kind within 10 % of even (all of the shared directory on one server would give 5×), a
/// joining server takes its 1/11 of the inodes and no data object, a leaving one gives up
/// its 1/10 of both.
#[test]
fn sim_spreads_a_namespace_evenly_and_a_join_moves_one_share_of_inodes() {
    let reports = json_reports(&["-n", "10", "--dirs", "1000", "--files-per-dir", "100", "--shared-files", "100k"]);
    assert_eq!(reports.len(), 1);
    let r = &reports[0];
    assert_eq!(r["servers"], 10);
    assert_eq!(r["files"], 200_000);
    assert_eq!(r["directories"], 1002);
    assert_eq!(r["target_depth"], 8, "10 servers: 256 partitions, 25 or 26 per server");
    assert_eq!(r["shared_partitions"], 256);
    for kind in ["directories", "partitions", "entries", "inodes", "objects"] {
        let k = spread(r, kind);
        let ratio = k["max_over_min"].as_f64().unwrap_or(f64::INFINITY);
        assert!(ratio <= 1.1, "{kind}: max/min {ratio}");
    }
    assert_eq!(spread(r, "inodes")["total"], 200_000 + 1002);
    assert_eq!(spread(r, "entries")["total"], 200_000 + 1001, "files and the root's directories");
    assert_eq!(spread(r, "objects")["total"], 200_000, "one object per 3,901-byte file");

    let join = moved(r, "join");
    let inodes = join["inodes"].as_f64().unwrap();
    assert!((inodes - 1.0 / 11.0).abs() < 0.005, "join moved {inodes} of the inodes, expected 1/11");
    assert_eq!(join["objects"], 0.0, "layouts are fixed at create");
    let leave = moved(r, "leave");
    let inodes = leave["inodes"].as_f64().unwrap();
    assert!((inodes - 0.1).abs() < 0.005, "leave moved {inodes} of the inodes, expected 1/10");
    let objects = leave["objects"].as_f64().unwrap();
    assert!((0.09..0.11).contains(&objects), "leave moved {objects} of the objects");
}

/// A power-of-two cluster ends with one partition per server; striping over every server
/// puts the same number of objects on each; the same seed gives the same figures.
#[test]
fn sim_places_a_shared_directory_one_partition_per_server_and_is_reproducible() {
    let args = ["-n", "4,8", "--dirs", "0", "--shared-files", "40k", "--stripe-count", "0", "--file-size", "8M"];
    let reports = json_reports(&args);
    assert_eq!(reports.len(), 2);
    for (r, n) in reports.iter().zip([4u64, 8]) {
        assert_eq!(r["shared_partitions"], n);
        assert_eq!(spread(r, "partitions")["max"], 2, "the root's partition and one of the shared directory");
        let objects = spread(r, "objects");
        assert_eq!(objects["max"], objects["min"], "every file has an object on every server");
        assert_eq!(objects["total"], 40_000 * n);
        let entries = spread(r, "entries")["max_over_min"].as_f64().unwrap();
        assert!(entries < 1.1, "{n} servers: entries max/min {entries}");
    }
    let again = json_reports(&args);
    assert_eq!(again[0]["spread"], reports[0]["spread"]);
}

#[test]
fn sim_prints_a_table_and_writes_a_plot() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("spread.svg");
    let out = shoal_sim(&["-n", "10", "--dirs", "100", "--shared-files", "10k", "--plot", svg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("10 servers: 20,000 files in 102 directories"), "{text}");
    for row in ["directories", "partitions", "entries", "inodes", "objects", "server 10 joins", "server 9 leaves"] {
        assert!(text.contains(row), "no {row:?} in\n{text}");
    }
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("inodes"), "{}", &plot[..plot.len().min(200)]);
}

/// Each bad argument: exit status 2 and one line on stderr that names it.
#[test]
fn sim_refuses_bad_arguments_in_one_line_with_status_2() {
    for (args, says) in [
        (&["-n", "0"][..], "server count 0"),
        (&["-n", "4,x"], "server count \"x\""),
        (&["-n", "200000"], "server count 200000"),
        (&["--dirs", "lots"], "directory count \"lots\""),
        (&["--dirs", "1e9"], "directory count 1000000000"),
        (&["-n", "10", "--stripe-count", "11"], "stripe count 11"),
        (&["--stripe-size", "1000"], "stripe size 1000"),
        (&["--dir-sizes", "zipf"], "\"zipf\""),
        (&["--plot", "x.txt"], "--plot x.txt"),
    ] {
        let out = shoal_sim(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("shoal: ") && err.contains(says), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}
