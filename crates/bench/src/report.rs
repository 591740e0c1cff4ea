//! Results: what a phase measured (merged over workers), the runs of a benchmark, the
//! medians and ratios of a comparison, and how they are printed for people.

use crate::counters::ServerSummary;
use crate::hist::Histogram;
use crate::spec::{PhaseKind, Workload};
use crate::timeline::DecileRates;
use crate::worker::PhaseResult;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

impl Latency {
    pub fn of(h: &Histogram) -> Latency {
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            p50_us: us(h.quantile(0.5)),
            p90_us: us(h.quantile(0.9)),
            p99_us: us(h.quantile(0.99)),
            max_us: us(h.quantile(1.0)),
            mean_us: us(h.mean_ns()),
        }
    }
}

/// One phase of one run, all workers together.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PhaseReport {
    pub label: String,
    pub kind: PhaseKind,
    pub procs: u64,
    /// Transfers (I/O) or items (metadata), all processes.
    pub ops: u64,
    pub bytes: u64,
    /// From the first worker's start to the last worker's end (IOR: the slowest process
    /// sets the time), opens and closes included.
    pub wall_s: f64,
    pub mib_s: f64,
    /// Transfers per second (I/O) or operations per second (metadata).
    pub ops_s: f64,
    /// Slowest open and slowest close (fsync included) of any process, I/O phases.
    pub open_s: f64,
    pub close_s: f64,
    /// Latency of one transfer or one metadata operation.
    pub latency: Latency,
    pub verified_bytes: u64,
    pub verify_errors: u64,
    /// CPU seconds the benchmark's client processes used, and the machine's busy CPU
    /// seconds over the phase (all processes: servers, clients, FUSE daemon, others).
    #[serde(default)]
    pub client_cpu_s: f64,
    #[serde(default)]
    pub machine_cpu_s: Option<f64>,
    /// Whether the page cache was dropped before the phase (None: not asked).
    pub caches_dropped: Option<bool>,
    /// The servers' counters during the phase (native and FUSE targets).
    pub servers: Option<ServerSummary>,
    /// The rate of the phase's first and last 10 % of operations (all processes, by
    /// completion time), and their ratio: whether the rate held up to the end. `None` with
    /// fewer than 10 operations.
    #[serde(default)]
    pub deciles: Option<DecileRates>,
}

impl PhaseReport {
    pub fn from_results(label: &str, kind: PhaseKind, results: &[PhaseResult]) -> PhaseReport {
        let start = results.iter().map(|r| r.start_ns).min().unwrap_or(0);
        let end = results.iter().map(|r| r.end_ns).max().unwrap_or(0);
        let wall_s = (end.saturating_sub(start)) as f64 / 1e9;
        let ops: u64 = results.iter().map(|r| r.ops).sum();
        let bytes: u64 = results.iter().map(|r| r.bytes).sum();
        let mut hist = Histogram::new();
        for r in results {
            hist.merge(&r.hist);
        }
        let per_s = |x: f64| if wall_s > 0.0 { x / wall_s } else { 0.0 };
        let timelines: Vec<_> = results.iter().map(|r| r.timeline.clone()).collect();
        PhaseReport {
            label: label.to_string(),
            kind,
            procs: results.len() as u64,
            ops,
            bytes,
            wall_s,
            mib_s: per_s(bytes as f64 / (1u64 << 20) as f64),
            ops_s: per_s(ops as f64),
            open_s: results.iter().map(|r| r.open_ns).max().unwrap_or(0) as f64 / 1e9,
            close_s: results.iter().map(|r| r.close_ns).max().unwrap_or(0) as f64 / 1e9,
            latency: Latency::of(&hist),
            verified_bytes: results.iter().map(|r| r.verified_bytes).sum(),
            verify_errors: results.iter().map(|r| r.verify_errors).sum(),
            client_cpu_s: results.iter().map(|r| r.cpu_ns).sum::<u64>() as f64 / 1e9,
            machine_cpu_s: None,
            caches_dropped: None,
            servers: None,
            deciles: DecileRates::of(start, &timelines),
        }
    }

