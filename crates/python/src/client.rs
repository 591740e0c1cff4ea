//! The clients: `Client` (blocking) and `AsyncClient` (asyncio), with the same calls on
//! paths, written once in `path_calls!`.

use crate::checkpoint::{AsyncMicroCheckpoint, MicroCheckpoint};
use crate::errors::{errno, os_error, value, OrRaise};
use crate::file::{bytes_of, AsyncFile, File, Handle};
use crate::types::{Data, DirEntry, Layout, Stat, StatFs};
use crate::{awaitable, block, runtime};
use pyo3::prelude::*;
use shoal_client::{ClientOptions, Errno, OpenFlags, TimeSet, Timestamp};
use std::path::PathBuf;

/// Connect to the cluster of the configuration file `config` (`None`: `$SHOAL_CONFIG`).
fn connect(config: Option<PathBuf>) -> PyResult<shoal_client::Client> {
    let path = match config.or_else(|| std::env::var_os("SHOAL_CONFIG").map(PathBuf::from)) {
        Some(p) => p,
        None => return Err(errno(libc::EINVAL, "no configuration file given and $SHOAL_CONFIG is not set")),
    };
    let _inside = runtime().enter();
    shoal_client::Client::from_config(&path, ClientOptions::default()).map_err(os_error)
}

/// open(2)-style flags from a mode string of Python's `open` ("r", "w", "x", "a", with
/// "+" and "b"/"t", which make no difference here).
pub(crate) fn flags_of(mode: &str, perm: u32) -> PyResult<OpenFlags> {
    let bad = || value(format!("invalid mode: {mode:?}"));
    let mut main = None;
    let mut plus = false;
    for ch in mode.chars() {
        match ch {
            'r' | 'w' | 'x' | 'a' if main.is_none() => main = Some(ch),
            '+' if !plus => plus = true,
            'b' | 't' => {}
            _ => return Err(bad()),
        }
    }
    let mut f = OpenFlags { perm, ..Default::default() };
    match main.ok_or_else(bad)? {
        'r' => f.read = true,
        'w' => (f.write, f.create, f.truncate) = (true, true, true),
        'x' => (f.write, f.create, f.exclusive) = (true, true, true),
        _ => (f.write, f.create, f.append) = (true, true, true),
    }
    if plus {
        (f.read, f.write) = (true, true);
    }
    Ok(f)
}

fn time_set(ns: i128) -> TimeSet {
    TimeSet::At(Timestamp { secs: ns.div_euclid(1_000_000_000) as i64, nsecs: ns.rem_euclid(1_000_000_000) as u32 })
}

