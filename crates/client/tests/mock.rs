//! End-to-end tests of the client against an in-memory mock of `shoald` (the real server
//! is tested with the client in crates/cli/tests). The mock speaks the real wire protocol,
//! checks that every request reaches the server placement names, and counts requests so
//! the tests can check caching and striping.

use bytes::Bytes;
use parking_lot::Mutex;
use shoal_client::*;
use shoal_placement::{object_len, resolve_layout};
use shoal_proto::frame::{Frame, FrameKind};
use shoal_proto::msg::{EntryOut, Op, Reply, Request, StatFsOut};
use shoal_proto::PROTOCOL_VERSION;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

#[derive(Default)]
struct Fs {
    inodes: HashMap<Ino, Attr>,
    entries: HashMap<Ino, BTreeMap<String, (Ino, FileKind)>>,
    links: HashMap<Ino, String>,
    objects: HashMap<(Ino, u32), Vec<u8>>,
    xattrs: HashMap<(Ino, String), Vec<u8>>,
}

struct Mock {
    map: Mutex<ClusterMap>,
    fs: Mutex<Fs>,
    /// (server, op name) → count
    counts: Mutex<HashMap<(u32, &'static str), u64>>,
    next: AtomicU64,
    /// `Write` requests wait for a read lock of this before they are counted and answered:
    /// a test holding the write lock keeps every write in flight.
    write_gate: tokio::sync::RwLock<()>,
}

fn now() -> Timestamp {
    Timestamp::now()
}

fn new_attr(ino: Ino, kind: FileKind, perm: u32, cred: &Cred) -> Attr {
    Attr {
        ino,
        kind,
        perm,
        uid: cred.uid,
        gid: cred.gid,
        size: 0,
        nlink: if kind == FileKind::Dir { 2 } else { 1 },
        atime: now(),
        mtime: now(),
        ctime: now(),
        blocks_bytes: 0,
        layout: None,
        dir_default: None,
        parent: None,
        read_mostly: false,
    }
}

impl Mock {
    fn count(&self, op: &'static str) -> u64 {
        self.counts.lock().iter().filter(|((_, o), _)| *o == op).map(|(_, n)| n).sum()
    }

    fn total(&self) -> u64 {
        self.counts.lock().values().sum()
    }

    fn ino_on(&self, me: ServerId) -> Ino {
        let map = self.map.lock();
        loop {
            let i = Ino(self.next.fetch_add(0x9E37_79B9, Ordering::Relaxed) | 2);
            if map.home_of(i) == me {
                return i;
            }
        }
    }

    fn handle(&self, me: ServerId, req: Request, data: Bytes) -> (Reply, Bytes) {
        let map = self.map.lock().clone();
        if req.map_version < map.version() {
            return (Reply::StaleMap { current: map.version() }, Bytes::new());
        }
        *self.counts.lock().entry((me.0, req.op.name())).or_default() += 1;
        match self.op(&map, me, &req.cred, req.op, data) {
            Ok(r) => r,
            Err(errno) => (Reply::error(errno, "mock"), Bytes::new()),
        }
    }

