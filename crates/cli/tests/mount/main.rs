//! The POSIX mount: real FUSE mounts of real clusters, the programs and suites run on them,
//! the interception library and the loader hook (docs/testing.md, "Tiers").
//!
//! One test binary per group, so that the harness and the dependencies are linked a
//! handful of times, not once per file; each file below is one subject.

mod fuse_caching;
mod fuse_failures;
mod fuse_killpriv;
mod fuse_mount;
mod fuse_posix;
mod fuse_programs;
mod fuse_requests;
mod fuse_suites;
mod loader;
mod preload;
mod unlinked_open;
