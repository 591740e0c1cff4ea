//! `shoal bench`: IOR- and mdtest-style benchmarks that run the same workload on the native
//! Shoal client, a Shoal FUSE mount (plain, or through the interception library), a local directory and tmpfs, side by side, and report
//! the servers' own counters (requests and bytes per operation per server, load balance).
//!
//! * [`spec`]: targets and workloads (IOR and mdtest parameters), sent to workers as JSON.
//! * [`worker`]: one benchmark process (a rank); `shoal bench worker` runs it.
//! * [`driver`]: the parent: starts the workers, runs phases in lock step, reads counters.
//! * [`link`]: the transports between the driver and the workers (pipes, TCP, in-process).
//! * [`mpi`]: under `mpirun`, every rank is a worker: rendezvous, clock offsets.
//! * [`counters`]: differences of the servers' counters and the FPFS load figures.
//! * [`report`], [`plot`]: tables, JSON, SVG/PNG charts. [`suite`]: the standard set.
//! * [`timeline`]: when operations complete, and the rate of a phase's first and last tenth.
//! * [`listing`]: the md `list` phase's check that every name is listed exactly once.
//! * [`preload`]: where the interception and audit libraries are.
//! * [`container`]: `shoal bench container`, task-local files against containers.
//! * [`http`]: `shoal bench http`, GETs from a server's HTTP port against the native client.
//! * [`load`]: `shoal bench load`, a Pynamic-style job start with and without the coop group.
//! * [`mounts`]: FUSE mounts seen from outside (is it mounted, unmount, reap its process).
//! * [`cli`]: the clap definitions used by the `shoal` binary.

pub mod ckpt;
pub mod cli;
pub mod clock;
pub mod container;
pub mod counters;
pub mod driver;
pub mod find;
pub mod hist;
pub mod http;
pub mod import;
pub mod link;
pub mod listing;
pub mod load;
pub mod mounts;
pub mod mpi;
pub mod pattern;
pub mod plot;
pub mod preload;
pub mod report;
pub mod spec;
pub mod suite;
pub mod timeline;
pub mod watch;
pub mod worker;

pub use cli::{run, BenchCmd, UsageError};
