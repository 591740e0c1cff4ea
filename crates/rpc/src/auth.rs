//! Authentication of connections: the tags of the `Hello` / `Authenticate` exchange, the
//! connector's side of it, and the messages of the local identity helper (docs/security.md,
//! docs/protocol.md "Authentication").
//!
//! Every tag covers the same *transcript*: the server's id, the role claimed, the
//! connector's nonce, the server's nonce and the key epoch, each under a label of its own
//! (`shoal_auth::tag`), so that no tag can stand in for another: the server's proof cannot
//! be replayed as the connector's, a tag made for one connection (two fresh nonces) is worth
//! nothing on another, and a tag for server 1 is refused by server 2.
//!
//! Keys by role: a *peer* (another server) proves the cluster key; a *host* (root on a
//! client host) proves the host key, derived one-way from the cluster key; a *user* presents
//! a [`UserCredential`] the host's identity helper made with the host key. The server
//! proves the key of the role claimed (the host key to hosts and users; to a user it is the
//! helper that checks the proof, as the user cannot read the key).

use crate::CallError;
use bytes::Bytes;
use shoal_auth::{KeyKind, KeyRing, Secret, Tag};
use shoal_placement::map::AuthMode;
use shoal_placement::ClusterMap;
use shoal_proto::auth::{HelloAuth, Role, ServerProof, UserCredential, NONCE_LEN};
use shoal_proto::frame::Frame;
use shoal_proto::msg::{Cred, Op, Reply, Request};
use shoal_proto::{Errno, ServerId};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const SERVER_LABEL: &str = "shoal hello server";
const CONNECTOR_LABEL: &str = "shoal hello connector";
const CREDENTIAL_LABEL: &str = "shoal user credential";

/// How long a user credential the identity helper makes is accepted. It is bound to one
/// connection's nonces anyway; the expiry only bounds how long a handshake may take.
pub const CREDENTIAL_LIFETIME: Duration = Duration::from_secs(60);
/// Servers refuse credentials that expire further ahead than this (a helper with a wrong
/// clock, or a credential made to last).
pub const CREDENTIAL_MAX_AHEAD: Duration = Duration::from_secs(300);
/// Largest message to or from the identity helper.
const HELPER_MESSAGE_MAX: usize = 1 << 20;

/// A fresh random nonce.
pub fn nonce() -> Vec<u8> {
    Secret::random().bytes()[..NONCE_LEN].to_vec()
}

pub fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// What the tags of one connection's handshake cover.
#[derive(Clone, Copy, Debug)]
pub struct Transcript<'a> {
    pub server: ServerId,
    pub role: Role,
    pub connector_nonce: &'a [u8],
    pub server_nonce: &'a [u8],
    pub epoch: u32,
}

