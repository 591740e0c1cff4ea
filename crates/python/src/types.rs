//! What calls return: attributes (`Stat`, shaped like `os.stat_result`), directory entries
//! (`DirEntry`, like `os.DirEntry`), capacity (`StatFs`) and layouts (`Layout`, also what
//! `set_layout` and `layout=` take).

use crate::errors::value;
use pyo3::prelude::*;
use shoal_client::{Attr, FileKind, LayoutSpec, PlacementPolicy, ServerId, REPLICAS_MAX};

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "file",
        FileKind::Dir => "directory",
        FileKind::Symlink => "symlink",
    }
}

fn mode_bits(k: FileKind) -> u32 {
    match k {
        FileKind::File => libc::S_IFREG,
        FileKind::Dir => libc::S_IFDIR,
        FileKind::Symlink => libc::S_IFLNK,
    }
}

/// The attributes of a file, directory or symbolic link, with the field names of
/// `os.stat_result` (so `stat.S_ISDIR(s.st_mode)` and friends work on it).
#[pyclass(frozen, get_all, module = "shoal._native")]
#[derive(Clone)]
pub struct Stat {
    pub st_ino: u64,
    /// File type and permission bits, as `st_mode`.
    pub st_mode: u32,
    pub st_nlink: u32,
    pub st_uid: u32,
    pub st_gid: u32,
    pub st_size: u64,
    /// 512-byte blocks allocated on the servers' disks.
    pub st_blocks: u64,
    pub st_atime: f64,
    pub st_mtime: f64,
    pub st_ctime: f64,
    pub st_atime_ns: i128,
    pub st_mtime_ns: i128,
    pub st_ctime_ns: i128,
    /// "file", "directory" or "symlink".
    pub kind: &'static str,
    /// Marked read-mostly (`Client.set_read_mostly`, docs/loading.md).
    pub read_mostly: bool,
}

fn ns(t: shoal_client::Timestamp) -> i128 {
    t.secs as i128 * 1_000_000_000 + t.nsecs as i128
}

impl From<&Attr> for Stat {
    fn from(a: &Attr) -> Stat {
        Stat {
            st_ino: a.ino.0,
            st_mode: mode_bits(a.kind) | a.perm,
            st_nlink: a.nlink,
            st_uid: a.uid,
            st_gid: a.gid,
            st_size: a.size,
            st_blocks: a.blocks_bytes.div_ceil(512),
            st_atime: ns(a.atime) as f64 / 1e9,
            st_mtime: ns(a.mtime) as f64 / 1e9,
            st_ctime: ns(a.ctime) as f64 / 1e9,
            st_atime_ns: ns(a.atime),
            st_mtime_ns: ns(a.mtime),
            st_ctime_ns: ns(a.ctime),
            kind: kind_name(a.kind),
            read_mostly: a.read_mostly,
        }
    }
}

impl From<Attr> for Stat {
    fn from(a: Attr) -> Stat {
        Stat::from(&a)
    }
}

#[pymethods]
impl Stat {
    fn is_dir(&self) -> bool {
        self.kind == "directory"
    }
    fn is_file(&self) -> bool {
        self.kind == "file"
    }
    fn is_symlink(&self) -> bool {
        self.kind == "symlink"
    }
    fn __repr__(&self) -> String {
        format!(
            "shoal.Stat(kind={:?}, st_ino={}, st_mode=0o{:o}, st_size={}, st_nlink={}, st_uid={}, st_gid={}, st_mtime={})",
            self.kind, self.st_ino, self.st_mode, self.st_size, self.st_nlink, self.st_uid, self.st_gid, self.st_mtime
        )
    }
}

/// One name in a directory listing, like `os.DirEntry` (without a cached `stat`).
#[pyclass(frozen, get_all, module = "shoal._native")]
#[derive(Clone)]
pub struct DirEntry {
    pub name: String,
    /// The entry's full path: the listed directory joined with `name`.
    pub path: String,
    pub inode: u64,
    /// "file", "directory" or "symlink".
    pub kind: &'static str,
}

