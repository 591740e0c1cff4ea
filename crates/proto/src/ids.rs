//! Identifiers shared by all components. Newtypes so that a server id can never be passed
//! where an inode number is expected.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Identifies one `shoald` in the cluster map. Stable for the server's lifetime; never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServerId(pub u32);

impl fmt::Display for ServerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}

/// Inode number. Cluster-wide unique; its home server (where the inode record and, for a
/// directory, its entries live) is computed from it by the placement function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Ino(pub u64);

impl fmt::Display for Ino {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// The root directory. It exists from the first start of its home server on.
pub const ROOT_INO: Ino = Ino(1);