impl Transcript<'_> {
    fn tag(&self, key: &Secret, label: &str, more: &[&[u8]]) -> Tag {
        let (sid, role, epoch) = (self.server.0.to_le_bytes(), [self.role.byte()], self.epoch.to_le_bytes());
        let mut parts: Vec<&[u8]> = vec![&sid, &role, self.connector_nonce, self.server_nonce, &epoch];
        parts.extend_from_slice(more);
        shoal_auth::tag(key, label, &parts)
    }

    fn verify(&self, key: &Secret, label: &str, more: &[&[u8]], candidate: &[u8]) -> bool {
        let (sid, role, epoch) = (self.server.0.to_le_bytes(), [self.role.byte()], self.epoch.to_le_bytes());
        let mut parts: Vec<&[u8]> = vec![&sid, &role, self.connector_nonce, self.server_nonce, &epoch];
        parts.extend_from_slice(more);
        shoal_auth::verify(key, label, &parts, candidate)
    }

    /// The server's proof.
    pub fn server_tag(&self, key: &Secret) -> Tag {
        self.tag(key, SERVER_LABEL, &[])
    }

    pub fn verify_server(&self, key: &Secret, proof: &[u8]) -> bool {
        self.verify(key, SERVER_LABEL, &[], proof)
    }

    /// The connector's proof (peers and hosts).
    pub fn connector_tag(&self, key: &Secret) -> Tag {
        self.tag(key, CONNECTOR_LABEL, &[])
    }

    pub fn verify_connector(&self, key: &Secret, proof: &[u8]) -> bool {
        self.verify(key, CONNECTOR_LABEL, &[], proof)
    }

    /// The tag of a user credential for (uid, gid, groups, expires) on this connection.
    fn credential_tag(&self, key: &Secret, uid: u32, gid: u32, groups: &[u32], expires: u64) -> Tag {
        let groups: Vec<u8> = groups.iter().flat_map(|g| g.to_le_bytes()).collect();
        self.tag(key, CREDENTIAL_LABEL, &[&uid.to_le_bytes(), &gid.to_le_bytes(), &groups, &expires.to_le_bytes()])
    }

    /// A credential for `cred` on this connection, valid for [`CREDENTIAL_LIFETIME`]: what
    /// the identity helper makes, with `key` the host key at `self.epoch`.
    pub fn issue_credential(&self, key: &Secret, cred: &Cred, now: u64) -> UserCredential {
        let expires = now + CREDENTIAL_LIFETIME.as_secs();
        let tag = self.credential_tag(key, cred.uid, cred.gid, &cred.groups, expires);
        UserCredential {
            uid: cred.uid,
            gid: cred.gid,
            groups: cred.groups.clone(),
            expires,
            epoch: self.epoch,
            tag: tag.to_vec(),
        }
    }

    /// The identity a credential proves on this connection, or why it proves none.
    pub fn check_credential(&self, key: &Secret, c: &UserCredential, now: u64) -> Result<Cred, String> {
        if c.expires < now {
            return Err(format!("the user credential expired {} s ago", now - c.expires));
        }
        if c.expires > now + CREDENTIAL_MAX_AHEAD.as_secs() {
            return Err("the user credential expires too far ahead (is the helper's clock right?)".into());
        }
        if c.epoch != self.epoch {
            return Err(format!("the user credential is for key epoch {}, the handshake used {}", c.epoch, self.epoch));
        }
        let groups: Vec<u8> = c.groups.iter().flat_map(|g| g.to_le_bytes()).collect();
        let parts: [&[u8]; 4] = [&c.uid.to_le_bytes(), &c.gid.to_le_bytes(), &groups, &c.expires.to_le_bytes()];
        if !self.verify(key, CREDENTIAL_LABEL, &parts, &c.tag) {
            return Err("the user credential's tag does not verify (made for another connection or host key)".into());
        }
        Ok(Cred { uid: c.uid, gid: c.gid, groups: c.groups.clone() })
    }
}

/// The key a role proves, at `epoch`, from the cluster ring (what a server holds): the
/// cluster key for peers, the host key for hosts and users.
pub fn role_key(cluster: &KeyRing, role: Role, epoch: u32) -> Option<Secret> {
    match role {
        Role::Peer => cluster.get(epoch).cloned(),
        Role::Host | Role::User => cluster.host_ring().get(epoch).cloned(),
    }
}

/// Where a server's pool gets the cluster ring to prove itself with: read at every new
/// connection, so a ring reloaded on SIGHUP is used from then on.
#[derive(Clone)]
pub struct PeerKeys(pub Arc<dyn Fn() -> Option<Arc<KeyRing>> + Send + Sync>);

impl std::fmt::Debug for PeerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerKeys")
    }
}

/// How this process proves who it is, settled per connection.
enum Prover {
    /// A key ring of the role's kind (cluster for peers, host for hosts).
    Key(Role, Arc<KeyRing>),
    /// Ask the identity helper; `why_not_host` says why the host key could not be used.
    Helper { socket: PathBuf, why_not_host: String },
}

/// A role claimed in a `Hello`, with the nonce sent.
pub(crate) struct Claim {
    prover: Prover,
    nonce: Vec<u8>,
}

