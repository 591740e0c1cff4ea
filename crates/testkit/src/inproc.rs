//! In-process clusters of real servers on loopback ports, driven through `shoal_rpc::Pool`
//! the way a client drives them: the servers run as tasks of the test's own runtime, so a
//! test can stop one and start it again on the same store within milliseconds, and a
//! failure shows in the test's own backtrace. The tests of the server crate's protocol
//! (`crates/server/tests/`) use it; tests of whole programs use [`crate::Cluster`].

use bytes::Bytes;
use shoal_placement::ClusterMap;
use shoal_proto::msg::{Attr, Cred, EntryOut, Op, RenameFlags, Reply};
use shoal_proto::{Errno, Ino, ServerId, ROOT_INO};
use shoal_rpc::{Pool, PoolOptions};
use shoal_server::ServerOptions;
use std::path::PathBuf;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running server: how to stop it, and its task.
type Running = (oneshot::Sender<()>, JoinHandle<anyhow::Result<()>>);

/// `n` servers as tasks of the calling runtime, on ports of 127.0.0.1 bound before they
/// start (no race for a port), each with its own store under one temporary folder.
pub struct InProcCluster {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub map: ClusterMap,
    servers: Vec<Option<Running>>,
    pub pool: Pool,
}

impl InProcCluster {
    pub async fn start(n: u32) -> InProcCluster {
        let dir = tempfile::tempdir().unwrap();
        let mut listeners = Vec::new();
        let mut map = ClusterMap::local(n, 1, dir.path());
        for s in &mut map.servers {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            s.addr = l.local_addr().unwrap().to_string();
            listeners.push(l);
        }
        let config = dir.path().join("cluster.toml");
        std::fs::write(&config, map.to_toml()).unwrap();
        let loaded = ClusterMap::load(&config).unwrap();
        shoal_auth::make_keys(&loaded.security.cluster_key, &loaded.security.host_key).unwrap();
        // The loaded map: its key paths are resolved against the config's folder.
        let map = loaded;
        let pool = Pool::new(
            map.clone(),
            PoolOptions {
                timeout: Duration::from_secs(20),
                connections_per_server: 1,
                client_name: "test".into(),
                session: 0,
                ..PoolOptions::default()
            },
        );
        let mut c = InProcCluster { dir, config, map, servers: Vec::new(), pool };
        for (id, l) in listeners.into_iter().enumerate() {
            let h = c.spawn(id as u32, l);
            c.servers.push(Some(h));
        }
        c
    }

    fn spawn(&self, id: u32, l: TcpListener) -> Running {
        let opts = ServerOptions {
            config: self.config.clone(),
            id,
            data_dir: None,
            listen: None,
            http_listen: None,
            max_connections: 0,
            handshake_timeout: Duration::from_secs(10),
            orphan_grace: shoal_server::DEFAULT_ORPHAN_GRACE,
            lease_max: shoal_server::leases::DEFAULT_MAX,
            throttle_mb_s: None,
            resync_mib_s: shoal_server::RESYNC_MIB_PER_S,
            resync_busy_mib_s: shoal_server::RESYNC_BUSY_MIB_PER_S,
        };
        let (tx, rx) = oneshot::channel::<()>();
        let h = tokio::spawn(shoal_server::serve_with_listener(opts, l, async move {
            let _ = rx.await;
        }));
        (tx, h)
    }

    pub async fn stop(&mut self, id: u32) {
        if let Some((tx, h)) = self.servers[id as usize].take() {
            let _ = tx.send(());
            h.await.unwrap().unwrap();
        }
    }

    pub async fn restart(&mut self, id: u32) {
        let addr = self.map.servers[id as usize].addr.clone();
        let l = TcpListener::bind(&addr).await.unwrap();
        let h = self.spawn(id, l);
        self.servers[id as usize] = Some(h);
    }

    pub fn home(&self, ino: Ino) -> ServerId {
        self.map.home_of(ino)
    }

    pub async fn call_as(&self, server: ServerId, cred: &Cred, op: Op, data: Bytes) -> Result<(Reply, Bytes), Errno> {
        self.pool.call(server, cred, op, data).await
    }

