//! What a served descriptor stands for: the kernel's *open file description* — the file,
//! the access mode and status flags (`F_GETFL`), the offset — shared by every descriptor
//! `dup`ed from it, as in the kernel. Per-descriptor flags (`FD_CLOEXEC`) stay in the
//! kernel, on the placeholder descriptor that holds the number.
//!
//! **Placeholders.** A served descriptor's number is held by a descriptor of
//! `/dev/null` opened with `O_PATH` (no device is opened): nothing can be read or
//! written through it, so a call the library does not intercept, made on a Shoal
//! descriptor (a raw system call, say), fails with EBADF instead of doing something else.
//!
//! **Handing a descriptor to the kernel** ([`convert`]). For what only the kernel can do
//! (mmap, locks, extended attributes, ioctls, stdio's `fdopen`), and before `fork` and
//! `exec`, the library flushes the file, opens it through the mount by its path with the
//! same access and status flags, checks it is the same inode, moves the offset, and puts
//! the new descriptor in place of the placeholder under every number that served it
//! (`dup3`, keeping each number's `FD_CLOEXEC`), so that from then on the kernel serves
//! it and descriptors that shared the offset still do. A file whose path no longer leads
//! to it (renamed or removed by another process) cannot be converted: that call fails
//! (EBADF... see `docs/preload.md`), and at `fork` it stays served.
//!
//! **Invariants.** The state lock is held (read) for the whole of every native operation
//! and (write) by conversion, so no native operation is in flight when a file changes
//! hands, and none starts after: an operation that finds the state `Kernel` puts the
//! kernel descriptor under its own number and redoes itself as a kernel call. The kernel
//! descriptor kept in `Kernel` lives as long as the `OpenFile` (numbers that still map to
//! it can always be moved).

use crate::cluster;
use crate::fd_table;
use crate::guard::{fail, Out, Res};
use crate::listing::Listing;
use crate::mounts::Mount;
use crate::node::{self, Node};
use crate::real;
use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use shoal_client::{Ino, OpenFlags};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;

/// What was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    /// A directory opened with `O_PATH` (a handle for `*at` calls and `fchdir` only).
    DirPath,
}

pub enum State {
    /// Served by this node.
    File(Arc<Node>),
    /// A directory and how far its listing went.
    Dir(Listing),
    /// In a child after fork: reopened by inode number at its first use.
    Reopen,
    /// Handed to the kernel: this descriptor replaces the placeholder of every number.
    Kernel(OwnedFd),
}

/// Status flags `F_SETFL` may change, and the ones the library keeps.
pub const STATUS_FLAGS: i32 = libc::O_APPEND | libc::O_NONBLOCK | libc::O_DIRECT | libc::O_NOATIME;

pub struct OpenFile {
    pub mount: &'static Mount,
    pub ino: Ino,
    pub kind: Kind,
    /// The host path it was opened by (kept up to date by this process's renames), for
    /// [`convert`].
    host: ArcSwap<String>,
    /// Access mode and status flags, as `F_GETFL` shows them.
    flags: AtomicI32,
    /// The file offset (for a directory: the index of the next entry).
    pub offset: AtomicU64,
    /// Held by `read`, `write` and `lseek` (the kernel's `f_pos` lock): calls that use
    /// the offset run one after the other.
    pub pos: Mutex<()>,
    pub state: RwLock<State>,
}

impl OpenFile {
    pub fn new(mount: &'static Mount, ino: Ino, kind: Kind, host: String, flags: i32, state: State) -> OpenFile {
        OpenFile {
            mount,
            ino,
            kind,
            host: ArcSwap::from_pointee(host),
            flags: AtomicI32::new(flags & (libc::O_ACCMODE | STATUS_FLAGS | libc::O_SYNC | libc::O_DSYNC)),
            offset: AtomicU64::new(0),
            pos: Mutex::new(()),
            state: RwLock::new(state),
        }
    }

    pub fn flags(&self) -> i32 {
        self.flags.load(Ordering::Relaxed)
    }

    pub fn set_status_flags(&self, f: i32) {
        let keep = self.flags() & !STATUS_FLAGS;
        self.flags.store(keep | (f & STATUS_FLAGS), Ordering::Relaxed);
    }