impl Claim {
    /// What this process claims on a new connection to a server of `map`: `None` under
    /// `auth = "none"`; a peer when the pool has `peer_keys`; a host when the host key is
    /// readable (read each time, so a rotated key file is used at once); else a user.
    pub(crate) fn new(
        map: &ClusterMap,
        peer_keys: Option<&PeerKeys>,
        host_keys: Option<&PeerKeys>,
    ) -> Result<Option<Claim>, CallError> {
        if map.security.auth == AuthMode::None {
            return Ok(None);
        }
        let prover = match peer_keys {
            Some(keys) => match (keys.0)() {
                Some(ring) => Prover::Key(Role::Peer, ring),
                None => return Err(CallError::transport(Errno::EACCES, "this server holds no cluster key")),
            },
            None if host_keys.is_some() => match host_keys.and_then(|keys| (keys.0)()) {
                Some(ring) => Prover::Key(Role::Host, ring),
                None => return Err(CallError::transport(Errno::EACCES, "this server holds no cluster key")),
            },
            None => match KeyRing::load(&map.security.host_key, KeyKind::Host) {
                Ok(ring) => Prover::Key(Role::Host, Arc::new(ring)),
                Err(e) => Prover::Helper { socket: map.security.identity_socket.clone(), why_not_host: e.to_string() },
            },
        };
        Ok(Some(Claim { prover, nonce: nonce() }))
    }

    fn role(&self) -> Role {
        match &self.prover {
            Prover::Key(role, _) => *role,
            Prover::Helper { .. } => Role::User,
        }
    }

    pub(crate) fn hello(&self) -> HelloAuth {
        let epoch = match &self.prover {
            Prover::Key(_, ring) => ring.current().0,
            Prover::Helper { .. } => 0,
        };
        HelloAuth { role: self.role(), nonce: self.nonce.clone(), epoch }
    }

    /// The rest of the exchange, after the server's `Hello` reply: check the server's proof
    /// (or have the helper check it), send `Authenticate`, read its answer. The proof is
    /// sent even when the server's did not verify, so that the server logs the refusal
    /// too (it learns nothing from a tag over two fresh nonces).
    pub(crate) async fn finish<R, W>(
        &self,
        rd: &mut R,
        wr: &mut W,
        server: ServerId,
        addr: &str,
        answer: Option<ServerProof>,
    ) -> Result<(), CallError>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let role = self.role();
        let Some(answer) = answer else {
            return Err(CallError::transport(
                Errno::EACCES,
                format!(
                    "server {server} at {addr} did not prove its key (does it run auth = \"none\" while this side's map says \"keys\"?)"
                ),
            ));
        };
        let t =
            Transcript { server, role, connector_nonce: &self.nonce, server_nonce: &answer.nonce, epoch: answer.epoch };
        let (op, server_ok) = match &self.prover {
            Prover::Key(_, ring) => {
                let Some(key) = ring.get(answer.epoch) else {
                    return Err(CallError::transport(
                        Errno::EACCES,
                        format!(
                            "server {server} at {addr} signs with key epoch {}, this side holds epochs {:?} (key files out of step?)",
                            answer.epoch,
                            ring.epochs()
                        ),
                    ));
                };
                let ok = t.verify_server(key, &answer.proof);
                (
                    Op::Authenticate {
                        epoch: answer.epoch,
                        proof: Some(t.connector_tag(key).to_vec()),
                        credential: None,
                    },
                    ok,
                )
            }
            Prover::Helper { socket, why_not_host } => {
                let req = IdentityRequest {
                    server: server.0,
                    connector_nonce: self.nonce.clone(),
                    server_nonce: answer.nonce.clone(),
                    epoch: answer.epoch,
                    server_proof: answer.proof.clone(),
                };
                let credential = match ask_helper(socket, &req).await {
                    Ok(c) => c,
                    Err(HelperError::Unreachable(e)) => {
                        return Err(CallError::transport(
                            Errno::EACCES,
                            format!(
                                "cannot prove who you are: {why_not_host} and no identity helper answers at {} ({e})",
                                socket.display()
                            ),
                        ))
                    }
                    Err(HelperError::Refused(e)) => {
                        return Err(CallError::transport(
                            Errno::EACCES,
                            format!("the identity helper at {} refused: {e}", socket.display()),
                        ))
                    }
                };
                (Op::Authenticate { epoch: answer.epoch, proof: None, credential: Some(credential) }, true)
            }
        };
        let req = Request { cred: Cred::root(), map_version: 0, op };
        let f = Frame::request(0, &req, Bytes::new())
            .map_err(|e| CallError::transport(Errno::EPROTO, format!("cannot encode Authenticate: {e}")))?;
        f.write_to(wr).await.map_err(|e| crate::read_error(e, " during authentication"))?;
        let reply = Frame::read_from(rd).await.map_err(|e| crate::read_error(e, " during authentication"));
        if !server_ok {
            tracing::warn!(
                "server {server} at {addr} failed to prove the {} key (epoch {}): refusing it; is its cluster key ours?",
                if role == Role::Peer { "cluster" } else { "host" },
                answer.epoch
            );
            return Err(CallError::transport(
                Errno::EACCES,
                format!(
                    "server {server} at {addr} failed to prove the {} key: it does not hold this cluster's key",
                    if role == Role::Peer { "cluster" } else { "host" }
                ),
            ));
        }
        // A server that refuses says so (`Error` with EACCES) before it closes; one that closes
        // without a word is going away (stopping, opening again in its process), and a
        // failover retries such a call: not a refusal (seen: a rename failed with EACCES
        // when the server it needed was restarting, docs/testing.md).
        let reply = reply?.ok_or_else(|| {
            CallError::transport(
                Errno::ENOTCONN,
                format!("server {server} at {addr} closed the connection during authentication"),
            )
        })?;
        match reply.reply_body().map_err(|e| crate::read_error(e, " in the Authenticate reply"))? {
            Reply::Ok => Ok(()),
            Reply::Error { errno, message } => Err(CallError::Server { errno, message }),
            other => Err(CallError::transport(Errno::EPROTO, format!("unexpected reply to Authenticate: {other:?}"))),
        }
    }
}

