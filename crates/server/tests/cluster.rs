//! In-process clusters of real servers on loopback ports (`shoal_testkit::inproc`), driven
//! through `shoal_rpc::Pool` the way a client drives them.

use bytes::Bytes;
use shoal_proto::frame::{Frame, FrameKind};
use shoal_proto::msg::{
    BatchOp, BatchReply, Cred, EntryOut, FileKind, LayoutSpec, Op, RenameFlags, Reply, Request, SetAttrs, BATCH_MAX,
};
use shoal_proto::{Errno, Ino, ServerId, PROTOCOL_VERSION, ROOT_INO};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use shoal_testkit::inproc::InProcCluster as Cluster;

fn alice() -> Cred {
    Cred { uid: 1000, gid: 1000, groups: vec![] }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_lookup_getattr_unlink() {
    let c = Cluster::start(2).await;
    let root = c.getattr(ROOT_INO).await;
    assert_eq!((root.kind, root.perm, root.nlink, root.parent), (FileKind::Dir, 0o755, 2, Some(ROOT_INO)));

    let e = c.create(ROOT_INO, "a").await;
    let attr = e.attr.clone().expect("a new file's inode sits with its entry");
    assert_eq!(c.home(e.ino), c.home(ROOT_INO));
    assert_eq!((attr.kind, attr.size, attr.nlink, attr.perm), (FileKind::File, 0, 1, 0o644));
    assert_eq!(attr.layout.as_ref().unwrap().servers[0], c.home(ROOT_INO));
    let l = c.lookup(ROOT_INO, "a").await.unwrap();
    assert_eq!(l.ino, e.ino);
    assert_eq!(l.attr.unwrap().ino, e.ino);

    // exclusive create of an existing name, non-exclusive returns it
    let dup = Op::Create { dir: ROOT_INO, name: "a".into(), perm: 0o644, exclusive: true, layout: None };
    assert_eq!(c.op(dup).await.unwrap_err(), Errno::EEXIST);
    let again = Op::Create { dir: ROOT_INO, name: "a".into(), perm: 0o600, exclusive: false, layout: None };
    assert!(matches!(c.op(again).await.unwrap(), Reply::Entry(EntryOut { ino, .. }) if ino == e.ino));

    // names
    assert_eq!(c.lookup(ROOT_INO, "nope").await.unwrap_err(), Errno::ENOENT);
    let long = "x".repeat(256);
    assert_eq!(c.lookup(ROOT_INO, &long).await.unwrap_err(), Errno::ENAMETOOLONG);
    assert_eq!(c.lookup(ROOT_INO, "a/b").await.unwrap_err(), Errno::EINVAL);

    // permissions: alice may not create in a 0755 root-owned directory
    let op = Op::Create { dir: ROOT_INO, name: "b".into(), perm: 0o644, exclusive: true, layout: None };
    assert_eq!(c.op_as(&alice(), op).await.unwrap_err(), Errno::EACCES);

    // readdir, symlinks
    c.op(Op::Symlink { dir: ROOT_INO, name: "s".into(), target: "a".into() }).await.unwrap();
    let s = c.lookup(ROOT_INO, "s").await.unwrap();
    assert_eq!(c.op(Op::ReadLink { ino: s.ino }).await.unwrap(), Reply::Link("a".into()));
    match c.op(Op::ReadDir { dir: ROOT_INO, after: None, limit: 10, lease: None, from: None }).await.unwrap() {
        Reply::DirEntries { entries, more, .. } => {
            // Listing order is by name hash (docs/protocol.md, "Listing order").
            let mut names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
            names.sort_unstable();
            assert_eq!(names, ["a", "s"]);
            assert!(!more);
        }
        other => panic!("{other:?}"),
    }

    // xattrs
    let set = Op::SetXattr {
        ino: e.ino,
        name: "user.k".into(),
        value: b"v".to_vec(),
        create_only: true,
        replace_only: false,
    };
    c.op(set.clone()).await.unwrap();
    assert_eq!(c.op(set).await.unwrap_err(), Errno::EEXIST);
    assert_eq!(c.op(Op::GetXattr { ino: e.ino, name: "user.k".into() }).await.unwrap(), Reply::Xattr(b"v".to_vec()));
    assert_eq!(c.op(Op::ListXattr { ino: e.ino }).await.unwrap(), Reply::XattrNames(vec!["user.k".into()]));
    assert_eq!(c.op(Op::GetXattr { ino: e.ino, name: "user.x".into() }).await.unwrap_err(), Errno::ENODATA);

    // unlink
    c.op(Op::Unlink { dir: ROOT_INO, name: "a".into(), keep: None }).await.unwrap();
    assert_eq!(c.lookup(ROOT_INO, "a").await.unwrap_err(), Errno::ENOENT);
    assert_eq!(c.op(Op::GetAttr { ino: e.ino }).await.unwrap_err(), Errno::ENOENT);
    assert_eq!(c.op(Op::Unlink { dir: ROOT_INO, name: "a".into(), keep: None }).await.unwrap_err(), Errno::ENOENT);

    let st = c.status(c.home(ROOT_INO)).await;
    assert!(st.counters.client_requests > 10);
    assert!(st.counters.ops.iter().any(|(n, k)| n == "create" && *k >= 4));
    assert!(st.counters.errors > 0);
}

/// A batch runs each operation as it would run alone, reports each result in order (one
/// failing does not stop the others), counts as one request, and is bounded in size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_run_every_operation_and_answer_each() {
    let c = Cluster::start(1).await;
    let home = c.home(ROOT_INO);
    let before = c.status(home).await.counters;
    let create = |name: &str, exclusive| BatchOp::Create {
        dir: ROOT_INO,
        name: name.into(),
        perm: 0o644,
        exclusive,
        layout: None,
    };
    let ops = vec![
        create("a", true),
        create("a", true),
        BatchOp::Lookup { dir: ROOT_INO, name: "a".into() },
        BatchOp::Lookup { dir: ROOT_INO, name: "nope".into() },
        BatchOp::Mkdir { dir: ROOT_INO, name: "d".into(), perm: 0o755 },
        BatchOp::Symlink { dir: ROOT_INO, name: "s".into(), target: "a".into() },
        BatchOp::Unlink { dir: ROOT_INO, name: "s".into() },
        BatchOp::Rmdir { dir: ROOT_INO, name: "d".into() },
        BatchOp::GetAttr { ino: ROOT_INO },
        BatchOp::Lookup { dir: ROOT_INO, name: "a/b".into() },
    ];
    let replies = match c.op(Op::Batch { ops }).await.unwrap() {
        Reply::Batch(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(replies.len(), 10);
    let a = match &replies[0] {
        BatchReply::Entry(e) => e.ino,
        other => panic!("{other:?}"),
    };
    assert!(matches!(&replies[1], BatchReply::Error { errno: Errno::EEXIST, .. }), "{:?}", replies[1]);
    assert!(matches!(&replies[2], BatchReply::Entry(e) if e.ino == a), "{:?}", replies[2]);
    assert!(matches!(&replies[3], BatchReply::Error { errno: Errno::ENOENT, .. }), "{:?}", replies[3]);
    assert!(matches!(&replies[4], BatchReply::Entry(e) if e.kind == FileKind::Dir), "{:?}", replies[4]);
    assert!(matches!(&replies[5], BatchReply::Entry(e) if e.kind == FileKind::Symlink), "{:?}", replies[5]);
    assert_eq!(replies[6], BatchReply::Ok);
    assert_eq!(replies[7], BatchReply::Ok);
    assert!(matches!(&replies[8], BatchReply::Attr(r) if r.ino == ROOT_INO), "{:?}", replies[8]);
    assert!(matches!(&replies[9], BatchReply::Error { errno: Errno::EINVAL, .. }), "{:?}", replies[9]);
    // One request; each operation counted under its own name.
    let after = c.status(home).await.counters;
    let count =
        |cs: &shoal_proto::msg::Counters, n: &str| cs.ops.iter().find(|(k, _)| k == n).map(|(_, v)| *v).unwrap_or(0);
    assert_eq!(after.client_requests - before.client_requests, 2, "the batch and the status request");
    assert_eq!(count(&after, "batch") - count(&before, "batch"), 1);
    assert_eq!(count(&after, "create") - count(&before, "create"), 2);
    assert_eq!(count(&after, "lookup") - count(&before, "lookup"), 3);

    // What it did stays done.
    assert_eq!(c.lookup(ROOT_INO, "a").await.unwrap().ino, a);
    assert_eq!(c.lookup(ROOT_INO, "s").await.unwrap_err(), Errno::ENOENT);
    assert_eq!(c.lookup(ROOT_INO, "d").await.unwrap_err(), Errno::ENOENT);

    // Permissions apply to each operation: alice may look but not create in root's 0755 root.
    let as_alice = vec![create("b", true), BatchOp::Lookup { dir: ROOT_INO, name: "a".into() }];
    match c.op_as(&alice(), Op::Batch { ops: as_alice }).await.unwrap() {
        Reply::Batch(r) => {
            assert!(matches!(&r[0], BatchReply::Error { errno: Errno::EACCES, .. }), "{:?}", r[0]);
            assert!(matches!(&r[1], BatchReply::Entry(_)), "{:?}", r[1]);
        }
        other => panic!("{other:?}"),
    }

    // Bounded: one operation more than BATCH_MAX is refused whole; BATCH_MAX is fine.
    let many = |n: usize| Op::Batch { ops: (0..n).map(|_| BatchOp::GetAttr { ino: ROOT_INO }).collect() };
    assert_eq!(c.op(many(BATCH_MAX + 1)).await.unwrap_err(), Errno::EINVAL);
    assert!(matches!(c.op(many(BATCH_MAX)).await.unwrap(), Reply::Batch(r) if r.len() == BATCH_MAX));
    assert!(matches!(c.op(many(0)).await.unwrap(), Reply::Batch(r) if r.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mkdir_across_servers_and_rmdir() {
    let c = Cluster::start(2).await;
    let d = c.mkdir_homed("d", true).await;
    assert_ne!(c.home(d), c.home(ROOT_INO));
    let a = c.getattr(d).await;
    assert_eq!((a.kind, a.nlink, a.parent), (FileKind::Dir, 2, Some(ROOT_INO)));
    let root = c.getattr(ROOT_INO).await;
    let subdirs =
        match c.op(Op::ReadDir { dir: ROOT_INO, after: None, limit: 0, lease: None, from: None }).await.unwrap() {
            Reply::DirEntries { entries, .. } => entries.len() as u32,
            other => panic!("{other:?}"),
        };
    assert_eq!(root.nlink, 2 + subdirs);
    assert_eq!(c.mkdir(ROOT_INO, "d0").await.unwrap_err(), Errno::EEXIST);

    // A file in the remote directory makes rmdir fail with ENOTEMPTY.
    let dname = find_name(&c, ROOT_INO, d).await;
    c.create(d, "f").await;
    assert_eq!(c.op(Op::Rmdir { dir: ROOT_INO, name: dname.clone() }).await.unwrap_err(), Errno::ENOTEMPTY);
    assert_eq!(c.op(Op::Unlink { dir: ROOT_INO, name: dname.clone(), keep: None }).await.unwrap_err(), Errno::EISDIR);
    c.op(Op::Unlink { dir: d, name: "f".into(), keep: None }).await.unwrap();
    c.op(Op::Rmdir { dir: ROOT_INO, name: dname.clone() }).await.unwrap();
    assert_eq!(c.lookup(ROOT_INO, &dname).await.unwrap_err(), Errno::ENOENT);
    assert_eq!(c.op(Op::GetAttr { ino: d }).await.unwrap_err(), Errno::ENOENT);
    assert_eq!(c.getattr(ROOT_INO).await.nlink, root.nlink - 1);
    // creating in the removed directory fails
    let op = Op::Create { dir: d, name: "g".into(), perm: 0o644, exclusive: true, layout: None };
    assert_eq!(c.op(op).await.unwrap_err(), Errno::ENOENT);
    for s in 0..2 {
        assert_eq!(c.status(ServerId(s)).await.pending_intents, 0);
    }
}

async fn find_name(c: &Cluster, dir: Ino, ino: Ino) -> String {
    match c.op(Op::ReadDir { dir, after: None, limit: 0, lease: None, from: None }).await.unwrap() {
        Reply::DirEntries { entries, .. } => entries.into_iter().find(|e| e.ino == ino).unwrap().name,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_across_servers() {
    let c = Cluster::start(2).await;
    let remote = c.mkdir_homed("r", true).await;
    let local = c.mkdir_homed("l", false).await;

    // A file moves from the root to a directory on the other server: the inode stays home.
    let f = c.create(ROOT_INO, "f").await;
    let op = Op::Rename {
        src_dir: ROOT_INO,
        src_name: "f".into(),
        dst_dir: remote,
        dst_name: "g".into(),
        flags: RenameFlags::default(),
        keep: None,
    };
    c.op(op).await.unwrap();
    assert_eq!(c.lookup(ROOT_INO, "f").await.unwrap_err(), Errno::ENOENT);
    let g = c.lookup(remote, "g").await.unwrap();
    assert_eq!(g.ino, f.ino);
    assert!(g.attr.is_none(), "the inode is on another server than the entry");
    assert_eq!(c.getattr(f.ino).await.nlink, 1);

    // Rename onto an existing file on the other side replaces it (its inode goes).
    let h = c.create(ROOT_INO, "h").await;
    let op = Op::Rename {
        src_dir: ROOT_INO,
        src_name: "h".into(),
        dst_dir: remote,
        dst_name: "g".into(),
        flags: RenameFlags::default(),
        keep: None,
    };
    c.op(op).await.unwrap();
    assert_eq!(c.lookup(remote, "g").await.unwrap().ino, h.ino);
    assert_eq!(c.op(Op::GetAttr { ino: f.ino }).await.unwrap_err(), Errno::ENOENT);

    // noreplace
    c.create(ROOT_INO, "i").await;
    let flags = RenameFlags { noreplace: true, exchange: false };
    let op = Op::Rename {
        src_dir: ROOT_INO,
        src_name: "i".into(),
        dst_dir: remote,
        dst_name: "g".into(),
        flags,
        keep: None,
    };
    assert_eq!(c.op(op).await.unwrap_err(), Errno::EEXIST);
    let flags = RenameFlags { noreplace: false, exchange: true };
    let op = Op::Rename {
        src_dir: ROOT_INO,
        src_name: "i".into(),
        dst_dir: remote,
        dst_name: "g".into(),
        flags,
        keep: None,
    };
    assert_eq!(c.op(op).await.unwrap_err(), Errno::EXDEV);

    // A directory moves across servers: parent pointer and link counts follow.
    let root_nlink = c.getattr(ROOT_INO).await.nlink;
    let lname = find_name(&c, ROOT_INO, local).await;
    let op = Op::Rename {
        src_dir: ROOT_INO,
        src_name: lname.clone(),
        dst_dir: remote,
        dst_name: "moved".into(),
        flags: RenameFlags::default(),
        keep: None,
    };
    c.op(op).await.unwrap();
    assert_eq!(c.getattr(local).await.parent, Some(remote));
    assert_eq!(c.getattr(ROOT_INO).await.nlink, root_nlink - 1);
    assert_eq!(c.getattr(remote).await.nlink, 3);

    // A directory cannot move into its own subtree.
    let rname = find_name(&c, ROOT_INO, remote).await;
    let op = Op::Rename {
        src_dir: ROOT_INO,
        src_name: rname.clone(),
        dst_dir: local,
        dst_name: "loop".into(),
        flags: RenameFlags::default(),
        keep: None,
    };
    assert_eq!(c.op(op).await.unwrap_err(), Errno::EINVAL);

    // Same-server rename within the root; and a no-op rename.
    let op = Op::Rename {
        src_dir: ROOT_INO,
        src_name: "i".into(),
        dst_dir: ROOT_INO,
        dst_name: "j".into(),
        flags: RenameFlags::default(),
        keep: None,
    };
    c.op(op).await.unwrap();
    assert!(c.lookup(ROOT_INO, "j").await.is_ok());
    let op = Op::Rename {
        src_dir: ROOT_INO,
        src_name: "j".into(),
        dst_dir: ROOT_INO,
        dst_name: "j".into(),
        flags: RenameFlags::default(),
        keep: None,
    };
    c.op(op).await.unwrap();

    // A hard link into the remote directory and an unlink of a name whose inode is elsewhere.
    let j = c.lookup(ROOT_INO, "j").await.unwrap();
    match c.op(Op::Link { ino: j.ino, dir: remote, name: "j2".into() }).await.unwrap() {
        Reply::Entry(e) => assert_eq!(e.attr.unwrap().nlink, 2),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.getattr(j.ino).await.nlink, 2);
    c.op(Op::Unlink { dir: remote, name: "j2".into(), keep: None }).await.unwrap();
    assert_eq!(c.getattr(j.ino).await.nlink, 1);
    assert_eq!(c.op(Op::Link { ino: local, dir: remote, name: "x".into() }).await.unwrap_err(), Errno::EPERM);

    // Replacing a non-empty remote directory fails, an empty one goes.
    let e1 = c.mkdir(remote, "e1").await.unwrap();
    let e2 = c.mkdir(remote, "e2").await.unwrap();
    c.create(e2.ino, "inside").await;
    let op = Op::Rename {
        src_dir: remote,
        src_name: "e1".into(),
        dst_dir: remote,
        dst_name: "e2".into(),
        flags: RenameFlags::default(),
        keep: None,
    };
    assert_eq!(c.op(op).await.unwrap_err(), Errno::ENOTEMPTY);
    let op = Op::Rename {
        src_dir: remote,
        src_name: "e2".into(),
        dst_dir: remote,
        dst_name: "e1".into(),
        flags: RenameFlags::default(),
        keep: None,
    };
    c.op(op).await.unwrap();
    assert_eq!(c.lookup(remote, "e1").await.unwrap().ino, e2.ino);
    assert_eq!(c.op(Op::GetAttr { ino: e1.ino }).await.unwrap_err(), Errno::ENOENT);
    for s in 0..2 {
        assert_eq!(c.status(ServerId(s)).await.pending_intents, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_read_truncate_objects() {
    let c = Cluster::start(2).await;
    let spec = LayoutSpec { stripe_size: Some(4096), stripe_count: Some(2), ..Default::default() };
    let op = Op::Create { dir: ROOT_INO, name: "f".into(), perm: 0o644, exclusive: true, layout: Some(spec) };
    let e = match c.op(op).await.unwrap() {
        Reply::Entry(e) => e,
        other => panic!("{other:?}"),
    };
    let layout = e.attr.unwrap().layout.unwrap();
    assert_eq!(layout.servers.len(), 2);
    assert_eq!(layout.servers[0], c.home(e.ino));
    // object 0 on the inode's home (raises the size), object 1 elsewhere (then ExtendSize)
    let w0 =
        Op::Write { ino: e.ino, index: 0, offset: 0, file_end: 4096, inode_local: true, cap: e.cap.clone(), copies: 1 };
    let data0 = Bytes::from(vec![7u8; 4096]);
    let (r, _) = c.call_as(layout.servers[0], &Cred::root(), w0, data0.clone()).await.unwrap();
    assert_eq!(r, Reply::Written { len: 4096 });
    assert_eq!(c.getattr(e.ino).await.size, 4096);
    let w1 = Op::Write {
        ino: e.ino,
        index: 1,
        offset: 10,
        file_end: 4096 + 15,
        inode_local: false,
        cap: e.cap.clone(),
        copies: 1,
    };
    c.call_as(layout.servers[1], &Cred::root(), w1, Bytes::from_static(b"hello")).await.unwrap();
    c.op(Op::ExtendSize { ino: e.ino, size: 4096 + 15 }).await.unwrap();
    assert_eq!(c.getattr(e.ino).await.size, 4111);
    let read = |server: ServerId, index: u32, offset: u64, len: u32| {
        let (c, cap) = (&c, e.cap.clone());
        async move {
            let op = Op::Read { ino: e.ino, index, offset, len, cap };
            c.call_as(server, &Cred::root(), op, Bytes::new()).await.unwrap()
        }
    };
    let (r, d) = read(layout.servers[1], 1, 0, 100).await;
    assert_eq!(r, Reply::Data);
    assert_eq!(&d[..], b"\0\0\0\0\0\0\0\0\0\0hello");
    let (_, d) = read(layout.servers[0], 0, 4000, 1000).await;
    assert_eq!(d.len(), 96);
    // fsync on both servers
    for s in &layout.servers {
        c.call_as(
            *s,
            &Cred::root(),
            Op::Fsync { ino: e.ino, data_only: true, cap: e.cap.clone(), closing: false },
            Bytes::new(),
        )
        .await
        .unwrap();
    }
    // Truncate to 4096 + 12 cuts object 1 to 12 bytes.
    c.op(Op::SetAttr { ino: e.ino, set: SetAttrs { size: Some(4108), ..Default::default() } }).await.unwrap();
    let (_, d) = read(layout.servers[1], 1, 0, 100).await;
    assert_eq!(&d[..], b"\0\0\0\0\0\0\0\0\0\0he");
    // Unlinking deletes the objects everywhere (in the background).
    c.op(Op::Unlink { dir: ROOT_INO, name: "f".into(), keep: None }).await.unwrap();
    for _ in 0..100 {
        let (_, d0) = read(layout.servers[0], 0, 0, 10).await;
        let (_, d1) = read(layout.servers[1], 1, 0, 10).await;
        if d0.is_empty() && d1.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("objects not deleted");
}

/// A raw connection that says `Hello` as root's tools do, proving the host key.
async fn raw_host_hello(c: &Cluster, addr: &str) -> TcpStream {
    use shoal_proto::auth::{HelloAuth, Role};
    let ring = shoal_auth::KeyRing::load(&c.map.security.host_key, shoal_auth::KeyKind::Host).unwrap();
    let nonce = shoal_rpc::auth::nonce();
    let claim = HelloAuth { role: Role::Host, nonce: nonce.clone(), epoch: ring.current().0 };
    let mut op = shoal_proto::hello::hello_op("raw host", 0);
    if let Op::Hello { auth, .. } = &mut op {
        *auth = Some(claim);
    }
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    Frame::request(1, &Request { cred: Cred::root(), map_version: 0, op }, Bytes::new()).unwrap().encode_into(&mut buf);
    s.write_all(&buf).await.unwrap();
    let f = Frame::read_from(&mut s).await.unwrap().unwrap();
    let Reply::Hello { server, auth: Some(proof), .. } = f.reply_body().unwrap() else { panic!("no proof in Hello") };
    let t = shoal_rpc::auth::Transcript {
        server,
        role: Role::Host,
        connector_nonce: &nonce,
        server_nonce: &proof.nonce,
        epoch: proof.epoch,
    };
    let key = ring.get(proof.epoch).unwrap();
    assert!(t.verify_server(key, &proof.proof), "the server proves the host key");
    let op = Op::Authenticate { epoch: proof.epoch, proof: Some(t.connector_tag(key).to_vec()), credential: None };
    let mut buf = Vec::new();
    Frame::request(0, &Request { cred: Cred::root(), map_version: 0, op }, Bytes::new()).unwrap().encode_into(&mut buf);
    s.write_all(&buf).await.unwrap();
    let f = Frame::read_from(&mut s).await.unwrap().unwrap();
    assert_eq!(f.reply_body().unwrap(), Reply::Ok, "authenticated");
    s
}

async fn raw_hello(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let hello = Request { cred: Cred::root(), map_version: 0, op: shoal_proto::hello::hello_op("raw", 0) };
    let mut buf = Vec::new();
    Frame::request(1, &hello, Bytes::new()).unwrap().encode_into(&mut buf);
    s.write_all(&buf).await.unwrap();
    let f = Frame::read_from(&mut s).await.unwrap().unwrap();
    assert_eq!(f.kind, FrameKind::Reply);
    assert!(matches!(f.reply_body().unwrap(), Reply::Hello { protocol_version: PROTOCOL_VERSION, .. }));
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_close_only_their_connection() {
    let c = Cluster::start(1).await;
    let addr = c.map.servers[0].addr.clone();
    // A working client connection before, during and after.
    c.getattr(ROOT_INO).await;

    // Garbage after the handshake.
    let mut s = raw_hello(&addr).await;
    let junk: Vec<u8> = (0..200u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    s.write_all(&junk).await.unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await.expect("server closes");
    assert!(n.is_err() || rest.is_empty());

    // Garbage instead of a handshake.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&junk).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await.expect("server closes");

    // A reply frame from a client.
    let mut s = raw_hello(&addr).await;
    let mut buf = Vec::new();
    Frame::reply(5, &Reply::Ok, Bytes::new()).unwrap().encode_into(&mut buf);
    s.write_all(&buf).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await.expect("server closes");

    // A request with a wrong map version gets StaleMap, and the connection stays usable
    // (a connection that proved the host key: one that proved nothing gets only EACCES).
    let mut s = raw_host_hello(&c, &addr).await;
    for (id, version) in [(2u64, 99u64), (3, 0)] {
        let req = Request { cred: Cred::root(), map_version: version, op: Op::GetAttr { ino: ROOT_INO } };
        let mut buf = Vec::new();
        Frame::request(id, &req, Bytes::new()).unwrap().encode_into(&mut buf);
        s.write_all(&buf).await.unwrap();
        let f = Frame::read_from(&mut s).await.unwrap().unwrap();
        assert_eq!(f.request_id, id);
        match (version, f.reply_body().unwrap()) {
            (99, Reply::StaleMap { current }) => assert_eq!(current, 1),
            (0, Reply::Attr(a)) => assert_eq!(a.ino, ROOT_INO),
            (_, other) => panic!("{other:?}"),
        }
    }

    // A range of protocol versions that does not meet ours is refused.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    let hello = Request {
        cred: Cred::root(),
        map_version: 0,
        op: Op::Hello { client: "new".into(), session: 0, min_version: 999, max_version: 999, features: 0, auth: None },
    };
    let mut buf = Vec::new();
    Frame::request(1, &hello, Bytes::new()).unwrap().encode_into(&mut buf);
    s.write_all(&buf).await.unwrap();
    let f = Frame::read_from(&mut s).await.unwrap().unwrap();
    assert!(matches!(f.reply_body().unwrap(), Reply::Error { errno: Errno::EPROTO, .. }));

    // The server still serves.
    assert_eq!(c.getattr(ROOT_INO).await.ino, ROOT_INO);
    c.create(ROOT_INO, "still-works").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_data_and_recovery_rolls_back_unfinished_mkdir() {
    let mut c = Cluster::start(2).await;
    let root_home = c.home(ROOT_INO);
    let other = ServerId(1 - root_home.0);
    let f = c.create(ROOT_INO, "kept").await;
    c.call_as(
        root_home,
        &Cred::root(),
        Op::Write { ino: f.ino, index: 0, offset: 0, file_end: 3, inode_local: true, cap: f.cap.clone(), copies: 1 },
        Bytes::from_static(b"abc"),
    )
    .await
    .unwrap();

    // With the other server down, a mkdir whose directory object would live there fails
    // with EIO and leaves an intent.
    c.stop(other.0).await;
    let mut failed = None;
    for i in 0..200 {
        match c.mkdir(ROOT_INO, &format!("m{i}")).await {
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e, Errno::EIO);
                failed = Some(format!("m{i}"));
                break;
            }
        }
    }
    let failed = failed.expect("some directory is homed on the stopped server");
    assert_eq!(c.lookup(ROOT_INO, &failed).await.unwrap_err(), Errno::ENOENT);
    assert_eq!(c.status(root_home).await.pending_intents, 1);

    // Restart both; the intent is resolved by the recovery loop, the data is still there.
    c.stop(root_home.0).await;
    c.restart(root_home.0).await;
    c.restart(other.0).await;
    let mut left = u64::MAX;
    for _ in 0..100 {
        left = c.status(root_home).await.pending_intents;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(left, 0);
    assert_eq!(c.getattr(f.ino).await.size, 3);
    let (_, d) = c
        .call_as(
            root_home,
            &Cred::root(),
            Op::Read { ino: f.ino, index: 0, offset: 0, len: 10, cap: f.cap.clone() },
            Bytes::new(),
        )
        .await
        .unwrap();
    assert_eq!(&d[..], b"abc");
    // the name is free again
    c.mkdir(ROOT_INO, &failed).await.unwrap();
    let _ = c.dir.path();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_replaces_directories_homed_elsewhere() {
    let c = Cluster::start(2).await;
    let a = c.home(ROOT_INO);
    let b = ServerId(1 - a.0);
    let root = Cred::root();

    // Same-server rename in the root onto an empty directory whose object lives on b.
    let (sname, sino) = c.mkdir_on(ROOT_INO, "s", a).await;
    let (tname, tino) = c.mkdir_on(ROOT_INO, "t", b).await;
    let nlink = c.getattr(ROOT_INO).await.nlink;
    c.rename(&root, ROOT_INO, &sname, ROOT_INO, &tname).await.unwrap();
    assert_eq!(c.lookup(ROOT_INO, &tname).await.unwrap().ino, sino);
    assert_eq!(c.lookup(ROOT_INO, &sname).await.unwrap_err(), Errno::ENOENT);
    assert_eq!(c.op(Op::GetAttr { ino: tino }).await.unwrap_err(), Errno::ENOENT);
    assert_eq!(c.getattr(ROOT_INO).await.nlink, nlink - 1);

    // ... and onto a non-empty one: ENOTEMPTY, nothing changes, nothing stays pinned.
    let (uname, uino) = c.mkdir_on(ROOT_INO, "u", b).await;
    c.create(uino, "inside").await;
    assert_eq!(c.rename(&root, ROOT_INO, &tname, ROOT_INO, &uname).await.unwrap_err(), Errno::ENOTEMPTY);
    assert_eq!(c.lookup(ROOT_INO, &uname).await.unwrap().ino, uino);
    assert_eq!(c.lookup(ROOT_INO, &tname).await.unwrap().ino, sino);
    let t0 = std::time::Instant::now();
    c.op(Op::Unlink { dir: uino, name: "inside".into(), keep: None }).await.unwrap();
    c.op(Op::Rmdir { dir: ROOT_INO, name: uname.clone() }).await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5), "names were left pinned");

    // Cross-server: a directory from the root into d (homed on b), replacing an empty
    // directory of d whose object lives on a.
    let (dname, d) = c.mkdir_on(ROOT_INO, "d", b).await;
    let _ = dname;
    let (vname, vino) = c.mkdir_on(d, "v", a).await;
    let (wname, wino) = c.mkdir_on(ROOT_INO, "w", a).await;
    c.rename(&root, ROOT_INO, &wname, d, &vname).await.unwrap();
    assert_eq!(c.lookup(d, &vname).await.unwrap().ino, wino);
    assert_eq!(c.op(Op::GetAttr { ino: vino }).await.unwrap_err(), Errno::ENOENT);
    assert_eq!(c.getattr(wino).await.parent, Some(d));
    c.no_pending_intents().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sticky_directories_and_ownership() {
    let c = Cluster::start(2).await;
    let a = c.home(ROOT_INO);
    let b = ServerId(1 - a.0);
    let root = Cred::root();
    let alice = alice();
    let bob = Cred { uid: 1001, gid: 1001, groups: vec![] };
    let (tmp_name, tmp) = c.mkdir_on(ROOT_INO, "tmp", b).await;
    let _ = tmp_name;
    let (_, public) = c.mkdir_on(ROOT_INO, "pub", a).await;
    for (dir, perm) in [(tmp, 0o1777), (public, 0o777)] {
        c.op(Op::SetAttr { ino: dir, set: SetAttrs { perm: Some(perm), ..Default::default() } }).await.unwrap();
    }
    // alice's file in the sticky directory, its inode on the same server
    let op = Op::Create { dir: tmp, name: "mine".into(), perm: 0o644, exclusive: true, layout: None };
    c.op_as(&alice, op).await.unwrap();
    assert_eq!(
        c.op_as(&bob, Op::Unlink { dir: tmp, name: "mine".into(), keep: None }).await.unwrap_err(),
        Errno::EPERM
    );
    // alice's file whose inode lives on the other server (moved in by rename)
    let op = Op::Create { dir: public, name: "far".into(), perm: 0o644, exclusive: true, layout: None };
    c.op_as(&alice, op).await.unwrap();
    c.rename(&alice, public, "far", tmp, "far").await.unwrap();
    assert_eq!(c.op_as(&bob, Op::Unlink { dir: tmp, name: "far".into(), keep: None }).await.unwrap_err(), Errno::EPERM);
    assert_eq!(c.rename(&bob, tmp, "far", tmp, "stolen").await.unwrap_err(), Errno::EPERM);
    c.op_as(&alice, Op::Unlink { dir: tmp, name: "far".into(), keep: None }).await.unwrap();
    c.op_as(&root, Op::Unlink { dir: tmp, name: "mine".into(), keep: None }).await.unwrap();

    // chmod/chown rules through the server
    let f = match c
        .op_as(&alice, Op::Create { dir: public, name: "f".into(), perm: 0o600, exclusive: true, layout: None })
        .await
        .unwrap()
    {
        Reply::Entry(e) => e.ino,
        other => panic!("{other:?}"),
    };
    let chmod = |perm| Op::SetAttr { ino: f, set: SetAttrs { perm: Some(perm), ..Default::default() } };
    assert_eq!(c.op_as(&bob, chmod(0o777)).await.unwrap_err(), Errno::EPERM);
    c.op_as(&alice, chmod(0o640)).await.unwrap();
    let chown = Op::SetAttr { ino: f, set: SetAttrs { uid: Some(1001), ..Default::default() } };
    assert_eq!(c.op_as(&alice, chown.clone()).await.unwrap_err(), Errno::EPERM);
    c.op_as(&root, chown).await.unwrap();
    assert_eq!(c.getattr(f).await.uid, 1001);
    // alice is left with the group's read permission only
    c.op_as(&alice, Op::Access { ino: f, mask: 4 }).await.unwrap();
    assert_eq!(c.op_as(&alice, Op::Access { ino: f, mask: 2 }).await.unwrap_err(), Errno::EACCES);
    c.op_as(&bob, Op::Access { ino: f, mask: 6 }).await.unwrap();
    c.no_pending_intents().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_namespace_changes_stay_consistent() {
    let c = std::sync::Arc::new(Cluster::start(3).await);
    let mut dirs = Vec::new();
    for s in 0..3 {
        dirs.push(c.mkdir_on(ROOT_INO, &format!("c{s}_"), ServerId(s)).await.1);
    }
    let mut tasks = Vec::new();
    for t in 0..6u32 {
        let (c, dirs) = (c.clone(), dirs.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..25u32 {
                let from = dirs[(t + i) as usize % 3];
                let to = dirs[(t + i + 1) as usize % 3];
                let name = format!("t{t}_{i}");
                c.create(from, &name).await;
                c.rename(&Cred::root(), from, &name, to, &name).await.unwrap();
                if i % 2 == 0 {
                    c.op(Op::Unlink { dir: to, name: name.clone(), keep: None }).await.unwrap();
                }
                // everyone also fights over one shared name
                let shared =
                    Op::Create { dir: dirs[0], name: "shared".into(), perm: 0o644, exclusive: false, layout: None };
                c.op(shared).await.unwrap();
                let _ = c.rename(&Cred::root(), dirs[0], "shared", dirs[1], "shared").await;
                let _ = c.rename(&Cred::root(), dirs[1], "shared", dirs[0], "shared").await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut names = 0;
    for &d in &dirs {
        if let Reply::DirEntries { entries, .. } =
            c.op(Op::ReadDir { dir: d, after: None, limit: 0, lease: None, from: None }).await.unwrap()
        {
            for e in &entries {
                // every entry names a live inode
                assert_eq!(c.getattr(e.ino).await.nlink, 1, "{} in {d}", e.name);
            }
            names += entries.iter().filter(|e| e.name != "shared").count();
        }
    }
    assert_eq!(names, 6 * 12);
    c.no_pending_intents().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_renames_and_unlinks_are_rolled_forward() {
    let mut c = Cluster::start(2).await;
    let a = c.home(ROOT_INO);
    let b = ServerId(1 - a.0);
    let (_, d) = c.mkdir_on(ROOT_INO, "d", b).await;
    let f = c.create(ROOT_INO, "f").await;
    let g = c.create(ROOT_INO, "g").await;
    c.rename(&Cred::root(), ROOT_INO, "g", d, "g").await.unwrap();

    c.stop(b.0).await;
    // The destination's server is down: the outcome is unknown (EIO), the source stays
    // pinned until recovery finishes the rename. A lookup of the source waits meanwhile (the
    // destination entry may exist already): it answers neither "present" nor "absent".
    assert_eq!(c.rename(&Cred::root(), ROOT_INO, "f", d, "moved").await.unwrap_err(), Errno::EIO);
    assert!(tokio::time::timeout(Duration::from_secs(1), c.lookup(ROOT_INO, "f")).await.is_err());
    // Other names of the directory answer at once.
    assert_eq!(c.lookup(ROOT_INO, "g").await, Err(Errno::ENOENT));
    assert_eq!(c.status(a).await.pending_intents, 1);
    c.restart(b.0).await;
    let mut done = false;
    for _ in 0..100 {
        match c.lookup(ROOT_INO, "f").await {
            Err(Errno::ENOENT) => {
                done = true;
                break;
            }
            // Waited for the whole pin wait (recovery runs every few seconds).
            Err(Errno::EBUSY) => {}
            other => panic!("the source of an unfinished rename showed as {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(done, "rename not rolled forward");
    assert_eq!(c.lookup(d, "moved").await.unwrap().ino, f.ino);

    // Unlinking a name whose inode's home is down succeeds; the link count drops later.
    c.stop(a.0).await;
    c.op(Op::Unlink { dir: d, name: "g".into(), keep: None }).await.unwrap();
    assert_eq!(c.status(b).await.pending_intents, 1);
    c.restart(a.0).await;
    let mut gone = false;
    for _ in 0..100 {
        if c.op(Op::GetAttr { ino: g.ino }).await == Err(Errno::ENOENT) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(gone, "unlink not rolled forward");
    c.no_pending_intents().await;
}

/// The partition of `name` in a directory split once (2 servers: partitions 0 and 1).
fn half(name: &str) -> u32 {
    (shoal_placement::name_hash(name) & 1) as u32
}

/// A directory on 2 servers splits once its partition 0 holds 32 entries: the names whose
/// hash has bit 0 set move to partition 1 on the other server, the home answers requests for
/// them with the directory's bitmap, the other server answers them (and only them), and a
/// listing walked partition by partition shows every name once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growing_directory_splits_and_answers_misrouted_names_with_its_bitmap() {
    let c = Cluster::start(2).await;
    let home = c.home(ROOT_INO);
    let other = ServerId(1 - home.0);
    let (_, d) = c.mkdir_on(ROOT_INO, "big", home).await;
    let root = Cred::root();
    let names: Vec<String> = (0..32).map(|i| format!("f{i}")).collect();
    for n in &names {
        let op = Op::Create { dir: d, name: n.clone(), perm: 0o644, exclusive: true, layout: None };
        c.call_as(home, &root, op, Bytes::new()).await.unwrap();
    }
    let moved = names.iter().find(|n| half(n) == 1).unwrap().clone();
    let lookup = |server: ServerId, name: String| {
        let c = &c;
        let root = root.clone();
        async move { c.call_as(server, &root, Op::Lookup { dir: d, name, lease: None }, Bytes::new()).await.map(|(r, _)| r) }
    };
    // The split runs in the background after the 32nd create.
    let mut bitmap = None;
    for _ in 0..100 {
        if let Ok(Reply::Partitions { dir, bitmap: b }) = lookup(home, moved.clone()).await {
            assert_eq!(dir, d);
            bitmap = Some(b);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(bitmap, Some(vec![0b11]), "the home answers a moved name with the bitmap of partitions 0 and 1");
    for n in &names {
        let (right, wrong) = if half(n) == 1 { (other, home) } else { (home, other) };
        match lookup(right, n.clone()).await.unwrap() {
            Reply::Entry(e) => assert_eq!(e.kind, FileKind::File),
            r => panic!("{n} on server {right}: {r:?}"),
        }
        assert!(matches!(lookup(wrong, n.clone()).await.unwrap(), Reply::Partitions { .. }), "{n} on server {wrong}");
    }
    // A file created in partition 1 has its inode with its entry (attributes in the lookup).
    let fresh = (0..).map(|i| format!("new{i}")).find(|n| half(n) == 1).unwrap();
    let op = Op::Create { dir: d, name: fresh.clone(), perm: 0o644, exclusive: true, layout: None };
    c.call_as(other, &root, op, Bytes::new()).await.unwrap();
    match lookup(other, fresh.clone()).await.unwrap() {
        Reply::Entry(e) => {
            assert!(e.attr.is_some(), "entry and inode on one server");
            assert_eq!(c.home(e.ino), other);
        }
        r => panic!("{r:?}"),
    }
    // The listing: partition 0 on the home, then partition 1 from its first key.
    let mut listed = Vec::new();
    let mut at = (home, None::<u64>);
    loop {
        let op = Op::ReadDir { dir: d, after: None, limit: 0, lease: None, from: at.1 };
        let Reply::DirEntries { entries, more, part } = c.call_as(at.0, &root, op, Bytes::new()).await.unwrap().0
        else {
            panic!("not a listing")
        };
        assert!(!more);
        listed.extend(entries.into_iter().map(|e| e.name));
        let part = part.expect("a listing names its partition");
        match shoal_placement::key_after(part.index, part.depth) {
            Some(k) => at = (other, Some(k)),
            None => break,
        }
    }
    listed.sort();
    let mut want: Vec<String> = names.iter().cloned().chain([fresh]).collect();
    want.sort();
    assert_eq!(listed, want);
    // A listing position in the other's partition, asked of the home: its bitmap.
    let op = Op::ReadDir { dir: d, after: Some(moved), limit: 0, lease: None, from: None };
    assert!(matches!(c.call_as(home, &root, op, Bytes::new()).await.unwrap().0, Reply::Partitions { .. }));
}

/// Across the partitions of a split directory: a chmod on the home reaches the other
/// partition's server, a rename from one partition to the other moves the name, and rmdir
/// sees entries on every server (ENOTEMPTY) and, once all are gone, removes the directory
/// everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_directory_keeps_permissions_renames_and_rmdir_right() {
    let c = Cluster::start(2).await;
    let home = c.home(ROOT_INO);
    let other = ServerId(1 - home.0);
    let (dname, d) = c.mkdir_on(ROOT_INO, "big", home).await;
    let root = Cred::root();
    let call = |server: ServerId, cred: Cred, op: Op| {
        let c = &c;
        async move { c.call_as(server, &cred, op, Bytes::new()).await.map(|(r, _)| r) }
    };
    let create = |n: &str| Op::Create { dir: d, name: n.into(), perm: 0o644, exclusive: true, layout: None };
    let mut names: Vec<String> = (0..32).map(|i| format!("f{i}")).collect();
    for n in &names {
        call(home, root.clone(), create(n)).await.unwrap();
    }
    let server_of = |n: &str| if half(n) == 1 { other } else { home };
    // Wait for the split (a moved name is answered with the bitmap at the home).
    let moved = names.iter().find(|n| half(n) == 1).unwrap().clone();
    for _ in 0..100 {
        let r = call(home, root.clone(), Op::Lookup { dir: d, name: moved.clone(), lease: None }).await;
        if matches!(r, Ok(Reply::Partitions { .. })) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The split directory's link count is reported as unknown.
    assert_eq!(c.getattr(d).await.nlink, 1);

    // Permissions: world-writable, then not; alice's creates follow on both servers.
    let in1 = (0..).map(|i| format!("alice{i}")).find(|n| half(n) == 1).unwrap();
    c.op(Op::SetAttr { ino: d, set: SetAttrs { perm: Some(0o777), ..Default::default() } }).await.unwrap();
    call(other, alice(), create(&in1)).await.unwrap();
    names.push(in1);
    c.op(Op::SetAttr { ino: d, set: SetAttrs { perm: Some(0o755), ..Default::default() } }).await.unwrap();
    let in1b = (0..).map(|i| format!("bob{i}")).find(|n| half(n) == 1).unwrap();
    assert_eq!(call(other, alice(), create(&in1b)).await.unwrap_err(), Errno::EACCES);

    // A rename from partition 0 (home) to a name of partition 1 (other).
    let src = names.iter().find(|n| half(n) == 0).unwrap().clone();
    let dst = (0..).map(|i| format!("moved{i}")).find(|n| half(n) == 1).unwrap();
    let op = Op::Rename {
        src_dir: d,
        src_name: src.clone(),
        dst_dir: d,
        dst_name: dst.clone(),
        flags: RenameFlags::default(),
        keep: None,
    };
    call(home, root.clone(), op).await.unwrap();
    assert_eq!(
        call(home, root.clone(), Op::Lookup { dir: d, name: src.clone(), lease: None }).await.unwrap_err(),
        Errno::ENOENT
    );
    assert!(matches!(
        call(other, root.clone(), Op::Lookup { dir: d, name: dst.clone(), lease: None }).await.unwrap(),
        Reply::Entry(_)
    ));
    names.retain(|n| *n != src);
    names.push(dst);

    // rmdir: ENOTEMPTY while either server holds an entry.
    let rmdir = || Op::Rmdir { dir: ROOT_INO, name: dname.clone() };
    assert_eq!(c.op(rmdir()).await.unwrap_err(), Errno::ENOTEMPTY);
    let (on_home, on_other): (Vec<String>, Vec<String>) = names.iter().cloned().partition(|n| server_of(n) == home);
    for n in &on_home {
        call(home, root.clone(), Op::Unlink { dir: d, name: n.clone(), keep: None }).await.unwrap();
    }
    assert_eq!(c.op(rmdir()).await.unwrap_err(), Errno::ENOTEMPTY, "entries left on the other server");
    // The failed rmdir unsealed the other server's partition: creating there works.
    let again = (0..).map(|i| format!("again{i}")).find(|n| half(n) == 1).unwrap();
    call(other, root.clone(), create(&again)).await.unwrap();
    for n in on_other.iter().chain([&again]) {
        call(other, root.clone(), Op::Unlink { dir: d, name: n.clone(), keep: None }).await.unwrap();
    }
    c.op(rmdir()).await.unwrap();
    // Gone everywhere: the other server no longer holds a partition of it.
    let r = call(other, root.clone(), Op::Lookup { dir: d, name: "x".into(), lease: None }).await;
    assert_eq!(r.unwrap_err(), Errno::ENOENT);
    c.no_pending_intents().await;
}
