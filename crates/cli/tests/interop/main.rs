//! Shoal with the world's tools: C programs built against the C libraries, `mpirun`, the
//! benchmarks, a browser on the status page, the install step (docs/testing.md, "Tiers").
//!
//! One test binary per group, so that the harness and the dependencies are linked a
//! handful of times, not once per file; each file below is one subject.

mod bench;
mod c_api;
mod container_mpi;
mod install;
mod job;
mod observe;