    pub fn host(&self) -> Arc<String> {
        self.host.load_full()
    }

    pub fn readable(&self) -> bool {
        self.kind != Kind::DirPath && self.flags() & libc::O_ACCMODE != libc::O_WRONLY
    }

    pub fn writable(&self) -> bool {
        self.kind == Kind::File && self.flags() & libc::O_ACCMODE != libc::O_RDONLY
    }

    /// The node serving this file, with the state held for the caller's operation; `fd`
    /// is the number the caller used (moved to the kernel if the file was converted).
    pub fn node(self: &Arc<Self>, fd: i32) -> Res<(RwLockReadGuard<'_, State>, Arc<Node>)> {
        loop {
            let st = self.state.read();
            match &*st {
                State::File(n) => {
                    let n = n.clone();
                    return Ok((st, n));
                }
                State::Kernel(k) => {
                    migrate(fd, self, k.as_raw_fd());
                    return Err(Out::Kernel);
                }
                State::Dir(_) => return fail(libc::EISDIR),
                State::Reopen => {}
            }
            drop(st);
            let mut st = self.state.write();
            if matches!(*st, State::Reopen) {
                *st = State::File(self.reopen()?);
            }
        }
    }

    /// A child's first use of a file its parent had open: open it by inode number.
    fn reopen(&self) -> Res<Arc<Node>> {
        let c = cluster::of(self.mount)?;
        let acc = self.flags() & libc::O_ACCMODE;
        let flags = OpenFlags { read: acc != libc::O_WRONLY, write: acc != libc::O_RDONLY, ..Default::default() };
        let file = c.block_on(c.client.open_ino(self.ino, flags.clone()))?;
        node::share(&c, self.mount.index, file, flags.read, flags.write)
    }

    /// Run `f` on the directory's listing (write-locked state); `fd` as in [`OpenFile::node`].
    pub fn with_listing<T>(self: &Arc<Self>, fd: i32, f: impl FnOnce(&mut Listing) -> Res<T>) -> Res<T> {
        let mut st = self.state.write();
        match &mut *st {
            State::Dir(l) => f(l),
            State::Kernel(k) => {
                migrate(fd, self, k.as_raw_fd());
                Err(Out::Kernel)
            }
            _ => fail(libc::ENOTDIR),
        }
    }
}

/// Put kernel descriptor `kfd` under number `fd`, which served `of`, keeping the number's
/// `FD_CLOEXEC`, and stop serving it.
fn migrate(fd: i32, of: &Arc<OpenFile>, kfd: i32) {
    // SAFETY: plain descriptor calls on numbers this process owns.
    unsafe {
        let fdflags = real::fcntl(fd, libc::F_GETFD, 0);
        if fdflags >= 0 {
            let cloexec = if fdflags & libc::FD_CLOEXEC != 0 { libc::O_CLOEXEC } else { 0 };
            if real::dup3(kfd, fd, cloexec) < 0 {
                crate::debug::say(&format!("dup3 onto descriptor {fd} failed: errno {}", crate::guard::errno()));
                return;
            }
        }
    }
    fd_table::remove_if(fd, of);
}

/// Hand `of` to the kernel (see the module doc). On failure, the errno, and the file
/// stays served.
pub fn convert(of: &Arc<OpenFile>) -> Result<(), i32> {
    let mut st = of.state.write();
    let k = match &*st {
        State::Kernel(k) => k.as_raw_fd(),
        state => {
            if let State::File(n) = state {
                if n.writable {
                    n.cluster.block_on(n.file().flush()).map_err(|e| match Out::from(e) {
                        Out::Errno(e) => e,
                        Out::Kernel => libc::EIO,
                    })?;
                }
            }
            let k = open_kernel(of)?;
            crate::stats::count(crate::stats::Op::Converted, crate::stats::Path::Kernel);
            // SAFETY: `k` was just opened and is owned by nobody else.
            *st = State::Kernel(unsafe { OwnedFd::from_raw_fd(k) });
            k
        }
    };
    drop(st);
    for (fd, e) in fd_table::all() {
        if Arc::ptr_eq(&e, of) {
            migrate(fd, of, k);
        }
    }
    Ok(())
}

