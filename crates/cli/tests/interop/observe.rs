//! Observing a cluster (docs/metrics.md): every server's `/metrics` counts a known workload,
//! `/api/status` and the status page (rendered by headless Chromium) show every server, and
//! `shoal top --once`/`--json` print the same in a terminal; a mount's `/metrics` counts
//! its FUSE requests and bytes.

use shoal_client::OpenFlags;
use shoal_testkit::{pattern, Cluster};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `curl -s URL`: (HTTP status, body).
fn curl(url: &str) -> (u16, String) {
    let out =
        Command::new("curl").args(["-s", "--max-time", "20", "-w", "\n%{http_code}", url]).output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// Every sample of `/metrics` of one server, as name → [(labels, value)].
type Samples = HashMap<String, Vec<(HashMap<String, String>, f64)>>;

fn scrape(cluster: &Cluster, id: u32) -> Samples {
    let (code, body) = curl(&format!("{}/metrics", cluster.http_url(id)));
    assert_eq!(code, 200, "GET /metrics of s{id}: {body}");
    assert!(body.trim_end().ends_with("# EOF"), "OpenMetrics text ends with # EOF");
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("a Prometheus text parser reads /metrics");
    let mut out: Samples = HashMap::new();
    for s in scrape.samples {
        let v = match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            // Histograms: the parser groups buckets; the test reads _count and _sum, which
            // arrive as their own samples in the OpenMetrics form the parser does not group.
            _ => continue,
        };
        let labels: HashMap<String, String> = s.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        out.entry(s.metric).or_default().push((labels, v));
    }
    out
}

