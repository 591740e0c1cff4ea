//! The generic communication interface in C: `shoal_comm`, a table of callbacks over any
//! parallel runtime (MPI through `shoal_container_mpi.h`, or the application's own), and
//! [`CComm`], which implements the container's [`Comm`] over it.
//!
//! **Buffers.** Every buffer a callback sees belongs to the library and is valid for that
//! call only; callbacks never allocate memory for the library nor free any of it. Data of
//! variable size is moved in two rounds of the same callback: first every length (8 bytes
//! per task, little-endian), then the bytes into buffers the library allocated for exactly
//! those lengths. So `bcast` always receives a buffer of the length the root sends, and
//! `gatherv`/`scatterv` always get every task's length: each maps onto one MPI call
//! (`MPI_Bcast`, `MPI_Gatherv`, `MPI_Scatterv`) with no size query of its own.
//!
//! **Ownership of a comm.** A `shoal_comm` handed to the library (to `paropen`, or filled
//! by `split`) belongs to it from then on: the library calls `free(user)`, if `free` is
//! not NULL, exactly once when it no longer needs that comm (at `parclose`, or before
//! `paropen` returns when it fails). Until then `user` must stay valid; the struct itself
//! is copied.
//!
//! **Threads.** Callbacks are called only on the thread that called the library function
//! (paropen, parclose, a collective write), during that call (`runtime::block`), never on
//! a thread of the library; they may block (that is what collective operations do).

use crate::runtime::in_call;
use container::{Comm, Error, Result};
use futures::future::BoxFuture;
use std::ffi::{c_int, c_void};

/// A group of tasks, as callbacks over the application's parallel runtime. Every task of
/// the group calls each collective callback, in the same order. Each callback gets `user`
/// first; those returning `int` return 0 on success and anything else on failure (an
/// errno, an MPI error code: it is named in the error message). Ranks, `root` and sizes are
/// those of this group. Every callback but `free` is required.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy)]
pub struct shoal_comm {
    /// The application's state for this group (an `MPI_Comm *`, say).
    pub user: *mut c_void,
    /// This task's rank in the group (from 0), or a negative number on failure.
    pub rank: Option<unsafe extern "C" fn(user: *mut c_void) -> c_int>,
    /// Tasks in the group, or a negative number on failure.
    pub size: Option<unsafe extern "C" fn(user: *mut c_void) -> c_int>,
    /// Return once every task of the group has called it.
    pub barrier: Option<unsafe extern "C" fn(user: *mut c_void) -> c_int>,
    /// `root`'s `len` bytes at `buf` into every task's `buf` (as `MPI_Bcast` of `MPI_BYTE`):
    /// `len` is the same on every task.
    pub bcast: Option<unsafe extern "C" fn(user: *mut c_void, buf: *mut c_void, len: usize, root: c_int) -> c_int>,
    /// Every task's `len` bytes at `send`, in rank order, into `recv` at `root` (as
    /// `MPI_Gatherv` of `MPI_BYTE`): `lens[i]` is task `i`'s `len`, task `i`'s bytes go to
    /// `recv` + `lens[0] + … + lens[i-1]`. `recv` and `lens` (`size` entries) are given at
    /// `root` only, NULL elsewhere.
    pub gatherv: Option<
        unsafe extern "C" fn(
            user: *mut c_void,
            send: *const c_void,
            len: usize,
            recv: *mut c_void,
            lens: *const usize,
            root: c_int,
        ) -> c_int,
    >,
    /// `root`'s `send`, cut into `size` consecutive parts of `lens[i]` bytes, part `i` into
    /// task `i`'s `recv` of `len` bytes (as `MPI_Scatterv` of `MPI_BYTE`; `len` is
    /// `lens[rank]`). `send` and `lens` are given at `root` only, NULL elsewhere.
    pub scatterv: Option<
        unsafe extern "C" fn(
            user: *mut c_void,
            send: *const c_void,
            lens: *const usize,
            recv: *mut c_void,
            len: usize,
            root: c_int,
        ) -> c_int,
    >,
    /// Split the group (as `MPI_Comm_split`): the tasks passing the same `color` form a
    /// new group, ordered by `key`, then by rank. Fill `*out` with the new group's comm;
    /// the library owns it from then on (its `free` is called when it is done with it).
    pub split: Option<unsafe extern "C" fn(user: *mut c_void, color: u64, key: u64, out: *mut shoal_comm) -> c_int>,
    /// Release `user` (for MPI: `MPI_Comm_free`, then the memory holding it); NULL when
    /// there is nothing to release. Called once, on the thread of a library call.
    pub free: Option<unsafe extern "C" fn(user: *mut c_void)>,
}

