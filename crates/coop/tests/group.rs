//! Coop groups of real members on 127.0.0.1, each answering from its own counting source
//! (standing for its servers): every object is asked of the servers about once per group,
//! a killed or hung member delays the others by at most one wait, and members of another
//! group or without the host key are not answered.

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt};
use shoal_auth::{KeyKind, KeyRing};
use shoal_coop::group::Group;
use shoal_coop::wire::{Named, Version};
use shoal_coop::{Coop, CoopOptions, Failure, Source, PIECE};
use shoal_proto::msg::{Attr, FileKind, Timestamp};
use shoal_proto::{Errno, Ino};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One "file system" all sources read: file 1 of 5 pieces at version `V`, directory 2.
const FILE: Ino = Ino(1);
const DIR: Ino = Ino(2);
const SIZE: u64 = 4 * PIECE + 1000;

fn attr(ino: Ino) -> Attr {
    let t = Timestamp { secs: 100, nsecs: 7 };
    Attr {
        ino,
        kind: if ino == DIR { FileKind::Dir } else { FileKind::File },
        perm: 0o644,
        uid: 0,
        gid: 0,
        size: if ino == FILE { SIZE } else { 0 },
        nlink: 1,
        atime: t,
        mtime: t,
        ctime: t,
        blocks_bytes: 0,
        layout: None,
        dir_default: None,
        parent: None,
        read_mostly: true,
    }
}

fn version() -> Version {
    Version::of(&attr(FILE))
}

fn piece_bytes(index: u64) -> Bytes {
    let len = PIECE.min(SIZE - index * PIECE) as usize;
    Bytes::from(vec![index as u8; len])
}

/// A source standing for a member's servers: counts the questions, and takes `delay` to answer.
struct Counting {
    calls: AtomicU64,
    delay: Duration,
}

impl Counting {
    fn new(delay: Duration) -> Arc<Counting> {
        Arc::new(Counting { calls: AtomicU64::new(0), delay })
    }
}

impl Source for Counting {
    fn attr(&self, ino: Ino) -> BoxFuture<'_, Result<Attr, Failure>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        async move {
            // Servers take a while: the members' questions meet in flight.
            tokio::time::sleep(self.delay).await;
            match ino {
                FILE | DIR => Ok(attr(ino)),
                _ => Err(Failure::new(Errno::ENOENT, "no such inode")),
            }
        }
        .boxed()
    }

    fn listing(&self, _dir: Ino) -> BoxFuture<'_, Result<Vec<Named>, Failure>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(self.delay).await;
            Ok(vec![Named { name: "lib.so".into(), attr: attr(FILE) }])
        }
        .boxed()
    }

    fn entry(&self, _dir: Ino, name: &str) -> BoxFuture<'_, Result<Attr, Failure>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let found = name == "lib.so";
        async move {
            tokio::time::sleep(self.delay).await;
            match found {
                true => Ok(attr(FILE)),
                false => Err(Failure::new(Errno::ENOENT, "no such name")),
            }
        }
        .boxed()
    }

    fn piece(&self, _ino: Ino, v: Version, index: u64) -> BoxFuture<'_, Result<Bytes, Failure>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(self.delay).await;
            match v == version() {
                true => Ok(piece_bytes(index)),
                false => Err(Failure::new(Errno::ESTALE, "the file changed")),
            }
        }
        .boxed()
    }
}

fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let listeners: Vec<std::net::TcpListener> =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    listeners.iter().map(|l| l.local_addr().unwrap()).collect()
}

async fn start(n: usize, keys: Option<KeyRing>, wait: Duration, delay: Duration) -> (Vec<Coop>, Vec<Arc<Counting>>) {
    let addrs = free_addrs(n);
    let mut members = Vec::new();
    let mut sources = Vec::new();
    for a in &addrs {
        let source = Counting::new(delay);
        let group = Group::new(addrs.clone(), *a).unwrap();
        let opts = CoopOptions { wait, ..CoopOptions::default() };
        members.push(Coop::start(group, keys.clone(), source.clone(), opts).await.unwrap());
        sources.push(source);
    }
    (members, sources)
}

fn server_calls(sources: &[Arc<Counting>]) -> u64 {
    sources.iter().map(|s| s.calls.load(Ordering::SeqCst)).sum()
}