/// The value of `name` with every label of `want` (sum over the samples that match).
fn value(samples: &Samples, name: &str, want: &[(&str, &str)]) -> f64 {
    samples
        .get(name)
        .map(|v| {
            v.iter()
                .filter(|(l, _)| want.iter().all(|(k, x)| l.get(*k).map(String::as_str) == Some(*x)))
                .map(|(_, v)| *v)
                .sum()
        })
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_of_every_server_count_a_known_workload() {
    let cluster = Cluster::start(4);
    let before: Vec<Samples> = (0..4).map(|i| scrape(&cluster, i)).collect();
    let fs = cluster.uncached_client();
    fs.mkdir("/obs", 0o755).await.unwrap();
    const FILES: u64 = 50;
    const SIZE: usize = 10_000;
    for i in 0..FILES {
        let f = fs.create(&format!("/obs/f{i}"), 0o644, None).await.unwrap();
        f.write_at(0, &pattern(i, 0, SIZE)).await.unwrap();
        f.close().await.unwrap();
    }
    for i in 0..FILES {
        let f = fs.open(&format!("/obs/f{i}"), OpenFlags::read_only()).await.unwrap();
        assert_eq!(f.read_at(0, SIZE).await.unwrap()[..], pattern(i, 0, SIZE)[..]);
        fs.stat(&format!("/obs/f{i}")).await.unwrap();
    }
    // A known failure: stat of a missing name answers ENOENT from the directory's server.
    assert!(fs.stat("/obs/missing").await.is_err());

    let after: Vec<Samples> = (0..4).map(|i| scrape(&cluster, i)).collect();
    let delta = |name: &str, want: &[(&str, &str)]| -> f64 {
        (0..4).map(|i| value(&after[i], name, want) - value(&before[i], name, want)).sum()
    };
    let creates = delta("shoal_operations_total", &[("op", "create")]);
    // The directory splits as it grows: a create sent with the old bitmap is answered
    // `misrouted` and sent again to the right server, so it counts twice.
    let misrouted = delta("shoal_operations_total", &[("op", "misrouted")]);
    assert!(
        creates >= FILES as f64 && creates <= FILES as f64 + misrouted,
        "{creates} creates over all servers for {FILES} files ({misrouted} misrouted)"
    );
    let written = delta("shoal_received_bytes_total", &[]);
    assert!(written >= (FILES as usize * SIZE) as f64, "bytes received {written} < what was written");
    let sent = delta("shoal_sent_bytes_total", &[]);
    assert!(sent >= (FILES as usize * SIZE) as f64, "bytes sent {sent} < what was read");
    assert!(delta("shoal_operations_total", &[("op", "write")]) >= FILES as f64);
    assert!(delta("shoal_operations_total", &[("op", "read")]) >= FILES as f64);
    assert!(delta("shoal_errors_total", &[("errno", "2")]) >= 1.0, "the ENOENT of the missing name");

    for (i, s) in after.iter().enumerate() {
        // Every request timed: the histogram counts (by operation) add up to what the
        // per-operation counters say of requests that came alone (a batch is timed once).
        let timed_creates = value(s, "shoal_request_duration_seconds_count", &[("op", "create")]);
        let counted = value(s, "shoal_operations_total", &[("op", "create")]);
        assert!(timed_creates <= counted, "s{i}: {timed_creates} timed creates, {counted} counted");
        let count = value(s, "shoal_request_duration_seconds_count", &[]);
        let requests = value(s, "shoal_requests_total", &[]);
        assert_eq!(count, requests, "s{i}: every request is timed once");
        // (A server may have had no request at all: no directory, inode or object of the
        // workload landed there.)
        assert_eq!(value(s, "shoal_request_duration_seconds_sum", &[]) > 0.0, count > 0.0, "s{i}: time was measured");
        assert_eq!(value(s, "shoal_requests_in_flight", &[]), 0.0, "s{i}: idle");
        assert!(value(s, "shoal_capacity_bytes", &[]) > 0.0);
        assert!(value(s, "shoal_free_bytes", &[]) > 0.0);
        assert!(value(s, "shoal_metadata_store", &[("stat", "estimate_keys")]) > 0.0, "s{i}: RocksDB keys");
    }
    // Contents are counted by a walk of the stores, cached for 5 s (the first scrape
    // counted none): within a few seconds the new count shows.
    let start = std::time::Instant::now();
    loop {
        let objects: f64 = (0..4).map(|i| value(&scrape(&cluster, i), "shoal_data_objects", &[])).sum();
        if objects >= FILES as f64 {
            break;
        }
        assert!(start.elapsed().as_secs() < 15, "{objects} data objects for {FILES} files");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    // Every write and every read looks its object up in the descriptor cache.
    let lookups = delta("shoal_cache_hits_total", &[("cache", "object_files")])
        + delta("shoal_cache_misses_total", &[("cache", "object_files")]);
    assert!(lookups >= 2.0 * FILES as f64, "{lookups} lookups of open objects for {FILES} writes and reads");
    let reads_hit: f64 = (0..4).map(|i| value(&after[i], "shoal_cache_hits_total", &[("cache", "checksums")])).sum();
    assert!(reads_hit > 0.0, "reads after writes find the checksums cached");
}

/// Where a test keeps a file worth looking at: `target/<profile>/observe/NAME`.
fn artifact(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/observe-HASH
    let dir = exe.parent().and_then(Path::parent).unwrap().join("observe");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn chromium(args: &[&str], url: &str) -> std::process::Output {
    let profile = tempfile::tempdir().unwrap();
    let data_dir = format!("--user-data-dir={}", profile.path().display());
    let mut cmd = Command::new("chromium");
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--virtual-time-budget=3000",
        "--window-size=1280,900",
        &data_dir,
    ]);
    cmd.args(args).arg(url);
    cmd.output().expect("run chromium (Debian package chromium, scripts/env.sh)")
}

#[test]
fn status_page_shows_every_server_in_a_real_browser() {
    let cluster = Cluster::start(4);
    let (code, json) = curl(&format!("{}/api/status", cluster.http_url(2)));
    assert_eq!(code, 200, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["servers_up"], 4);
    assert_eq!(v["local"]["server"], "s2");
    let names: Vec<&str> = v["servers"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["s0", "s1", "s2", "s3"]);
    assert!(!v["busiest"].as_array().unwrap().is_empty(), "the status requests themselves are operations");

    let (code, html) = curl(&format!("{}/status", cluster.http_url(1)));
    assert_eq!(code, 200);
    assert!(html.contains("<canvas"), "the page draws its charts itself");

    let url = format!("{}/", cluster.http_url(1));
    let dom = chromium(&["--dump-dom"], &url);
    let dom_text = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.status.success(), "chromium --dump-dom: {}", String::from_utf8_lossy(&dom.stderr));
    for s in ["s0", "s1", "s2", "s3"] {
        assert!(dom_text.contains(&format!("id=\"server-{s}\"")), "the rendered page has a row for {s}:\n{dom_text}");
    }
    assert!(dom_text.contains("all 4 servers up"), "the page reports the cluster's health:\n{dom_text}");

    let shots = tempfile::tempdir().unwrap();
    let png = shots.path().join("status.png");
    let out = chromium(&[&format!("--screenshot={}", png.display())], &url);
    assert!(out.status.success(), "chromium --screenshot: {}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&png).expect("chromium wrote the screenshot");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    assert!(bytes.len() > 20_000, "a screenshot of a drawn page, not a blank one ({} bytes)", bytes.len());
    let kept = artifact("status_page.png");
    std::fs::copy(&png, &kept).unwrap();
    println!("status page screenshot: {}", kept.display());
}

#[test]
fn shoal_top_once_and_json_show_every_server_and_who_is_down() {
    let mut cluster = Cluster::start(3);
    let (code, out, err) = cluster.shoal(&["top", "--once", "--interval", "0.2"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("all 3 servers up"), "{out}");
    for s in ["s0", "s1", "s2"] {
        assert!(out.lines().any(|l| l.starts_with(s) && l.contains(" up ")), "{s} in:\n{out}");
    }
    assert!(out.contains("busiest operation"), "{out}");

    let (code, out, err) = cluster.shoal(&["top", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["servers_total"], 3);
    assert_eq!(v["servers"][1]["name"], "s1");
    assert!(v["servers"][0]["capacity_bytes"].as_u64().unwrap() > 0);

    // Not a terminal: the live view refuses with a usage error instead of drawing garbage.
    let (code, _, err) = cluster.shoal(&["top"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--once or --json"), "{err}");
    let (code, _, err) = cluster.shoal(&["top", "--once", "--interval", "0"]);
    assert_eq!(code, 2, "{err}");

    cluster.kill9(1);
    let (code, out, err) = cluster.shoal(&["--timeout", "2", "top", "--once"]);
    assert_eq!(code, 1, "a down server fails the command: {out}{err}");
    assert!(out.contains("1 of 3 servers UNREACHABLE"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("s1") && l.contains("DOWN")), "{out}");
    assert!(err.contains("1 of 3 servers do not answer"), "{err}");
}

#[test]
fn mount_metrics_count_fuse_requests_and_bytes() {
    if shoal_testkit::mount::skip_without_fuse() {
        return;
    }
    let cluster = Cluster::start(2);
    let addr = {
        // A free port: bound, read, released (the mount binds it again at once).
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let m = shoal_testkit::mount::Mount::with_args(&cluster, &["-o", "allow_other", "--metrics", &addr]);
    const SIZE: usize = 300_000;
    let data = pattern(7, 0, SIZE);
    std::fs::write(m.p("a"), &data).unwrap();
    assert_eq!(std::fs::read(m.p("a")).unwrap(), data);
    std::fs::metadata(m.p("a")).unwrap();
    // The kernel sends some requests after the call that caused them returned (the
    // release of a closed file): wait until none is in flight, as it must come to.
    let start = std::time::Instant::now();
    let (body, scrape) = loop {
        let (code, body) = curl(&format!("http://{addr}/metrics"));
        assert_eq!(code, 200, "{body}");
        let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap();
        let idle = scrape.samples.iter().any(|s| {
            s.metric == "shoal_fuse_requests_in_flight"
                && matches!(s.value, prometheus_parse::Value::Gauge(v) if v == 0.0)
        });
        if idle {
            break (body, scrape);
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(10), "FUSE requests still in flight:\n{body}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let get = |name: &str, label: Option<(&str, &str)>| -> f64 {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum()
    };
    assert!(get("shoal_fuse_written_bytes_total", None) >= SIZE as f64, "{body}");
    assert!(get("shoal_fuse_read_bytes_total", None) >= SIZE as f64, "{body}");
    assert!(get("shoal_fuse_request_duration_seconds_count", Some(("op", "create"))) >= 1.0, "{body}");
    assert!(get("shoal_fuse_request_duration_seconds_count", Some(("op", "write"))) >= 1.0, "{body}");
    assert!(get("shoal_fuse_request_duration_seconds_count", Some(("op", "read"))) >= 1.0, "{body}");

    // A port that is taken: the mount fails at once, naming the cause.
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = holder.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = cluster.shoal(&["mount", "--foreground", "--metrics", &taken, dir.path().to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("cannot serve metrics on"), "{err}");
    let (code, _, err) = cluster.shoal(&["mount", "--metrics", "nonsense", dir.path().to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--metrics nonsense"), "{err}");
    drop(m);
}
