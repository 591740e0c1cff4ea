//! Shoal's key material and the one primitive everything built on it uses.
//!
//! * A **cluster key** ring (`cluster.key`, made by `shoal keygen` or `shoal cluster up`)
//!   is held by servers only. Knowing it is what makes a process a Shoal server: servers
//!   prove it to each other in `Hello`, and derive from it the keys of per-open
//!   capabilities.
//! * A **host key** ring (`host.key`) is held by root on client hosts. It is derived from
//!   the cluster key (one-way), so a client host that is broken into does not give away
//!   the servers' key. A process that can read it (the FUSE daemon, root's tools) may act
//!   for any local user, as a MUNGE daemon does.
//!
//! Every authenticator is an HMAC-SHA256 [`tag`] over a domain label and length-prefixed
//! parts, so that a tag made for one purpose can never be replayed for another.
//! docs/security.md gives the threat model; docs/formats.md the key file.

pub mod http_token;
mod key;
mod mac;

pub use key::{KeyError, KeyKind, KeyRing, Secret};
pub use mac::{derive, tag, verify, Tag, TAG_LEN};

/// Make a new cluster key ring at `cluster_key` and its host ring at `host_key` (both mode
/// 0600, replacing what is there): what `shoal cluster up` and test clusters do.
pub fn make_keys(cluster_key: &std::path::Path, host_key: &std::path::Path) -> Result<KeyRing, KeyError> {
    let ring = KeyRing::generate(KeyKind::Cluster);
    ring.save(cluster_key, true)?;
    ring.host_ring().save(host_key, true)?;
    Ok(ring)
}