    /// Microseconds of CPU per operation: the clients', and the whole machine's.
    pub fn cpu_us_per_op(&self) -> (f64, Option<f64>) {
        let n = self.ops.max(1) as f64;
        (self.client_cpu_s * 1e6 / n, self.machine_cpu_s.map(|m| m * 1e6 / n))
    }

    /// The figure compared across targets: MiB/s for data phases, ops/s for metadata.
    pub fn metric(&self) -> f64 {
        if self.kind.is_io() {
            self.mib_s
        } else {
            self.ops_s
        }
    }
}

/// One run of the workload on one target.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TargetRun {
    pub target: String,
    pub location: String,
    pub rep: usize,
    pub phases: Vec<PhaseReport>,
}

/// Median over repetitions of one phase on one target, and its ratio to the baselines.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SummaryRow {
    pub phase: String,
    pub target: String,
    pub unit: String,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
    /// Median of this target divided by the median of `local` and of `tmpfs` in the same
    /// invocation, when those targets took part.
    pub vs_local: Option<f64>,
    pub vs_tmpfs: Option<f64>,
    /// Medians of the servers' figures (native and FUSE targets).
    pub client_requests_per_op: Option<f64>,
    pub peer_requests_per_op: Option<f64>,
    pub requests_max_min: Option<f64>,
    pub requests_max_mean: Option<f64>,
    /// Median of the phases' `deciles.last_over_first`: the rate of the last 10 % of the
    /// operations over that of the first 10 %.
    #[serde(default)]
    pub last_over_first: Option<f64>,
    /// Median of the requests per operation that directory splits cost ([`split_requests`]),
    /// included in the figures above.
    #[serde(default)]
    pub split_requests_per_op: Option<f64>,
}

/// Requests per operation owed to directories splitting over servers rather than to the
/// operations themselves: requests sent with a view from before a split and answered with
/// the new bitmap (`misrouted`), the split's own steps between servers, and for a name a
/// split moved (its inode stayed where it was made) the stat's `getattr` at the inode's
/// server or the unlink's `peer_link_delta` there. Also the acknowledgements of lease
/// revocations (`lease_ack`): a process whose changes revoke another's lease on its
/// directory (the other read it, shifted) costs one per directory, not per operation.
pub fn split_requests(s: &ServerSummary) -> f64 {
    ["misrouted", "peer_split_in", "peer_add_partition", "peer_partitions", "peer_link_delta", "getattr", "lease_ack"]
        .iter()
        .map(|op| s.ops_per_op.get(*op).copied().unwrap_or(0.0))
        .sum()
}

/// Everything one `shoal bench io|md` invocation measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub name: String,
    pub workload: Workload,
    pub procs: u64,
    pub in_flight: usize,
    pub reps: usize,
    pub runs: Vec<TargetRun>,
    pub summary: Vec<SummaryRow>,
    /// Under mpirun: the ranks, where they ran and how their clocks were aligned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mpi: Option<crate::link::MpiInfo>,
}

pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn median_opt(v: Vec<Option<f64>>) -> Option<f64> {
    let mut x: Vec<f64> = v.into_iter().flatten().collect();
    if x.is_empty() {
        None
    } else {
        Some(median(&mut x))
    }
}

