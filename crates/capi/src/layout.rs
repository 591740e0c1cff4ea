//! Layouts: where a file's bytes live (its stripe size and the servers holding its objects,
//! fixed when it is created), and the default a directory gives the files created in it
//! (as `shoal setstripe` / `shoal getstripe`). Blocking calls and their asynchronous twins.

use crate::client::{client, shoal_client, text};
use crate::error::{fail, guard, status};
use crate::file::{open_flags, shoal_file};
use crate::future::{shoal_callback, shoal_future};
use crate::out::{Out, Slots};
use crate::path_async::{on_paths, on_paths_then, open_as_future, NONE};
use ::shoal_client::{Attr, Client, LayoutSpec, OpenFlags, PlacementPolicy, ServerId};
use std::ffi::{c_char, c_int, c_void};

/// A layout asked for (`shoal_set_layout`, `shoal_create`) or found (`shoal_get_layout`).
/// What is left unset is inherited: from the directory's default, then from the cluster's.
/// Start from `SHOAL_LAYOUT_INHERIT` rather than zeros: server 0 is a real server.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub struct shoal_layout {
    /// Bytes per stripe: a multiple of 4096 from 4 KiB to 1 GiB; 0: inherit.
    pub stripe_size: u64,
    /// How many servers hold the file's objects; 0: inherit; `SHOAL_STRIPE_COUNT_ALL`:
    /// every server that holds data.
    pub stripe_count: u32,
    /// Where the first object goes when `first_server` is unset: `SHOAL_POLICY_SAME` (the
    /// server of the file's inode: a small file touches one server), `SHOAL_POLICY_SPREAD`
    /// (a server picked by hashing the inode number: spreads load), `SHOAL_POLICY_UNSET`
    /// (0): inherit.
    pub policy: u32,
    /// The server holding the first object (an id of the cluster map; ids start at 0), or
    /// `SHOAL_FIRST_SERVER_UNSET` (-1): inherit, else chosen by `policy`.
    pub first_server: i64,
    /// Copies of each data object, 1 to `SHOAL_REPLICAS_MAX`; 0: inherit. More than the
    /// cluster keeps of its metadata (`[cluster] replicas`) is capped to it at create.
    pub replicas: u32,
    /// Must be 0 (else EINVAL): keeps the struct free of padding (so it can be compared
    /// with `memcmp`) and holds a later field without changing the struct's size again.
    pub reserved: u32,
}

/// `shoal_layout::policy`: inherit.
pub const SHOAL_POLICY_UNSET: u32 = 0;
/// `shoal_layout::policy`: the first object on the server of the file's inode.
pub const SHOAL_POLICY_SAME: u32 = 1;
/// `shoal_layout::policy`: the first object on a server picked by hashing the inode number.
pub const SHOAL_POLICY_SPREAD: u32 = 2;
/// `shoal_layout::policy`: the objects on the least-loaded servers (load-aware placement).
pub const SHOAL_POLICY_LOAD: u32 = 3;
/// `shoal_layout::stripe_count`: stripe over every server that holds data.
pub const SHOAL_STRIPE_COUNT_ALL: u32 = u32::MAX;
/// `shoal_layout::first_server`: inherit, else chosen by the policy.
pub const SHOAL_FIRST_SERVER_UNSET: i64 = -1;
/// `shoal_layout::replicas`: the most copies a layout may ask for.
pub const SHOAL_REPLICAS_MAX: u32 = 3;
// A literal above, because cbindgen writes only literals into shoal.h; kept equal here.
const _: () = assert!(SHOAL_REPLICAS_MAX == ::shoal_client::REPLICAS_MAX as u32);
/// A layout that inherits everything: the starting point of one to ask for.
pub const SHOAL_LAYOUT_INHERIT: shoal_layout = shoal_layout {
    stripe_size: 0,
    stripe_count: 0,
    policy: SHOAL_POLICY_UNSET,
    first_server: SHOAL_FIRST_SERVER_UNSET,
    replicas: 0,
    reserved: 0,
};

impl shoal_layout {
    /// What this asks for, as the client takes it; `None` (EINVAL) for an unknown policy or
    /// a server id out of range (whether the server exists is the servers' to say).
    fn spec(&self, path: &str) -> Option<LayoutSpec> {
        let policy = match self.policy {
            SHOAL_POLICY_UNSET => None,
            SHOAL_POLICY_SAME => Some(PlacementPolicy::Same),
            SHOAL_POLICY_SPREAD => Some(PlacementPolicy::Spread),
            SHOAL_POLICY_LOAD => Some(PlacementPolicy::Load),
            p => {
                fail(libc::EINVAL, format_args!("layout of {path}: policy {p} is not a SHOAL_POLICY_ constant"));
                return None;
            }
        };
        let first_server = match self.first_server {
            SHOAL_FIRST_SERVER_UNSET => None,
            f => match u32::try_from(f) {
                Ok(id) => Some(ServerId(id)),
                Err(_) => {
                    fail(libc::EINVAL, format_args!("layout of {path}: first server {f} is not a server id or -1"));
                    return None;
                }
            },
        };
        let replicas = match self.replicas {
            0 => None,
            r if r <= SHOAL_REPLICAS_MAX => Some(r as u8),
            r => {
                fail(
                    libc::EINVAL,
                    format_args!(
                        "layout of {path}: replica count {r} must be 0 (inherit) or 1 to {SHOAL_REPLICAS_MAX}"
                    ),
                );
                return None;
            }
        };
        if self.reserved != 0 {
            fail(libc::EINVAL, format_args!("layout of {path}: the reserved field is {}, it must be 0", self.reserved));
            return None;
        }
        Some(LayoutSpec {
            stripe_size: (self.stripe_size != 0).then_some(self.stripe_size),
            stripe_count: (self.stripe_count != 0).then_some(self.stripe_count),
            first_server,
            policy,
            replicas,
        })
    }

