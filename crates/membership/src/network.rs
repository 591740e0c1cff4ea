//! Raft's messages over whatever carries them between servers: the group hands an encoded
//! message of a `kind` to a [`RaftTransport`] (the server sends it as `Op::Raft` on its peer
//! connections) and the receiving group decodes it in [`crate::MapGroup::handle`].

use crate::detector::Heard;
use crate::TypeConfig;
use futures::future::BoxFuture;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::EmptyNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// `AppendEntries` (also the leader's heartbeat).
pub const KIND_APPEND: u8 = 1;
/// `RequestVote`.
pub const KIND_VOTE: u8 = 2;
/// A chunk of a snapshot.
pub const KIND_SNAPSHOT: u8 = 3;
/// A proposal forwarded to the leader by a member that is not.
pub const KIND_PROPOSE: u8 = 4;
/// The failure detector's ping: answered by any member, started or not.
pub const KIND_PING: u8 = 5;

/// Why a message did not reach its target's group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Undelivered {
    /// What happened, for the log.
    pub reason: String,
    /// The target's host refused the connection: nothing listens at its address, so the
    /// server is dead (or not started), not merely slow or cut off. The failure detector
    /// marks such a server down sooner (`[membership] refused_down_after_ms`).
    pub refused: bool,
}

impl Undelivered {
    /// A failure that says nothing about whether the target is alive.
    pub fn other(reason: impl Into<String>) -> Undelivered {
        Undelivered { reason: reason.into(), refused: false }
    }
}

impl std::fmt::Display for Undelivered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// What carries the group's messages to another server.
pub trait RaftTransport: Send + Sync + 'static {
    /// Deliver `payload` of `kind` to server `target`'s group and return its answer (what
    /// that group's `handle` returned), or why not, within `timeout`.
    fn call(
        &self,
        target: u32,
        kind: u8,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Vec<u8>, Undelivered>>;
}

#[derive(Debug)]
struct Failed(String);

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failed {}

/// Makes a [`Peer`] per target for openraft.
pub struct Network {
    pub transport: Arc<dyn RaftTransport>,
    pub heard: Arc<Heard>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, _node: &EmptyNode) -> Peer {
        Peer { target: target as u32, transport: self.transport.clone(), heard: self.heard.clone() }
    }
}

/// One target server.
pub struct Peer {
    target: u32,
    transport: Arc<dyn RaftTransport>,
    heard: Arc<Heard>,
}

impl Peer {
    /// One exchange. The answer is the remote `Result` itself, so that an error of the
    /// remote Raft (a higher vote, a fatal error) reaches openraft as a remote error, and
    /// a failure to deliver as "unreachable" (openraft then backs off from that target).
    async fn exchange<Req, Resp, E>(
        &self,
        kind: u8,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<u64, EmptyNode, RaftError<u64, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let payload = rmp_serde::to_vec_named(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let answer = match self.transport.call(self.target, kind, payload, option.hard_ttl()).await {
            Ok(a) => a,
            Err(u) => {
                if u.refused {
                    self.heard.refused(self.target);
                }
                return Err(RPCError::Unreachable(Unreachable::new(&Failed(u.reason))));
            }
        };
        self.heard.heard(self.target);
        let res: Result<Resp, RaftError<u64, E>> =
            rmp_serde::from_slice(&answer).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target as u64, e)))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, EmptyNode, RaftError<u64>>> {
        self.exchange(KIND_APPEND, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RPCError<u64, EmptyNode, RaftError<u64, InstallSnapshotError>>> {
        self.exchange(KIND_SNAPSHOT, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, EmptyNode, RaftError<u64>>> {
        self.exchange(KIND_VOTE, &rpc, &option).await
    }
}
