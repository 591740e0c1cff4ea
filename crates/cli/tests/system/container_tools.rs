//! `shoal container dump | split | cat | defrag` on a known container, in a local directory and
//! on a real cluster: the exact output of dump (table and JSON), the bytes of split's files
//! and of cat, a defragmented container smaller and identical per rank, and the errors (and
//! exit codes) for missing, foreign, truncated and bit-flipped containers.

use shoal_container::{Container, SerialWriter, Target, WriteOptions};
use shoal_testkit::{shoal_cmd, Cluster};
use std::path::Path;

/// The known container: six tasks, chunks of 4 KiB (8 KiB for rank 2), aligned to 4 KiB.
/// Rank 1 overflows into three chunks, rank 4 into two, rank 3 writes nothing.
const CHUNKS: [u64; 6] = [4096, 4096, 8192, 4096, 4096, 4096];
const LENS: [usize; 6] = [1000, 10000, 8192, 0, 5000, 4096];
const DATA_BYTES: u64 = 28288;

fn data(r: usize) -> Vec<u8> {
    (0..LENS[r]).map(|i| (i * 7 + r * 101 + i / 251) as u8).collect()
}

/// Write the known container `name` on `target` in `nfiles` physical files, in pieces of
/// 700 bytes (a write goes on into the task's next chunk when one is full).
async fn build(target: &Target, name: &str, nfiles: u32, key_value: bool) {
    let opts = WriteOptions { nfiles, fs_block: 4096, key_value, ..WriteOptions::default() };
    let mut w = SerialWriter::create(target, name, &CHUNKS, &opts).await.unwrap();
    for r in 0..6 {
        for piece in data(r).chunks(700) {
            w.task(r as u64).unwrap().write(piece).await.unwrap();
        }
    }
    w.close().await.unwrap();
}

/// The sizes of the physical files as the library reads them (the tail's length is the
/// format's business; everything else the tools print is checked against fixed values).
async fn file_sizes(target: &Target, name: &str) -> Vec<u64> {
    Container::open(target, name).await.unwrap().files().iter().map(|m| m.len).collect()
}

fn ok(r: (i32, String, String)) -> String {
    assert_eq!(r.0, 0, "exit status; stderr: {}", r.2);
    assert_eq!(r.2, "", "stderr");
    r.1
}

/// Runs `shoal` from an async test (the CLI's own runtime is another process).
fn shoal(config: Option<&Path>, args: &[&str]) -> (i32, String, String) {
    tokio::task::block_in_place(|| shoal_cmd(config, args))
}

/// `shoal container cat`'s standard output, as bytes (it fails the test on any error).
fn cat(config: Option<&Path>, name: &str, rank: usize) -> Vec<u8> {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_shoal"));
    cmd.env_remove("SHOAL_CONFIG").stdin(std::process::Stdio::null());
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    cmd.args(["container", "cat", name, "--rank", &rank.to_string()]);
    let o = tokio::task::block_in_place(|| cmd.output().unwrap());
    assert_eq!((o.status.code(), String::from_utf8_lossy(&o.stderr).as_ref()), (Some(0), ""), "cat {name} rank {rank}");
    o.stdout
}

fn pct(part: u64, whole: u64) -> String {
    format!("{:.1}", (part as f64 * 1000.0 / whole as f64).round() / 10.0)
}