    /// Send `op` to the server a client would: home of the directory or inode.
    pub async fn op_as(&self, cred: &Cred, op: Op) -> Result<Reply, Errno> {
        let server = match &op {
            Op::Lookup { dir, .. }
            | Op::Create { dir, .. }
            | Op::Mkdir { dir, .. }
            | Op::Symlink { dir, .. }
            | Op::Link { dir, .. }
            | Op::Unlink { dir, .. }
            | Op::Rmdir { dir, .. }
            | Op::ReadDir { dir, .. } => self.home(*dir),
            Op::Rename { src_dir, .. } => self.home(*src_dir),
            Op::GetAttr { ino }
            | Op::SetAttr { ino, .. }
            | Op::SetDirLayout { ino, .. }
            | Op::SetReadMostly { ino, .. }
            | Op::ReadLink { ino }
            | Op::Access { ino, .. }
            | Op::ExtendSize { ino, .. }
            | Op::SetXattr { ino, .. }
            | Op::GetXattr { ino, .. }
            | Op::ListXattr { ino }
            | Op::RemoveXattr { ino, .. } => self.home(*ino),
            // The tests batch operations on root's directory only.
            Op::Batch { .. } => self.home(ROOT_INO),
            other => panic!("route {other:?} yourself"),
        };
        self.call_as(server, cred, op, Bytes::new()).await.map(|(r, _)| r)
    }

    pub async fn op(&self, op: Op) -> Result<Reply, Errno> {
        self.op_as(&Cred::root(), op).await
    }

    pub async fn getattr(&self, ino: Ino) -> Attr {
        match self.op(Op::GetAttr { ino }).await.unwrap() {
            Reply::Attr(a) => a,
            other => panic!("{other:?}"),
        }
    }

    pub async fn lookup(&self, dir: Ino, name: &str) -> Result<EntryOut, Errno> {
        match self.op(Op::Lookup { dir, name: name.into(), lease: None }).await? {
            Reply::Entry(e) => Ok(e),
            other => panic!("{other:?}"),
        }
    }

    pub async fn create(&self, dir: Ino, name: &str) -> EntryOut {
        let op = Op::Create { dir, name: name.into(), perm: 0o644, exclusive: true, layout: None };
        match self.op(op).await.unwrap() {
            Reply::Entry(e) => e,
            other => panic!("{other:?}"),
        }
    }

    pub async fn mkdir(&self, dir: Ino, name: &str) -> Result<EntryOut, Errno> {
        match self.op(Op::Mkdir { dir, name: name.into(), perm: 0o755 }).await? {
            Reply::Entry(e) => Ok(e),
            other => panic!("{other:?}"),
        }
    }

    /// A new directory under the root whose home is (`want_remote`) or is not the root's home.
    pub async fn mkdir_homed(&self, prefix: &str, want_remote: bool) -> Ino {
        let root_home = self.home(ROOT_INO);
        for i in 0..200 {
            let e = self.mkdir(ROOT_INO, &format!("{prefix}{i}")).await.unwrap();
            if (self.home(e.ino) != root_home) == want_remote {
                return e.ino;
            }
        }
        panic!("no directory with the wanted home");
    }

    pub async fn status(&self, server: ServerId) -> shoal_proto::msg::ServerStatus {
        match self.call_as(server, &Cred::root(), Op::Status, Bytes::new()).await.unwrap().0 {
            Reply::Status(s) => s,
            other => panic!("{other:?}"),
        }
    }
}

impl InProcCluster {
    /// A new directory in `dir` (named `prefix<i>`) whose inode is homed on `home`.
    pub async fn mkdir_on(&self, dir: Ino, prefix: &str, home: ServerId) -> (String, Ino) {
        for i in 0..200 {
            let name = format!("{prefix}{i}");
            let e = self.mkdir(dir, &name).await.unwrap();
            if self.home(e.ino) == home {
                return (name, e.ino);
            }
        }
        panic!("no directory homed on {home}");
    }

    pub async fn rename(&self, cred: &Cred, src_dir: Ino, src: &str, dst_dir: Ino, dst: &str) -> Result<Reply, Errno> {
        let op = Op::Rename {
            src_dir,
            src_name: src.into(),
            dst_dir,
            dst_name: dst.into(),
            flags: RenameFlags::default(),
            keep: None,
        };
        self.op_as(cred, op).await
    }

    pub async fn no_pending_intents(&self) {
        for s in &self.map.servers {
            assert_eq!(self.status(ServerId(s.id)).await.pending_intents, 0, "server s{}", s.id);
        }
    }
}