impl shoal_comm {
    /// A table with every callback unset, for `split` to fill.
    pub(crate) fn empty() -> shoal_comm {
        shoal_comm {
            user: std::ptr::null_mut(),
            rank: None,
            size: None,
            barrier: None,
            bcast: None,
            gatherv: None,
            scatterv: None,
            split: None,
            free: None,
        }
    }
}

/// The container's [`Comm`] over a `shoal_comm`, which it owns (see the module's notes).
pub struct CComm {
    c: shoal_comm,
    rank: usize,
    size: usize,
}

// SAFETY: `Comm` must be Send + Sync because the container keeps comms in its handles,
// which the runtime may move. The callbacks themselves are only ever called from the
// thread inside a blocking call of the C API (`call` checks it), one at a time per task,
// as the documented contract of `shoal_comm` says; `user` is never touched by Rust.
unsafe impl Send for CComm {}
unsafe impl Sync for CComm {}

impl Drop for CComm {
    fn drop(&mut self) {
        if let Some(free) = self.c.free {
            // SAFETY: the application's callback, called once for the comm it gave us.
            unsafe { free(self.c.user) };
        }
    }
}

/// A buffer of `n` zero bytes, or an error instead of aborting the process when a callback
/// reported an impossible length.
fn zeroed(n: usize, what: &str) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::Comm(format!("{what}: cannot allocate {n} bytes")))?;
    v.resize(n, 0);
    Ok(v)
}

/// Lengths as the 8-byte little-endian words of the first round.
fn words(lens: impl IntoIterator<Item = usize>) -> Vec<u8> {
    lens.into_iter().flat_map(|l| (l as u64).to_le_bytes()).collect()
}

fn word(b: &[u8]) -> Result<usize> {
    let w = u64::from_le_bytes(b.try_into().map_err(|_| Error::Comm("a length of other than 8 bytes".into()))?);
    usize::try_from(w).map_err(|_| Error::Comm(format!("a length of {w} bytes")))
}

impl CComm {
    /// Take `c` (its `free` is called when this is dropped, also when this fails) and ask
    /// its rank and size.
    pub(crate) fn new(c: shoal_comm) -> std::result::Result<CComm, String> {
        let mut me = CComm { c, rank: 0, size: 0 };
        let missing = [
            ("rank", c.rank.is_none()),
            ("size", c.size.is_none()),
            ("barrier", c.barrier.is_none()),
            ("bcast", c.bcast.is_none()),
            ("gatherv", c.gatherv.is_none()),
            ("scatterv", c.scatterv.is_none()),
            ("split", c.split.is_none()),
        ];
        if let Some((name, _)) = missing.iter().find(|m| m.1) {
            return Err(format!("the shoal_comm has no {name} callback"));
        }
        // SAFETY: the application's callbacks (checked non-NULL above) with its `user`.
        let (rank, size) = unsafe { (c.rank.unwrap()(c.user), c.size.unwrap()(c.user)) };
        if rank < 0 || size <= 0 || rank >= size {
            return Err(format!("the shoal_comm says rank {rank} of {size} tasks"));
        }
        (me.rank, me.size) = (rank as usize, size as usize);
        Ok(me)
    }

    /// Call a collective callback: refused off the thread of a C API call (never call the
    /// application's code on a runtime thread), and a non-zero return is an error.
    fn call(&self, what: &str, f: impl FnOnce(&shoal_comm) -> c_int) -> Result<()> {
        if !in_call() {
            return Err(Error::Comm(format!(
                "the {what} callback would run outside the application's call (on a library thread): refused"
            )));
        }
        match f(&self.c) {
            0 => Ok(()),
            rc => Err(Error::Comm(format!("the {what} callback failed ({rc})"))),
        }
    }

    fn check_root(&self, root: usize) -> Result<c_int> {
        if root >= self.size {
            return Err(Error::Comm(format!("root {root} of a group of {}", self.size)));
        }
        Ok(root as c_int)
    }

    /// One `gatherv` round: `send` to `root`, which passes `lens` and gets the bytes.
    fn gatherv(&self, send: &[u8], lens: Option<&[usize]>, root: c_int) -> Result<Option<Vec<u8>>> {
        let mut recv = match lens {
            Some(l) => {
                let total = l.iter().try_fold(0usize, |a, &b| a.checked_add(b));
                Some(zeroed(total.ok_or_else(|| Error::Comm("gather of more than 2^64 bytes".into()))?, "gather")?)
            }
            None => None,
        };
        let recv_ptr = recv.as_mut().map_or(std::ptr::null_mut(), |r| r.as_mut_ptr() as *mut c_void);
        let lens_ptr = lens.map_or(std::ptr::null(), |l| l.as_ptr());
        self.call("gatherv", |c| {
            // SAFETY: checked non-NULL in `new`; `send` holds `send.len()` bytes, `recv` the
            // sum of `lens`, `lens` one entry per task (root only), all alive for the call.
            unsafe { c.gatherv.unwrap()(c.user, send.as_ptr() as *const c_void, send.len(), recv_ptr, lens_ptr, root) }
        })?;
        Ok(recv)
    }

