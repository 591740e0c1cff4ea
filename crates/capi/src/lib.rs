//! `libshoal`: Shoal's native client for C (docs/c-api.md; the header `shoal.h` is
//! generated from this crate by `build.rs`).
//!
//! Every call exists in a blocking form and in an asynchronous form that returns a future
//! (`future.rs`). Conventions, for every function:
//!
//! * **Errors**: a call that fails returns -1 (or NULL), sets `errno`, and keeps a message
//!   naming the cause for the calling thread (`shoal_last_error`). `errno` and the message
//!   are left alone by calls that succeed.
//! * **No panic crosses the boundary**: each entry point runs inside `guard`, which turns a
//!   panic into EIO with the panic's message.
//! * **Threads**: a `shoal_client` and its files may be used from any number of threads at
//!   once. Completion callbacks run on one of the client's runtime threads; they must not
//!   call a blocking function of the library (that fails with EDEADLK) and should return
//!   quickly.

// The entry points are called from C, where every function trusts its pointer arguments:
// each checks them for NULL (EFAULT) and otherwise relies on the caller, as a C library
// does. Marking them `unsafe fn` would change nothing for C callers.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

mod changes;
mod checkpoint;
mod client;
mod dir;
mod du;
mod error;
mod file;
mod find;
mod future;
mod layout;
mod list_io;
mod meta;
mod meta_async;
mod out;
mod path_async;
mod tuples;

pub use changes::*;
pub use checkpoint::*;
pub use client::*;
pub use dir::*;
pub use du::*;
pub use error::*;
pub use file::*;
pub use find::*;
pub use future::*;
pub use layout::*;
pub use meta::*;
pub use tuples::*;
