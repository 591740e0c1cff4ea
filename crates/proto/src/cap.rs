//! Per-open capabilities (FPFS's "secrets"): what a client shows a data server to prove
//! that the inode's home server let it open the file.
//!
//! The home server of an inode makes one after its permission check (in the reply to
//! `Create` and to `Open`); the client sends it with every `Read`, `Write`, `Append` and
//! `Fsync` of that file, to whichever server holds the object; that server verifies the
//! tag with the key it shares with the other servers and refuses (`EACCES`) a missing,
//! forged or expired capability, one of another inode, or a read-only one used to write.
//! The tag is made and checked by `shoal-server` (`caps.rs`); this crate only carries it.

use crate::Ino;
use serde::{Deserialize, Serialize};

/// The capability allows reading the file's objects.
pub const RIGHT_READ: u8 = 1;
/// The capability allows writing (and appending to) the file's objects.
pub const RIGHT_WRITE: u8 = 2;

/// A capability. Every field but `tag` is authenticated by `tag`, an HMAC-SHA256 under the
/// key derived for capabilities from the cluster key of epoch `epoch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    pub ino: Ino,
    /// `RIGHT_READ` | `RIGHT_WRITE`.
    pub rights: u8,
    /// When it was made, in seconds since the Unix epoch (server clock): with `expires`,
    /// how long it lives, which clients use to renew it in time whatever their clock says.
    pub issued: u64,
    /// Last second (Unix time, server clock) it is accepted in.
    pub expires: u64,
    /// Epoch of the cluster key it was made with (see `shoal keygen --rotate`).
    pub epoch: u32,
    /// HMAC-SHA256 over the fields above.
    pub tag: Vec<u8>,
}

impl Capability {
    pub fn allows(&self, rights: u8) -> bool {
        self.rights & rights == rights
    }

    /// How long it lives, in seconds.
    pub fn lifetime_secs(&self) -> u64 {
        self.expires.saturating_sub(self.issued)
    }
}

/// Ends the message of an `EACCES` that a fresh capability would cure (an expired one, or
/// one made with a key epoch the server has retired): a client that sees it renews its
/// capability at the inode's home and retries the operation once.
pub const RENEW_HINT: &str = "(renew the capability)";

/// Whether a refusal's message says the capability only needs renewing.
pub fn is_renewable(message: &str) -> bool {
    message.ends_with(RENEW_HINT)
}