// ---- the local identity helper (`shoal identityd`) ----

/// What a client asks the identity helper: a credential for the connection whose `Hello`
/// exchange these are. The helper checks `server_proof` (so a user's client also knows it
/// reached a real server) and learns the uid from the kernel, never from this message.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IdentityRequest {
    pub server: u32,
    pub connector_nonce: Vec<u8>,
    pub server_nonce: Vec<u8>,
    pub epoch: u32,
    pub server_proof: Vec<u8>,
}

/// The helper's answer: a credential, or why not.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum IdentityAnswer {
    Credential(UserCredential),
    Refused(String),
}

impl IdentityRequest {
    /// The helper's work, given the host ring and the caller's identity as the kernel gave
    /// it: check the server's proof, then make the credential.
    pub fn answer(&self, host: &KeyRing, caller: &Cred, now: u64) -> IdentityAnswer {
        let Some(key) = host.get(self.epoch) else {
            return IdentityAnswer::Refused(format!(
                "the server signs with host key epoch {}, this host holds {:?}",
                self.epoch,
                host.epochs()
            ));
        };
        if self.connector_nonce.len() != NONCE_LEN || self.server_nonce.len() != NONCE_LEN {
            return IdentityAnswer::Refused("nonces must be 32 bytes".into());
        }
        let t = Transcript {
            server: ServerId(self.server),
            role: Role::User,
            connector_nonce: &self.connector_nonce,
            server_nonce: &self.server_nonce,
            epoch: self.epoch,
        };
        if !t.verify_server(key, &self.server_proof) {
            return IdentityAnswer::Refused(format!(
                "server {} failed to prove the host key: it is not a server of this cluster",
                self.server
            ));
        }
        IdentityAnswer::Credential(t.issue_credential(key, caller, now))
    }
}

/// Write one helper message: a 4-byte little-endian length, then MessagePack.
pub async fn write_message<W: AsyncWrite + Unpin, T: serde::Serialize>(w: &mut W, m: &T) -> std::io::Result<()> {
    let body = rmp_serde::to_vec_named(m).map_err(std::io::Error::other)?;
    w.write_all(&(body.len() as u32).to_le_bytes()).await?;
    w.write_all(&body).await?;
    w.flush().await
}