    fn op(
        &self,
        map: &ClusterMap,
        me: ServerId,
        cred: &Cred,
        op: Op,
        data: Bytes,
    ) -> std::result::Result<(Reply, Bytes), Errno> {
        let ok = |r: Reply| Ok((r, Bytes::new()));
        // Routing checks: every request must reach the server placement names.
        let route = |ino: Ino| if map.home_of(ino) == me { Ok(()) } else { Err(Errno::EXDEV) };
        let mut fs = self.fs.lock();
        match op {
            Op::Lookup { dir, name, .. } => {
                route(dir)?;
                let &(ino, kind) = fs.entries.get(&dir).ok_or(Errno::ENOENT)?.get(&name).ok_or(Errno::ENOENT)?;
                let attr = (map.home_of(ino) == me).then(|| fs.inodes[&ino].clone());
                ok(Reply::Entry(EntryOut { ino, kind, attr, cap: None, attr_lease: None }))
            }
            Op::Create { dir, name, perm, exclusive, layout } => {
                route(dir)?;
                let dir_default = fs.inodes.get(&dir).ok_or(Errno::ENOENT)?.dir_default.clone();
                if let Some(&(ino, kind)) = fs.entries[&dir].get(&name) {
                    if exclusive {
                        return Err(Errno::EEXIST);
                    }
                    if kind != FileKind::File {
                        return Err(Errno::EEXIST);
                    }
                    return ok(Reply::Attr(fs.inodes[&ino].clone()));
                }
                drop(fs);
                let ino = self.ino_on(me);
                let mut fs = self.fs.lock();
                let mut a = new_attr(ino, FileKind::File, perm, cred);
                a.layout = Some(resolve_layout(map, ino, me, layout.as_ref(), dir_default.as_ref())?);
                fs.inodes.insert(ino, a.clone());
                fs.entries.get_mut(&dir).ok_or(Errno::ENOENT)?.insert(name, (ino, FileKind::File));
                ok(Reply::Attr(a))
            }
            Op::Mkdir { dir, name, perm } => {
                route(dir)?;
                if fs.entries.get(&dir).ok_or(Errno::ENOENT)?.contains_key(&name) {
                    return Err(Errno::EEXIST);
                }
                let ino = Ino(self.next.fetch_add(0x9E37_79B9, Ordering::Relaxed) | 2);
                let mut a = new_attr(ino, FileKind::Dir, perm, cred);
                a.parent = Some(dir);
                a.dir_default = fs.inodes[&dir].dir_default.clone();
                fs.inodes.insert(ino, a.clone());
                fs.entries.insert(ino, BTreeMap::new());
                fs.entries.get_mut(&dir).ok_or(Errno::ENOENT)?.insert(name, (ino, FileKind::Dir));
                ok(Reply::Attr(a))
            }
            Op::Symlink { dir, name, target } => {
                route(dir)?;
                if fs.entries.get(&dir).ok_or(Errno::ENOENT)?.contains_key(&name) {
                    return Err(Errno::EEXIST);
                }
                drop(fs);
                let ino = self.ino_on(me);
                let mut fs = self.fs.lock();
                let mut a = new_attr(ino, FileKind::Symlink, 0o777, cred);
                a.size = target.len() as u64;
                fs.inodes.insert(ino, a.clone());
                fs.links.insert(ino, target);
                fs.entries.get_mut(&dir).ok_or(Errno::ENOENT)?.insert(name, (ino, FileKind::Symlink));
                ok(Reply::Attr(a))
            }
            Op::Link { ino, dir, name } => {
                route(dir)?;
                if fs.entries.get(&dir).ok_or(Errno::ENOENT)?.contains_key(&name) {
                    return Err(Errno::EEXIST);
                }
                let a = fs.inodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
                a.nlink += 1;
                let (kind, a) = (a.kind, a.clone());
                fs.entries.get_mut(&dir).ok_or(Errno::ENOENT)?.insert(name, (ino, kind));
                ok(Reply::Attr(a))
            }
            Op::Unlink { dir, name, .. } | Op::Rmdir { dir, name } => {
                route(dir)?;
                let &(ino, kind) = fs.entries.get(&dir).ok_or(Errno::ENOENT)?.get(&name).ok_or(Errno::ENOENT)?;
                if kind == FileKind::Dir {
                    if !fs.entries[&ino].is_empty() {
                        return Err(Errno::ENOTEMPTY);
                    }
                    fs.entries.remove(&ino);
                    fs.inodes.remove(&ino);
                } else {
                    let a = fs.inodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
                    a.nlink -= 1;
                    if a.nlink == 0 {
                        fs.inodes.remove(&ino);
                        fs.objects.retain(|(i, _), _| *i != ino);
                    }
                }
                fs.entries.get_mut(&dir).ok_or(Errno::ENOENT)?.remove(&name);
                ok(Reply::Ok)
            }
            Op::Rename { src_dir, src_name, dst_dir, dst_name, .. } => {
                route(src_dir)?;
                let e = fs.entries.get_mut(&src_dir).ok_or(Errno::ENOENT)?.remove(&src_name).ok_or(Errno::ENOENT)?;
                fs.entries.get_mut(&dst_dir).ok_or(Errno::ENOENT)?.insert(dst_name, e);
                ok(Reply::Ok)
            }
            Op::ReadDir { dir, after, limit, .. } => {
                route(dir)?;
                let names = fs.entries.get(&dir).ok_or(Errno::ENOTDIR)?;
                let mut it = names
                    .iter()
                    .filter(|(n, _)| match &after {
                        Some(a) => n.as_str() > a.as_str(),
                        None => true,
                    })
                    .map(|(n, (ino, kind))| DirEntry { name: n.clone(), ino: *ino, kind: *kind });
                let entries: Vec<DirEntry> = it.by_ref().take(limit as usize).collect();
                let more = it.next().is_some();
                ok(Reply::DirEntries { entries, more, part: None })
            }
            Op::GetAttr { ino } => {
                route(ino)?;
                ok(Reply::Attr(fs.inodes.get(&ino).ok_or(Errno::ENOENT)?.clone()))
            }
            Op::SetAttr { ino, set } => {
                route(ino)?;
                let a = fs.inodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
                if let Some(p) = set.perm {
                    a.perm = p;
                }
                if let Some(s) = set.size {
                    a.size = s;
                    let layout = a.layout.clone().ok_or(Errno::EISDIR)?;
                    for (i, _) in layout.servers.iter().enumerate() {
                        let len = object_len(&layout, i as u32, s) as usize;
                        if let Some(o) = fs.objects.get_mut(&(ino, i as u32)) {
                            o.resize(len, 0);
                        }
                    }
                }
                ok(Reply::Attr(fs.inodes[&ino].clone()))
            }
            Op::SetDirLayout { ino, spec } => {
                route(ino)?;
                fs.inodes.get_mut(&ino).ok_or(Errno::ENOENT)?.dir_default = Some(spec);
                ok(Reply::Ok)
            }
            Op::ReadLink { ino } => {
                route(ino)?;
                ok(Reply::Link(fs.links.get(&ino).ok_or(Errno::EINVAL)?.clone()))
            }
            Op::Access { ino, mask } => {
                route(ino)?;
                let a = fs.inodes.get(&ino).ok_or(Errno::ENOENT)?;
                let bits = if cred.uid == a.uid { a.perm >> 6 } else { a.perm } & 7;
                if cred.uid == 0 || bits & mask == mask {
                    ok(Reply::Ok)
                } else {
                    Err(Errno::EACCES)
                }
            }
            Op::ExtendSize { ino, size } => {
                route(ino)?;
                let a = fs.inodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
                a.size = a.size.max(size);
                ok(Reply::Ok)
            }
            Op::SetXattr { ino, name, value, .. } => {
                route(ino)?;
                fs.xattrs.insert((ino, name), value);
                ok(Reply::Ok)
            }
            Op::GetXattr { ino, name } => {
                route(ino)?;
                ok(Reply::Xattr(fs.xattrs.get(&(ino, name)).ok_or(Errno::ENODATA)?.clone()))
            }
            Op::ListXattr { ino } => {
                route(ino)?;
                ok(Reply::XattrNames(fs.xattrs.keys().filter(|(i, _)| *i == ino).map(|(_, n)| n.clone()).collect()))
            }
            Op::RemoveXattr { ino, name } => {
                route(ino)?;
                fs.xattrs.remove(&(ino, name)).ok_or(Errno::ENODATA)?;
                ok(Reply::Ok)
            }
            Op::Read { ino, index, offset, len, .. } => {
                let layout = fs.inodes.get(&ino).and_then(|a| a.layout.clone()).ok_or(Errno::ENOENT)?;
                if layout.servers.get(index as usize) != Some(&me) {
                    return Err(Errno::EXDEV);
                }
                let Some(o) = fs.objects.get(&(ino, index)) else { return Ok((Reply::Data, Bytes::new())) };
                let start = (offset as usize).min(o.len());
                let end = (offset as usize + len as usize).min(o.len());
                Ok((Reply::Data, Bytes::copy_from_slice(&o[start..end])))
            }
            Op::Write { ino, index, offset, file_end, inode_local, .. } => {
                let layout = fs.inodes.get(&ino).and_then(|a| a.layout.clone()).ok_or(Errno::ENOENT)?;
                if layout.servers.get(index as usize) != Some(&me) || inode_local != (map.home_of(ino) == me) {
                    return Err(Errno::EXDEV);
                }
                let o = fs.objects.entry((ino, index)).or_default();
                let end = offset as usize + data.len();
                if o.len() < end {
                    o.resize(end, 0);
                }
                o[offset as usize..end].copy_from_slice(&data);
                if inode_local {
                    let a = fs.inodes.get_mut(&ino).ok_or(Errno::ENOENT)?;
                    a.size = a.size.max(file_end);
                }
                ok(Reply::Written { len: data.len() as u32 })
            }
            Op::Fsync { .. } => ok(Reply::Ok),
            Op::StatFs => ok(Reply::StatFs(StatFsOut { capacity_bytes: 1000, free_bytes: 400, inodes: 7 })),
            Op::Status => ok(Reply::Status(ServerStatus { id: Some(me), ..Default::default() })),
            _ => Err(Errno::ENOSYS),
        }
    }
}

async fn serve(mock: Arc<Mock>, me: ServerId, listener: TcpListener) {
    loop {
        let Ok((sock, _)) = listener.accept().await else { return };
        let mock = mock.clone();
        tokio::spawn(async move {
            let (mut rd, wr) = sock.into_split();
            let wr = Arc::new(tokio::sync::Mutex::new(wr));
            while let Ok(Some(f)) = Frame::read_from(&mut rd).await {
                assert_eq!(f.kind, FrameKind::Request);
                let req = f.request_body().expect("request decodes");
                let (mock, wr) = (mock.clone(), wr.clone());
                tokio::spawn(async move {
                    let _gate = match req.op {
                        Op::Write { .. } => Some(mock.write_gate.read().await),
                        _ => None,
                    };
                    let (reply, data) = match req.op {
                        Op::Hello { .. } => (
                            Reply::Hello {
                                protocol_version: PROTOCOL_VERSION,
                                server: me,
                                map_version: 1,
                                features: 0,
                                auth: None,
                            },
                            Bytes::new(),
                        ),
                        _ => mock.handle(me, req, f.data.clone()),
                    };
                    let out = Frame::reply(f.request_id, &reply, data).expect("reply encodes");
                    let _ = out.write_to(&mut *wr.lock().await).await;
                });
            }
        });
    }
}

/// A mock cluster of `n` servers.
async fn cluster(n: u32) -> (Arc<Mock>, ClusterMap) {
    let mut listeners = Vec::new();
    for _ in 0..n {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let mut map = ClusterMap::local(n, 1, "/tmp".as_ref());
    // The mock proves no key: clients talk to it as under `auth = "none"`.
    map.security.auth = shoal_placement::map::AuthMode::None;
    for (s, l) in map.servers.iter_mut().zip(&listeners) {
        s.addr = l.local_addr().unwrap().to_string();
    }
    let mut fs = Fs::default();
    let mut root = new_attr(ROOT_INO, FileKind::Dir, 0o755, &Cred::root());
    root.parent = Some(ROOT_INO);
    fs.inodes.insert(ROOT_INO, root);
    fs.entries.insert(ROOT_INO, BTreeMap::new());
    let mock = Arc::new(Mock {
        map: Mutex::new(map.clone()),
        fs: Mutex::new(fs),
        counts: Mutex::new(HashMap::new()),
        next: AtomicU64::new(0x1234_5678),
        write_gate: tokio::sync::RwLock::new(()),
    });
    for (i, l) in listeners.into_iter().enumerate() {
        tokio::spawn(serve(mock.clone(), ServerId(i as u32), l));
    }
    (mock, map)
}

fn opts() -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_secs(5),
        cred: Cred { uid: 1000, gid: 1000, groups: vec![] },
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_and_lookup_storm() {
    let (mock, map) = cluster(4).await;
    let c = Client::new(map, opts());
    let d = c.mkdir_all("/a/b/c", 0o777).await.unwrap();
    assert_eq!(d.kind, FileKind::Dir);
    assert_eq!(d.perm, 0o755, "umask applied");
    assert_eq!(c.mkdir_all("shoal://a/b/c/", 0o755).await.unwrap().ino, d.ino);
    assert_eq!(c.mkdir("/a/b", 0o755).await.unwrap_err().errno, Errno::EEXIST);
    let f = c.create("/a/b/c/f", 0o644, None).await.unwrap();
    f.close().await.unwrap();
    assert_eq!(c.mkdir_all("/a/b/c/f/g", 0o755).await.unwrap_err().errno, Errno::ENOTDIR);

    // A storm of identical stats: the servers see (almost) nothing.
    let before = mock.total();
    let storm: Vec<_> = (0..200).map(|_| c.stat("/a/b/c/f")).collect();
    for r in futures::future::join_all(storm).await {
        assert_eq!(r.unwrap().kind, FileKind::File);
    }
    assert!(mock.total() - before <= 4, "{} requests for 200 cached stats", mock.total() - before);

    // Negative entries are cached too.
    // The first miss costs a lookup and a check that the cached directory still exists.
    let before = mock.total();
    for _ in 0..50 {
        assert_eq!(c.stat("/a/b/c/missing").await.unwrap_err().errno, Errno::ENOENT);
    }
    assert_eq!(mock.total() - before, 2);

    // ...and a create through this client replaces the negative entry.
    c.create("/a/b/c/missing", 0o600, None).await.unwrap().close().await.unwrap();
    assert_eq!(c.stat("/a/b/c/missing").await.unwrap().perm, 0o600);

    let names: Vec<String> = c.readdir("/a/b/c").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, vec!["f", "missing"]);
    c.rename("/a/b/c/missing", "/a/moved").await.unwrap();
    assert_eq!(c.stat("/a/b/c/missing").await.unwrap_err().errno, Errno::ENOENT);
    assert_eq!(c.stat("/a/moved").await.unwrap().kind, FileKind::File);

    c.symlink("b/c", "/a/link").await.unwrap();
    c.symlink("/a/link/f", "/top").await.unwrap();
    assert_eq!(c.readlink("/a/link").await.unwrap(), "b/c");
    assert_eq!(c.stat("/a/link/f").await.unwrap().kind, FileKind::File);
    assert_eq!(c.stat("/top").await.unwrap().kind, FileKind::File);
    assert_eq!(c.lstat("/top").await.unwrap().kind, FileKind::Symlink);
    assert_eq!(c.stat("/a/link/../c/f").await.unwrap().kind, FileKind::File, ".. after a link is the target's parent");
    c.symlink("loop2", "/loop1").await.unwrap();
    c.symlink("loop1", "/loop2").await.unwrap();
    assert_eq!(c.stat("/loop1").await.unwrap_err().errno, Errno::ELOOP);

    let h = c.link("/a/moved", "/a/hard").await.unwrap();
    assert_eq!(h.nlink, 2);
    c.unlink("/a/hard").await.unwrap();
    assert_eq!(c.stat("/a/hard").await.unwrap_err().errno, Errno::ENOENT);
    assert_eq!(c.rmdir("/a").await.unwrap_err().errno, Errno::ENOTEMPTY);
    assert_eq!(c.unlink("/").await.unwrap_err().errno, Errno::EISDIR);

    let err = c.stat("/a/nope/x").await.unwrap_err();
    assert!(err.to_string().starts_with("stat /a/nope/x: No such file or directory (server s"), "{err}");
    assert!(err.to_string().ends_with(": mock)"), "the server's message: {err}");

    c.setxattr(d.ino, "user.k", b"v", false, false).await.unwrap();
    assert_eq!(c.getxattr(d.ino, "user.k").await.unwrap(), b"v");
    assert_eq!(c.listxattr(d.ino).await.unwrap(), vec!["user.k".to_string()]);
    c.removexattr(d.ino, "user.k").await.unwrap();
    assert_eq!(c.getxattr(d.ino, "user.k").await.unwrap_err().errno, Errno::ENODATA);

    // /a, /a/b, /a/b/c, /a/b/c/f, /a/moved, /a/link
    let n = c.remove_all("/a").await.unwrap();
    assert_eq!(n, 6);
    assert_eq!(c.stat("/a").await.unwrap_err().errno, Errno::ENOENT);

    let st = c.statfs().await.unwrap();
    assert_eq!((st.capacity_bytes, st.servers_up, st.servers_total), (4000, 4, 4));
    let all = c.status_all().await;
    assert!(all.iter().all(|(id, s)| s.as_ref().unwrap().id == Some(*id)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn striped_io_and_sizes() {
    let (mock, map) = cluster(3).await;
    let c = Client::new(map, opts());
    let spec = LayoutSpec { stripe_size: Some(4096), stripe_count: Some(3), ..Default::default() };
    let f = c.create("/big", 0o644, Some(spec)).await.unwrap();
    assert_eq!(f.layout().servers.len(), 3);
    let data: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(f.write_at(0, &data).await.unwrap(), data.len());
    assert_eq!(f.attr().size, 50_000);
    // A write landing only on a non-home object is published at close.
    let home = c.home_of(f.ino());
    let remote = f.layout().servers.iter().position(|&s| s != home).unwrap() as u64;
    let off = 100 * 3 * 4096 + remote * 4096;
    f.write_at(off, b"tail").await.unwrap();
    let before = mock.count("extendsize");
    f.close().await.unwrap();
    assert_eq!(mock.count("extendsize") - before, 1);
    assert!(mock.count("fsync") >= 3);

    let g = c.open("/big", OpenFlags::read_only()).await.unwrap();
    assert_eq!(g.attr().size, off + 4);
    let back = g.read_at(0, 50_000).await.unwrap();
    assert_eq!(&back[..], &data[..]);
    // The hole between reads as zeros; reads stop at the end.
    let hole = g.read_at(60_000, 1000).await.unwrap();
    assert!(hole.iter().all(|&b| b == 0) && hole.len() == 1000);
    assert_eq!(&g.read_at(off, 100).await.unwrap()[..], b"tail");
    assert!(g.read_at(off + 4, 10).await.unwrap().is_empty());
    assert_eq!(g.write_at(0, b"x").await.unwrap_err().errno, Errno::EBADF);

    // Cursor and truncation. (Appends are placed by the inode's home server, `Op::Append`:
    // tested on real servers in crates/cli/tests/system/append.rs, not against this mock.)
    let t = c.create("/big", 0o644, None).await.unwrap();
    assert_eq!(t.attr().size, 0, "create truncates");
    t.write(b"hello ").await.unwrap();
    t.write(b"world").await.unwrap();
    t.seek(std::io::SeekFrom::Start(6)).await.unwrap();
    assert_eq!(&t.read(100).await.unwrap()[..], b"world");
    t.set_len(5).await.unwrap();
    assert_eq!(t.stat().await.unwrap().size, 5);
    t.close().await.unwrap();

    // Exclusive create, directories, permissions.
    let e = c.open("/big", OpenFlags { write: true, create: true, exclusive: true, ..Default::default() }).await;
    assert_eq!(e.unwrap_err().errno, Errno::EEXIST);
    c.mkdir("/d", 0o755).await.unwrap();
    assert_eq!(c.open("/d", OpenFlags::write_only()).await.unwrap_err().errno, Errno::EISDIR);
    c.chmod("/big", 0o400).await.unwrap();
    assert!(c.open("/big", OpenFlags::read_only()).await.is_ok());
    let other = c.with_cred(Cred { uid: 2000, gid: 2000, groups: vec![] });
    assert_eq!(other.open("/big", OpenFlags::read_only()).await.unwrap_err().errno, Errno::EACCES);
    assert_eq!(c.open("/big", OpenFlags::write_only()).await.unwrap_err().errno, Errno::EACCES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_pieces_go_out_in_parallel() {
    let (mock, map) = cluster(2).await;
    let c = Client::new(map, opts());
    let spec = LayoutSpec { stripe_size: Some(1 << 30), stripe_count: Some(1), ..Default::default() };
    let f = c.create("/huge", 0o644, Some(spec)).await.unwrap();
    let data = vec![7u8; 20 << 20];
    let before = mock.count("write");
    f.write_at(0, &data).await.unwrap();
    assert_eq!(mock.count("write") - before, 3, "20 MiB go as 8 + 8 + 4 MiB pieces");
    let back = f.read_at(0, 20 << 20).await.unwrap();
    assert_eq!(back.len(), 20 << 20);
    assert!(back.iter().all(|&b| b == 7));
    f.close().await.unwrap();
}

/// Wait (a few seconds at most) until the mock has answered `n` write requests in all.
async fn writes_reach(mock: &Mock, n: u64) {
    for _ in 0..500 {
        if mock.count("write") >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} writes answered, {n} expected", mock.count("write"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_sequential_writes_are_gathered_while_one_is_in_flight() {
    let (mock, map) = cluster(2).await;
    let c = Client::new(map, opts());
    let spec = LayoutSpec { stripe_size: Some(1 << 20), stripe_count: Some(2), ..Default::default() };
    let f = c.create("/log", 0o644, Some(spec)).await.unwrap();
    let record = |i: u64| -> Vec<u8> { (0..100u64).map(|j| ((i * 100 + j) % 251) as u8).collect() };
    let stall = mock.write_gate.write().await;
    let before = mock.count("write");
    // The first goes out at once (nothing in flight); the 999 after it are held while it is
    // in flight, in the cell of the first MiB (one object piece).
    for i in 0..1000u64 {
        f.write_at(i * 100, &record(i)).await.unwrap();
    }
    assert_eq!(f.attr().size, 100_000, "held bytes count in the size the handle knows");
    drop(stall);
    // The held bytes go out on their own (HOLD_FOR after the cell started): one request.
    writes_reach(&mock, before + 2).await;
    f.flush().await.unwrap();
    assert_eq!(mock.count("write") - before, 2, "one write, then the 999 gathered behind it");
    let back = f.read_at(0, 100_000).await.unwrap();
    assert!(back.chunks(100).enumerate().all(|(i, r)| r == &record(i as u64)[..]));

    // Held bytes are read back by the handle; a cell holding runs with a gap between them
    // sends one request per run.
    let stall = mock.write_gate.write().await;
    let before = mock.count("write");
    let base = 3 << 20; // object boundaries at every MiB
    f.write_at(base, &[1u8; 10]).await.unwrap(); // sent
    f.write_at(base + 10, &[2u8; 10]).await.unwrap(); // held: starts the cell [3 MiB, 4 MiB)
    let tail_start = base + (1 << 20) - 30;
    f.write_at(tail_start, &[3u8; 20]).await.unwrap(); // held in the same cell
    f.write_at(tail_start + 20, &[4u8; 10]).await.unwrap(); // reaches its end, but a run is before it
    drop(stall);
    assert_eq!(&f.read_at(base, 20).await.unwrap()[..], &[[1u8; 10], [2u8; 10]].concat()[..]);
    f.flush().await.unwrap();
    assert_eq!(mock.count("write") - before, 3, "10 B, then the cell's two runs of 10 and 30 B");
    assert_eq!(&f.read_at(tail_start, 30).await.unwrap()[..], &[[3u8; 20].to_vec(), vec![4u8; 10]].concat()[..]);
    f.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_records_of_two_writers_sharing_a_handle_go_out_per_object_piece() {
    // IOR-hard through a FUSE mount: two processes write 47,008-byte records of one shared
    // file in turn, each process's descriptor using the mount's one handle of the file.
    const T: u64 = 47_008;
    let (mock, map) = cluster(2).await;
    let c = Client::new(map, opts());
    let spec = LayoutSpec { stripe_size: Some(1 << 20), stripe_count: Some(2), ..Default::default() };
    let f = c.create("/shared", 0o644, Some(spec)).await.unwrap();
    let record = |k: u64| -> Vec<u8> { (0..T).map(|j| ((k * 7 + j) % 251) as u8).collect() };
    let stall = mock.write_gate.write().await;
    let before = mock.count("write");
    // A write in flight elsewhere (a whole object piece: sent at once).
    f.write_at(8 << 20, &vec![9u8; 1 << 20]).await.unwrap();
    // 50 records (2.24 MiB), the two writers' turns arriving in either order.
    let n = 50u64;
    let (a, b) = (f.clone(), f.clone());
    let even = tokio::spawn(async move {
        for k in (0..n).step_by(2) {
            a.write_at(k * T, &record(k)).await.unwrap();
            tokio::task::yield_now().await;
        }
    });
    let odd = tokio::spawn(async move {
        for k in (1..n).step_by(2) {
            b.write_at(k * T, &record(k)).await.unwrap();
            tokio::task::yield_now().await;
        }
    });
    even.await.unwrap();
    odd.await.unwrap();
    drop(stall);
    f.flush().await.unwrap();
    // The MiB piece, then one request per object piece the records reach: [0, 1 MiB),
    // [1 MiB, 2 MiB) and [2 MiB, 2.24 MiB), whatever the order they came in.
    let sent = mock.count("write") - before;
    assert_eq!(sent, 1 + 3, "{n} records of {T} bytes went in {} requests", sent - 1);
    let back = f.read_at(0, (n * T) as usize).await.unwrap();
    for k in 0..n {
        assert!(back[(k * T) as usize..((k + 1) * T) as usize] == record(k)[..], "record {k}");
    }
    f.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_said_to_be_continued_waits_for_its_continuation() {
    let (mock, map) = cluster(2).await;
    let c = Client::new(map, opts());
    let spec = LayoutSpec { stripe_size: Some(1 << 20), stripe_count: Some(2), ..Default::default() };
    let f = c.create("/cut", 0o644, Some(spec)).await.unwrap();
    let before = mock.count("write");
    // A 1 MiB write the kernel cut in two at its page limit: one request.
    let head = Bytes::from(vec![5u8; (1 << 20) - 16]);
    f.write_bytes_at_then_more(0, head).await.unwrap();
    f.write_at((1 << 20) - 16, &[6u8; 16]).await.unwrap();
    f.flush().await.unwrap();
    assert_eq!(mock.count("write") - before, 1);
    // With no continuation, it goes out on its own (within HOLD_MORE), without any call.
    let before = mock.count("write");
    f.write_bytes_at_then_more(1 << 20, Bytes::from(vec![7u8; 1000])).await.unwrap();
    writes_reach(&mock, before + 1).await;
    let back = f.read_at(0, (1 << 20) + 1000).await.unwrap();
    assert!(back[..(1 << 20) - 16].iter().all(|&b| b == 5));
    assert!(back[(1 << 20) - 16..1 << 20].iter().all(|&b| b == 6));
    assert!(back[1 << 20..].iter().all(|&b| b == 7));
    f.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_cache_is_retried_fresh() {
    let (_mock, map) = cluster(3).await;
    let a = Client::new(map.clone(), opts());
    let b = Client::new(map, opts());
    a.mkdir_all("/x/y", 0o755).await.unwrap();
    assert!(b.stat("/x/y").await.is_ok()); // b caches /x and /x/y
    a.remove_all("/x").await.unwrap();
    a.mkdir_all("/x/y", 0o755).await.unwrap(); // same names, new inodes
                                               // b's cached /x is gone on the server: b must notice and walk afresh.
    b.mkdir("/x/y/z", 0o755).await.unwrap();
    assert!(a.stat("/x/y/z").await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_map_reloads_the_config() {
    let (mock, map) = cluster(2).await;
    let dir = std::env::temp_dir().join(format!("shoal-client-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("cluster.toml");
    std::fs::write(&cfg, map.to_toml()).unwrap();
    let c = Client::from_config(&cfg, opts()).unwrap();
    c.mkdir("/m", 0o755).await.unwrap();
    let mut newer = map.clone();
    newer.cluster.version = 2;
    *mock.map.lock() = newer.clone();
    std::fs::write(&cfg, newer.to_toml()).unwrap();
    c.clear_cache();
    assert_eq!(c.stat("/m").await.unwrap().kind, FileKind::Dir);
    assert_eq!(c.map().version(), 2);
    // Without a config file the stale map is an error.
    let d = Client::new(map, opts());
    assert_eq!(d.stat("/m").await.unwrap_err().errno, Errno::ESTALE);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_servers_are_named() {
    let (_mock, mut map) = cluster(2).await;
    // Point server 1 at a port nobody listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap().to_string();
    drop(dead);
    map.servers[1].addr = addr.clone();
    let c = Client::new(map, ClientOptions { timeout: Duration::from_secs(2), ..opts() });
    let st = c.statfs().await.unwrap();
    assert_eq!((st.servers_up, st.servers_total), (1, 2));
    let e = c.server_status(ServerId(1)).await.unwrap_err();
    assert_eq!(e.errno, Errno::ENOTCONN);
    assert!(e.context.contains(&format!("server s1 ({addr}) unreachable")), "{e}");
}

#[test]
fn blocking_twins_work_without_a_runtime() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_mock, map) = rt.block_on(cluster(2));
    let c = BlockingClient::new(map, opts()).unwrap();
    c.mkdir_all("/b/c", 0o755).unwrap();
    let mut f = c.create("/b/c/file", 0o644, None).unwrap();
    use std::io::{Read, Write};
    f.write_all(b"blocking hello").unwrap();
    f.seek(std::io::SeekFrom::Start(9)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "hello");
    f.close().unwrap();
    assert_eq!(c.stat("/b/c/file").unwrap().size, 14);
    assert_eq!(c.readdir("/b/c").unwrap().len(), 1);
    assert_eq!(c.remove_all("/b").unwrap(), 3);
    drop(rt);
}