impl DirEntry {
    pub(crate) fn new(dir: &str, e: shoal_client::DirEntry) -> DirEntry {
        let path = if dir.ends_with('/') { format!("{dir}{}", e.name) } else { format!("{dir}/{}", e.name) };
        DirEntry { name: e.name, path, inode: e.ino.0, kind: kind_name(e.kind) }
    }
}

#[pymethods]
impl DirEntry {
    fn is_dir(&self) -> bool {
        self.kind == "directory"
    }
    fn is_file(&self) -> bool {
        self.kind == "file"
    }
    fn is_symlink(&self) -> bool {
        self.kind == "symlink"
    }
    fn __repr__(&self) -> String {
        format!("<shoal.DirEntry {:?} ({})>", self.name, self.kind)
    }
}

/// Capacity of the whole file system, summed over the servers that answered.
#[pyclass(frozen, get_all, module = "shoal._native")]
#[derive(Clone)]
pub struct StatFs {
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub inodes: u64,
    pub servers_up: usize,
    pub servers_total: usize,
}

impl From<shoal_client::StatFs> for StatFs {
    fn from(s: shoal_client::StatFs) -> StatFs {
        StatFs {
            capacity_bytes: s.capacity_bytes,
            free_bytes: s.free_bytes,
            inodes: s.inodes,
            servers_up: s.servers_up,
            servers_total: s.servers_total,
        }
    }
}

#[pymethods]
impl StatFs {
    fn __repr__(&self) -> String {
        format!(
            "shoal.StatFs(capacity_bytes={}, free_bytes={}, inodes={}, servers_up={}/{})",
            self.capacity_bytes, self.free_bytes, self.inodes, self.servers_up, self.servers_total
        )
    }
}

/// Where a file's bytes live, or what a directory gives the files created in it.
///
/// From `Client.layout`: for a file, `stripe_size`, `stripe_count`, `first_server`,
/// `replicas` and `servers` (the ids of the servers holding objects 0, 1, …; `policy` is not kept and is
/// `None`); for a directory, its default for new files, `None` where unset (inherited from
/// the cluster), and `servers` is `None`.
///
/// Made by hand (`Layout(stripe_count=4)`), it asks for a layout when a file is created
/// (`open(..., layout=)`): fields left `None` are inherited from the directory's default,
/// then from the cluster's.
#[pyclass(frozen, get_all, eq, module = "shoal._native")]
#[derive(Clone, PartialEq)]
pub struct Layout {
    /// Bytes per stripe (a multiple of 4096, from 4 KiB to 1 GiB).
    pub stripe_size: Option<u64>,
    /// How many servers hold the file's objects; -1: every server that holds data.
    pub stripe_count: Option<i64>,
    /// The server holding the first object (an id of the cluster map, from 0).
    pub first_server: Option<u32>,
    /// Where the first object goes when `first_server` is not given: "same" (the server of
    /// the file's inode) or "spread" (a server picked by hashing the inode number).
    pub policy: Option<&'static str>,
    /// A file's servers, object by object; `None` for a directory's default.
    pub servers: Option<Vec<u32>>,
    /// Copies of each data object, 1 to 3 (docs/replicas.md): a file's, or a directory's
    /// default (`None`: inherited). More than the cluster keeps of its metadata is capped to
    /// it when a file is created.
    pub replicas: Option<u8>,
}

impl Layout {
    /// A layout to ask for, checked: `ValueError` for what no cluster takes (the servers
    /// say whether theirs takes the rest: `OSError` EINVAL).
    pub(crate) fn asked(
        stripe_size: Option<i64>,
        stripe_count: Option<i64>,
        first_server: Option<i64>,
        policy: Option<&str>,
        replicas: Option<i64>,
    ) -> PyResult<Layout> {
        let replicas = match replicas {
            None => None,
            Some(r) if (1..=REPLICAS_MAX as i64).contains(&r) => Some(r as u8),
            Some(r) => return Err(value(format!("replicas {r} must be 1 to {REPLICAS_MAX} (None: inherit)"))),
        };
        let stripe_size = match stripe_size {
            None => None,
            Some(s) if s > 0 => Some(s as u64),
            Some(s) => return Err(value(format!("stripe_size {s} must be positive (None: inherit)"))),
        };
        let stripe_count = match stripe_count {
            None => None,
            Some(c) if c == -1 || (1..=u32::MAX as i64 - 1).contains(&c) => Some(c),
            Some(c) => return Err(value(format!("stripe_count {c} must be -1 (all servers) or at least 1"))),
        };
        let first_server = match first_server {
            None => None,
            Some(f) => Some(u32::try_from(f).map_err(|_| value(format!("first_server {f} is not a server id")))?),
        };
        let policy = match policy {
            None => None,
            Some("same") => Some("same"),
            Some("spread") => Some("spread"),
            Some("load") => Some("load"),
            Some(p) => return Err(value(format!("policy {p:?} is not \"same\", \"spread\" or \"load\""))),
        };
        Ok(Layout { stripe_size, stripe_count, first_server, policy, servers: None, replicas })
    }