/// Every member asks for everything at once: attributes, the listing, a name found and
/// one missing, and all five pieces.
async fn everyone_loads(members: &[Coop]) {
    let all = members.iter().map(|m| async move {
        assert_eq!(m.attr(FILE, None).await.unwrap().size, SIZE);
        assert_eq!(m.listing(DIR).await.unwrap()[0].name, "lib.so");
        assert_eq!(m.entry(DIR, "lib.so").await.unwrap().ino, FILE);
        assert_eq!(m.entry(DIR, "libc.so.6").await.unwrap_err().errno, Errno::ENOENT);
        for i in 0..5 {
            assert_eq!(m.piece(FILE, version(), i, None).await.unwrap(), piece_bytes(i), "piece {i}");
        }
    });
    futures::future::join_all(all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_members_ask_the_servers_once_per_object() {
    let keys = KeyRing::generate(KeyKind::Host);
    // Servers slow enough that the members' questions, sent together, meet in flight even
    // on a loaded machine.
    let (members, sources) = start(16, Some(keys), Duration::from_secs(5), Duration::from_millis(200)).await;
    everyone_loads(&members).await;
    // Attributes, listing and entries: asked together, answered by one flight each; pieces
    // once each (then kept). A member a little late for a flight asks again: allow one more.
    let calls = server_calls(&sources);
    assert!((9..=10).contains(&calls), "{calls} questions reached the servers for 9 objects and 16 members");
    let fell: u64 = members.iter().map(|m| m.stats().fell_back).sum();
    assert_eq!(fell, 0);
    // Pieces are kept: a second round reads no piece from the servers.
    let before = server_calls(&sources);
    for m in &members {
        for i in 0..5 {
            m.piece(FILE, version(), i, None).await.unwrap();
        }
    }
    assert_eq!(server_calls(&sources), before);
    // A version the file is not at: ESTALE, passed down as it is.
    let old = Version { size: 1, ..version() };
    assert_eq!(members[3].piece(FILE, old, 0, None).await.unwrap_err().errno, Errno::ESTALE);
    assert_eq!(members[5].attr(Ino(99), None).await.unwrap_err().errno, Errno::ENOENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_delays_the_others_by_at_most_one_wait() {
    let wait = Duration::from_millis(500);
    let (mut members, sources) = start(8, None, wait, Duration::from_millis(10)).await;
    // Kill the designated reader of the file's attributes mid-job: its listener and its
    // connections go away, as with kill -9.
    everyone_loads(&members[..2]).await;
    let dead = members[0].group().root(shoal_coop::wire::Key::Attr { ino: FILE, dir: None }.hash());
    drop(members.remove(dead));
    let mut slow = Duration::ZERO;
    for m in &members {
        let t = Instant::now();
        assert_eq!(m.attr(FILE, None).await.unwrap().size, SIZE);
        slow = slow.max(t.elapsed());
    }
    everyone_loads(&members).await;
    assert!(slow < wait + Duration::from_secs(1), "one question waited {slow:?}");
    assert!(server_calls(&sources) >= 1);
    let fell: u64 = members.iter().map(|m| m.stats().fell_back).sum();
    assert!(fell >= 1, "someone's parent was the dead member");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_member_costs_one_wait_and_is_then_left_alone() {
    let wait = Duration::from_millis(400);
    let mut addrs = free_addrs(4);
    // Member 3 accepts connections and never says a word (a stopped process).
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    addrs[3] = hung.local_addr().unwrap();
    let source = Counting::new(Duration::from_millis(10));
    let mut members = Vec::new();
    for a in &addrs[..3] {
        let group = Group::new(addrs.clone(), *a).unwrap();
        let opts = CoopOptions { wait, ..CoopOptions::default() };
        members.push(Coop::start(group, None, source.clone(), opts).await.unwrap());
    }
    // Inodes whose designated reader is the hung member are among these (the answers are
    // "no such inode" from the servers for most: answers all the same).
    assert!(
        (0..16).any(|k| members[0].group().root(shoal_coop::wire::Key::Attr { ino: Ino(k), dir: None }.hash()) == 3)
    );
    let mut slow = Duration::ZERO;
    // Within the time a failed member is left alone (`peer::SHUN_FOR`).
    for k in 0..16 {
        for m in &members {
            let t = Instant::now();
            let _ = m.attr(Ino(k), None).await;
            slow = slow.max(t.elapsed());
        }
    }
    assert!(slow < wait + Duration::from_secs(1), "one question waited {slow:?}");
    let fell: u64 = members.iter().map(|m| m.stats().fell_back).sum();
    assert!((1..=3).contains(&fell), "{fell}: each member waits for the hung one once, then leaves it alone");
    drop(hung);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_without_the_host_key_or_of_another_group_are_not_answered() {
    let addrs = free_addrs(2);
    let (good, other) = (KeyRing::generate(KeyKind::Host), KeyRing::generate(KeyKind::Host));
    let sources = [Counting::new(Duration::ZERO), Counting::new(Duration::ZERO)];
    let opts = CoopOptions { wait: Duration::from_millis(500), ..CoopOptions::default() };
    let a = Coop::start(Group::new(addrs.clone(), addrs[0]).unwrap(), Some(good), sources[0].clone(), opts);
    let b = Coop::start(Group::new(addrs.clone(), addrs[1]).unwrap(), Some(other), sources[1].clone(), opts);
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    // Whoever is not the designated reader asks the other, is refused, and asks its servers.
    for m in [&a, &b] {
        assert_eq!(m.attr(FILE, None).await.unwrap().size, SIZE);
    }
    assert_eq!(a.stats().answered + b.stats().answered, 0, "nothing answered across keys");
    assert_eq!(a.stats().fell_back + b.stats().fell_back, 1);
    assert_eq!(server_calls(&sources), 2);
}