/// How long [`open_kernel`] waits for the kernel to see a name this process changed.
const KERNEL_CATCH_UP: std::time::Duration = std::time::Duration::from_millis(1500);

/// Open `of`'s file through the mount as it was opened here, at its offset.
///
/// The kernel may still hold what the name meant before this process changed it through
/// the native client (renamed a file over it, say): the mount keeps names for
/// `entry_timeout` (1 s) unless the change revokes a lease it gave them under. A path
/// that does not lead to the inode yet is tried again until it does, for a little longer
/// than that.
fn open_kernel(of: &OpenFile) -> Result<i32, i32> {
    let start = std::time::Instant::now();
    loop {
        match open_kernel_once(of) {
            Err(e) if (e == libc::ENOENT || e == libc::ESTALE) && start.elapsed() < KERNEL_CATCH_UP => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

fn open_kernel_once(of: &OpenFile) -> Result<i32, i32> {
    let host = of.host();
    let path = std::ffi::CString::new(host.as_bytes()).map_err(|_| libc::EINVAL)?;
    let flags = of.flags();
    let kflags = match of.kind {
        Kind::File => {
            (flags
                & (libc::O_ACCMODE
                    | libc::O_APPEND
                    | libc::O_NONBLOCK
                    | libc::O_NOATIME
                    | libc::O_SYNC
                    | libc::O_DSYNC))
                | libc::O_CLOEXEC
        }
        Kind::Dir => libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        Kind::DirPath => libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
    };
    // SAFETY: a NUL-terminated path; the descriptor is closed on every failure below.
    unsafe {
        let k = real::open(path.as_ptr(), kflags, 0);
        if k < 0 {
            let e = crate::guard::errno();
            crate::debug::say(&format!("cannot reopen {host} through the mount: errno {e}"));
            return Err(e);
        }
        let mut st: libc::stat64 = std::mem::zeroed();
        if real::fstat64(k, &mut st) < 0 || st.st_ino != of.ino.0 {
            real::close(k);
            crate::debug::say(&format!("{host} is no longer the file that was opened"));
            return Err(libc::ESTALE);
        }
        if of.kind == Kind::File && real::lseek64(k, of.offset.load(Ordering::Relaxed) as i64, libc::SEEK_SET) < 0 {
            let e = crate::guard::errno();
            real::close(k);
            return Err(e);
        }
        Ok(k)
    }
}

/// After this process renamed `from` to `to` (host paths): files opened below `from`
/// are now below `to`.
pub fn renamed(from: &str, to: &str) {
    for (_, of) in fd_table::all() {
        let h = of.host();
        if let Some(rest) = h.strip_prefix(from) {
            if rest.is_empty() || rest.starts_with('/') {
                of.host.store(Arc::new(format!("{to}{rest}")));
            }
        }
    }
}

/// A fresh copy of `of` for a child after fork (see `fork.rs`): same file, flags, offset
/// and path, no lock or client of the parent's. `None` for a converted file (the child
/// puts its kernel descriptor in place instead).
pub fn copy_for_child(of: &OpenFile) -> Option<OpenFile> {
    // The state lock may be held by a thread that did not follow the fork: peek at the
    // state without it (this thread is the only one in the child).
    // SAFETY: no other thread exists in the child; `data_ptr` reads the value in place.
    let state = unsafe { &*of.state.data_ptr() };
    let fresh = match state {
        State::Kernel(_) => return None,
        State::File(_) | State::Reopen => State::Reopen,
        State::Dir(l) => State::Dir(Listing::new(of.ino, l.parent())),
    };
    let copy = OpenFile::new(of.mount, of.ino, of.kind, of.host().to_string(), of.flags(), fresh);
    copy.offset.store(of.offset.load(Ordering::Relaxed), Ordering::Relaxed);
    Some(copy)
}

/// The kernel descriptor of a converted file (for the child after fork).
pub fn kernel_fd(of: &OpenFile) -> Option<i32> {
    // SAFETY: as in `copy_for_child`.
    match unsafe { &*of.state.data_ptr() } {
        State::Kernel(k) => Some(k.as_raw_fd()),
        _ => None,
    }
}
