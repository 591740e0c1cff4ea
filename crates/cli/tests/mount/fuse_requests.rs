//! What FUSE operations cost in server requests, counted by the servers themselves (as
//! `namespace::small_file_create_stat_unlink_are_one_request_to_one_server` does for the
//! native client). Counts, never timings: the mounts trust what they cached for 10 minutes,
//! so no cache expires during the test and every count is exact.

use shoal_testkit::mount::{skip_without_fuse, Mount};
use shoal_testkit::Cluster;
use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::time::{Duration, Instant};

/// Nothing the kernel or the mount caches expires while the test runs. Without directory
/// leases, whose renewals and revocations depend on timing: what they save is counted by
/// `a_create_costs_one_request_with_a_lease_on_the_parent`.
const LONG: &[&str] = &["attr_timeout=600", "entry_timeout=600", "dir_lease=0"];

/// Requests served so far, by operation, summed over the servers (`Cluster::ops`).
fn ops(c: &Cluster) -> BTreeMap<String, u64> {
    c.ops()
}

/// Requests by operation that `f` caused, per call (`f` makes `n` calls).
fn per_call(c: &Cluster, n: u64, f: impl FnOnce()) -> BTreeMap<String, f64> {
    let before = ops(c);
    f();
    diff(&before, &ops(c), n)
}

fn diff(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, n: u64) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(op, a)| {
            let d = a - before.get(op).copied().unwrap_or(0);
            (d > 0).then(|| (op.clone(), d as f64 / n as f64))
        })
        .collect()
}

fn expect(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(op, n)| (op.to_string(), *n)).collect()
}