/// Medians per (phase, target) in first-seen order, with ratios to `local` and `tmpfs`.
pub fn summarize(runs: &[TargetRun]) -> Vec<SummaryRow> {
    let mut phases: Vec<String> = Vec::new();
    let mut targets: Vec<String> = Vec::new();
    for r in runs {
        if !targets.contains(&r.target) {
            targets.push(r.target.clone());
        }
        for p in &r.phases {
            if !phases.contains(&p.label) {
                phases.push(p.label.clone());
            }
        }
    }
    let mut rows = Vec::new();
    let mut medians: BTreeMap<(String, String), f64> = BTreeMap::new();
    for phase in &phases {
        for target in &targets {
            let reps: Vec<&PhaseReport> = runs
                .iter()
                .filter(|r| &r.target == target)
                .flat_map(|r| r.phases.iter().filter(|p| &p.label == phase))
                .collect();
            if reps.is_empty() {
                continue;
            }
            let mut vals: Vec<f64> = reps.iter().map(|p| p.metric()).collect();
            let med = median(&mut vals);
            medians.insert((phase.clone(), target.clone()), med);
            let srv = |f: &dyn Fn(&ServerSummary) -> Option<f64>| {
                median_opt(reps.iter().map(|p| p.servers.as_ref().and_then(f)).collect())
            };
            rows.push(SummaryRow {
                phase: phase.clone(),
                target: target.clone(),
                unit: if reps[0].kind.is_io() { "MiB/s".into() } else { "ops/s".into() },
                median: med,
                min: vals.first().copied().unwrap_or(0.0),
                max: vals.last().copied().unwrap_or(0.0),
                runs: vals.len(),
                vs_local: None,
                vs_tmpfs: None,
                client_requests_per_op: srv(&|s| Some(s.client_requests_per_op)),
                peer_requests_per_op: srv(&|s| Some(s.peer_requests_per_op)),
                requests_max_min: srv(&|s| s.requests_max_min),
                requests_max_mean: srv(&|s| s.requests_max_mean),
                last_over_first: median_opt(reps.iter().map(|p| p.deciles.map(|d| d.last_over_first)).collect()),
                split_requests_per_op: srv(&|s| Some(split_requests(s))),
            });
        }
    }
    for row in &mut rows {
        let base = |name: &str| medians.get(&(row.phase.clone(), name.to_string())).copied().filter(|b| *b > 0.0);
        row.vs_local = base("local").map(|b| row.median / b);
        row.vs_tmpfs = base("tmpfs").map(|b| row.median / b);
    }
    rows
}

pub fn fmt_rate(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

pub fn fmt_us(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{:.2}s", us / 1e6)
    } else if us >= 1000.0 {
        format!("{:.2}ms", us / 1000.0)
    } else {
        format!("{us:.0}µs")
    }
}

pub fn fmt_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) => format!("{x:.digits$}"),
        None => "-".into(),
    }
}

/// A one-line description of the workload.
pub fn describe(w: &Workload, procs: u64, in_flight: usize) -> String {
    match w {
        Workload::Io(io) => format!(
            "IOR: {procs} processes, {}, transfer {}, block {} x {} segment{}, {} per process, {}{}{}{}",
            if io.file_per_proc { "file per process" } else { "one shared file" },
            fmt_bytes(io.transfer as f64),
            fmt_bytes(io.block as f64),
            io.segments,
            if io.segments == 1 { "" } else { "s" },
            fmt_bytes(io.bytes_per_proc() as f64),
            if io.random { "random order" } else { "sequential" },
            if io.fsync { ", fsync at close" } else { "" },
            if io.reorder { ", reads shifted to the next rank" } else { "" },
            if in_flight > 1 { format!(", {in_flight} transfers in flight") } else { String::new() },
        ),
        Workload::Md(md) => format!(
            "mdtest: {procs} processes, {} files each, {}, {}{}",
            md.files,
            if md.shared_dir { "one shared directory" } else { "a directory per process" },
            if md.size == 0 {
                "empty files".to_string()
            } else {
                format!("{} bytes written and read per file", md.size)
            },
            if in_flight > 1 { format!(", {in_flight} operations in flight") } else { String::new() },
        ),
    }
}

/// Column of the rate of a phase's last 10 % of operations over that of its first 10 %.
const LAST_FIRST: &str = "last/first 10%";