    /// What the client sends when creating a file or setting a directory's default (a
    /// file's `servers` are not asked for: its `first_server` and `stripe_count` say it).
    pub(crate) fn spec(&self) -> LayoutSpec {
        LayoutSpec {
            stripe_size: self.stripe_size,
            stripe_count: self.stripe_count.map(|c| if c == -1 { u32::MAX } else { c as u32 }),
            first_server: self.first_server.map(ServerId),
            policy: self.policy.map(|p| match p {
                "spread" => PlacementPolicy::Spread,
                "load" => PlacementPolicy::Load,
                _ => PlacementPolicy::Same,
            }),
            replicas: self.replicas,
        }
    }

    /// The layout of a file, or the default of a directory (`None`s for anything else).
    pub(crate) fn of(a: &Attr) -> Layout {
        if let Some(l) = &a.layout {
            let servers: Vec<u32> = l.servers.iter().map(|s| s.0).collect();
            return Layout {
                stripe_size: Some(l.stripe_size),
                stripe_count: Some(servers.len() as i64),
                first_server: servers.first().copied(),
                policy: None,
                servers: Some(servers),
                replicas: Some(l.replicas),
            };
        }
        let spec = a.dir_default.clone().unwrap_or_default();
        Layout {
            stripe_size: spec.stripe_size,
            stripe_count: match spec.stripe_count {
                Some(u32::MAX) => Some(-1),
                Some(c) if c > 0 => Some(c as i64),
                _ => None,
            },
            first_server: spec.first_server.map(|s| s.0),
            policy: spec.policy.map(|p| match p {
                PlacementPolicy::Same => "same",
                PlacementPolicy::Spread => "spread",
                PlacementPolicy::Load => "load",
            }),
            servers: None,
            replicas: spec.replicas,
        }
    }
}

#[pymethods]
impl Layout {
    /// A layout to ask for; `None` fields are inherited. `stripe_count=-1`: every server.
    #[new]
    #[pyo3(signature = (*, stripe_size = None, stripe_count = None, first_server = None, policy = None, replicas = None))]
    fn new(
        stripe_size: Option<i64>,
        stripe_count: Option<i64>,
        first_server: Option<i64>,
        policy: Option<&str>,
        replicas: Option<i64>,
    ) -> PyResult<Layout> {
        Layout::asked(stripe_size, stripe_count, first_server, policy, replicas)
    }

    fn __repr__(&self) -> String {
        let opt = |v: Option<String>| v.unwrap_or_else(|| "None".into());
        let mut s = format!(
            "shoal.Layout(stripe_size={}, stripe_count={}, first_server={}, policy={}",
            opt(self.stripe_size.map(|v| v.to_string())),
            opt(self.stripe_count.map(|v| v.to_string())),
            opt(self.first_server.map(|v| v.to_string())),
            opt(self.policy.map(|p| format!("'{p}'"))),
        );
        if let Some(servers) = &self.servers {
            s += &format!(", servers={servers:?}");
        }
        s += &format!(", replicas={}", opt(self.replicas.map(|r| r.to_string())));
        s + ")"
    }
}

/// Bytes read, handed to Python as `bytes`.
pub struct Data(pub bytes::Bytes);

impl<'py> IntoPyObject<'py> for Data {
    type Target = pyo3::types::PyBytes;
    type Output = Bound<'py, pyo3::types::PyBytes>;
    type Error = std::convert::Infallible;

    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        Ok(pyo3::types::PyBytes::new(py, &self.0))
    }
}