/// The calls on paths, for the blocking class and the asyncio class alike: `$run` is
/// `block` or `awaitable`, `$file` the class of open files, `$ckpt` of micro-checkpoints.
macro_rules! path_calls {
    ($class:ident, $run:path, $file:ident, $ckpt:ident) => {
        #[pymethods]
        impl $class {
            /// Connect to the cluster described by the configuration file `config` (default:
            /// the file named by `$SHOAL_CONFIG`). Servers are contacted when first needed.
            #[new]
            #[pyo3(signature = (config = None))]
            fn new(config: Option<PathBuf>) -> PyResult<Self> {
                Ok($class { client: connect(config)? })
            }

            /// The attributes of `path`, following a final symbolic link.
            fn stat<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.stat(&path).await.or_raise().map(Stat::from) })
            }

            /// The attributes of `path` itself (a symbolic link is not followed).
            fn lstat<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.lstat(&path).await.or_raise().map(Stat::from) })
            }

            /// Whether `path` names something (following symbolic links).
            fn exists<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move {
                    match c.stat(&path).await {
                        Ok(_) => Ok(true),
                        Err(e) if e.errno == Errno::ENOENT || e.errno == Errno::ENOTDIR => Ok(false),
                        Err(e) => Err(os_error(e)),
                    }
                })
            }

            /// The names in directory `path` (without "." and "..").
            #[pyo3(signature = (path = String::from("/")))]
            fn listdir<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move {
                    let entries = c.readdir(&path).await.or_raise()?;
                    Ok(entries.into_iter().map(|e| e.name).collect::<Vec<_>>())
                })
            }

            /// The entries of directory `path`: name, full path, inode and kind.
            #[pyo3(signature = (path = String::from("/")))]
            fn scandir<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move {
                    let entries = c.readdir(&path).await.or_raise()?;
                    Ok(entries.into_iter().map(|e| DirEntry::new(&path, e)).collect::<Vec<_>>())
                })
            }

            /// The paths at or under `path` whose metadata passes every test given, as
            /// find(1) (docs/find.md): every server scans the entries it holds at once.
            /// Tests in find's notation: `name`/`iname` (shell pattern), `type` ("f", "d",
            /// "l"), `size` ("+1M"), `mtime`/`atime`/`ctime` (days, "+30"), `mmin`/`amin`/
            /// `cmin` (minutes), `uid`, `gid`, `perm` (an int, or "644", "-600", "/111"),
            /// `stripe_count`, `stripe_size`, `xattr` with `xattr_value`, `read_mostly`;
            /// `mindepth` and `maxdepth`. Returns (path, stat) pairs sorted by path.
            #[pyo3(signature = (path = String::from("/"), **tests))]
            fn find<'py>(
                &self,
                py: Python<'py>,
                path: String,
                tests: Option<&Bound<'py, pyo3::types::PyDict>>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let (query, opts) = crate::find::query_of(tests)?;
                let c = self.client.clone();
                $run(py, async move {
                    let (found, _) = c.find(&path, &query, opts).await.or_raise()?;
                    Ok(found.iter().map(|f| (f.path.clone(), Stat::from(&f.attr))).collect::<Vec<_>>())
                })
            }

            /// What the tree at `path` holds, added up from the usage every server keeps
            /// per directory (docs/du.md): `{"dirs": [...], "unreadable": [...]}`, `dirs`
            /// one dict per directory down to `depth` levels below `path` (`path`, `ino`,
            /// `depth`, `files`, `dirs`, `bytes`, `inodes`), each before its parent,
            /// siblings by name, `path` last (its totals); `unreadable` the inode numbers
            /// of the directories the caller may not read (each adds only itself). A path
            /// that is not a directory reports itself.
            #[pyo3(signature = (path = String::from("/"), depth = 0))]
            fn du<'py>(&self, py: Python<'py>, path: String, depth: usize) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.du(&path, depth).await.or_raise().map(crate::du::DuOut) })
            }

            /// Store a tuple (docs/tuples.md): a sequence of int, str and bytes, the first
            /// naming where it is kept. Returns the number of the event that recorded it.
            fn tuple_write<'py>(&self, py: Python<'py>, fields: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
                let t = crate::tuples::tuple_of(&fields)?;
                let c = self.client.clone();
                $run(py, async move { c.tuple_write(&t).await.or_raise() })
            }

            /// The oldest tuple matching `template` (values; None: any value; int, str,
            /// bytes: any of that type; the first field a value), left in place, waiting up
            /// to `timeout` seconds (None: until there is one; 0: look once). None when
            /// none came in time.
            #[pyo3(signature = (template, timeout = Some(0.0)))]
            fn tuple_read<'py>(
                &self,
                py: Python<'py>,
                template: Bound<'py, PyAny>,
                timeout: Option<f64>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let (t, wait) = (crate::tuples::template_of(&template)?, crate::tuples::wait_of(timeout)?);
                let c = self.client.clone();
                $run(py, async move { Ok(c.tuple_read(&t, wait).await.or_raise()?.map(crate::tuples::TupleOut)) })
            }

            /// As `tuple_read`, and the tuple is removed: of several takers, each tuple
            /// goes to one.
            #[pyo3(signature = (template, timeout = Some(0.0)))]
            fn tuple_take<'py>(
                &self,
                py: Python<'py>,
                template: Bound<'py, PyAny>,
                timeout: Option<f64>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let (t, wait) = (crate::tuples::template_of(&template)?, crate::tuples::wait_of(timeout)?);
                let c = self.client.clone();
                $run(py, async move { Ok(c.tuple_take(&t, wait).await.or_raise()?.map(crate::tuples::TupleOut)) })
            }

            /// Follow the tuples matching `template` as they are written (and, with
            /// `taken`, taken), after event `after` (None: from now on; a `cursor` kept
            /// from an earlier watch). Returns a `TupleWatch`.
            #[pyo3(signature = (template, written = true, taken = false, after = None))]
            fn tuple_watch<'py>(
                &self,
                py: Python<'py>,
                template: Bound<'py, PyAny>,
                written: bool,
                taken: bool,
                after: Option<u64>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let t = crate::tuples::template_of(&template)?;
                let kinds = crate::tuples::kinds_of(written, taken)?;
                let from = after.map_or(shoal_client::WatchFrom::Now, shoal_client::WatchFrom::After);
                let c = self.client.clone();
                $run(py, async move {
                    let w = c.tuple_watch(&t, kinds, from).await.or_raise()?;
                    Ok(crate::tuples::TupleWatch::new(w))
                })
            }

            /// The tuples `("file", path, type, size, uid, gid, mode, mtime)` of the files at
            /// or under `root` matching `template` (docs/tuples.md, "Files as tuples"), by
            /// path: `type` is "f", "d" or "l", `mode` the permission bits, `mtime` seconds.
            fn file_tuples<'py>(
                &self,
                py: Python<'py>,
                root: String,
                template: Bound<'py, PyAny>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let t = crate::tuples::template_of(&template)?;
                let c = self.client.clone();
                $run(py, async move {
                    let found = c.file_tuples(&root, &t).await.or_raise()?;
                    Ok(found.into_iter().map(crate::tuples::TupleOut).collect::<Vec<_>>())
                })
            }

            /// Follow the changes under directory `path` (docs/changes.md): `events` names
            /// the kinds wanted as `shoal watch --events` does ("create,close", "all"),
            /// `pattern` a shell pattern on the name (with a '/': on the path below `path`),
            /// `recursive` the whole tree; `consumer` keeps the watch's place on the
            /// servers (see `ChangeWatch.ack`), `oldest` starts with the oldest event kept.
            /// Returns a `ChangeWatch`.
            #[pyo3(signature = (path, events = "all", pattern = None, recursive = true, consumer = None, oldest = false))]
            #[allow(clippy::too_many_arguments)]
            fn watch<'py>(
                &self,
                py: Python<'py>,
                path: String,
                events: &str,
                pattern: Option<String>,
                recursive: bool,
                consumer: Option<String>,
                oldest: bool,
            ) -> PyResult<Bound<'py, PyAny>> {
                let opts = crate::changes::options_of(events, pattern, recursive, consumer, oldest)?;
                let c = self.client.clone();
                $run(py, async move {
                    let w = c.watch_changes(&path, opts).await.or_raise()?;
                    Ok(crate::changes::ChangeWatch::new(w))
                })
            }

            /// Remove change-log consumer `name` from every server (its place, and the
            /// events kept for it).
            fn forget_consumer<'py>(&self, py: Python<'py>, name: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.forget_consumer(&name).await.or_raise() })
            }

            /// The micro-checkpoints of job `name` (docs/checkpoint.md), of `parts` parts
            /// each (one per task), kept as files `DIR/N.PART` in `dir` (made if missing).
            /// Every task of the job opens them with the same arguments.
            fn micro_checkpoint<'py>(
                &self,
                py: Python<'py>,
                name: String,
                dir: String,
                parts: u32,
            ) -> PyResult<Bound<'py, PyAny>> {
                let open = crate::checkpoint::Job::opening(self.client.clone(), name, dir, parts)?;
                $run(py, async move { Ok($ckpt { job: open.await? }) })
            }

            /// Make directory `path` with permission bits `mode`.
            #[pyo3(signature = (path, mode = 0o777))]
            fn mkdir<'py>(&self, py: Python<'py>, path: String, mode: u32) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.mkdir(&path, mode).await.or_raise().map(|_| ()) })
            }

            /// Make directory `path` and its missing parents; with `exist_ok` an existing
            /// directory is no error.
            #[pyo3(signature = (path, mode = 0o777, exist_ok = false))]
            fn makedirs<'py>(
                &self,
                py: Python<'py>,
                path: String,
                mode: u32,
                exist_ok: bool,
            ) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move {
                    if !exist_ok {
                        match c.stat(&path).await {
                            Ok(_) => {
                                return Err(os_error(shoal_client::Error::new(
                                    Errno::EEXIST,
                                    format!("makedirs {path}"),
                                )))
                            }
                            Err(e) if e.errno == Errno::ENOENT => {}
                            Err(e) => return Err(os_error(e)),
                        }
                    }
                    c.mkdir_all(&path, mode).await.or_raise().map(|_| ())
                })
            }

            /// Remove the empty directory `path`.
            fn rmdir<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.rmdir(&path).await.or_raise() })
            }

            /// Remove the file or symbolic link `path`.
            fn unlink<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.unlink(&path).await.or_raise() })
            }

            /// Remove `path` and, for a directory, everything under it; returns how many
            /// names were removed.
            fn rmtree<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.remove_all(&path).await.or_raise() })
            }

            /// Rename `src` to `dst`, replacing `dst` if it exists (as rename(2)).
            fn rename<'py>(&self, py: Python<'py>, src: String, dst: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.rename(&src, &dst).await.or_raise() })
            }

            /// Make a symbolic link `link_path` pointing to `target`.
            fn symlink<'py>(&self, py: Python<'py>, target: String, link_path: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.symlink(&target, &link_path).await.or_raise().map(|_| ()) })
            }

            /// The target of the symbolic link `path`.
            fn readlink<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.readlink(&path).await.or_raise() })
            }

            /// Give the file `existing` a second name `new_path` (a hard link).
            fn link<'py>(&self, py: Python<'py>, existing: String, new_path: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.link(&existing, &new_path).await.or_raise().map(|_| ()) })
            }

            /// Set the permission bits of `path`.
            fn chmod<'py>(&self, py: Python<'py>, path: String, mode: u32) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.chmod(&path, mode & 0o7777).await.or_raise().map(|_| ()) })
            }

            /// Set the owner and/or group of `path` (`None`: unchanged).
            #[pyo3(signature = (path, uid = None, gid = None))]
            fn chown<'py>(
                &self,
                py: Python<'py>,
                path: String,
                uid: Option<u32>,
                gid: Option<u32>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.chown(&path, uid, gid).await.or_raise().map(|_| ()) })
            }

            /// Set the access and modification times of `path`: `ns=(atime_ns, mtime_ns)`,
            /// or `times=(atime, mtime)` in seconds, or neither for now (as `os.utime`).
            #[pyo3(signature = (path, times = None, *, ns = None))]
            fn utime<'py>(
                &self,
                py: Python<'py>,
                path: String,
                times: Option<(f64, f64)>,
                ns: Option<(i128, i128)>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let (atime, mtime) = match (times, ns) {
                    (Some(_), Some(_)) => return Err(value("utime: give times or ns, not both")),
                    (Some((a, m)), None) => (time_set((a * 1e9) as i128), time_set((m * 1e9) as i128)),
                    (None, Some((a, m))) => (time_set(a), time_set(m)),
                    (None, None) => (TimeSet::Now, TimeSet::Now),
                };
                let c = self.client.clone();
                $run(py, async move { c.utimens(&path, Some(atime), Some(mtime)).await.or_raise().map(|_| ()) })
            }

            /// Cut or extend the file `path` to `size` bytes.
            fn truncate<'py>(&self, py: Python<'py>, path: String, size: u64) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.truncate(&path, size).await.or_raise().map(|_| ()) })
            }

            /// The value of the extended attribute `name` of `path`.
            fn getxattr<'py>(&self, py: Python<'py>, path: String, name: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move {
                    let a = c.stat(&path).await.or_raise()?;
                    c.getxattr(a.ino, &name).await.or_raise().map(|v| Data(v.into()))
                })
            }

            /// Set the extended attribute `name` of `path` to `value`; `flags` as
            /// `os.setxattr`: 0, `os.XATTR_CREATE` (1) or `os.XATTR_REPLACE` (2).
            #[pyo3(signature = (path, name, value, flags = 0))]
            fn setxattr<'py>(
                &self,
                py: Python<'py>,
                path: String,
                name: String,
                value: &Bound<'py, PyAny>,
                flags: i32,
            ) -> PyResult<Bound<'py, PyAny>> {
                let v = bytes_of(value)?;
                let c = self.client.clone();
                $run(py, async move {
                    let a = c.stat(&path).await.or_raise()?;
                    c.setxattr(a.ino, &name, &v, flags & 1 != 0, flags & 2 != 0).await.or_raise()
                })
            }

            /// The names of the extended attributes of `path`.
            fn listxattr<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move {
                    let a = c.stat(&path).await.or_raise()?;
                    c.listxattr(a.ino).await.or_raise()
                })
            }

            /// Remove the extended attribute `name` of `path`.
            fn removexattr<'py>(&self, py: Python<'py>, path: String, name: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move {
                    let a = c.stat(&path).await.or_raise()?;
                    c.removexattr(a.ino, &name).await.or_raise()
                })
            }

            /// The layout of `path` (following a final symbolic link), as a `Layout`: a
            /// file's stripe size, stripe count, first server and servers; a directory's
            /// default for the files created in it (`None` where unset).
            fn layout<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.stat(&path).await.or_raise().map(|a| Layout::of(&a)) })
            }

            /// Set the default layout of the files created in the directory `path` from
            /// now on (subdirectories made later inherit it); `None` fields are inherited
            /// from the cluster, `stripe_count=-1` stripes over every server, `policy` is
            /// "same" or "spread", `replicas` 1 to 3 copies of each data object (capped to
            /// the cluster's `[cluster] replicas` at create). A file's layout is fixed when it is created: a file
            /// raises `FileExistsError` (create it with `layout=` instead). Values the
            /// cluster does not take raise `OSError` (EINVAL).
            #[pyo3(signature = (path, *, stripe_size = None, stripe_count = None, first_server = None, policy = None, replicas = None))]
            // One argument per keyword of the Python method, as Python callers see it.
            #[allow(clippy::too_many_arguments)]
            fn set_layout<'py>(
                &self,
                py: Python<'py>,
                path: String,
                stripe_size: Option<i64>,
                stripe_count: Option<i64>,
                first_server: Option<i64>,
                policy: Option<&str>,
                replicas: Option<i64>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let spec = Layout::asked(stripe_size, stripe_count, first_server, policy, replicas)?.spec();
                let c = self.client.clone();
                $run(py, async move { c.set_layout(&path, spec).await.or_raise() })
            }

            /// Mark the file or directory `path` read-mostly, or clear the mark with
            /// `on=False` (docs/loading.md): clients list a read-mostly directory whole and
            /// answer look-ups in it, missing names included, from that listing; what is
            /// created in it inherits the mark. Not recursive. Owner or root only
            /// (`PermissionError`). `Stat.read_mostly` shows the mark.
            #[pyo3(signature = (path, on = true))]
            fn set_read_mostly<'py>(&self, py: Python<'py>, path: String, on: bool) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.set_read_mostly(&path, on).await.or_raise().map(|_| ()) })
            }

            /// Capacity and use of the whole file system.
            fn statfs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move { c.statfs().await.or_raise().map(StatFs::from) })
            }

            /// The whole content of the file `path`.
            fn read_bytes<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
                let c = self.client.clone();
                $run(py, async move {
                    let f = c.open(&path, OpenFlags::read_only()).await.or_raise()?;
                    let size = f.attr().size as usize;
                    let data = f.read_at(0, size).await.or_raise()?;
                    f.close().await.or_raise()?;
                    Ok(Data(data))
                })
            }

            /// Make `path` hold exactly `data` (created or truncated; durable on return).
            /// Returns the number of bytes written. `layout` (a `Layout`) applies if the
            /// file is created; an existing file keeps its own.
            #[pyo3(signature = (path, data, *, layout = None))]
            fn write_bytes<'py>(
                &self,
                py: Python<'py>,
                path: String,
                data: &Bound<'py, PyAny>,
                layout: Option<&Bound<'py, Layout>>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let data = bytes_of(data)?;
                let layout = layout.map(|l| l.get().spec());
                let c = self.client.clone();
                $run(py, async move {
                    let f = c.create(&path, 0o644, layout).await.or_raise()?;
                    let n = f.write_bytes_at(0, data).await.or_raise()?;
                    f.close().await.or_raise()?;
                    Ok(n)
                })
            }

            /// Open `path` with a mode of Python's `open` ("r", "w", "x", "a", with "+";
            /// "b" and "t" are ignored here), creating it with permission bits `perm` and
            /// `layout` (a `Layout`; default: the directory's). The layout applies only if
            /// the file is created (mode "x" makes sure it is); a mode that never creates
            /// ("r", "r+") with a layout is a `ValueError`.
            #[pyo3(signature = (path, mode = String::from("r"), perm = 0o666, *, layout = None))]
            fn open_file<'py>(
                &self,
                py: Python<'py>,
                path: String,
                mode: String,
                perm: u32,
                layout: Option<&Bound<'py, Layout>>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let mut flags = flags_of(&mode, perm)?;
                if let Some(l) = layout {
                    if !flags.create {
                        return Err(value(format!("layout= with mode {mode:?}, which does not create files")));
                    }
                    flags.layout = Some(l.get().spec());
                }
                let c = self.client.clone();
                $run(py, async move {
                    let f = c.open(&path, flags).await.or_raise()?;
                    Ok($file { h: Handle::new(f, path) })
                })
            }
        }
    };
}

/// A blocking client of one Shoal cluster. Calls release the GIL while they wait, so
/// threads overlap their requests. `shoal.Client` (Python) adds `open` with file objects.
#[pyclass(frozen, subclass, module = "shoal._native")]
pub struct Client {
    client: shoal_client::Client,
}

/// An asyncio client of one Shoal cluster: every call returns an awaitable, completed by
/// the client's own threads on the caller's event loop.
#[pyclass(frozen, subclass, module = "shoal._native")]
pub struct AsyncClient {
    client: shoal_client::Client,
}

path_calls!(Client, block, File, MicroCheckpoint);
path_calls!(AsyncClient, awaitable, AsyncFile, AsyncMicroCheckpoint);

/// The native client inside a `Client` or `AsyncClient` (of this module or a subclass).
pub(crate) fn native_of(obj: &Bound<'_, PyAny>) -> PyResult<shoal_client::Client> {
    if let Ok(c) = obj.cast::<Client>() {
        return Ok(c.get().client.clone());
    }
    if let Ok(c) = obj.cast::<AsyncClient>() {
        return Ok(c.get().client.clone());
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!("a shoal.Client or shoal.AsyncClient, not {obj}")))
}
