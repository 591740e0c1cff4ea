//! A shrinking truncate killed between its steps (failpoints `truncate.cut.before`,
//! `truncate.cut.after`, `truncate.finish.after`; `server/src/ops/truncate.rs`), and one whose
//! cut cannot finish because a server holding objects is down.
//!
//! After the restart the file must read as the truncated content — never as its old length
//! with zeros where the cut objects were — and a later extension must show zeros past the
//! truncated size, never the old bytes that were cut (or are still to be cut).

use shoal_client::{Client, LayoutSpec, OpenFlags, ServerId};
use shoal_testkit::wait_no_intents;
use shoal_testkit::{pattern, Cluster};
use std::time::Duration;

const SERVERS: u32 = 3;
const STRIPE: u64 = 4096;
/// Two stripes on each of the three servers.
const OLD_LEN: u64 = 6 * STRIPE;
/// Inside object 0: objects 1 and 2 are cut to nothing, object 0 in its middle.
const NEW_LEN: u64 = 1000;
const SEED: u64 = 0x7a11;

/// Create `path` striped over all servers, filled with the pattern; (its home, its layout's
/// servers).
async fn make_file(c: &Cluster, fs: &Client, path: &str) -> (ServerId, Vec<ServerId>) {
    let spec = LayoutSpec { stripe_size: Some(STRIPE), stripe_count: Some(SERVERS), ..Default::default() };
    let f = fs.create(path, 0o644, Some(spec)).await.unwrap();
    f.write_at(0, &pattern(SEED, 0, OLD_LEN as usize)).await.unwrap();
    let attr = f.attr();
    f.close().await.unwrap();
    let servers = attr.layout.expect("a file has a layout").servers;
    assert_eq!(servers.len(), SERVERS as usize, "the file is striped over every server");
    (c.map.home_of(attr.ino), servers)
}

/// The whole file as a fresh client reads it.
async fn read_all(c: &Cluster, path: &str) -> Vec<u8> {
    let f = c.uncached_client().open(path, OpenFlags::read_only()).await.unwrap();
    let size = f.attr().size;
    let data = f.read_at(0, size as usize).await.unwrap().to_vec();
    assert_eq!(data.len() as u64, size, "{path}: short read");
    data
}

/// The truncated file reads as the old content's first `NEW_LEN` bytes; extended again (by
/// a truncate, then by a write beyond the end) it shows zeros past them.
async fn check_truncated_then_extend(c: &Cluster, fs: &Client, path: &str) {
    let old = pattern(SEED, 0, OLD_LEN as usize);
    let got = read_all(c, path).await;
    assert_eq!(got.len() as u64, NEW_LEN, "{path}: size after the interrupted truncate");
    assert!(got == old[..NEW_LEN as usize], "{path}: content after the interrupted truncate is not the old prefix");

    fs.truncate(path, OLD_LEN).await.unwrap();
    let got = read_all(c, path).await;
    assert_eq!(got.len() as u64, OLD_LEN);
    assert!(got[..NEW_LEN as usize] == old[..NEW_LEN as usize], "{path}: kept bytes changed by the extension");
    assert!(got[NEW_LEN as usize..].iter().all(|&b| b == 0), "{path}: extending truncate shows cut bytes");

    // A write beyond the end leaves a hole that reads as zeros.
    fs.truncate(path, NEW_LEN).await.unwrap();
    let f = fs.open(path, OpenFlags::read_write()).await.unwrap();
    f.write_at(OLD_LEN + 100, b"end").await.unwrap();
    f.close().await.unwrap();
    let got = read_all(c, path).await;
    assert_eq!(got.len() as u64, OLD_LEN + 103);
    assert!(got[NEW_LEN as usize..(OLD_LEN + 100) as usize].iter().all(|&b| b == 0), "{path}: hole shows old bytes");
    assert_eq!(&got[(OLD_LEN + 100) as usize..], b"end");
}