/// Read one helper message (at most [`HELPER_MESSAGE_MAX`] bytes).
pub async fn read_message<R: AsyncRead + Unpin, T: serde::de::DeserializeOwned>(r: &mut R) -> std::io::Result<T> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = u32::from_le_bytes(len) as usize;
    if len > HELPER_MESSAGE_MAX {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("a message of {len} bytes")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    rmp_serde::from_slice(&body).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

enum HelperError {
    /// Nothing answers at the socket (or it broke off).
    Unreachable(String),
    /// The helper answered no.
    Refused(String),
}

/// How long the helper may take to answer.
const HELPER_TIMEOUT: Duration = Duration::from_secs(5);

async fn ask_helper(socket: &Path, req: &IdentityRequest) -> Result<UserCredential, HelperError> {
    let exchange = async {
        let mut s = tokio::net::UnixStream::connect(socket).await?;
        write_message(&mut s, req).await?;
        read_message::<_, IdentityAnswer>(&mut s).await
    };
    match tokio::time::timeout(HELPER_TIMEOUT, exchange).await {
        Ok(Ok(IdentityAnswer::Credential(c))) => Ok(c),
        Ok(Ok(IdentityAnswer::Refused(why))) => Err(HelperError::Refused(why)),
        Ok(Err(e)) => Err(HelperError::Unreachable(e.to_string())),
        Err(_) => Err(HelperError::Unreachable(format!("no answer within {HELPER_TIMEOUT:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript<'a>(role: Role, cn: &'a [u8], sn: &'a [u8]) -> Transcript<'a> {
        Transcript { server: ServerId(1), role, connector_nonce: cn, server_nonce: sn, epoch: 1 }
    }

    #[test]
    fn proofs_are_bound_to_role_server_nonces_and_direction() {
        let ring = KeyRing::generate(KeyKind::Cluster);
        let key = ring.get(1).unwrap();
        let (cn, sn) = (nonce(), nonce());
        let t = transcript(Role::Peer, &cn, &sn);
        let p = t.connector_tag(key);
        assert!(t.verify_connector(key, &p));
        assert!(!t.verify_server(key, &p), "a connector's tag is not a server's");
        assert!(!transcript(Role::Host, &cn, &sn).verify_connector(key, &p), "another role");
        assert!(!transcript(Role::Peer, &cn, &nonce()).verify_connector(key, &p), "another connection");
        assert!(!Transcript { server: ServerId(2), ..t }.verify_connector(key, &p), "another server");
        assert!(!t.verify_connector(&KeyRing::generate(KeyKind::Cluster).current().1.clone(), &p), "another key");
    }

    #[test]
    fn a_user_credential_proves_its_identity_on_its_connection_only_and_not_for_long() {
        let ring = KeyRing::generate(KeyKind::Cluster);
        let host = role_key(&ring, Role::User, 1).unwrap();
        let (cn, sn) = (nonce(), nonce());
        let t = transcript(Role::User, &cn, &sn);
        let who = Cred { uid: 1000, gid: 100, groups: vec![100, 27] };
        let req = IdentityRequest {
            server: 1,
            connector_nonce: cn.clone(),
            server_nonce: sn.clone(),
            epoch: 1,
            server_proof: t.server_tag(&host).to_vec(),
        };
        let IdentityAnswer::Credential(c) = req.answer(&ring.host_ring(), &who, 1000) else { panic!("refused") };
        assert_eq!(t.check_credential(&host, &c, 1000).unwrap(), who);
        let sn2 = nonce();
        assert!(transcript(Role::User, &cn, &sn2).check_credential(&host, &c, 1000).is_err(), "replayed elsewhere");
        assert!(t.check_credential(&host, &c, 1000 + 61).is_err(), "expired");
        let forged = UserCredential { uid: 0, ..c.clone() };
        assert!(t.check_credential(&host, &forged, 1000).is_err(), "changed uid");
        // A server without the key gets no credential from the helper.
        let fake = IdentityRequest { server_proof: vec![0; 32], ..req };
        assert!(matches!(fake.answer(&ring.host_ring(), &who, 1000), IdentityAnswer::Refused(_)));
    }
}