/// What `dump` prints for the known container in one physical file named `shown`, whose
/// blocks are `block_len` bytes long.
fn expected_dump(shown: &str, size: u64, block_len: u64) -> String {
    let lines = [
        format!("container   {shown}"),
        "format      version 1 (little-endian, CRC32C on each metadata block)".into(),
        "flags       0x0 (plain)".into(),
        "tasks       6".into(),
        "files       1".into(),
        format!(
            "data        28288 bytes in logical files, {size} bytes in physical files ({}% data)",
            pct(DATA_BYTES, size)
        ),
        "".into(),
        "file         size   tasks block size    block len  blocks  fill%  path".into(),
        format!(
            "   0 {size:>12}       6       4096 {block_len:>12}       3   {}  {shown}",
            pct(DATA_BYTES, 3 * block_len)
        ),
        "".into(),
        "    rank file chunk size  chunks        bytes  fill%".into(),
        "       0    0       4096       1         1000   24.4".into(),
        "       1    0       4096       3        10000   81.4".into(),
        "       2    0       8192       1         8192  100.0".into(),
        "       3    0       4096       0            0    0.0".into(),
        "       4    0       4096       2         5000   61.0".into(),
        "       5    0       4096       1         4096  100.0".into(),
    ];
    lines.map(|l| l + "\n").concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_on_a_local_container() {
    let dir = tempfile::tempdir().unwrap();
    let name = dir.path().join("ckpt").to_str().unwrap().to_string();
    build(&Target::Posix, &name, 1, false).await;
    let size = file_sizes(&Target::Posix, &name).await[0];
    assert_eq!(size, std::fs::metadata(&name).unwrap().len());

    // dump: the table, exactly; no cluster configuration needed for a local path.
    assert_eq!(ok(shoal(None, &["container", "dump", &name])), expected_dump(&name, size, 28672));

    // dump --json: every field.
    let j: serde_json::Value = serde_json::from_str(&ok(shoal(None, &["container", "dump", "--json", &name]))).unwrap();
    assert_eq!(j["container"], name.as_str());
    assert_eq!(j["target"], "local");
    assert_eq!(j["format_version"], 1);
    assert_eq!(j["byte_order"], "little-endian");
    assert_eq!(
        (j["flags"].as_u64(), j["key_value"].as_bool(), j["coalesced"].as_bool()),
        (Some(0), Some(false), Some(false))
    );
    assert_eq!((j["ntasks"].as_u64(), j["nfiles"].as_u64()), (Some(6), Some(1)));
    assert_eq!((j["data_bytes"].as_u64(), j["file_bytes"].as_u64()), (Some(DATA_BYTES), Some(size)));
    let f = &j["files"][0];
    assert_eq!(f["path"], name.as_str());
    assert_eq!(
        [
            &f["number"],
            &f["size"],
            &f["tasks"],
            &f["first_rank"],
            &f["block_size"],
            &f["block_len"],
            &f["data_start"],
            &f["blocks"],
            &f["data_bytes"]
        ]
        .map(|v| v.as_u64().unwrap()),
        [0, size, 6, 0, 4096, 28672, 4096, 3, DATA_BYTES]
    );
    assert_eq!(j["tasks_omitted"], 0);
    let tasks = j["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 6);
    let t1 = &tasks[1];
    assert_eq!((t1["rank"].as_u64(), t1["file"].as_u64(), t1["chunk_size"].as_u64()), (Some(1), Some(0), Some(4096)));
    assert_eq!(
        (t1["chunks"].as_u64(), t1["bytes"].as_u64(), t1["fill_percent"].as_f64()),
        (Some(3), Some(10000), Some(81.4))
    );
    // Block b starts at 4096 + b * 28672; rank 1's chunk at 4096 in it.
    assert_eq!(t1["chunk_offsets"], serde_json::json!([8192, 36864, 65536]));
    assert_eq!(t1["chunk_bytes"], serde_json::json!([4096, 4096, 1808]));
    assert_eq!(tasks[3]["chunks"], 0);
    assert_eq!(tasks[3]["chunk_bytes"], serde_json::json!([]));

    // split: every task's logical file as OUTDIR/ckpt.RANK (made if missing), a task that
    // wrote nothing as an empty file; nothing else in OUTDIR.
    let out = dir.path().join("out/split");
    ok(shoal(None, &["container", "split", &name, out.to_str().unwrap()]));
    let mut names: Vec<String> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["ckpt.0", "ckpt.1", "ckpt.2", "ckpt.3", "ckpt.4", "ckpt.5"]);
    for r in 0..6 {
        assert_eq!(std::fs::read(out.join(format!("ckpt.{r}"))).unwrap(), data(r), "split rank {r}");
    }
    // One task's, under another prefix.
    let one = dir.path().join("one");
    ok(shoal(None, &["container", "split", &name, one.to_str().unwrap(), "--rank", "4", "--prefix", "task"]));
    assert_eq!(std::fs::read_dir(&one).unwrap().count(), 1);
    assert_eq!(std::fs::read(one.join("task.4")).unwrap(), data(4));

    // cat: one task's bytes, exactly.
    for r in 0..6 {
        assert_eq!(cat(None, &name, r), data(r), "cat rank {r}");
    }

    // defrag: one chunk per task, no gaps; smaller, and the same bytes per rank.
    let packed = dir.path().join("packed").to_str().unwrap().to_string();
    let said = ok(shoal(None, &["container", "defrag", &name, &packed]));
    let c = Container::open(&Target::Posix, &packed).await.unwrap();
    let new_size = c.files()[0].len;
    assert_eq!(
        said,
        format!("{name} -> {packed}: 6 tasks, 28288 bytes of data; physical files {size} -> {new_size} bytes\n")
    );
    assert!(new_size < size);
    // One block of 40 KiB (the chunks: 4, 12, 8, 4, 8 and 4 KiB) after the 4 KiB header, then
    // the tail (shorter than before: one chunk per task to describe) and the trailer.
    let h = &c.files()[0].header;
    assert_eq!((h.data_start, h.block_len, c.files()[0].tail.nblocks), (4096, 40960, 1));
    assert!(new_size - 45056 < size - 4096 - 3 * 28672);
    for r in 0..6u64 {
        assert_eq!(c.read_all(r).await.unwrap(), data(r as usize), "defragmented rank {r}");
        let loc = c.location(r).unwrap();
        // Each chunk is the task's data rounded up to 4 KiB (an empty task still has one block).
        assert_eq!(loc.chunk_len, (LENS[r as usize] as u64).max(1).next_multiple_of(4096), "rank {r}");
        assert_eq!(loc.used.len(), usize::from(LENS[r as usize] > 0), "rank {r}: one chunk");
    }
    let j: serde_json::Value =
        serde_json::from_str(&ok(shoal(None, &["container", "dump", "--json", &packed]))).unwrap();
    assert_eq!(j["files"][0]["blocks"], 1);
    assert_eq!(j["files"][0]["block_len"], 40960);
    assert_eq!(j["data_bytes"], DATA_BYTES);
    // -q: nothing printed.
    let quiet = dir.path().join("quiet").to_str().unwrap().to_string();
    assert_eq!(ok(shoal(None, &["container", "defrag", "-q", &name, &quiet])), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_file_key_value_and_the_task_limit() {
    let dir = tempfile::tempdir().unwrap();
    let name = dir.path().join("mf").to_str().unwrap().to_string();
    build(&Target::Posix, &name, 2, true).await;
    let sizes = file_sizes(&Target::Posix, &name).await;
    let second = format!("{name}.000001");

    let out = ok(shoal(None, &["container", "dump", &name]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[2], "flags       0x1 (key-value)");
    assert_eq!(lines[4], "files       2");
    // Ranks 0-2 in file 0, 3-5 in file 1, each file with blocks of its own tasks' chunks.
    assert_eq!(
        lines[8],
        format!("   0 {:>12}       3       4096        16384       3   {}  {name}", sizes[0], pct(19192, 3 * 16384))
    );
    assert_eq!(
        lines[9],
        format!("   1 {:>12}       3       4096        12288       2   {}  {second}", sizes[1], pct(9096, 2 * 12288))
    );
    assert_eq!(lines[15], "       3    1       4096       0            0    0.0");

    // The key-value flag and the two files survive a defrag.
    let packed = dir.path().join("packed").to_str().unwrap().to_string();
    ok(shoal(None, &["container", "defrag", "-q", &name, &packed]));
    let c = Container::open(&Target::Posix, &packed).await.unwrap();
    assert!(c.key_value());
    assert_eq!(c.nfiles(), 2);
    for r in 0..6u64 {
        assert_eq!(c.read_all(r).await.unwrap(), data(r as usize));
    }
    // --files 1 merges them.
    let one = dir.path().join("one").to_str().unwrap().to_string();
    ok(shoal(None, &["container", "defrag", "-q", "--files", "1", &name, &one]));
    assert_eq!(Container::open(&Target::Posix, &one).await.unwrap().nfiles(), 1);

    // Without --tasks, a container of more than 32 tasks lists the first 32.
    let many = dir.path().join("many").to_str().unwrap().to_string();
    let mut w = SerialWriter::create(
        &Target::Posix,
        &many,
        &[512; 40],
        &WriteOptions { fs_block: 512, ..WriteOptions::default() },
    )
    .await
    .unwrap();
    for r in 0..40u64 {
        w.task(r).unwrap().write(&[r as u8; 100]).await.unwrap();
    }
    w.close().await.unwrap();
    let out = ok(shoal(None, &["container", "dump", &many]));
    assert!(
        out.ends_with("      31    0        512       1          100   19.5\n(8 more tasks: --tasks lists them all)\n"),
        "{out}"
    );
    let out = ok(shoal(None, &["container", "dump", "--tasks", &many]));
    assert!(out.ends_with("      39    0        512       1          100   19.5\n"), "{out}");
    let j: serde_json::Value = serde_json::from_str(&ok(shoal(None, &["container", "dump", "--json", &many]))).unwrap();
    assert_eq!((j["tasks"].as_array().unwrap().len(), j["tasks_omitted"].as_u64()), (32, Some(8)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_and_missing_containers_fail_with_one_line_and_their_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let name = dir.path().join("ckpt").to_str().unwrap().to_string();
    build(&Target::Posix, &name, 2, false).await;
    let good = std::fs::read(&name).unwrap();
    let bad = dir.path().join("bad").to_str().unwrap().to_string();
    let fails = |bytes: &[u8], code: i32, msg: &str| {
        std::fs::write(&bad, bytes).unwrap();
        // A damaged file 0 is refused by every command, before any output is written.
        for args in [
            vec!["container", "dump", bad.as_str()],
            vec!["container", "cat", bad.as_str(), "--rank", "0"],
            vec!["container", "split", bad.as_str(), dir.path().join("never").to_str().unwrap()],
            vec!["container", "defrag", bad.as_str(), dir.path().join("never2").to_str().unwrap()],
        ] {
            let (c, out, err) = shoal(None, &args);
            assert_eq!(
                (c, out.as_str(), err.as_str()),
                (code, "", format!("shoal: {bad}: {msg}\n").as_str()),
                "{args:?}"
            );
        }
        assert!(!dir.path().join("never").exists() && !dir.path().join("never2").exists());
    };
    let closed = "not a readable container: no trailer at its end: the container was never closed (a writer stopped before the collective close) or the file was cut short";
    // Truncated anywhere: by a byte, in the data, in the header, to nothing.
    fails(&good[..good.len() - 1], 3, closed);
    fails(&good[..4096 + 100], 3, closed);
    fails(&good[..20], 3, "not a readable container: the header (metadata block 1) is cut short (truncated file)");
    fails(&[], 3, "not a readable container: the header (metadata block 1) is cut short (truncated file)");
    // One flipped bit in each metadata block.
    let mut h = good.clone();
    h[40] ^= 0x08;
    fails(&h, 3, "not a readable container: the checksum of the header (metadata block 1) does not match (corrupted)");
    let tail_at = u64::from_le_bytes(good[good.len() - 24..good.len() - 16].try_into().unwrap()) as usize;
    let mut t = good.clone();
    t[tail_at + 9] ^= 0x01;
    fails(&t, 3, "not a readable container: the checksum of the tail (metadata block 2) does not match (corrupted)");
    let mut tr = good.clone();
    let at = tr.len() - 20;
    tr[at] ^= 0x40;
    fails(&tr, 3, "not a readable container: the checksum of the trailer does not match (corrupted)");
    // Not a container at all.
    fails(&b"just some text, long enough to hold a header's fixed part and then some more"[..], 3,
        "not a readable container: the header (metadata block 1) does not start with its magic number (not a Shoal container, or overwritten)");

    // A missing container, a missing physical file of a multi-file one: exit 1, the file named.
    let missing = dir.path().join("nothing").to_str().unwrap().to_string();
    assert_eq!(
        shoal(None, &["container", "dump", &missing]),
        (1, String::new(), format!("shoal: {missing}: No such file or directory\n"))
    );
    std::fs::rename(format!("{name}.000001"), format!("{name}.moved")).unwrap();
    assert_eq!(
        shoal(None, &["container", "cat", &name, "-r", "0"]),
        (1, String::new(), format!("shoal: {name}.000001: No such file or directory\n"))
    );
    std::fs::rename(format!("{name}.moved"), format!("{name}.000001")).unwrap();

    // Usage errors, exit 2: no such rank, outputs that would overwrite the container.
    assert_eq!(
        shoal(None, &["container", "cat", &name, "--rank", "6"]),
        (2, String::new(), format!("shoal: {name}: no rank 6 (the container holds 6 tasks, ranks 0 to 5)\n"))
    );
    let (c, _, err) = shoal(None, &["container", "defrag", &name, &format!("{}/./ckpt", dir.path().display())]);
    assert_eq!(
        (c, err),
        (
            2,
            format!(
                "shoal: {}/./ckpt is a physical file of {name}: defrag writes a new container, give it another name\n",
                dir.path().display()
            )
        )
    );
    // A container named like a split output (run.4), split into its own directory as run.R.
    let run = dir.path().join("run.4").to_str().unwrap().to_string();
    std::fs::copy(&name, &run).unwrap();
    std::fs::copy(format!("{name}.000001"), format!("{run}.000001")).unwrap();
    let (c, _, err) = shoal(None, &["container", "split", &run, dir.path().to_str().unwrap(), "--prefix", "run"]);
    assert_eq!(
        (c, err),
        (2, format!("shoal: {run} is a physical file of the container: choose another OUTDIR or --prefix\n"))
    );
    assert!(!dir.path().join("run.0").exists(), "nothing split");
    assert_eq!(std::fs::read(&name).unwrap(), good, "nothing written over the container");
    // A Shoal path without a cluster configuration.
    let (c, _, err) = shoal(None, &["container", "dump", "shoal://ckpt"]);
    assert_eq!(c, 2, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_on_a_container_on_shoal() {
    let cluster = Cluster::start(2);
    let client = cluster.client();
    client.mkdir("/runs", 0o755).await.unwrap();
    let target = Target::Shoal(client.clone());
    build(&target, "/runs/ckpt", 1, false).await;
    let size = file_sizes(&target, "/runs/ckpt").await[0];
    let sh = |args: &[&str]| tokio::task::block_in_place(|| cluster.shoal(args));

    // Blocks of 7 chunks of 4 KiB, padded to whole rounds of the 2 servers (8 stripes): each
    // task's chunks on one server.
    assert_eq!(ok(sh(&["container", "dump", "shoal://runs/ckpt"])), expected_dump("shoal://runs/ckpt", size, 32768));
    let j: serde_json::Value =
        serde_json::from_str(&ok(sh(&["container", "dump", "--json", "shoal://runs/ckpt"]))).unwrap();
    assert_eq!((j["target"].as_str(), j["files"][0]["path"].as_str()), (Some("shoal"), Some("shoal://runs/ckpt")));

    // split into Shoal and into a local directory.
    ok(sh(&["container", "split", "shoal://runs/ckpt", "shoal://runs/out"]));
    let local = tempfile::tempdir().unwrap();
    ok(sh(&["container", "split", "shoal://runs/ckpt", local.path().to_str().unwrap()]));
    for r in 0..6 {
        let f = client.open(&format!("/runs/out/ckpt.{r}"), shoal_client::OpenFlags::read_only()).await.unwrap();
        assert_eq!(f.read_at(0, 1 << 20).await.unwrap(), data(r), "split to Shoal, rank {r}");
        assert_eq!(std::fs::read(local.path().join(format!("ckpt.{r}"))).unwrap(), data(r), "split to local, rank {r}");
    }
    for r in 0..6 {
        assert_eq!(cat(Some(&cluster.config), "shoal://runs/ckpt", r), data(r), "cat rank {r}");
    }

    // defrag on Shoal, and from Shoal to a local directory.
    ok(sh(&["container", "defrag", "-q", "shoal://runs/ckpt", "shoal://runs/packed"]));
    let c = Container::open(&target, "/runs/packed").await.unwrap();
    assert!(c.files()[0].len < size);
    assert_eq!(c.files()[0].header.block_len, 40960);
    let to_local = local.path().join("packed").to_str().unwrap().to_string();
    ok(sh(&["container", "defrag", "-q", "shoal://runs/ckpt", &to_local]));
    let l = Container::open(&Target::Posix, &to_local).await.unwrap();
    for r in 0..6u64 {
        assert_eq!(c.read_all(r).await.unwrap(), data(r as usize), "defragmented on Shoal, rank {r}");
        assert_eq!(l.read_all(r).await.unwrap(), data(r as usize), "defragmented to local, rank {r}");
    }

    // A truncated and a bit-flipped container on Shoal.
    let f = client.open("/runs/ckpt", shoal_client::OpenFlags::read_write()).await.unwrap();
    f.set_len(size - 1).await.unwrap();
    f.close().await.unwrap();
    assert_eq!(
        sh(&["container", "dump", "shoal://runs/ckpt"]),
        (3, String::new(), "shoal: shoal://runs/ckpt: not a readable container: no trailer at its end: the container was never closed (a writer stopped before the collective close) or the file was cut short\n".to_string())
    );
    let f = client.open("/runs/packed", shoal_client::OpenFlags::read_write()).await.unwrap();
    let byte = f.read_at(30, 1).await.unwrap()[0];
    f.write_at(30, &[byte ^ 0x20]).await.unwrap();
    f.close().await.unwrap();
    assert_eq!(
        sh(&["container", "split", "shoal://runs/packed", "shoal://runs/never"]),
        (3, String::new(), "shoal: shoal://runs/packed: not a readable container: the checksum of the header (metadata block 1) does not match (corrupted)\n".to_string())
    );
    assert!(client.stat("/runs/never").await.is_err(), "nothing made for a damaged container");
    // The client's cause, as other shoal commands print it (the server's detail in parentheses).
    let (c, out, err) = sh(&["container", "dump", "shoal://runs/missing"]);
    assert_eq!((c, out.as_str()), (1, ""));
    assert!(err.starts_with("shoal: shoal://runs/missing: No such file or directory"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