    /// One `scatterv` round: at `root`, `send` cut by `lens`; `len` bytes back.
    fn scatterv(&self, send: Option<(&[u8], &[usize])>, len: usize, root: c_int) -> Result<Vec<u8>> {
        let mut recv = zeroed(len, "scatter")?;
        let (send_ptr, lens_ptr) =
            send.map_or((std::ptr::null(), std::ptr::null()), |(s, l)| (s.as_ptr() as *const c_void, l.as_ptr()));
        self.call("scatterv", |c| {
            // SAFETY: as in `gatherv`: buffers of the stated sizes, alive for the call.
            unsafe { c.scatterv.unwrap()(c.user, send_ptr, lens_ptr, recv.as_mut_ptr() as *mut c_void, len, root) }
        })?;
        Ok(recv)
    }
}

impl Comm for CComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn barrier(&self) -> BoxFuture<'_, Result<()>> {
        // The callbacks block: each future does its work when first polled, on the thread
        // of the C call (`runtime::block`), and never yields.
        Box::pin(async move {
            // SAFETY: checked non-NULL in `new`.
            self.call("barrier", |c| unsafe { c.barrier.unwrap()(c.user) })
        })
    }

    fn bcast(&self, data: Vec<u8>, root: usize) -> BoxFuture<'_, Result<Vec<u8>>> {
        Box::pin(async move {
            let root_c = self.check_root(root)?;
            let me_root = self.rank == root;
            let mut len = words([if me_root { data.len() } else { 0 }]);
            // SAFETY (both calls): checked non-NULL in `new`; the buffer holds the length given.
            self.call("bcast", |c| unsafe { c.bcast.unwrap()(c.user, len.as_mut_ptr() as *mut c_void, 8, root_c) })?;
            let n = word(&len)?;
            let mut buf = if me_root { data } else { zeroed(n, "bcast")? };
            if n > 0 {
                self.call("bcast", |c| unsafe {
                    c.bcast.unwrap()(c.user, buf.as_mut_ptr() as *mut c_void, n, root_c)
                })?;
            }
            Ok(buf)
        })
    }

    fn gather(&self, data: Vec<u8>, root: usize) -> BoxFuture<'_, Result<Option<Vec<Vec<u8>>>>> {
        Box::pin(async move {
            let root_c = self.check_root(root)?;
            let at_root = self.rank == root;
            let eights = vec![8usize; self.size];
            let lens = self.gatherv(&words([data.len()]), at_root.then_some(&eights[..]), root_c)?;
            let lens = match lens {
                Some(b) => Some(b.chunks(8).map(word).collect::<Result<Vec<usize>>>()?),
                None => None,
            };
            let all = self.gatherv(&data, lens.as_deref(), root_c)?;
            Ok(all.zip(lens).map(|(all, lens)| {
                let mut at = 0;
                lens.iter()
                    .map(|&l| {
                        at += l;
                        all[at - l..at].to_vec()
                    })
                    .collect()
            }))
        })
    }

    fn scatter(&self, parts: Vec<Vec<u8>>, root: usize) -> BoxFuture<'_, Result<Vec<u8>>> {
        Box::pin(async move {
            let root_c = self.check_root(root)?;
            let at_root = self.rank == root;
            if at_root && parts.len() != self.size {
                return Err(Error::Comm(format!("scatter of {} parts to {} tasks", parts.len(), self.size)));
            }
            let eights = vec![8usize; self.size];
            let lens: Vec<usize> = parts.iter().map(Vec::len).collect();
            let len_words = words(lens.iter().copied());
            let mine = self.scatterv(at_root.then_some((&len_words[..], &eights[..])), 8, root_c)?;
            let n = word(&mine)?;
            let all = if at_root { parts.concat() } else { Vec::new() };
            self.scatterv(at_root.then_some((&all[..], &lens[..])), n, root_c)
        })
    }

    fn split(&self, color: u64, key: u64) -> BoxFuture<'_, Result<Box<dyn Comm>>> {
        Box::pin(async move {
            let mut out = shoal_comm::empty();
            // SAFETY: checked non-NULL in `new`; `out` is ours for the call.
            self.call("split", |c| unsafe { c.split.unwrap()(c.user, color, key, &mut out) })?;
            let group = CComm::new(out).map_err(|e| Error::Comm(format!("split: {e}")))?;
            Ok(Box::new(group) as Box<dyn Comm>)
        })
    }
}
