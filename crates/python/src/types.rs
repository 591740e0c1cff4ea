//! What calls return: attributes (`Stat`, shaped like `os.stat_result`), directory entries
//! (`DirEntry`, like `os.DirEntry`) and capacity (`StatFs`).

use pyo3::prelude::*;
use shoal_client::{Attr, FileKind};

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
