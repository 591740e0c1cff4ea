//! Per-block checksums of data objects on real servers: a flipped bit on disk reads as EIO
//! naming the object file and the block, `shoal scrub` reports exactly that object, old
//! objects without checksums stay readable, and `kill -9` under writes leaves every block
//! readable as its old or new bytes.

use shoal_client::{Client, ClientOptions, Errno, LayoutSpec, OpenFlags};
use shoal_testkit::mount::{skip_without_fuse, Mount};
use shoal_testkit::{pattern, Cluster};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

const BLOCK: u64 = 64 << 10;

/// A client that caches nothing and reads exactly the ranges asked (no read-ahead), so
/// that a read touches only the blocks of its range.
fn direct_client(c: &Cluster, timeout: Duration) -> Client {
    let opts = ClientOptions { cache_ttl: Duration::ZERO, readahead: 0, write_behind: 0, timeout, ..c.options() };
    Client::from_config(&c.config, opts).unwrap()
}

/// The object file of object `index` of the file at `path`, named as the server names it:
/// `<data_dir>/objects/<ino & 0xff as 2 hex digits>/<ino as 16 hex digits>.<index>`.
async fn object_file(c: &Cluster, fs: &Client, path: &str, index: usize) -> (u32, PathBuf) {
    let attr = fs.stat(path).await.unwrap();
    let server = attr.layout.as_ref().unwrap().servers[index].0;
    let dir = c.map.servers[server as usize].data_dir.clone().unwrap();
    let ino = attr.ino.0;
    (server, dir.join("objects").join(format!("{:02x}", ino & 0xff)).join(format!("{ino:016x}.{index}")))
}

fn one_stripe() -> Option<LayoutSpec> {
    Some(LayoutSpec { stripe_count: Some(1), ..Default::default() })
}

async fn write_file(fs: &Client, path: &str, body: &[u8]) {
    let f = fs.create(path, 0o644, one_stripe()).await.unwrap();
    f.write_at(0, body).await.unwrap();
    f.close().await.unwrap();
}