    /// A directory's default as C sees it: unset fields as above.
    fn of_spec(s: &LayoutSpec) -> shoal_layout {
        shoal_layout {
            stripe_size: s.stripe_size.unwrap_or(0),
            stripe_count: s.stripe_count.unwrap_or(0),
            policy: match s.policy {
                None => SHOAL_POLICY_UNSET,
                Some(PlacementPolicy::Same) => SHOAL_POLICY_SAME,
                Some(PlacementPolicy::Spread) => SHOAL_POLICY_SPREAD,
                Some(PlacementPolicy::Load) => SHOAL_POLICY_LOAD,
            },
            first_server: s.first_server.map_or(SHOAL_FIRST_SERVER_UNSET, |f| i64::from(f.0)),
            replicas: s.replicas.map_or(0, u32::from),
            reserved: 0,
        }
    }
}

/// The caller's `shoal_layout` at `p` as a spec; `None` (EFAULT, EINVAL) if NULL or bad.
fn spec_at(path: &str, p: *const shoal_layout) -> Option<LayoutSpec> {
    if p.is_null() {
        fail(libc::EFAULT, "the shoal_layout is NULL");
        return None;
    }
    // SAFETY: non-NULL, the caller's shoal_layout, alive for the call (copied here).
    unsafe { *p }.spec(path)
}

/// `shoal_create`'s flags: open(2)'s with O_CREAT, and the layout for a new file (NULL: the
/// directory's default). `None` (errno set) for a bad argument.
fn create_flags(path: &str, flags: c_int, mode: u32, layout: *const shoal_layout) -> Option<OpenFlags> {
    let mut how = open_flags(path, flags | libc::O_CREAT, mode)?;
    if !layout.is_null() {
        how.layout = Some(spec_at(path, layout)?);
    }
    Some(how)
}

/// Put what `shoal_get_layout` reports of `a` into the caller's `out` and `servers`: a
/// file's stripe size, count, first server and servers (its policy is not kept: unset), a
/// directory's default with no servers. Returns the number of servers, or the message of
/// ERANGE if they do not fit (then nothing is written).
fn put_layout(a: &Attr, out: Out<shoal_layout>, servers: &Slots<u32>) -> Result<usize, String> {
    let (layout, ids) = match (&a.layout, &a.dir_default) {
        (Some(l), _) => {
            let ids: Vec<u32> = l.servers.iter().map(|s| s.0).collect();
            let layout = shoal_layout {
                stripe_size: l.stripe_size,
                stripe_count: ids.len() as u32,
                policy: SHOAL_POLICY_UNSET,
                first_server: ids.first().map_or(SHOAL_FIRST_SERVER_UNSET, |&f| i64::from(f)),
                replicas: l.replicas.into(),
                reserved: 0,
            };
            (layout, ids)
        }
        (None, Some(spec)) => (shoal_layout::of_spec(spec), Vec::new()),
        // A directory without a default (or anything else without a layout).
        (None, None) => (SHOAL_LAYOUT_INHERIT, Vec::new()),
    };
    let n = servers.give(&ids)?;
    out.put(layout);
    Ok(n)
}

/// Set the default layout of the files created in the directory `path` from now on
/// (subdirectories made later inherit it); unset fields of `layout` are inherited from the
/// cluster then. A file's layout is fixed when it is created: a file gives EEXIST. 0 or -1
/// (EINVAL: a value the cluster does not take, e.g. more servers than it has).
#[no_mangle]
pub extern "C" fn shoal_set_layout(c: *const shoal_client, path: *const c_char, layout: *const shoal_layout) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        let Some(spec) = spec_at(path, layout) else { return -1 };
        status(c.block(c.client.set_layout(path, spec)))
    })
}

/// Mark the file or directory `path` read-mostly (`on` non-zero) or clear the mark
/// (docs/loading.md): clients list a read-mostly directory whole and answer look-ups in it,
/// missing names included, from that listing; what is created in it inherits the mark.
/// Not recursive. 0 or -1 (EPERM: not the owner; ENOTSUP: a server that predates it).
#[no_mangle]
pub extern "C" fn shoal_set_read_mostly(c: *const shoal_client, path: *const c_char, on: c_int) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        status(c.block(c.client.set_read_mostly(path, on != 0)).map(|_| ()))
    })
}

