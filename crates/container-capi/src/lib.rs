//! `libshoal_container`: task-local I/O containers for C (docs/containers-c.md), with
//! calls that mirror SIONlib's so that porting a SIONlib program is mechanical. The header
//! `shoal_container.h` is generated from this crate by `build.rs`; the MPI adapter,
//! `shoal_container_mpi.h`, is header-only (compiled by the application's `mpicc`, so this
//! library never links MPI).
//!
//! * `comm.rs`: `shoal_comm`, the generic communication interface as C callbacks, and its
//!   adapter to the container's `Comm`.
//! * `par.rs`: collective open and close; `handle.rs`: the handle and the calls on a
//!   logical file (fwrite, fread, seek, …); `keyval.rs`: key-value records and the
//!   collective reads and writes through collectors; `serial.rs`: the serial API.
//! * `runtime.rs`: the process's runtime, blocking on it from C, and container names
//!   (`shoal://` or host paths).
//!
//! Conventions, as libshoal's (docs/c-api.md): a call that fails returns -1 (or NULL, or
//! 0 items) and sets `errno`, with a message for the calling thread
//! (`shoal_container_last_error`); no panic crosses the boundary (`guard`: EIO).

// The entry points are called from C, where every function trusts its pointer arguments:
// each checks them for NULL (EFAULT) and otherwise relies on the caller, as a C library
// does. Marking them `unsafe fn` would change nothing for C callers.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

mod comm;
mod error;
mod handle;
mod keyval;
mod par;
mod runtime;
mod serial;

pub use comm::*;
pub use error::*;
pub use handle::*;
pub use keyval::*;
pub use par::*;
pub use serial::*;

#[cfg(test)]
mod tests;