/// The table of one run: a line per phase.
pub fn run_table(run: &TargetRun) -> String {
    let mut s = String::new();
    let io = run.phases.first().map(|p| p.kind.is_io()).unwrap_or(false);
    let _ = writeln!(s, "target {} ({}), run {}", run.target, run.location, run.rep + 1);
    if io {
        let _ = writeln!(
            s,
            "  {:<11} {:>9} {:>9} {:>8} {:>14} {:>7} {:>7} {:>9} {:>9} {:>9} {:>8} {:>17}",
            "phase",
            "MiB/s",
            "IOPS",
            "time(s)",
            LAST_FIRST,
            "open",
            "close",
            "lat p50",
            "p99",
            "max",
            "verified",
            "cpu/op cl/srv/all"
        );
        for p in &run.phases {
            let _ = writeln!(
                s,
                "  {:<11} {:>9} {:>9} {:>8.3} {:>14} {:>7.3} {:>7.3} {:>9} {:>9} {:>9} {:>8} {:>17}",
                p.label,
                fmt_rate(p.mib_s),
                fmt_rate(p.ops_s),
                p.wall_s,
                fmt_opt(p.deciles.map(|d| d.last_over_first), 2),
                p.open_s,
                p.close_s,
                fmt_us(p.latency.p50_us),
                fmt_us(p.latency.p99_us),
                fmt_us(p.latency.max_us),
                verified_cell(p),
                cpu_cell(p),
            );
        }
    } else {
        let _ = writeln!(
            s,
            "  {:<11} {:>10} {:>8} {:>14} {:>9} {:>9} {:>9} {:>9} {:>8} {:>17}",
            "phase", "ops/s", "time(s)", LAST_FIRST, "lat p50", "p90", "p99", "max", "verified", "cpu/op cl/srv/all"
        );
        for p in &run.phases {
            let _ = writeln!(
                s,
                "  {:<11} {:>10} {:>8.3} {:>14} {:>9} {:>9} {:>9} {:>9} {:>8} {:>17}",
                p.label,
                fmt_rate(p.ops_s),
                p.wall_s,
                fmt_opt(p.deciles.map(|d| d.last_over_first), 2),
                fmt_us(p.latency.p50_us),
                fmt_us(p.latency.p90_us),
                fmt_us(p.latency.p99_us),
                fmt_us(p.latency.max_us),
                verified_cell(p),
                cpu_cell(p),
            );
        }
    }
    for p in &run.phases {
        if p.caches_dropped == Some(false) {
            let _ = writeln!(s, "  note: the page cache could not be dropped before {} (needs root)", p.label);
        }
    }
    for p in &run.phases {
        if let Some(sv) = &p.servers {
            s.push_str(&servers_table(&p.label, sv));
        }
    }
    s
}

/// "client µs / servers µs / machine µs" of CPU per operation ("-" where not measured).
fn cpu_cell(p: &PhaseReport) -> String {
    let (c, m) = p.cpu_us_per_op();
    let srv = p.servers.as_ref().map_or("-".to_string(), |s| fmt_us(s.cpu_us_per_op));
    format!("{}/{}/{}", fmt_us(c), srv, m.map_or("-".to_string(), fmt_us))
}

fn verified_cell(p: &PhaseReport) -> String {
    if p.verify_errors > 0 {
        format!("{} BAD", p.verify_errors)
    } else if p.verified_bytes > 0 {
        "ok".into()
    } else {
        "-".into()
    }
}

/// The servers' figures for one phase: totals per operation, then one line per server.
pub fn servers_table(label: &str, sv: &ServerSummary) -> String {
    let mut s = String::new();
    let ops: Vec<String> = sv.ops_per_op.iter().map(|(n, v)| format!("{n} {v:.2}")).collect();
    let _ = writeln!(
        s,
        "  servers during {label}: per operation {:.2} client + {:.2} peer requests ({}), {} in, {} out; load max/min {} max/mean {} (requests), {} / {} (bytes)",
        sv.client_requests_per_op,
        sv.peer_requests_per_op,
        if ops.is_empty() { "none".into() } else { ops.join(", ") },
        fmt_bytes(sv.bytes_received_per_op),
        fmt_bytes(sv.bytes_sent_per_op),
        fmt_opt(sv.requests_max_min, 2),
        fmt_opt(sv.requests_max_mean, 2),
        fmt_opt(sv.bytes_max_min, 2),
        fmt_opt(sv.bytes_max_mean, 2),
    );
    let n = sv.phase_ops.max(1) as f64;
    let _ = writeln!(
        s,
        "    {:<6} {:>10} {:>9} {:>9} {:>11} {:>11} {:>10} {:>10}",
        "server", "client-req", "peer-in", "peer-out", "bytes-in", "bytes-out", "req/op", "bytes/op"
    );
    for d in &sv.per_server {
        if !d.answered {
            let _ = writeln!(s, "    s{:<5} did not answer", d.server);
            continue;
        }
        let _ = writeln!(
            s,
            "    s{:<5} {:>10} {:>9} {:>9} {:>11} {:>11} {:>10.3} {:>10}",
            d.server,
            d.client_requests,
            d.peer_requests,
            d.peer_requests_sent,
            fmt_bytes(d.bytes_received as f64),
            fmt_bytes(d.bytes_sent as f64),
            d.requests() as f64 / n,
            fmt_bytes((d.bytes_received + d.bytes_sent) as f64 / n),
        );
    }
    s
}