/// 1 if `path` (following a final symbolic link) is marked read-mostly, 0 if not, -1 on
/// failure.
#[no_mangle]
pub extern "C" fn shoal_is_read_mostly(c: *const shoal_client, path: *const c_char) -> c_int {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        c.block(c.client.stat(path)).map_or(-1, |a| c_int::from(a.read_mostly))
    })
}

/// The layout of `path` (following a final symbolic link) into `*out`. For a file: its
/// stripe size, stripe count, first server and replica count, and the ids of the servers holding objects
/// 0, 1, … into `servers` (capacity `cap`); returns their number (at least 1). For a
/// directory: its default for new files (unset fields as unset); returns 0. -1 on failure
/// (ERANGE: more servers than `cap`, nothing written; a `cap` of 0 only asks for the
/// number, and `servers` may then be NULL).
#[no_mangle]
pub extern "C" fn shoal_get_layout(
    c: *const shoal_client,
    path: *const c_char,
    out: *mut shoal_layout,
    servers: *mut u32,
    cap: usize,
) -> isize {
    guard(-1, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return -1 };
        let Some(out) = Out::new(out, "the shoal_layout to fill") else { return -1 };
        let Some(servers) = server_slots(servers, cap) else { return -1 };
        let Some(a) = c.block(c.client.stat(path)) else { return -1 };
        match put_layout(&a, out, &servers) {
            Ok(n) => n as isize,
            Err(m) => {
                fail(libc::ERANGE, m);
                -1
            }
        }
    })
}

fn server_slots(servers: *mut u32, cap: usize) -> Option<Slots<u32>> {
    Slots::new(servers, cap, "the array of server ids", "server ids")
}

/// Create the file `path` with `layout` (NULL: the directory's default) and open it:
/// open(2)'s `flags` (O_CREAT implied; with O_EXCL, EEXIST if it exists) and `mode`, as
/// `shoal_open`. The layout applies only if the file is created: an existing file keeps its
/// own (use O_EXCL to be sure). NULL on failure (errno set).
#[no_mangle]
pub extern "C" fn shoal_create(
    c: *const shoal_client,
    path: *const c_char,
    flags: c_int,
    mode: u32,
    layout: *const shoal_layout,
) -> *mut shoal_file {
    guard(std::ptr::null_mut(), || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return std::ptr::null_mut() };
        let Some(how) = create_flags(path, flags, mode, layout) else { return std::ptr::null_mut() };
        match c.block(c.client.open(path, how)) {
            Some(f) => shoal_file::new(f, c.rt.handle().clone()),
            None => std::ptr::null_mut(),
        }
    })
}

/// `shoal_set_layout` as a future (`*layout` is copied before this returns). Result: 0 or
/// -errno.
#[no_mangle]
pub extern "C" fn shoal_set_layout_async(
    c: *const shoal_client,
    path: *const c_char,
    layout: *const shoal_layout,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(NONE, || {
        let Some(p) = text(path, "the path") else { return NONE };
        let Some(spec) = spec_at(p, layout) else { return NONE };
        on_paths(c, [(path, "the path")], cb, user, |cl, [p]| async move { cl.set_layout(&p, spec).await })
    })
}

/// `shoal_get_layout` as a future: `*out` and `servers` are written when it completes
/// (before the callback) and must stay valid until then. Result: the number of servers (0
/// for a directory), or -errno (-ERANGE: more than `cap`, nothing written).
#[no_mangle]
pub extern "C" fn shoal_get_layout_async(
    c: *const shoal_client,
    path: *const c_char,
    out: *mut shoal_layout,
    servers: *mut u32,
    cap: usize,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(NONE, || {
        let Some(out) = Out::new(out, "the shoal_layout to fill") else { return NONE };
        let Some(servers) = server_slots(servers, cap) else { return NONE };
        let call = |cl: Client, [p]: [String; 1]| async move { cl.stat(&p).await };
        on_paths_then(c, [(path, "the path")], cb, user, call, move |a| match put_layout(&a, out, &servers) {
            Ok(n) => n as i64,
            Err(_) => -(libc::ERANGE as i64),
        })
    })
}

/// `shoal_create` as a future (`*layout` is copied before this returns); the new
/// `shoal_file *` goes into `*out` when it completes with 0. Result: 0 or -errno.
#[no_mangle]
pub extern "C" fn shoal_create_async(
    c: *const shoal_client,
    path: *const c_char,
    flags: c_int,
    mode: u32,
    layout: *const shoal_layout,
    out: *mut *mut shoal_file,
    cb: shoal_callback,
    user: *mut c_void,
) -> *mut shoal_future {
    guard(NONE, || {
        let (Some(c), Some(path)) = (client(c), text(path, "the path")) else { return NONE };
        let Some(how) = create_flags(path, flags, mode, layout) else { return NONE };
        open_as_future(c, path, how, out, cb, user)
    })
}
