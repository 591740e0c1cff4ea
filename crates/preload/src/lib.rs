//! Shoal's interception library: `LD_PRELOAD=libshoal_preload.so program` serves the
//! program's file calls on paths below a Shoal FUSE mount with the native client, in the
//! program's own process, instead of through the kernel and the mount's daemon.
//!
//! **Correctness never depends on it.** Anything the library does not serve goes to the C
//! library, hence to the kernel and the mount: paths outside Shoal, flags it does not
//! know, paths that leave Shoal through a symbolic link or `..`, and on a Shoal
//! descriptor every call only the kernel can do (mmap, locks, extended attributes,
//! ioctls, `fdopen`...), for which the descriptor is first turned into a real descriptor of
//! the same file on the mount, at the same offset (`open_file::convert`). So does every
//! descriptor before `fork` and `exec`, so that parent and child share offsets through
//! the kernel and an exec'd program inherits real descriptors.
//!
//! How a call travels (`docs/preload.md` has the user's view):
//!
//! * **Interceptors** (`intercept/*.rs`, one file per family of calls) are the exported C
//!   symbols. Each first tells cheaply whether the call is Shoal's — a descriptor in the
//!   table (`fd_table.rs`), a path below a mount (`mounts.rs`) — and otherwise calls the
//!   C library's own function (`real.rs`) at once. A Shoal call runs through
//!   `guard::serve`: re-entrancy guard set, panics caught, errno as the kernel would set it.
//! * **Files** are served by the native client (`cluster.rs`: one client per mount, made at
//!   the first call) through handles shared per file within the process (`node.rs`).
//!   Every served descriptor holds a real descriptor number (a placeholder) and maps to an
//!   open file description (`open_file.rs`: offset, status flags, state) shared by its
//!   `dup`s. Directories list through `listing.rs` and `DIR` streams (`dir_stream.rs`).
//! * **Processes** (`fork.rs`): `fork`, `exec`, `posix_spawn`, `system`, `popen` and exit.
//!
//! Calls served cost what the native client's cost: an open is the client's open (one
//! request, or none when a lease answers), a read or write one request per object piece
//! (none for data already prefetched or written behind), a `stat` one request or a cache
//! hit, a `close` of a file that was not written nothing.

// The exported functions are the C library's interface: their contracts are the POSIX ones.
#![allow(clippy::missing_safety_doc)]

mod attrs;
mod cluster;
mod debug;
mod dir_stream;
mod fd_table;
mod fork;
mod guard;
mod intercept;
mod listing;
mod mounts;
mod node;
mod open_file;
mod real;
mod settings;
mod stats;

/// Runs when the library is loaded, before the program's `main` (and usually before any
/// other thread exists): read the settings and the mount table, remember the umask,
/// register the fork handlers.
extern "C" fn on_load() {
    let _g = guard::Guard::enter();
    let s = settings::get();
    if s.stats_file.is_some() {
        stats::enable();
    }
    if !s.enabled {
        return;
    }
    intercept::process::load_umask();
    intercept::stdio::check();
    mounts::load();
    fork::register();
}

/// Runs at `exit` (after the program's `atexit` handlers): flush what was written and
/// wait for the closes in flight.
extern "C" fn on_unload() {
    fork::at_exit();
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;
