//! Load-aware placement on real servers: with one of four servers throttled
//! (`shoald --throttle`, here through `SHOALD_THROTTLE`), new files under the `load` policy
//! avoid it, while hash placement (`spread`) gives it its share.

use shoal_client::{Client, LayoutSpec, PlacementPolicy, ServerId};
use shoal_testkit::{pattern, Cluster};
use std::collections::HashMap;
use std::time::Duration;

const THROTTLED: u32 = 3;
const WRITERS: usize = 8;
const FILES_PER_WRITER: usize = 6;
const FILE_BYTES: usize = 256 << 10;

/// 8 writers at once, each creating and writing its files in `dir`; how many of the new
/// files' (single) objects each server holds.
async fn write_files(fs: &Client, dir: &str) -> HashMap<ServerId, usize> {
    let writers = (0..WRITERS).map(|w| {
        let fs = fs.clone();
        let dir = dir.to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            for i in 0..FILES_PER_WRITER {
                let f = fs.create(&format!("{dir}/w{w}-{i}"), 0o644, None).await.unwrap();
                f.write_at(0, &pattern(w as u64, 0, FILE_BYTES)).await.unwrap();
                held.extend(f.layout().servers.iter().copied());
                f.close().await.unwrap();
            }
            held
        })
    });
    let mut count = HashMap::new();
    for w in writers {
        for s in w.await.unwrap() {
            *count.entry(s).or_default() += 1;
        }
    }
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn new_files_avoid_a_throttled_server_under_load_placement_and_not_under_hash() {
    let mut cluster = Cluster::start(4);
    cluster.stop(THROTTLED);
    cluster.restart_with_env(THROTTLED, &[("SHOALD_THROTTLE", "4")]);
    let fs = cluster.client();

    // Warm-up: one file striped over every server, so that each has served data and the
    // throttled one has shown how slow it is; then time for a few load exchanges.
    let warm = LayoutSpec { stripe_size: Some(64 << 10), stripe_count: Some(4), ..Default::default() };
    let f = fs.create("/warm", 0o644, Some(warm)).await.unwrap();
    f.write_at(0, &pattern(9, 0, 1 << 20)).await.unwrap();
    f.close().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let total = WRITERS * FILES_PER_WRITER;
    let share = total / 4;
    for (dir, policy) in [("/hash", PlacementPolicy::Spread), ("/load", PlacementPolicy::Load)] {
        fs.mkdir(dir, 0o755).await.unwrap();
        let spec = LayoutSpec { stripe_count: Some(1), policy: Some(policy), ..Default::default() };
        fs.set_dir_layout(fs.stat(dir).await.unwrap().ino, spec).await.unwrap();
        let count = write_files(&fs, dir).await;
        let on_throttled = count.get(&ServerId(THROTTLED)).copied().unwrap_or(0);
        assert_eq!(count.values().sum::<usize>(), total, "{dir}: one object per file: {count:?}");
        match policy {
            // Binomial(48, 1/4): mean 12, standard deviation 3; 4 is 2.7 deviations below.
            PlacementPolicy::Spread => {
                assert!(
                    on_throttled >= share / 3,
                    "{dir}: hash placement gives the throttled server its share: {count:?}"
                )
            }
            _ => assert!(
                on_throttled <= share / 4,
                "{dir}: load placement keeps new files off the throttled server: {count:?}\n{}",
                (0..4).map(|i| cluster.log(i)).collect::<Vec<_>>().join("\n")
            ),
        }
        if policy == PlacementPolicy::Load {
            // The others share the files: none is left out, none takes them all (herding).
            for id in (0..4).filter(|&i| i != THROTTLED) {
                let n = count.get(&ServerId(id)).copied().unwrap_or(0);
                assert!(n >= total / 8 && n <= total * 2 / 3, "{dir}: server {id} got {n}: {count:?}");
            }
        }
    }

    // The policy is visible where layouts are shown.
    let (code, out, err) = cluster.shoal(&["getstripe", "/load"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("load"), "getstripe shows the load policy: {out}");
}

#[test]
fn a_bad_throttle_is_refused_with_one_line() {
    let cluster = Cluster::start(1);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shoald"))
        .args(["--config", cluster.config.to_str().unwrap(), "--id", "0", "--throttle=0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a positive number of MB/s"), "{err}");
}