/// Wait until the servers have served `total` requests of `op` (the kernel sends RELEASE,
/// where a written file is synced, after close has returned).
fn wait_for(c: &Cluster, op: &str, total: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while ops(c).get(op).copied().unwrap_or(0) < total {
        assert!(Instant::now() < deadline, "the servers never saw {total} {op} requests");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn create_stat_unlink_and_small_writes_cost_the_fewest_requests() {
    if skip_without_fuse() {
        return;
    }
    const N: u64 = 20;
    let c = Cluster::start(4);
    let a = Mount::new(&c, LONG);
    fs::create_dir(a.p("md")).unwrap();
    let name = |i: u64| format!("md/f{i}");

    // Create (open O_CREAT|O_WRONLY, close): the kernel's lookup of the new name, and the
    // create, which also opens. The permission checks on the directory the kernel makes
    // before each create (it forgets the directory's attributes after every change) are
    // answered by the mount; flush and release of a file that wrote nothing cost nothing.
    let created = per_call(&c, N, || {
        for i in 0..N {
            drop(OpenOptions::new().write(true).create(true).truncate(false).open(a.p(&name(i))).unwrap());
        }
    });
    assert_eq!(created, expect(&[("lookup", 1.0), ("create", 1.0)]), "create");

    // Stat on another mount, which has never seen the names: one lookup each (it carries
    // the attributes). Its walk into the directory is made first.
    let b = Mount::new(&c, LONG);
    assert!(b.p("md").is_dir());
    let stat = per_call(&c, N, || {
        for i in 0..N / 2 {
            fs::symlink_metadata(b.p(&name(i))).unwrap();
        }
        for i in 0..N / 2 {
            fs::symlink_metadata(b.p(&name(i))).unwrap();
        }
    });
    assert_eq!(stat, expect(&[("lookup", 0.5)]), "stat of N/2 names, twice each");

    // Unlink where the name is known (entry cached): the unlink alone.
    let unlink_known = per_call(&c, N / 2, || {
        for i in 0..N / 2 {
            fs::remove_file(b.p(&name(i))).unwrap();
        }
    });
    assert_eq!(unlink_known, expect(&[("unlink", 1.0)]), "unlink of cached names");
    // Unlink of names this mount never looked up: the kernel's lookup, then the unlink.
    // While a file is open on the mount, the client must also learn whether the name is
    // that file (to keep it as an orphan at the server): with the mount's client cache off
    // (the kernel caches), that is a second lookup. Known cost, see docs/mount.md; a name
    // hint from the mount (which inode it told the kernel) would remove it.
    let keep = OpenOptions::new().write(true).create(true).truncate(false).open(b.p("md/keep")).unwrap();
    let unlink_new = per_call(&c, N / 2, || {
        for i in N / 2..N {
            fs::remove_file(b.p(&name(i))).unwrap();
        }
    });
    assert_eq!(unlink_new, expect(&[("lookup", 2.0), ("unlink", 1.0)]), "unlink of new names with a file open");
    drop(keep);

    // A small write into a new file: lookup and create, one write (it carries the new
    // size to the inode's server: nothing to publish at close), and the fsync of the last
    // close (sync_close, on by default; sent at release, after close returned). The
    // kernel's check for file capabilities before the write is answered by the mount (a
    // new file has no extended attributes).
    let before = ops(&c);
    for i in 0..N {
        let mut f = OpenOptions::new().write(true).create(true).truncate(false).open(a.p(&format!("md/w{i}"))).unwrap();
        f.write_all(b"a small write").unwrap();
    }
    wait_for(&c, "fsync", before.get("fsync").copied().unwrap_or(0) + N);
    let small = diff(&before, &ops(&c), N);
    assert_eq!(small, expect(&[("lookup", 1.0), ("create", 1.0), ("write", 1.0), ("fsync", 1.0)]), "small write");

    // Rewriting an existing file: the open asks the inode's home for fresh attributes
    // (close-to-open: what other clients wrote and closed is seen) and the handle's
    // capability in one `Open` (in place of a `GetAttr`), then the write and the fsync at close.
    let before = ops(&c);
    for i in 0..N {
        let f = OpenOptions::new().write(true).open(a.p(&format!("md/w{i}"))).unwrap();
        f.write_all_at(b"again", 3).unwrap();
    }
    wait_for(&c, "fsync", before.get("fsync").copied().unwrap_or(0) + N);
    let rewrite = diff(&before, &ops(&c), N);
    assert_eq!(rewrite, expect(&[("open", 1.0), ("write", 1.0), ("fsync", 1.0)]), "rewrite");
    assert_eq!(fs::read(a.p("md/w0")).unwrap(), b"a sagainwrite");

    // Reading a file back on another mount: lookup, the open's `Open`, one read; no
    // flush at close (nothing to publish from a read-only descriptor) and no fsync.
    let read = per_call(&c, N, || {
        for i in 0..N {
            assert_eq!(fs::read(b.p(&format!("md/w{i}"))).unwrap(), b"a sagainwrite");
        }
    });
    assert_eq!(read, expect(&[("lookup", 1.0), ("open", 1.0), ("read", 1.0)]), "read");
}

#[test]
fn a_create_costs_one_request_with_a_lease_on_the_parent() {
    if skip_without_fuse() {
        return;
    }
    // With a lease on the directory (the default, `dir_lease`), the kernel's lookup of each
    // new name before its create is answered by the mount: ENOENT from the lease's listing.
    // Taking the lease costs a lookup and a listing once per directory.
    const N: u64 = 200;
    let c = Cluster::start(4);
    let a = Mount::new(&c, &["attr_timeout=600", "entry_timeout=600", "dir_lease=5"]);
    fs::create_dir(a.p("md")).unwrap();
    let created = per_call(&c, N, || {
        for i in 0..N {
            drop(OpenOptions::new().write(true).create(true).truncate(false).open(a.p(&format!("md/f{i}"))).unwrap());
        }
    });
    // 200 names split the directory over the 4 servers (3 splits at 32 entries a partition):
    // a request the mount sent with its view from before a split is answered with the new
    // bitmap and sent again (`misrouted`: a create, or the kernel's lookup before one).
    let count = |m: &BTreeMap<String, f64>, op: &str| (m.get(op).copied().unwrap_or(0.0) * N as f64).round();
    let (creates, misrouted) = (count(&created, "create"), count(&created, "misrouted"));
    assert!(creates >= N as f64 && creates - N as f64 <= misrouted, "{created:?}");
    assert!(misrouted <= 3.0 * 2.0, "requests sent again (a create or a lookup per split): {created:?}");
    // Besides the creates: a lookup and a listing to take the lease of each partition (4),
    // the acknowledgement of a lease a split revoked (3), a renewal now and then. Steps
    // between servers (`peer_*`) are not the mount's requests.
    let client_op = |op: &str| !op.starts_with("peer_") && op != "create" && op != "misrouted";
    let others: f64 = created.iter().filter(|(op, _)| client_op(op)).map(|(op, _)| count(&created, op)).sum();
    assert!(others <= 4.0 * 2.0 + 3.0 + 6.0, "requests besides the creates: {created:?}");
    // Unlinking what the kernel knows: the unlink alone. (A name a split moved to another
    // server left its inode behind: its server drops the link count there with a
    // `peer_link_delta`, a step between servers.)
    let unlinked = per_call(&c, N, || {
        for i in 0..N {
            fs::remove_file(a.p(&format!("md/f{i}"))).unwrap();
        }
    });
    assert_eq!(unlinked.get("unlink"), Some(&1.0), "{unlinked:?}");
    let others: f64 =
        unlinked.iter().filter(|(op, _)| *op != "unlink" && !op.starts_with("peer_")).map(|(_, n)| n).sum();
    assert!(others * N as f64 <= 6.0, "requests besides the unlinks: {unlinked:?}");
    // Another mount's create in the directory is seen at once (it revoked the lease).
    let b = Mount::new(&c, &["dir_lease=5"]);
    assert!(!a.p("md/late").exists());
    fs::write(b.p("md/late"), b"x").unwrap();
    assert!(a.p("md/late").exists(), "the new name is seen at once through the mount holding the lease");
}

#[test]
fn directory_times_follow_changes_made_through_the_mount() {
    if skip_without_fuse() {
        return;
    }
    // The mount answers the kernel's questions about a directory it changed from its own
    // copy of the directory's attributes: they must show the change as a server would.
    let c = Cluster::start(2);
    let m = Mount::new(&c, LONG);
    fs::create_dir(m.p("d")).unwrap();
    let t0 = fs::metadata(m.p("d")).unwrap();
    assert_eq!(t0.nlink(), 2);
    std::thread::sleep(Duration::from_millis(20));
    fs::write(m.p("d/f"), b"x").unwrap();
    let t1 = fs::metadata(m.p("d")).unwrap();
    assert!(t1.modified().unwrap() > t0.modified().unwrap(), "create changes the directory's mtime");
    assert!(t1.ctime_nsec() != t0.ctime_nsec() || t1.ctime() != t0.ctime(), "and its ctime");
    fs::create_dir(m.p("d/sub")).unwrap();
    assert_eq!(fs::metadata(m.p("d")).unwrap().nlink(), 3, "a subdirectory adds a link");
    std::thread::sleep(Duration::from_millis(20));
    fs::remove_file(m.p("d/f")).unwrap();
    let t2 = fs::metadata(m.p("d")).unwrap();
    assert!(t2.modified().unwrap() > t1.modified().unwrap(), "unlink changes the directory's mtime");
    fs::remove_dir(m.p("d/sub")).unwrap();
    assert_eq!(fs::metadata(m.p("d")).unwrap().nlink(), 2, "and removing it takes the link away");
    // chmod and rename are not followed: the attributes come from the server again.
    fs::set_permissions(m.p("d"), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    assert_eq!(fs::metadata(m.p("d")).unwrap().mode() & 0o7777, 0o700);
    fs::create_dir(m.p("e")).unwrap();
    fs::rename(m.p("e"), m.p("d/e")).unwrap();
    assert_eq!(fs::metadata(m.p("d")).unwrap().nlink(), 3);
    // What the server says agrees, once the mount is asked afresh (another mount).
    let fresh = Mount::new(&c, &[]);
    let s = fs::metadata(fresh.p("d")).unwrap();
    assert_eq!((s.nlink(), s.mode() & 0o7777), (3, 0o700));
}

#[test]
fn an_unaligned_47008_byte_write_is_one_request_to_the_mount_and_one_to_a_server_with_no_capability_checks() {
    if skip_without_fuse() {
        return;
    }
    const N: u64 = 40;
    const T: u64 = 47_008;
    let c = Cluster::start(2);
    // Every FUSE request the kernel sends is logged, one line each.
    let m = Mount::with_log(&c, LONG, "info,fuser::request=debug");
    let buf: Vec<u8> = (0..T).map(|i| (i % 251) as u8).collect();
    let count = |what: &str| m.log_text().lines().filter(|l| l.contains(what)).count();
    const CAPS: &str = "GETXATTR name \"security.capability\"";
    // Write-only, as IOR opens for its write phase: every write bypasses the page cache.
    let f = OpenOptions::new().create(true).write(true).truncate(true).open(m.p("f")).unwrap();
    // The first write of a file may still be checked for privileges to drop (the kernel then
    // remembers the file has none until its attributes change).
    f.write_at(&buf, 0).unwrap();
    let (kernel_writes, checks) = (count(" WRITE fh "), count(CAPS));
    let per = per_call(&c, N, || {
        for k in 1..=N {
            f.write_at(&buf, k * T).unwrap();
        }
        // The client's write-behind has sent them all once fsync returns.
        f.sync_all().unwrap();
    });
    let kernel_writes = count(" WRITE fh ") - kernel_writes;
    assert_eq!(kernel_writes as u64, N, "the kernel sent {kernel_writes} WRITE requests for {N} pwrites");
    let checks = count(CAPS) - checks;
    assert_eq!(checks, 0, "{N} pwrites of {T} bytes sent {checks} security.capability lookups");
    // At most one server write each, a write crossing a stripe boundary (1 MiB) being two
    // pieces (a run on CI counted one more than that once; through the page cache it would
    // be 2N). Fewer when the client gathers these contiguous writes while one is in flight
    // (then one per MiB piece): how many depends on how fast the servers answer.
    let server_writes = per.get("write").copied().unwrap_or(0.0) * N as f64;
    let crossings = (1..=N).filter(|k| (k * T) >> 20 != ((k + 1) * T - 1) >> 20).count() as f64;
    assert!(
        server_writes >= 2.0 && server_writes <= N as f64 + crossings + 2.0,
        "{server_writes} server writes for {N} pwrites ({crossings} crossing a stripe boundary): {per:?}"
    );
    drop(f);
    // The bytes are where they were written, read back through the page cache.
    let back = fs::read(m.p("f")).unwrap();
    assert_eq!(back.len() as u64, (N + 1) * T);
    for k in 0..=N {
        assert!(back[(k * T) as usize..((k + 1) * T) as usize] == buf[..], "transfer {k} reads back wrong");
    }
    // A read-write descriptor keeps the page cache (it may be mapped): its unaligned writes
    // may reach the mount in two requests, and read back what they wrote.
    let g = OpenOptions::new().read(true).write(true).open(m.p("f")).unwrap();
    g.write_at(&buf[..100], 3).unwrap();
    let mut first = vec![0u8; 103];
    g.read_exact_at(&mut first, 0).unwrap();
    assert_eq!(&first[3..], &buf[..100]);
}

#[test]
fn a_1_mib_write_from_a_buffer_not_on_a_page_boundary_is_one_request_to_a_server() {
    if skip_without_fuse() {
        return;
    }
    const N: u64 = 8;
    const MIB: usize = 1 << 20;
    let c = Cluster::start(2);
    let m = Mount::with_log(&c, LONG, "info,fuser::request=debug");
    // A buffer 100 bytes into a page, as malloc gives (Python's bytes, a Rust Vec): 1 MiB of
    // it spans 257 pages, one more than a FUSE request carries.
    let mut space = vec![0u8; MIB + 8192];
    let off = (4096 + 100 - space.as_ptr() as usize % 4096) % 4096;
    for (i, b) in space[off..off + MIB].iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    let buf = &space[off..off + MIB];
    assert_eq!(buf.as_ptr() as usize % 4096, 100);
    let count = |what: &str| m.log_text().lines().filter(|l| l.contains(what)).count();
    let f = OpenOptions::new().create(true).write(true).truncate(true).open(m.p("big")).unwrap();
    f.write_at(buf, 0).unwrap();
    let kernel_writes = count(" WRITE fh ");
    let per = per_call(&c, N, || {
        for k in 1..=N {
            f.write_at(buf, k * MIB as u64).unwrap();
        }
        f.sync_all().unwrap();
    });
    let kernel_writes = count(" WRITE fh ") - kernel_writes;
    // The kernel cuts each at its page limit: 1 MiB - 100 bytes, then 100.
    assert_eq!(kernel_writes as u64, 2 * N, "the kernel sent {kernel_writes} WRITE requests for {N} pwrites");
    // The mount holds the first part for the second: one server write per MiB (without it,
    // 2N). One more is allowed for a continuation that took longer than HOLD_FOR to come.
    let server_writes = (per.get("write").copied().unwrap_or(0.0) * N as f64).round() as u64;
    assert!(server_writes == N || server_writes == N + 1, "{server_writes} server writes for {N} pwrites: {per:?}");
    drop(f);
    let back = fs::read(m.p("big")).unwrap();
    assert_eq!(back.len(), (N as usize + 1) * MIB);
    assert!(back.chunks(MIB).all(|c| c == buf), "a MiB reads back wrong");
}

/// `ls -l` of a directory this mount has never seen: READDIRPLUS gives the kernel every
/// name with its attributes, fetched in batches (one request per server per 128 names),
/// so the listing costs a handful of requests instead of one per file; and what `ls -l`
/// shows is right. With `noreaddirplus` the same listing costs a request per file (the
/// count the test would see if the mount stopped sending attributes with listings).
#[test]
fn ls_l_of_a_directory_costs_a_request_per_server_per_batch_of_names() {
    if skip_without_fuse() {
        return;
    }
    const N: usize = 300;
    let c = Cluster::start(4);
    let writer = Mount::new(&c, LONG);
    fs::create_dir(writer.p("big")).unwrap();
    for i in 0..N {
        fs::write(writer.p(&format!("big/f{i:03}")), vec![b'x'; i]).unwrap();
    }
    let ls = |m: &Mount| -> String {
        let out = std::process::Command::new("ls").arg("-ln").arg(m.p("big")).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    // Every file shown with its size.
    let check = |text: &str| {
        let mut sizes = BTreeMap::new();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            sizes.insert(f[8].to_string(), f[4].parse::<usize>().unwrap());
        }
        assert_eq!(sizes.len(), N, "{text}");
        for (name, size) in sizes {
            assert_eq!(size, name[1..].parse::<usize>().unwrap(), "size of {name}");
        }
    };
    // Requests, not operations (a batch counts once), without the extended attributes
    // `ls` asks for (`security.selinux`: one request per file either way).
    let cost = |m: &Mount| -> (u64, String) {
        let (r0, o0) = (requests(&c), ops(&c));
        let text = ls(m);
        let (r1, o1) = (requests(&c), ops(&c));
        let xattrs = o1.get("getxattr").copied().unwrap_or(0) - o0.get("getxattr").copied().unwrap_or(0);
        (r1 - r0 - counting_cost(&c) - xattrs, text)
    };
    let plus = Mount::new(&c, LONG);
    let (n, text) = cost(&plus);
    check(&text);
    // The directory's lookup, its listing, and one batch per server per 128 names (3
    // batches × 4 servers), the inodes that live on another server than their entries
    // asked for one by one (about a quarter with 4 servers: the servers place a file's
    // inode with its entry unless the directory's policy spreads them).
    assert!(n <= 16 + N as u64 / 3, "ls -l of {N} files cost {n} requests");

    let plain = Mount::new(&c, &[LONG, &["noreaddirplus"]].concat());
    let (m, text) = cost(&plain);
    check(&text);
    assert!(m >= N as u64, "without readdirplus, ls -l of {N} files cost only {m} requests");
    eprintln!("ls -l of {N} files: {n} requests with readdirplus, {m} without");
    assert!(n * 2 < m, "readdirplus saved too little: {n} requests against {m}");
}

/// Client requests served so far, summed over the servers.
fn requests(c: &Cluster) -> u64 {
    c.client_requests()
}

/// The requests that one `requests` and one `ops` call add to the count themselves.
fn counting_cost(c: &Cluster) -> u64 {
    let a = requests(c);
    let _ = ops(c);
    requests(c) - a
}