fn flip(file: &PathBuf, offset: u64) {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(file).unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, offset).unwrap();
    f.write_all_at(&[b[0] ^ 0x20], offset).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_reads_as_eio_naming_the_file_and_offset_and_scrub_reports_only_that_object() {
    let c = Cluster::start(2);
    let fs = direct_client(&c, Duration::from_secs(20));
    let len = 4 * BLOCK as usize + 1000;
    let body = pattern(7, 0, len);
    write_file(&fs, "/damaged", &body).await;
    for i in 0..3 {
        write_file(&fs, &format!("/fine{i}"), &pattern(i, 0, 300_000)).await;
    }
    let (server, file) = object_file(&c, &fs, "/damaged", 0).await;
    // Nothing written yet is damaged.
    let (code, out, err) = c.shoal(&["scrub"]);
    assert_eq!(code, 0, "clean scrub: {out}{err}");

    flip(&file, BLOCK + 1234);
    let f = fs.open("/damaged", OpenFlags::read_only()).await.unwrap();
    let e = f.read_at(BLOCK + 100, 10).await.unwrap_err();
    assert_eq!(e.errno, Errno::EIO);
    let text = e.to_string();
    assert!(text.contains(&file.display().to_string()) && text.contains(&format!("offset {BLOCK}")), "{text}");
    // A read spanning the bad block fails too; the other blocks read fine.
    assert_eq!(f.read_at(0, len).await.unwrap_err().errno, Errno::EIO);
    assert!(f.read_at(0, BLOCK as usize).await.unwrap()[..] == body[..BLOCK as usize]);
    assert!(f.read_at(2 * BLOCK, len).await.unwrap()[..] == body[2 * BLOCK as usize..]);
    // The server logged it.
    assert!(c.log(server).contains(&file.display().to_string()), "server log:\n{}", c.log(server));

    // scrub: exactly that object and block, exit status 3.
    let (code, out, err) = c.shoal(&["scrub"]);
    assert_eq!(code, 3, "damage found: {out}{err}");
    assert!(out.contains(&format!("{} at offset {BLOCK}", file.display())), "{out}");
    let (code, out, _) = c.shoal(&["scrub", "--json"]);
    assert_eq!(code, 3);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["damaged"], 1);
    let errors: Vec<(u64, String, u64)> = v["servers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| {
            let id = s["id"].as_u64().unwrap();
            s["errors"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |e| (id, e["name"].as_str().unwrap().to_string(), e["offset"].as_u64().unwrap()))
        })
        .collect();
    assert_eq!(errors, vec![(server as u64, file.display().to_string(), BLOCK)]);
    for s in v["servers"].as_array().unwrap() {
        assert!(s["records"].as_u64().unwrap() > 0, "metadata records verified: {s}");
    }
    // Only the server asked: the other one is clean.
    let other = 1 - server;
    let (code, out, _) = c.shoal(&["scrub", "--server", &other.to_string()]);
    assert_eq!(code, 0, "{out}");

    // Rewriting the damaged block repairs it: reads and scrub are clean again.
    let w = fs.open("/damaged", OpenFlags::read_write()).await.unwrap();
    w.write_at(BLOCK, &body[BLOCK as usize..2 * BLOCK as usize]).await.unwrap();
    w.close().await.unwrap();
    assert!(f.read_at(0, len).await.unwrap()[..] == body[..]);
    let (code, out, err) = c.shoal(&["scrub"]);
    assert_eq!(code, 0, "{out}{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_block_reads_as_eio_through_the_fuse_mount_and_the_others_read_fine() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(1);
    let fs = direct_client(&c, Duration::from_secs(20));
    let body = pattern(11, 0, 3 * BLOCK as usize);
    write_file(&fs, "/m", &body).await;
    let (_, file) = object_file(&c, &fs, "/m", 0).await;
    flip(&file, 2 * BLOCK + 7);
    // Small kernel read-ahead, so that a read of block 0 does not reach block 2.
    let m = Mount::new(&c, &["max_readahead=4096"]);
    let path = m.p("m");
    let err = tokio::task::spawn_blocking(move || {
        let f = std::fs::File::open(&path).unwrap();
        let mut last = vec![0u8; 100];
        let err = f.read_exact_at(&mut last, 2 * BLOCK).unwrap_err();
        let mut first = vec![0u8; 4096];
        f.read_exact_at(&mut first, 0).unwrap();
        assert!(first[..] == body[..4096]);
        err
    })
    .await
    .unwrap();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_without_checksums_stay_readable_and_get_them() {
    let mut c = Cluster::start(1);
    let fs = direct_client(&c, Duration::from_secs(20));
    let body = pattern(3, 0, 200_000);
    write_file(&fs, "/old", &body).await;
    let (_, file) = object_file(&c, &fs, "/old", 0).await;
    // As an object written before checksums existed: no checksum file.
    c.kill9(0);
    let sums = PathBuf::from(format!("{}.crc", file.display()));
    std::fs::remove_file(&sums).unwrap();
    c.restart(0);
    let f = fs.open("/old", OpenFlags::read_only()).await.unwrap();
    assert!(f.read_at(0, body.len()).await.unwrap()[..] == body[..]);
    assert!(sums.exists(), "checksums computed at first access");
    let (code, out, err) = c.shoal(&["scrub"]);
    assert_eq!(code, 0, "{out}{err}");
    // And they protect it from then on.
    flip(&file, 5);
    assert_eq!(f.read_at(0, 10).await.unwrap_err().errno, Errno::EIO);
}

#[test]
fn scrub_names_an_unreachable_server_with_its_own_exit_status() {
    let mut c = Cluster::start(2);
    c.kill9(1);
    let (code, out, err) = shoal_testkit::shoal_cmd(Some(&c.config), &["--timeout", "3", "scrub"]);
    assert_eq!(code, 4, "{out}{err}");
    assert!(out.contains("UNREACHABLE") && err.contains("could not be scrubbed"), "{out}{err}");
    let (code, _, err) = c.shoal(&["scrub", "--server", "9"]);
    assert_eq!(code, 2, "{err}");
}

/// Regions of the file the writer overwrites in turn: unaligned, crossing blocks, some
/// inside one block.
fn regions() -> Vec<(u64, usize)> {
    let mut out = Vec::new();
    let mut off = 100u64;
    for i in 0..24u64 {
        let len = [1_000usize, 70_000, 150_000, 20_000][(i % 4) as usize];
        out.push((off, len));
        off += len as u64 + 3_333;
    }
    out
}

fn content(region: usize, generation: u64, off: u64, len: usize) -> Vec<u8> {
    pattern(generation * 1000 + region as u64, off, len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_writes_leaves_every_block_readable_as_old_or_new_bytes() {
    let mut c = Cluster::start(1);
    let regions = regions();
    let size = regions.last().map(|(o, l)| o + *l as u64).unwrap();
    let fs = direct_client(&c, Duration::from_secs(3));
    {
        let f = fs.create("/hot", 0o644, one_stripe()).await.unwrap();
        for (r, &(off, len)) in regions.iter().enumerate() {
            f.write_at(off, &content(r, 0, off, len)).await.unwrap();
        }
        f.close().await.unwrap();
    }
    // acked[r]: the last generation acknowledged for region r; in flight: (region, gen).
    let mut acked = vec![0u64; regions.len()];
    let mut generation = 0;
    for round in 0..3 {
        let writer = direct_client(&c, Duration::from_secs(3));
        let f = writer.open("/hot", OpenFlags::read_write()).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(700 + 300 * round);
        let killer = async {
            tokio::time::sleep_until(deadline).await;
        };
        tokio::pin!(killer);
        // The write under way when the server is killed: (region, generation).
        let in_flight = loop {
            generation += 1;
            let r = (generation as usize * 7) % regions.len();
            let (off, len) = regions[r];
            let data = content(r, generation, off, len);
            tokio::select! {
                res = f.write_at(off, &data) => {
                    if res.is_err() {
                        break (r, generation);
                    }
                    // Without write-behind, write_at returns once the server acknowledged it.
                    acked[r] = generation;
                }
                _ = &mut killer => break (r, generation),
            }
        };
        c.kill9(0);
        drop(f);
        c.restart(0);
        // Every byte reads (no EIO) and each region holds its last acknowledged generation,
        // or for the write under way, that write's bytes page by page.
        let reader = direct_client(&c, Duration::from_secs(20));
        let f = reader.open("/hot", OpenFlags::read_only()).await.unwrap();
        let got = f.read_at(0, size as usize).await.unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(got.len() as u64, size);
        for (r, &(off, len)) in regions.iter().enumerate() {
            let acked_bytes = content(r, acked[r], off, len);
            let here = &got[off as usize..off as usize + len];
            match in_flight {
                (fr, g) if fr == r => {
                    let new_bytes = content(r, g, off, len);
                    // Page by page of the file (the kernel copies a write a page at a time).
                    let mut at = off;
                    while at < off + len as u64 {
                        let next = ((at / 4096 + 1) * 4096).min(off + len as u64);
                        let (i, j) = ((at - off) as usize, (next - off) as usize);
                        assert!(
                            here[i..j] == acked_bytes[i..j] || here[i..j] == new_bytes[i..j],
                            "round {round}: region {r} at file offset {at} is neither old nor new"
                        );
                        at = next;
                    }
                    if here == &new_bytes[..] {
                        acked[r] = g;
                    } else if here != &acked_bytes[..] {
                        // Torn (part new, part old): settle the region for the next round.
                        let w = reader.open("/hot", OpenFlags::read_write()).await.unwrap();
                        w.write_at(off, &acked_bytes).await.unwrap();
                        w.close().await.unwrap();
                    }
                }
                _ => assert!(here == &acked_bytes[..], "round {round}: acknowledged region {r} lost"),
            }
        }
        let (code, out, err) = c.shoal(&["scrub"]);
        assert_eq!(code, 0, "round {round}: {out}{err}");
    }
    assert!(generation > 30, "the writer made progress ({generation} writes)");
}
