//! Servers that die, stall, fill up or are cut off: `kill -9` at every step, failover and
//! resync, history runs under faults, partitions in a network lab (docs/testing.md, "Tiers").
//!
//! One test binary per group, so that the harness and the dependencies are linked a
//! handful of times, not once per file; each file below is one subject.

mod crash;
mod failover;
mod full_disk;
mod history;
mod partition;
mod replication;
mod resync;
mod scrub_repair;
mod slots;
mod step_crashes;
mod truncate_crash;
