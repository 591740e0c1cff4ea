//! The replicated cluster map (docs/membership.md): a Raft group ([openraft]) whose state
//! machine is the map document ([`MapDoc`]: the TOML text and its version, the epoch every
//! request names). A few servers vote (`[membership] voters`); every other server follows
//! as a learner, so that every server applies each new map and can [`MapGroup::watch`] it.
//!
//! ```no_run
//! # async fn f(transport: std::sync::Arc<dyn shoal_membership::RaftTransport>) -> anyhow::Result<()> {
//! use shoal_membership::{MapDoc, MapGroup};
//! let doc = MapDoc::new(std::fs::read_to_string("cluster.toml")?).map_err(anyhow::Error::msg)?;
//! let group = MapGroup::start(0, &[0, 1, 2], &[3], "data/raft".as_ref(), doc, transport).await?;
//! let now = group.current();
//! let next = now.toml.replace("version = 1", "version = 2");
//! group.propose(now.version, next).await?;
//! # Ok(()) }
//! ```

pub mod detector;
pub mod doc;
mod group;
pub mod network;
mod store;

pub use doc::{ApplyResult, Command, MapDoc};
pub use group::{GroupStatus, MapGroup, ProposeError, HEARTBEAT_MS};
pub use network::{RaftTransport, Undelivered};

use std::io::Cursor;

openraft::declare_raft_types!(
    /// The group's types: map changes in, their results out; server ids as node ids; no
    /// per-node data (addresses come from the map itself).
    pub TypeConfig:
        D = Command,
        R = ApplyResult,
        NodeId = u64,
        Node = openraft::EmptyNode,
);
