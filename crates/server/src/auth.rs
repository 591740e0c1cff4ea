//! Who is at the other end of a connection: the server's side of the `Hello` /
//! `Authenticate` exchange (tags in `shoal_rpc::auth`), and what each role may do.
//!
//! Invariants: under `auth = "keys"` a connection has no role until its `Authenticate`
//! verified; `Peer*` operations run only on connections authenticated as peers; a user's
//! requests run with the identity its credential proved, whatever `cred` they state. Under
//! `auth = "none"` (explicit) every connection is trusted as before: the stated `cred` is
//! believed and peer operations are served.

use crate::net::RateLog;
use crate::state::State;
use shoal_auth::KeyRing;
use shoal_proto::auth::{HelloAuth, Role, ServerProof, NONCE_LEN};
use shoal_proto::msg::{Cred, Op, Request};
use shoal_proto::Errno;
use shoal_rpc::auth::{nonce, now_secs, role_key, Transcript};
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};

/// What a connection is allowed, settled in its handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnAuth {
    /// `auth = "none"`: trusted as before authentication existed.
    Open,
    /// Said `Hello` without claiming a role: may do nothing else.
    Unauthenticated,
    /// Proved the cluster key: another server.
    Peer,
    /// Proved the host key: root on a client host, may state any credentials.
    Host,
    /// Presented a user credential: bound to this identity.
    User(Cred),
}

/// The server's half of a handshake that claimed a role, kept until `Authenticate`.
pub struct Challenge {
    role: Role,
    connector_nonce: Vec<u8>,
    server_nonce: Vec<u8>,
    epoch: u32,
    ring: Arc<KeyRing>,
}

impl Challenge {
    pub fn role(&self) -> Role {
        self.role
    }

    fn transcript(&self, st: &State) -> Transcript<'_> {
        Transcript {
            server: st.id,
            role: self.role,
            connector_nonce: &self.connector_nonce,
            server_nonce: &self.server_nonce,
            epoch: self.epoch,
        }
    }
}

/// What answers a `Hello`: the proof for the reply, and the challenge its `Authenticate`
/// must meet; or, without a role claimed, the connection's (final) standing.
pub enum HelloAnswer {
    Settled(ConnAuth),
    Challenge(ServerProof, Challenge),
}

/// Answer the authentication part of a `Hello`. The key epoch is the connector's newest if
/// this server holds it (so either side may be rotated first), else this server's current.
pub fn answer_hello(st: &State, claim: Option<HelloAuth>) -> Result<HelloAnswer, String> {
    let Some(ring) = st.key_ring() else { return Ok(HelloAnswer::Settled(ConnAuth::Open)) };
    let Some(claim) = claim else { return Ok(HelloAnswer::Settled(ConnAuth::Unauthenticated)) };
    if claim.nonce.len() != NONCE_LEN {
        return Err(format!("the Hello's nonce has {} bytes, not {NONCE_LEN}", claim.nonce.len()));
    }
    let epoch = if ring.get(claim.epoch).is_some() { claim.epoch } else { ring.current().0 };
    let ch = Challenge { role: claim.role, connector_nonce: claim.nonce, server_nonce: nonce(), epoch, ring };
    let key = role_key(&ch.ring, ch.role, epoch).expect("the epoch is in the ring");
    let proof = ch.transcript(st).server_tag(&key).to_vec();
    Ok(HelloAnswer::Challenge(ServerProof { nonce: ch.server_nonce.clone(), epoch, proof }, ch))
}

/// Check the connector's `Authenticate` against the challenge: the connection's role, or
/// why it has none (a line for the log and the connector).
pub fn check(st: &State, ch: &Challenge, op: Op) -> Result<ConnAuth, String> {
    let Op::Authenticate { epoch, proof, credential } = op else {
        return Err(format!("sent {} where Authenticate was due", op.name()));
    };
    if epoch != ch.epoch {
        return Err(format!("authenticated with key epoch {epoch}, the Hello was answered with {}", ch.epoch));
    }
    let key = role_key(&ch.ring, ch.role, epoch).expect("the epoch is in the ring");
    let t = ch.transcript(st);
    match ch.role {
        Role::Peer | Role::Host => {
            let which = if ch.role == Role::Peer { "cluster" } else { "host" };
            match proof {
                Some(p) if t.verify_connector(&key, &p) => {
                    Ok(if ch.role == Role::Peer { ConnAuth::Peer } else { ConnAuth::Host })
                }
                Some(_) => Err(format!("failed to prove the {which} key (epoch {epoch}): it holds another key")),
                None => Err(format!("claimed to be a {} but sent no proof", ch.role.name())),
            }
        }
        Role::User => match credential {
            Some(c) => t.check_credential(&key, &c, now_secs()).map(ConnAuth::User),
            None => Err("claimed to be a user but sent no credential".into()),
        },
    }
}

/// Peer-only requests refused on other connections: logged at most once per interval.
static PEER_REFUSALS: LazyLock<RateLog> = LazyLock::new(RateLog::new);
static UNAUTHENTICATED: LazyLock<RateLog> = LazyLock::new(RateLog::new);

impl ConnAuth {
    /// Whether the connection may send `req`, with a user's credentials put in place of
    /// what the request states. `Err`: the errno and why it is refused (EACCES before
    /// authentication, EPERM for a peer-only request from a client).
    pub fn admit(&self, req: &mut Request, addr: SocketAddr) -> Result<(), (Errno, String)> {
        let name = req.op.name();
        let who = match self {
            ConnAuth::Open | ConnAuth::Peer => return Ok(()),
            ConnAuth::Unauthenticated => {
                let msg = format!(
                    "{name} refused: this connection did not authenticate (the server requires a key proof in Hello)"
                );
                UNAUTHENTICATED.warn(|| format!("connection from {addr}: {msg}"));
                return Err((Errno::EACCES, msg));
            }
            ConnAuth::Host => "a client host".to_string(),
            ConnAuth::User(c) => format!("user uid {}", c.uid),
        };
        if req.op.is_peer() {
            let msg = format!("{name} refused: only servers may send it, and this connection authenticated as {who}");
            PEER_REFUSALS.warn(|| format!("connection from {addr}: {msg}"));
            return Err((Errno::EPERM, msg));
        }
        if let ConnAuth::User(c) = self {
            req.cred = c.clone();
        }
        Ok(())
    }

    /// Authenticated as another server (its requests count as peer traffic).
    pub fn is_peer(&self) -> bool {
        *self == ConnAuth::Peer
    }
}