/// The comparison table: median (min–max) per phase and target, ratios to the baselines.
pub fn summary_table(rows: &[SummaryRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<11} {:<10} {:>10} {:>19} {:>4} {:>7} {:>7} {:>7} {:>8} {:>8} {:>14}",
        "phase", "target", "median", "min-max", "runs", "xlocal", "xtmpfs", "req/op", "max/min", "max/mean", LAST_FIRST
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<11} {:<10} {:>10} {:>19} {:>4} {:>7} {:>7} {:>7} {:>8} {:>8} {:>14}",
            r.phase,
            r.target,
            format!("{} {}", fmt_rate(r.median), if r.unit == "MiB/s" { "MiB/s" } else { "op/s" }),
            format!("{}-{}", fmt_rate(r.min), fmt_rate(r.max)),
            r.runs,
            fmt_opt(r.vs_local, 2),
            fmt_opt(r.vs_tmpfs, 2),
            fmt_opt(r.client_requests_per_op.map(|c| c + r.peer_requests_per_op.unwrap_or(0.0)), 2),
            fmt_opt(r.requests_max_min, 2),
            fmt_opt(r.requests_max_mean, 2),
            fmt_opt(r.last_over_first, 2),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(target: &str, rep: usize, v: f64) -> TargetRun {
        TargetRun {
            target: target.into(),
            location: "x".into(),
            rep,
            phases: vec![PhaseReport {
                label: "create".into(),
                kind: PhaseKind::Create,
                procs: 2,
                ops: 10,
                bytes: 0,
                wall_s: 1.0,
                mib_s: 0.0,
                ops_s: v,
                open_s: 0.0,
                close_s: 0.0,
                latency: Latency::default(),
                verified_bytes: 0,
                verify_errors: 0,
                client_cpu_s: 0.0,
                machine_cpu_s: None,
                caches_dropped: None,
                servers: None,
                deciles: Some(DecileRates { first_ops_s: v, last_ops_s: v / 2.0, last_over_first: 0.5 }),
            }],
        }
    }

    #[test]
    fn medians_and_ratios() {
        let runs = vec![
            run("native", 0, 100.0),
            run("tmpfs", 0, 400.0),
            run("native", 1, 300.0),
            run("tmpfs", 1, 1000.0),
            run("native", 2, 200.0),
            run("tmpfs", 2, 500.0),
        ];
        let rows = summarize(&runs);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].target, "native");
        assert_eq!(rows[0].median, 200.0);
        assert_eq!((rows[0].min, rows[0].max), (100.0, 300.0));
        assert!((rows[0].vs_tmpfs.unwrap() - 0.4).abs() < 1e-9);
        assert_eq!(rows[0].vs_local, None);
        assert!((rows[1].vs_tmpfs.unwrap() - 1.0).abs() < 1e-9);
        assert!(summary_table(&rows).contains("0.40"));
        // The ratio of the last tenth's rate to the first's: a median, in both tables.
        assert_eq!(rows[0].last_over_first, Some(0.5));
        assert!(summary_table(&rows).contains("last/first 10%"));
        let table = run_table(&runs[0]);
        assert!(table.contains("last/first 10%") && table.contains(" 0.50 "), "{table}");
        assert_eq!(median(&mut [3.0, 1.0, 2.0, 10.0]), 2.5);
    }
}
