//! Asking servers to verify what they store (`shoal scrub`): start a server's background
//! scrub and follow its progress.

use crate::client::{unexpected, Client, To};
use crate::error::Result;
use bytes::Bytes;
use shoal_proto::msg::{Op, Reply, ScrubStatus};
use shoal_proto::ServerId;

impl Client {
    /// Start a scrub on `server` (a scrub already running goes on) and return its status.
    pub async fn scrub_start(&self, server: ServerId) -> Result<ScrubStatus> {
        self.scrub_call(server, Op::ScrubStart).await
    }

    /// The status of the current or last scrub on `server`.
    pub async fn scrub_status(&self, server: ServerId) -> Result<ScrubStatus> {
        self.scrub_call(server, Op::ScrubStatus).await
    }

    async fn scrub_call(&self, server: ServerId, op: Op) -> Result<ScrubStatus> {
        match self.call(To::Server(server), op, Bytes::new()).await {
            Ok((Reply::Scrub(s), _)) => Ok(s),
            Ok((other, _)) => Err(unexpected(&other)),
            Err(e) => Err(e),
        }
        .map_err(|e| e.within(format_args!("scrub on server {server}")))
    }
}
