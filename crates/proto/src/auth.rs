//! The wire side of authentication in `Hello` (docs/protocol.md, "Authentication"; the
//! tags themselves are computed in `shoal_rpc::auth`).
//!
//! The connector's `Hello` carries [`HelloAuth`] (who it claims to be and a fresh nonce);
//! the server's `Hello` reply carries [`ServerProof`] (its own fresh nonce and a tag proving
//! it holds the key of that role); the connector then sends `Op::Authenticate` with its tag
//! (peers and hosts) or a [`UserCredential`] from the local identity helper (users). Only
//! after the server has checked it does the connection get its role.

use serde::{Deserialize, Serialize};

/// Bytes of every nonce, on both sides.
pub const NONCE_LEN: usize = 32;

/// Who a connector claims to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Another server: proves the cluster key. May send `Peer*` operations.
    Peer,
    /// A root process on a client host (the FUSE daemon, root's `shoal`): proves the host
    /// key. May state any credentials per request.
    Host,
    /// An unprivileged process: presents a credential from the local identity helper and is
    /// bound to the identity it proves.
    User,
}

impl Role {
    /// The byte standing for the role inside tags.
    pub fn byte(self) -> u8 {
        match self {
            Role::Peer => 1,
            Role::Host => 2,
            Role::User => 3,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Peer => "peer",
            Role::Host => "host",
            Role::User => "user",
        }
    }
}

/// In `Op::Hello`: the role claimed, the connector's nonce, and the newest key epoch the
/// connector holds (0: any; the server then signs with its current epoch).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloAuth {
    pub role: Role,
    pub nonce: Vec<u8>,
    pub epoch: u32,
}

/// In `Reply::Hello`: the server's nonce, the key epoch it signed with, and its tag.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerProof {
    pub nonce: Vec<u8>,
    pub epoch: u32,
    pub proof: Vec<u8>,
}

/// A user's proof of identity, made by the identity helper of the user's host (which holds
/// the host key and learnt the uid from the kernel, `SO_PEERCRED`) for one connection: the
/// tag binds the server, both nonces of that connection's `Hello` and an expiry, so it is
/// worth nothing on any other connection or after `expires`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserCredential {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// Seconds since the Unix epoch after which the server refuses it.
    pub expires: u64,
    /// Host key epoch of the tag.
    pub epoch: u32,
    pub tag: Vec<u8>,
}
