//! Real servers, driven through the native client, the `shoal` command, HTTP and raw
//! connections: everything that needs `shoald` processes but no FUSE mount as the main
//! subject, no injected faults and no outside toolchain (docs/testing.md, "Tiers").
//!
//! One test binary per group, so that the harness and the dependencies are linked a
//! handful of times, not once per file; each file below is one subject.

mod append;
mod capabilities;
mod changes;
mod checksums;
mod cli;
mod connections;
mod container;
mod container_tools;
mod du;
mod errors;
mod find;
mod floods;
mod format_upgrade;
mod http;
mod import;
mod leases;
mod list_io;
mod load_placement;
mod membership;
mod namespace;
mod protocol_fuzz;
mod read_mostly;
mod rename_loops;
mod rename_visibility;
mod replicas_layout;
mod sim;
mod split_dirs;
mod striping;
mod tls;
mod trust;
mod tuples;
mod tuples_blocking;
mod wire;