/// Truncate `path` to `NEW_LEN` with failpoint `point` armed on its home, which must die
/// there; with `in_recovery`, let it die again at that point while recovering; then restart
/// it cleanly and wait until every intent is resolved.
async fn truncate_crashing_at(c: &mut Cluster, fs: &Client, path: &str, point: &str, in_recovery: Option<&str>) {
    let (home, _) = make_file(c, fs, path).await;
    let id = home.0;
    c.stop(id);
    c.restart_with_env(id, &[("FAILPOINTS", &format!("{point}=return"))]);
    let (fs2, p) = (c.client(), path.to_string());
    let task = tokio::spawn(async move {
        // Its answer does not matter: the client may have resent it to the restarted server.
        let _ = fs2.truncate(&p, NEW_LEN).await;
    });
    let died = tokio::task::block_in_place(|| c.wait_exit(id, Duration::from_secs(30)));
    assert!(died, "server {id} did not die at failpoint {point}:\n{}", c.log(id));
    if let Some(p2) = in_recovery {
        tokio::task::block_in_place(|| {
            c.spawn_with_env(id, &[("FAILPOINTS", &format!("{p2}=return"))]);
            assert!(c.wait_exit(id, Duration::from_secs(30)), "server {id} did not die at {p2} while recovering");
        });
    }
    tokio::task::block_in_place(|| c.restart(id));
    let _ = tokio::time::timeout(Duration::from_secs(60), task).await.expect("the truncate ended after the restart");
    wait_no_intents(fs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncate_killed_between_its_steps_reads_truncated_and_extends_with_zeros() {
    let mut c = Cluster::start(SERVERS);
    let fs = c.client();
    let cases: [(&str, Option<&str>); 4] = [
        ("truncate.cut.before", None),
        ("truncate.cut.after", None),
        ("truncate.finish.after", None),
        // Killed again in recovery, after its cut and before its finish.
        ("truncate.cut.before", Some("truncate.cut.after")),
    ];
    for (i, (point, in_recovery)) in cases.into_iter().enumerate() {
        let path = format!("/f{i}");
        truncate_crashing_at(&mut c, &fs, &path, point, in_recovery).await;
        check_truncated_then_extend(&c, &fs, &path).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_that_cannot_finish_keeps_the_new_size_and_refuses_extensions_until_it_can() {
    let mut c = Cluster::start(SERVERS);
    let fs = c.client();
    let path = "/pending";
    let (home, servers) = make_file(&c, &fs, path).await;
    // A server holding only bytes beyond the new size (objects 1 or 2), not the home.
    let away = *servers[1..].iter().find(|&&s| s != home).expect("two objects beyond NEW_LEN, at most one at home");
    let id = home.0;
    c.stop(id);
    c.restart_with_env(id, &[("FAILPOINTS", "truncate.cut.before=return")]);
    let (fs2, p) = (c.client(), path.to_string());
    let task = tokio::spawn(async move {
        let _ = fs2.truncate(&p, NEW_LEN).await;
    });
    let died = tokio::task::block_in_place(|| c.wait_exit(id, Duration::from_secs(30)));
    assert!(died, "server {id} did not die at truncate.cut.before:\n{}", c.log(id));
    c.stop(away.0);
    tokio::task::block_in_place(|| c.restart(id));
    let _ = tokio::time::timeout(Duration::from_secs(60), task).await.expect("the truncate ended after the restart");

    // The size is the new one at once; its bytes are all there.
    let old = pattern(SEED, 0, OLD_LEN as usize);
    let got = read_all(&c, path).await;
    assert!(got == old[..NEW_LEN as usize], "the file does not read as truncated while its cut is pending");
    assert!(fs.server_status(home).await.unwrap().pending_intents >= 1, "the cut on server {away} is pending");
    // Extending now would show the old bytes still on `away`: refused, with a cause.
    let e = fs.truncate(path, OLD_LEN).await.expect_err("an extension while a cut is pending");
    let cause = format!("until its truncation to {NEW_LEN} is finished");
    assert!(e.to_string().contains(&cause), "the error names the pending truncation: {e}");
    assert_eq!(read_all(&c, path).await.len() as u64, NEW_LEN, "a refused extension changed the size");

    tokio::task::block_in_place(|| c.restart(away.0));
    wait_no_intents(&fs).await;
    check_truncated_then_extend(&c, &fs, path).await;
}
