//! The cluster map: a versioned list of servers, read from a TOML file.
//!
//! ```toml
//! [cluster]
//! name = "demo"
//! version = 1
//! stripe_size = 1048576      # default for new files
//! stripe_count = 1           # default for new files; 0 = all servers
//! policy = "same"            # or "spread"
//! replicas = 1               # copies of metadata, and the default for files' data (1 to 3)
//!
//! [[server]]
//! id = 0
//! addr = "127.0.0.1:7400"
//! data_dir = "/var/lib/shoal/s0"   # used by the server itself
//! weight = 1.0
//! state = "up"                     # "up", "down" (still owns its objects) or "out"
//! http = "127.0.0.1:8400"          # optional: this server's HTTP port (docs/http.md)
//!
//! [http]                             # optional; these are the defaults
//! anonymous = "read"                 # or "none": requests without a token are refused
//! anonymous_uid = 65534              # who anonymous requests act as (nobody/nogroup)
//! anonymous_gid = 65534
//! anonymous_min_id = 1000            # anonymous_uid/gid below this are refused (0 never allowed)
//! import_from = []                   # URL prefixes `shoal import` may fetch (empty: any)
//!
//! [membership]                       # optional (docs/membership.md)
//! voters = [0, 1, 2]                 # the Raft group's voters; default: the first 3 ids (5 from 7 servers)
//! down_after_ms = 3000               # unheard this long: marked down by the group's leader
//! refused_down_after_ms = 1000       # unheard and refusing connections this long: down (0: off)
//! absent_after_ms = 600000           # away this long: its copies are made elsewhere (0: never)
//!
//! [security]                         # optional; these are the defaults
//! auth = "keys"                      # or "none": trust whoever reaches a port (explicit only)
//! cluster_key = "cluster.key"        # servers only; relative to this file's folder
//! host_key = "host.key"              # root on client hosts; relative to this file's folder
//! admin_gid = 1500                   # optional: this group may start a scrub, as root may
//! ```

use crate::rendezvous;
use serde::{Deserialize, Serialize};
use shoal_proto::msg::{PlacementPolicy, REPLICAS_MAX, STRIPE_SIZE_MAX, STRIPE_SIZE_MIN};
use shoal_proto::{Ino, ServerId};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("cannot read cluster config {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cluster config {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("cluster config {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerState {
    /// Serving.
    Up,
    /// Temporarily unavailable; still owns what placement gives it (requests fail with EIO).
    Down,
    /// Retired: excluded from placement.
    Out,
}

fn default_weight() -> f64 {
    1.0
}
fn default_state() -> ServerState {
    ServerState::Up
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
// A misspelt key (`stripe_cout`) is an error, not a silently applied default.
#[serde(deny_unknown_fields)]
pub struct ServerEntry {
    pub id: u32,
    /// `host:port` the server listens on and clients connect to.
    pub addr: String,
    /// Where this server keeps its RocksDB and data objects (read by the server only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Relative share of placement (capacity); must be > 0.
    #[serde(default = "default_weight")]
    pub weight: f64,
    #[serde(default = "default_state")]
    pub state: ServerState,
    /// `host:port` of this server's HTTP service (files, metrics, the status page); none
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
    /// After a failover: the server whose process serves this slot now, from its mirror
    /// copy (at `addr`). The slot's own server, if it comes back, must not serve it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_by: Option<u32>,
    /// Mirrors of this slot that missed changes (the primary went on without them, with the
    /// group's consent): their copies are not to be promoted until resynchronised.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub behind: Vec<u32>,
    /// While the slot is served from a copy (`served_by`): `host:port` where the slot's own
    /// server, started again, stands by to take it back. The serving copy resynchronises
    /// that server's stores as a mirror reached there, then hands the slot back
    /// (docs/failover.md, "Rejoining").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<String>,
    /// While the slot is served from a copy (`served_by`) and no `home` is recorded yet: the
    /// address its own process had before the failover (where it listens again when started
    /// again). Messages for that process rather than its slot (the map group's, a mirror's
    /// shipping) go there: a voter started again must be reachable by the group before it
    /// can record its home through the group (else two voters down of three, one of them
    /// back, could never commit again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_at: Option<String>,
    /// A slot without a process of its own: it lives on server `host` (its stores under
    /// that server's data directory, served on a port of its own there). A cluster made
    /// with several slots per server has such slots from the start; a slot moved between
    /// servers (`shoal server add`, `drain`) becomes one. Its `addr` is empty until its
    /// host first serves it. Entries without `host` are the servers (processes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<u32>,
    /// A move of this slot to server `moving_to` is under way: that server is one more
    /// mirror of the slot, resynchronised, and takes the slot once it is in sync
    /// (docs/membership.md, "Moving slots").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving_to: Option<u32>,
    /// Whether this entry's own slot takes part in placement (holds new inodes, directory
    /// partitions and file objects). False for a server added to a running cluster: placing
    /// anything new on a slot of its own would move existing inodes (an inode's number says
    /// where it lives); it holds the slots moved to it instead.
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub placed: bool,
    /// This server (a process) is being drained (`shoal server drain`): no slot moves or
    /// fails over to it, it leaves the map group's voters, and every slot living on it
    /// moves to the other servers, its own last. Once its own slot has moved, the entry is
    /// a slot living on another server and the process stops (docs/membership.md,
    /// "Draining and removing a server").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
    /// This server (a process) has been away (down, or its slot served from a copy while
    /// its process is not back) for `[membership] absent_after_ms`: the copies it held are
    /// made again on the other servers. Mirror
    /// sets skip it ([`ClusterMap::mirrors_of`]), so that every slot gets its count of copies
    /// back without it; cleared when it serves again (docs/membership.md, "A server gone
    /// for long").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub absent: bool,
}

fn yes() -> bool {
    true
}

fn is_yes(b: &bool) -> bool {
    *b
}

impl ServerEntry {
    pub fn server_id(&self) -> ServerId {
        ServerId(self.id)
    }
}

fn default_stripe_size() -> u64 {
    1 << 20
}
fn default_stripe_count() -> u32 {
    1
}
fn default_policy() -> PlacementPolicy {
    PlacementPolicy::Same
}

/// Cluster-wide settings and the defaults new files get when nothing else says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
// A misspelt key (`stripe_cout`) is an error, not a silently applied default.
#[serde(deny_unknown_fields)]
pub struct ClusterDefaults {
    #[serde(default)]
    pub name: String,
    /// Bumped whenever the server list changes. Servers refuse requests routed with an
    /// older version ("wrong map version"), so clients reload.
    #[serde(default = "one")]
    pub version: u64,
    #[serde(default = "default_stripe_size")]
    pub stripe_size: u64,
    /// 0 means "all servers".
    #[serde(default = "default_stripe_count")]
    pub stripe_count: u32,
    #[serde(default = "default_policy", with = "policy_serde")]
    pub policy: PlacementPolicy,
    /// Copies the cluster keeps of its metadata (directory objects and inodes: always this
    /// many, since a file is reachable only through its ancestors' metadata), and the
    /// replica count of new files that ask for none. A file asking for more gets this many.
    /// 1 ..= `REPLICAS_MAX`, and at most the servers that can hold data (`validate`).
    /// Left out of a written map when 1, so that a map this code writes for a cluster without
    /// replication still loads in an older `shoal`/`shoald` (they refuse unknown keys).
    #[serde(default = "shoal_proto::msg::one_copy", skip_serializing_if = "shoal_proto::msg::is_one_copy")]
    pub replicas: u8,
}

fn one() -> u64 {
    1
}

mod policy_serde {
    use serde::{Deserialize, Deserializer, Serializer};
    use shoal_proto::msg::PlacementPolicy;
    pub fn serialize<S: Serializer>(p: &PlacementPolicy, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match p {
            PlacementPolicy::Same => "same",
            PlacementPolicy::Spread => "spread",
            PlacementPolicy::Load => "load",
        })
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PlacementPolicy, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_policy(&s).map_err(serde::de::Error::custom)
    }
}

/// Parse "same", "spread" or "load".
pub fn parse_policy(s: &str) -> Result<PlacementPolicy, String> {
    match s {
        "same" => Ok(PlacementPolicy::Same),
        "spread" => Ok(PlacementPolicy::Spread),
        "load" => Ok(PlacementPolicy::Load),
        other => Err(format!("unknown placement policy {other:?} (expected \"same\", \"spread\" or \"load\")")),
    }
}

/// `host:port` with a non-empty host and a port from 1 to 65535 (`[v6]:port` included).
fn is_host_port(addr: &str) -> bool {
    match addr.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0),
        None => false,
    }
}

/// Whether two `host:port` strings name the same address as written (host names compare
/// without case, IP addresses by value; no name is looked up).
fn same_addr(a: &str, b: &str) -> bool {
    match (a.parse::<std::net::SocketAddr>(), b.parse::<std::net::SocketAddr>()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a.eq_ignore_ascii_case(b),
    }
}

/// How servers and clients prove who they are (docs/security.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Servers prove the cluster key to each other; clients act as the user they can prove
    /// to be (the host key, or the local identity helper).
    #[default]
    Keys,
    /// No authentication: anyone who reaches a port is trusted with the identity they
    /// state (NFS AUTH_SYS). Only for closed test networks, and only when asked for.
    None,
}

fn default_cluster_key() -> PathBuf {
    PathBuf::from("cluster.key")
}
/// Ten minutes: long next to an `Open` round trip, short enough that a retired key or a
/// stolen capability stops working soon.
fn default_capability_lifetime() -> u64 {
    600
}
fn default_host_key() -> PathBuf {
    PathBuf::from("host.key")
}
fn default_identity_socket() -> PathBuf {
    PathBuf::from("identity.sock")
}
fn default_tls_ca() -> PathBuf {
    PathBuf::from("tls-ca.pem")
}
fn default_tls_ca_key() -> PathBuf {
    PathBuf::from("tls-ca.key")
}
fn default_tls_cert() -> PathBuf {
    PathBuf::from("tls-cert.pem")
}
fn default_tls_key() -> PathBuf {
    PathBuf::from("tls-key.pem")
}

/// The `[security]` table. Relative key paths are resolved against the folder of the
/// config file when it is loaded, so that a map and its keys can move together.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Security {
    #[serde(default)]
    pub auth: AuthMode,
    /// The cluster key ring, read by servers.
    #[serde(default = "default_cluster_key")]
    pub cluster_key: PathBuf,
    /// The host key ring, read by root's processes on client hosts.
    #[serde(default = "default_host_key")]
    pub host_key: PathBuf,
    /// The local identity helper's socket (`shoal identityd`): where unprivileged clients,
    /// which cannot read the host key, get a credential for their own uid (docs/security.md).
    #[serde(default = "default_identity_socket")]
    pub identity_socket: PathBuf,
    /// Every connection (client to server and server to server) is TLS 1.3; servers and
    /// clients must agree (docs/security.md, "TLS").
    #[serde(default)]
    pub tls: bool,
    /// The cluster CA's certificate (PEM, public): clients and servers verify servers
    /// against it.
    #[serde(default = "default_tls_ca")]
    pub tls_ca: PathBuf,
    /// The cluster CA's private key (PEM, root only): only `shoal keygen` reads it, to
    /// issue the server certificate.
    #[serde(default = "default_tls_ca_key")]
    pub tls_ca_key: PathBuf,
    /// The servers' certificate (PEM), naming every server address of the map.
    #[serde(default = "default_tls_cert")]
    pub tls_cert: PathBuf,
    /// The servers' private key (PEM, root only).
    #[serde(default = "default_tls_key")]
    pub tls_key: PathBuf,
    /// How long a per-open capability lives, in seconds (clients renew theirs before it
    /// runs out; a shorter life makes a revoked permission or a retired key take effect
    /// sooner, at the cost of one `Open` per handle per lifetime).
    #[serde(default = "default_capability_lifetime")]
    pub capability_lifetime_secs: u64,
    /// Members of this group may run the cluster's administrative operations (start a
    /// scrub), besides root on a host with the host key. None: root only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_gid: Option<u32>,
}

impl Security {
    /// Whether `cred` (as the server admitted it: a user's own uid and groups, proven) may
    /// run administrative operations: root, or a member of `admin_gid`.
    pub fn is_admin(&self, cred: &shoal_proto::msg::Cred) -> bool {
        cred.uid == 0 || self.admin_gid.is_some_and(|g| cred.gid == g || cred.groups.contains(&g))
    }
}

impl Default for Security {
    fn default() -> Self {
        Security {
            auth: AuthMode::default(),
            cluster_key: default_cluster_key(),
            host_key: default_host_key(),
            identity_socket: default_identity_socket(),
            tls: false,
            tls_ca: default_tls_ca(),
            tls_ca_key: default_tls_ca_key(),
            tls_cert: default_tls_cert(),
            tls_key: default_tls_key(),
            capability_lifetime_secs: default_capability_lifetime(),
            admin_gid: None,
        }
    }
}

/// What a request to a server's HTTP port that carries no token may do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AnonymousAccess {
    /// Read what the anonymous identity may read (`GET`, `HEAD`, listings).
    #[default]
    Read,
    /// Nothing: every file request needs a token.
    None,
}

fn nobody() -> u32 {
    65534
}

/// Debian's and most distributions' first uid of an ordinary user: ids below are system
/// accounts, which anonymous HTTP readers must not act as by default.
fn first_ordinary_id() -> u32 {
    1000
}

/// The `[http]` table: who the servers' HTTP services serve (docs/http.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    #[serde(default)]
    pub anonymous: AnonymousAccess,
    /// The uid anonymous requests act as (POSIX permissions apply as to any user).
    #[serde(default = "nobody")]
    pub anonymous_uid: u32,
    /// The gid anonymous requests act as.
    #[serde(default = "nobody")]
    pub anonymous_gid: u32,
    /// The lowest uid and gid anonymous requests may act as (root, 0, never): a site that
    /// means anonymous readers to be a system account lowers it knowingly.
    #[serde(default = "first_ordinary_id")]
    pub anonymous_min_id: u32,
    /// URL prefixes the servers may fetch from for `shoal import` (docs/import.md); empty:
    /// any `http` or `https` URL. Servers fetch from their own network position, so a site
    /// whose servers reach internal services should list what users may import from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub import_from: Vec<String>,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            anonymous: AnonymousAccess::Read,
            anonymous_uid: nobody(),
            anonymous_gid: nobody(),
            anonymous_min_id: first_ordinary_id(),
            import_from: Vec::new(),
        }
    }
}

impl HttpSettings {
    fn is_default(&self) -> bool {
        *self == HttpSettings::default()
    }

    /// Anonymous HTTP readers never act as root, nor (unless the site lowers
    /// `anonymous_min_id`) as a system account.
    fn validate(&self) -> Result<(), String> {
        for (what, id) in [("anonymous_uid", self.anonymous_uid), ("anonymous_gid", self.anonymous_gid)] {
            if id == 0 {
                return Err(format!("http.{what} is 0: anonymous HTTP requests would act as root (use 65534, nobody)"));
            }
            if id < self.anonymous_min_id {
                return Err(format!(
                    "http.{what} {id} is below http.anonymous_min_id {}: a system account (lower anonymous_min_id to allow it)",
                    self.anonymous_min_id
                ));
            }
        }
        Ok(())
    }
}

fn default_down_after_ms() -> u64 {
    3000
}

fn default_refused_down_after_ms() -> u64 {
    1000
}

fn default_absent_after_ms() -> u64 {
    600_000
}

/// The `[membership]` table: who holds the replicated cluster map (docs/membership.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Membership {
    /// Server ids of the Raft group's voters; `None`: [`ClusterMap::voters`] picks them.
    /// Every other server follows the group as a learner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voters: Option<Vec<u32>>,
    /// A server that is `up` and unheard by the group's leader for this long is marked
    /// `down` (a map change, version + 1).
    #[serde(default = "default_down_after_ms")]
    pub down_after_ms: u64,
    /// A server that is `up`, unheard, and whose host has refused every connection for this
    /// long is marked `down` sooner than `down_after_ms`: a refused connection means nothing
    /// listens at its address (the process died), which silence does not prove. 0: only
    /// silence counts. Keep it above the time a server takes to restart, or a restart is
    /// taken for a death and its slot fails over.
    #[serde(default = "default_refused_down_after_ms")]
    pub refused_down_after_ms: u64,
    /// A server (a process) away for this long (down, or its slot served from a copy while
    /// its process has not come back) is marked `absent`: the copies it held are made again elsewhere, as Ceph marks a
    /// down OSD `out` after `mon_osd_down_out_interval`. 0: never (copies stay one fewer
    /// until the server returns or is removed). Long by default: making copies again costs
    /// a full resync of each, which a reboot should not.
    #[serde(default = "default_absent_after_ms")]
    pub absent_after_ms: u64,
}

impl Default for Membership {
    fn default() -> Self {
        Membership {
            voters: None,
            down_after_ms: default_down_after_ms(),
            refused_down_after_ms: default_refused_down_after_ms(),
            absent_after_ms: default_absent_after_ms(),
        }
    }
}

impl Membership {
    fn is_default(&self) -> bool {
        *self == Membership::default()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
// A misspelt key (`stripe_cout`) is an error, not a silently applied default.
#[serde(deny_unknown_fields)]
pub struct ClusterMap {
    pub cluster: ClusterDefaults,
    #[serde(rename = "server")]
    pub servers: Vec<ServerEntry>,
    #[serde(default)]
    pub security: Security,
    #[serde(default, skip_serializing_if = "HttpSettings::is_default")]
    pub http: HttpSettings,
    #[serde(default, skip_serializing_if = "Membership::is_default")]
    pub membership: Membership,
}

/// One line for a TOML error: where (line number) and what, without the source excerpt that
/// `toml::de::Error`'s `Display` adds over several lines.
fn parse_message(text: &str, e: &toml::de::Error) -> String {
    let what = e.message().trim_end();
    match e.span() {
        Some(span) => format!(
            "line {}: {what}",
            text.as_bytes()[..span.start.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
        ),
        None => what.to_string(),
    }
}

impl ClusterMap {
    /// Read and validate a map from a TOML file.
    pub fn load(path: &Path) -> Result<ClusterMap, MapError> {
        let text = std::fs::read_to_string(path).map_err(|source| MapError::Read { path: path.into(), source })?;
        let map: ClusterMap = toml::from_str(&text)
            .map_err(|e| MapError::Parse { path: path.into(), message: parse_message(&text, &e) })?;
        map.validate().map_err(|message| MapError::Invalid { path: path.into(), message })?;
        let mut map = map;
        map.resolve_key_paths(path.parent().unwrap_or(Path::new(".")));
        Ok(map)
    }

    /// Make the relative paths of the `[security]` files relative to `base` (the map file's
    /// folder).
    fn resolve_key_paths(&mut self, base: &Path) {
        let sec = &mut self.security;
        for key in [
            &mut sec.cluster_key,
            &mut sec.host_key,
            &mut sec.identity_socket,
            &mut sec.tls_ca,
            &mut sec.tls_ca_key,
            &mut sec.tls_cert,
            &mut sec.tls_key,
        ] {
            if key.is_relative() {
                *key = base.join(&*key);
            }
        }
    }

    /// Parse and validate a map received as text (from the replicated map, `GetMap`). Relative
    /// key paths are resolved against `base`, as [`ClusterMap::load`] resolves them against
    /// the file's folder.
    pub fn from_toml(text: &str, base: &Path) -> Result<ClusterMap, String> {
        let mut map: ClusterMap = toml::from_str(text).map_err(|e| parse_message(text, &e))?;
        map.validate()?;
        map.resolve_key_paths(base);
        Ok(map)
    }

    /// The voters of the group that holds the map: `[membership] voters`, or else the first 3
    /// server ids in map order (5 when the map has 7 or more servers; all when fewer than 3).
    /// Why so few: every map change waits for a majority of voters, and 3 or 5 survive one or
    /// two failures; the other servers follow as learners.
    pub fn voters(&self) -> Vec<u32> {
        // Voters are processes (a slot living on another server has no member of its own),
        // and not one being drained: it is about to leave.
        // Nor one gone for long (`absent`): a voter that does not come back would leave the
        // group one failure from losing its majority.
        let staying: Vec<u32> = self.processes().filter(|s| !s.draining && !s.absent).map(|s| s.id).collect();
        if let Some(v) = &self.membership.voters {
            // A named voter being drained is replaced by the first other server, so that
            // the group keeps as many voters as it was given.
            let mut voters: Vec<u32> = v.iter().copied().filter(|id| staying.contains(id)).collect();
            for id in &staying {
                if voters.len() >= v.len() {
                    break;
                }
                if !voters.contains(id) {
                    voters.push(*id);
                }
            }
            return voters;
        }
        let n = if staying.len() >= 7 { 5 } else { 3 };
        staying.into_iter().take(n).collect()
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("cluster map serialises")
    }

    /// A map of `n` servers on loopback ports `base_port..`, data under `dir/s<id>`.
    pub fn local(n: u32, base_port: u16, dir: &Path) -> ClusterMap {
        ClusterMap {
            cluster: ClusterDefaults {
                name: "local".into(),
                version: 1,
                stripe_size: default_stripe_size(),
                stripe_count: default_stripe_count(),
                policy: PlacementPolicy::Same,
                replicas: 1,
            },
            servers: (0..n)
                .map(|id| ServerEntry {
                    id,
                    addr: format!("127.0.0.1:{}", base_port as u32 + id),
                    data_dir: Some(dir.join(format!("s{id}"))),
                    weight: 1.0,
                    state: ServerState::Up,
                    http: None,
                    served_by: None,
                    behind: Vec::new(),
                    home: None,
                    member_at: None,
                    host: None,
                    moving_to: None,
                    placed: true,
                    draining: false,
                    absent: false,
                })
                .collect(),
            security: Security::default(),
            http: HttpSettings::default(),
            membership: Membership::default(),
        }
    }

    /// A map of `n` servers as [`ClusterMap::local`], with `slots` slots in all (at least
    /// `n`): the slots beyond the servers' own live on the servers in turn (`host`). A
    /// cluster that is to grow needs more slots than servers: a server that joins takes
    /// whole slots (docs/membership.md, "Moving slots").
    pub fn local_with_slots(n: u32, slots: u32, base_port: u16, dir: &Path) -> ClusterMap {
        let mut map = ClusterMap::local(n, base_port, dir);
        map.add_spare_slots(slots);
        map
    }

    /// Add slots living on the servers in turn (`host`), numbered after the last entry,
    /// until the map has `slots` entries.
    pub fn add_spare_slots(&mut self, slots: u32) {
        let hosts: Vec<u32> = self.processes().map(|p| p.id).collect();
        let Some(template) = self.servers.first().cloned() else { return };
        let mut next = self.servers.iter().map(|e| e.id + 1).max().unwrap_or(0);
        let mut turn = 0;
        while (self.servers.len() as u32) < slots {
            self.servers.push(ServerEntry {
                id: next,
                addr: String::new(),
                data_dir: None,
                http: None,
                host: Some(hosts[turn % hosts.len()]),
                ..template.clone()
            });
            next += 1;
            turn += 1;
        }
    }

    /// Check the invariants every other function relies on, and refuse what would only fail
    /// later (two servers on one address, an empty data directory). Each refusal is one line
    /// that names the field and what is allowed; servers and clients both load maps through
    /// here, so a bad map is refused everywhere.
    pub fn validate(&self) -> Result<(), String> {
        if self.cluster.version == 0 {
            return Err("cluster.version must be ≥ 1 (it is 0)".into());
        }
        if self.security.capability_lifetime_secs == 0 {
            return Err("security.capability_lifetime_secs must be ≥ 1 (it is 0)".into());
        }
        if self.servers.is_empty() {
            return Err("no [[server]] entries; a cluster needs at least one".into());
        }
        for (i, s) in self.servers.iter().enumerate() {
            if self.servers[..i].iter().any(|o| o.id == s.id) {
                return Err(format!("server {} is listed twice: two [[server]] entries have the same id", s.id));
            }
            if !(s.weight.is_finite() && s.weight > 0.0) {
                return Err(format!("server {}: weight {} must be a positive number", s.id, s.weight));
            }
            // A slot living on another server has no address until that server serves it.
            let unserved = s.host.is_some() && s.addr.is_empty();
            if !unserved && !is_host_port(&s.addr) {
                return Err(format!(
                    "server {}: addr {:?} must be host:port with a port from 1 to 65535",
                    s.id, s.addr
                ));
            }
            if let Some(other) = self.servers[..i].iter().find(|o| !unserved && same_addr(&o.addr, &s.addr)) {
                return Err(format!("server {}: addr {} is also the address of server {}", s.id, s.addr, other.id));
            }
            if let Some(h) = s.served_by {
                if h == s.id || !self.servers.iter().any(|o| o.id == h && o.host.is_none()) {
                    return Err(format!("server {}: served_by {h} must be another server of the map", s.id));
                }
            }
            let is_process = |id: u32| self.servers.iter().any(|o| o.id == id && o.host.is_none());
            if let Some(h) = s.host {
                if h == s.id || !is_process(h) {
                    return Err(format!(
                        "server {}: host {h} must be another server of the map that has no host itself",
                        s.id
                    ));
                }
                if s.data_dir.is_some() || s.http.is_some() {
                    return Err(format!(
                        "server {}: a slot living on server {h} (host) has no data_dir or http of its own",
                        s.id
                    ));
                }
            }
            if s.absent && s.host.is_some() {
                return Err(format!("server {}: absent is only for a server with a process of its own", s.id));
            }
            if s.draining && s.host.is_some() {
                return Err(format!("server {}: draining is only for a server with a process of its own", s.id));
            }
            if let Some(t) = s.moving_to {
                let drained = self.servers.iter().any(|o| o.id == t && o.draining);
                if !is_process(t) || t == self.process_of(s.server_id()).0 || drained {
                    return Err(format!(
                        "server {}: moving_to {t} must be another server of the map that has no host itself and is not being drained",
                        s.id
                    ));
                }
            }
            if let Some(at) = &s.member_at {
                if s.served_by.is_none() || !is_host_port(at) {
                    return Err(format!(
                        "server {}: member_at {at:?} must be host:port, and only for a slot served from a copy (served_by)",
                        s.id
                    ));
                }
            }
            if let Some(home) = &s.home {
                if s.served_by.is_none() {
                    return Err(format!("server {}: home is only for a slot served from a copy (served_by)", s.id));
                }
                if !is_host_port(home) {
                    return Err(format!(
                        "server {}: home {home:?} must be host:port with a port from 1 to 65535",
                        s.id
                    ));
                }
            }
            if let Some(b) = s.behind.iter().find(|b| !self.servers.iter().any(|o| o.id == **b)) {
                return Err(format!("server {}: behind names server {b}, which is not in the map", s.id));
            }
            if let Some(http) = &s.http {
                if !is_host_port(http) {
                    return Err(format!(
                        "server {}: http {:?} must be host:port with a port from 1 to 65535",
                        s.id, http
                    ));
                }
                let taken = self.servers.iter().find(|o| {
                    same_addr(&o.addr, http) || (o.id != s.id && o.http.as_deref().is_some_and(|h| same_addr(h, http)))
                });
                if let Some(other) = taken {
                    return Err(format!("server {}: http {http} is also an address of server {}", s.id, other.id));
                }
            }
            if s.data_dir.as_ref().is_some_and(|d| d.as_os_str().is_empty()) {
                return Err(format!(
                    "server {}: data_dir is empty (give the directory that holds the server's data, or leave data_dir out)",
                    s.id
                ));
            }
        }
        let placeable = self.placeable().count();
        if placeable == 0 {
            return Err("every server is marked out; at least one must be up or down to hold data".into());
        }
        let ss = self.cluster.stripe_size;
        if !(STRIPE_SIZE_MIN..=STRIPE_SIZE_MAX).contains(&ss) || !ss.is_multiple_of(STRIPE_SIZE_MIN) {
            return Err(format!("cluster.stripe_size {ss} must be a multiple of 4096 between 4 KiB and 1 GiB"));
        }
        if let Some(voters) = &self.membership.voters {
            if voters.is_empty() {
                return Err("membership.voters is empty; name 1 to 5 server ids (or leave it out)".into());
            }
            if voters.len() > 5 {
                return Err(format!("membership.voters names {} servers; at most 5", voters.len()));
            }
            for (i, v) in voters.iter().enumerate() {
                if !self.processes().any(|s| s.id == *v) {
                    return Err(format!(
                        "membership.voters: server {v} is not a [[server]] of this map with a process of its own"
                    ));
                }
                if voters[..i].contains(v) {
                    return Err(format!("membership.voters: server {v} is listed twice"));
                }
            }
        }
        if self.membership.down_after_ms < 500 {
            return Err(format!(
                "membership.down_after_ms {} must be ≥ 500 (a server is pinged every 500 ms)",
                self.membership.down_after_ms
            ));
        }
        let refused = self.membership.refused_down_after_ms;
        if refused != 0 && !(250..=self.membership.down_after_ms).contains(&refused) {
            return Err(format!(
                "membership.refused_down_after_ms {refused} must be 0 (off) or from 250 to down_after_ms ({})",
                self.membership.down_after_ms
            ));
        }
        let absent_after = self.membership.absent_after_ms;
        if absent_after != 0 && absent_after < self.membership.down_after_ms {
            return Err(format!(
                "membership.absent_after_ms {absent_after} must be 0 (never) or at least down_after_ms ({})",
                self.membership.down_after_ms
            ));
        }
        let sc = self.cluster.stripe_count;
        if sc as usize > placeable {
            return Err(format!(
                "cluster.stripe_count {sc} is more than the {placeable} servers that can hold data (0 means all of them)"
            ));
        }
        self.http.validate()?;
        let r = self.cluster.replicas;
        if !(1..=REPLICAS_MAX).contains(&r) {
            return Err(format!("cluster.replicas {r} must be 1 to {REPLICAS_MAX}"));
        }
        let processes = self.processes().count();
        if r as usize > placeable.min(processes) {
            // Each copy must be on a server of its own, or losing one server loses two.
            return Err(format!(
                "cluster.replicas {r} is more than the {} servers that can hold data",
                placeable.min(processes)
            ));
        }
        Ok(())
    }

    pub fn version(&self) -> u64 {
        self.cluster.version
    }

    pub fn server(&self, id: ServerId) -> Option<&ServerEntry> {
        self.servers.iter().find(|s| s.id == id.0)
    }

    /// The servers that mirror `slot`'s stores: the next `replicas - 1` servers after it in
    /// map order (wrapping), whatever their state (a down mirror is out of sync, not
    /// replaced: moving a mirror is a rebalancing), except the server that serves the slot
    /// since a failover (its copy became the slot: the slot runs with one copy fewer).
    ///
    /// With slots living on other servers (`host`), "servers" are the processes: the next
    /// ones after the slot's host, so that no two copies share a process. A slot being
    /// moved (`moving_to`) has its destination as one more mirror.
    ///
    /// A server gone for long (`absent`) is skipped: the next server takes its place as a
    /// mirror, and a slot whose own server is absent gets a mirror in place of the copy that
    /// serves it (its count of copies back).
    ///
    /// A server being drained (`draining`) is skipped too, but keeps its copies until the
    /// ones replacing them are in sync: it stays a mirror, after the others, of every slot
    /// it mirrored while a mirror that replaces it is `behind`, or while there is no server
    /// to replace it (so a drain never leaves a slot with fewer copies in sync).
    pub fn mirrors_of(&self, slot: ServerId) -> Vec<ServerId> {
        let Some(entry) = self.server(slot) else { return Vec::new() };
        let all: Vec<&ServerEntry> = self.processes().collect();
        let host = self.process_of(slot).0;
        let Some(at) = all.iter().position(|p| p.id == host) else { return Vec::new() };
        let n = all.len();
        let present = all.iter().filter(|p| !p.absent).count();
        let copies = (self.cluster.replicas as usize).clamp(1, present.max(1));
        let serving = entry.served_by;
        let chosen = |skip: &dyn Fn(&ServerEntry) -> bool| -> Vec<ServerId> {
            let after = (1..n).map(|k| all[(at + k) % n]).filter(|p| !skip(p)).map(|p| ServerId(p.id));
            if all[at].absent {
                after.filter(|m| Some(m.0) != serving).take(copies - 1).collect()
            } else {
                after.take(copies - 1).filter(|m| Some(m.0) != serving).collect()
            }
        };
        let mut mirrors = chosen(&|p| p.absent || p.draining);
        let with_drained = chosen(&|p| p.absent);
        let replacing = mirrors.len() < with_drained.len()
            || mirrors.iter().any(|m| !with_drained.contains(m) && entry.behind.contains(&m.0));
        if replacing {
            for d in with_drained {
                if !mirrors.contains(&d) {
                    mirrors.push(d);
                }
            }
        }
        if let Some(to) = entry.moving_to.filter(|&t| t != host && Some(t) != serving) {
            if !mirrors.contains(&ServerId(to)) {
                mirrors.push(ServerId(to));
            }
        }
        mirrors
    }

    /// Retire the process `id`: its own slot lives on `to` from now on (it was drained and
    /// its slot moved there, or it is removed and the copy on `to` serves its slot). The
    /// entry becomes a slot living on `to`, like any other: no data directory, HTTP port or
    /// vote of its own. Mirrors the slot gains are `behind` until resynchronised, and no
    /// slot counts the retired process as behind any more (it mirrors nothing now).
    pub fn retire(&mut self, id: ServerId, to: ServerId) {
        self.changing_mirrors(|map| {
            let Some(e) = map.servers.iter_mut().find(|e| e.id == id.0) else { return };
            e.host = Some(to.0);
            e.moving_to = None;
            e.served_by = None;
            e.home = None;
            e.member_at = None;
            e.draining = false;
            e.absent = false;
            e.data_dir = None;
            e.http = None;
            if map.membership.voters.is_some() {
                // The same number of voters, the retired one replaced (see `voters`).
                map.membership.voters = Some(map.voters());
            }
        });
    }

    /// Mark the process `id` absent (gone for long: its copies are made elsewhere) or
    /// present again. Every slot's new mirrors are `behind` until resynchronised.
    pub fn set_absent(&mut self, id: ServerId, absent: bool) {
        self.changing_mirrors(|map| {
            if let Some(e) = map.servers.iter_mut().find(|e| e.id == id.0 && e.host.is_none()) {
                e.absent = absent;
            }
        });
    }

    /// Mark the process `id` as being drained: its slots are to move off it, and the slots
    /// it mirrors get new mirrors, `behind` until resynchronised (it keeps its copies until
    /// then, see [`ClusterMap::mirrors_of`]). Moves to it are called off.
    pub fn set_draining(&mut self, id: ServerId) {
        self.changing_mirrors(|map| {
            for e in &mut map.servers {
                if e.moving_to == Some(id.0) {
                    e.moving_to = None;
                }
            }
            if let Some(e) = map.servers.iter_mut().find(|e| e.id == id.0 && e.host.is_none()) {
                e.draining = true;
            }
        });
    }

    /// The slots that keep a copy on the drained process `id` only until a mirror replacing
    /// it is in sync (see [`ClusterMap::mirrors_of`]): what a drain waits for before `id`
    /// leaves.
    pub fn awaiting_replacement(&self, id: ServerId) -> Vec<ServerId> {
        self.mirrored_by(id)
            .into_iter()
            .filter(|&slot| {
                let mut synced = self.clone();
                if let Some(e) = synced.servers.iter_mut().find(|e| e.id == slot.0) {
                    e.behind.clear();
                }
                !synced.mirrors_of(slot).contains(&id)
            })
            .collect()
    }

    /// Mark every mirror of `slot` `behind`: they hold positions of an incarnation of the
    /// slot that is over (a copy promoted, a slot switched to another process).
    pub fn set_all_behind(&mut self, slot: ServerId) {
        // Twice: with mirrors behind, a drained server keeps its copy (`mirrors_of`) and is
        // behind too.
        for _ in 0..2 {
            let behind: Vec<u32> = self.mirrors_of(slot).into_iter().map(|m| m.0).collect();
            if let Some(e) = self.servers.iter_mut().find(|e| e.id == slot.0) {
                e.behind = behind;
            }
        }
    }

    /// Apply `change`, which may change mirror sets (a process leaves the ring, or is
    /// skipped), and keep `behind` true: a server that becomes a mirror of a slot holds
    /// nothing of it yet, so it is behind (never promoted) until the slot's server has
    /// resynchronised it; a server that is no longer a mirror is no longer behind.
    fn changing_mirrors(&mut self, change: impl FnOnce(&mut ClusterMap)) {
        let before: Vec<(u32, Vec<ServerId>)> =
            self.servers.iter().map(|e| (e.id, self.mirrors_of(e.server_id()))).collect();
        change(self);
        for (slot, was) in before {
            let now = self.mirrors_of(ServerId(slot));
            let Some(e) = self.servers.iter_mut().find(|e| e.id == slot) else { continue };
            e.behind.retain(|b| now.contains(&ServerId(*b)));
            for m in now.iter().filter(|m| !was.contains(m)) {
                if !e.behind.contains(&m.0) {
                    e.behind.push(m.0);
                }
            }
        }
    }

    /// The servers (processes): entries without a `host`, in map order.
    pub fn processes(&self) -> impl Iterator<Item = &ServerEntry> {
        self.servers.iter().filter(|s| s.host.is_none())
    }

    /// The server whose process `slot` lives on (not counting a failover): its `host`, or
    /// the slot's own server.
    pub fn process_of(&self, slot: ServerId) -> ServerId {
        ServerId(self.server(slot).and_then(|e| e.host).unwrap_or(slot.0))
    }

    /// The server whose process serves `slot` now: the one that took it over in a failover
    /// (`served_by`), else the one it lives on.
    pub fn serving_process(&self, slot: ServerId) -> ServerId {
        match self.server(slot).and_then(|e| e.served_by) {
            Some(by) => ServerId(by),
            None => self.process_of(slot),
        }
    }

    /// The slots that live on server `process` (its own, if it has one, and those it hosts).
    pub fn slots_on(&self, process: ServerId) -> Vec<ServerId> {
        self.servers.iter().map(|e| e.server_id()).filter(|&s| self.process_of(s) == process).collect()
    }

    /// The mirror to promote when `slot`'s primary is down: the first of its mirrors that is
    /// up and not behind. `None` when the slot is up or has no such mirror. A slot failed
    /// over already, whose serving copy is down in turn, has a mirror only if copies are
    /// made beyond it (three copies, or its own server `absent`).
    pub fn promotion_of(&self, slot: ServerId) -> Option<ServerId> {
        let entry = self.server(slot)?;
        if entry.state != ServerState::Down {
            return None;
        }
        self.mirrors_of(slot).into_iter().find(|m| {
            !entry.behind.contains(&m.0)
                && self.server(*m).is_some_and(|e| e.state == ServerState::Up && e.served_by.is_none() && !e.draining)
        })
    }

    /// This map with every slot that has a `home` (its own server standing by to take it
    /// back), or else a `member_at`, routed there: what the serving copy and the map group
    /// reach that server's process by.
    pub fn homes_routed(&self) -> ClusterMap {
        let mut m = self.clone();
        for e in &mut m.servers {
            if let Some(h) = e.home.take().or(e.member_at.take()) {
                e.addr = h;
            }
        }
        m
    }

    /// The slots whose stores `server` mirrors (the inverse of [`ClusterMap::mirrors_of`]).
    pub fn mirrored_by(&self, server: ServerId) -> Vec<ServerId> {
        self.servers.iter().map(|s| ServerId(s.id)).filter(|&s| self.mirrors_of(s).contains(&server)).collect()
    }

    /// Servers that take part in placement (not `out`), in map order.
    pub fn placeable(&self) -> impl Iterator<Item = &ServerEntry> {
        self.servers.iter().filter(|s| s.state != ServerState::Out && s.placed)
    }

    /// The home server of an inode: holds the inode record and, for a directory, its
    /// entries. Weighted rendezvous over the placeable servers.
    pub fn home_of(&self, ino: Ino) -> ServerId {
        // The first of `rank`, without building and sorting the list: this runs for every
        // request on both sides, and for every candidate number when allocating inodes.
        let mut best: Option<(f64, u32)> = None;
        for s in self.placeable() {
            let score = rendezvous::score(ino.0, s.id, s.weight);
            match best {
                Some((b, id)) if b > score || (b == score && id < s.id) => {}
                _ => best = Some((score, s.id)),
            }
        }
        // `validate` guarantees a placeable server; an unvalidated empty map yields server 0.
        ServerId(best.map_or(0, |(_, id)| id))
    }

    /// All placeable servers, best first, for `key`.
    pub fn rank(&self, key: u64) -> Vec<ServerId> {
        let mut scored: Vec<(f64, u32)> =
            self.placeable().map(|s| (rendezvous::score(key, s.id, s.weight), s.id)).collect();
        scored.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal).then(a.1.cmp(&b.1)));
        scored.into_iter().map(|(_, id)| ServerId(id)).collect()
    }

    /// `count` placeable servers starting at `first` and continuing in map order (wrapping),
    /// as `lfs setstripe -i first -c count` does.
    pub fn servers_from(&self, first: ServerId, count: u32) -> Vec<ServerId> {
        let ring: Vec<ServerId> = self.placeable().map(|s| s.server_id()).collect();
        let start = ring.iter().position(|&s| s == first).unwrap_or(0);
        let count = (count as usize).clamp(1, ring.len());
        (0..count).map(|i| ring[(start + i) % ring.len()]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn map(n: u32) -> ClusterMap {
        ClusterMap::local(n, 7000, Path::new("/tmp"))
    }

    #[test]
    fn toml_round_trip_and_validation() {
        let m = map(3);
        let back: ClusterMap = toml::from_str(&m.to_toml()).unwrap();
        assert_eq!(back, m);
        let mut bad = m.clone();
        bad.servers[1].id = 0;
        assert!(bad.validate().unwrap_err().contains("same id"));
        let mut bad = m.clone();
        bad.servers[0].weight = 0.0;
        assert!(bad.validate().is_err());
    }

    #[test]
    fn the_replica_count_is_read_from_the_map_and_written_only_when_not_one() {
        let mut m = map(3);
        // One copy is what a map without the key means, and what older code reads.
        assert!(!m.to_toml().contains("replicas"), "{}", m.to_toml());
        m.cluster.replicas = 2;
        let text = m.to_toml();
        assert!(text.contains("replicas = 2"), "{text}");
        let back: ClusterMap = toml::from_str(&text).unwrap();
        assert_eq!(back.cluster.replicas, 2);
        let old: ClusterMap = toml::from_str(&text.replace("replicas = 2", "")).unwrap();
        assert_eq!(old.cluster.replicas, 1);
    }

    /// Every refusal is one line that names the field and says what is allowed.
    #[test]
    fn validation_names_the_field_and_what_is_allowed() {
        let refused = |tweak: &dyn Fn(&mut ClusterMap)| {
            let mut m = map(4);
            tweak(&mut m);
            let err = m.validate().expect_err("the map must be refused");
            assert_eq!(err.lines().count(), 1, "{err}");
            err
        };
        assert_eq!(
            refused(&|m| m.servers[3].addr = m.servers[1].addr.clone()),
            "server 3: addr 127.0.0.1:7001 is also the address of server 1"
        );
        assert_eq!(
            refused(&|m| {
                m.servers[0].addr = "node-a:7000".into();
                m.servers[2].addr = "NODE-A:7000".into();
            }),
            "server 2: addr NODE-A:7000 is also the address of server 0"
        );
        assert_eq!(
            refused(&|m| m.servers[0].data_dir = Some(PathBuf::new())),
            "server 0: data_dir is empty (give the directory that holds the server's data, or leave data_dir out)"
        );
        assert_eq!(refused(&|m| m.cluster.version = 0), "cluster.version must be ≥ 1 (it is 0)");
        assert_eq!(
            refused(&|m| m.cluster.stripe_count = 5),
            "cluster.stripe_count 5 is more than the 4 servers that can hold data (0 means all of them)"
        );
        assert!(refused(&|m| m.servers[1].addr = "127.0.0.1".into()).starts_with("server 1: addr \"127.0.0.1\""));
        assert!(refused(&|m| m.servers[1].addr = "host:http".into()).starts_with("server 1: addr"));
        assert!(refused(&|m| m.servers[1].addr = ":7000".into()).starts_with("server 1: addr"));
        assert!(refused(&|m| m.servers[1].http = Some("8080".into())).starts_with("server 1: http \"8080\""));
        let addr0 = map(4).servers[0].addr.clone();
        assert_eq!(
            refused(&|m| m.servers[1].http = Some(addr0.clone())),
            format!("server 1: http {addr0} is also an address of server 0")
        );
        assert_eq!(
            refused(&|m| {
                m.servers[0].http = Some("127.0.0.1:8400".into());
                m.servers[1].http = Some("127.0.0.1:8400".into());
            }),
            "server 0: http 127.0.0.1:8400 is also an address of server 1"
        );
        assert!(refused(&|m| m.servers[1].weight = -1.0).starts_with("server 1: weight"));
        assert!(refused(&|m| m.cluster.stripe_size = 1000).starts_with("cluster.stripe_size 1000"));
        assert_eq!(refused(&|m| m.cluster.replicas = 0), "cluster.replicas 0 must be 1 to 3");
        assert_eq!(refused(&|m| m.cluster.replicas = 4), "cluster.replicas 4 must be 1 to 3");
        assert_eq!(
            refused(&|m| {
                m.cluster.replicas = 3;
                m.servers[0].state = ServerState::Out;
                m.servers[1].state = ServerState::Out;
            }),
            "cluster.replicas 3 is more than the 2 servers that can hold data"
        );
        // Issue 51: anonymous HTTP readers acting as root, or as a system account.
        assert_eq!(
            refused(&|m| m.http.anonymous_uid = 0),
            "http.anonymous_uid is 0: anonymous HTTP requests would act as root (use 65534, nobody)"
        );
        assert!(refused(&|m| m.http.anonymous_gid = 0).starts_with("http.anonymous_gid is 0"));
        assert_eq!(
            refused(&|m| m.http.anonymous_uid = 33),
            "http.anonymous_uid 33 is below http.anonymous_min_id 1000: a system account (lower anonymous_min_id to allow it)"
        );
        assert!(refused(&|m| {
            m.http.anonymous_min_id = 0;
            m.http.anonymous_uid = 0;
        })
        .starts_with("http.anonymous_uid is 0"));
        // Still accepted: all servers, and a count up to the servers not marked out.
        let mut m = map(4);
        m.http.anonymous_min_id = 33;
        m.http.anonymous_uid = 33;
        m.validate().unwrap();
        m.cluster.stripe_count = 0;
        m.validate().unwrap();
        m.cluster.stripe_count = 4;
        m.validate().unwrap();
        m.cluster.replicas = 3;
        m.validate().unwrap();
        m.servers[0].data_dir = None;
        m.validate().unwrap();
    }

    #[test]
    fn slots_living_on_servers_are_mirrored_by_other_processes_and_never_vote() {
        let mut m = ClusterMap::local_with_slots(3, 9, 7000, Path::new("/tmp"));
        m.cluster.replicas = 2;
        m.validate().unwrap();
        let back: ClusterMap = toml::from_str(&m.to_toml()).unwrap();
        assert_eq!(back, m);
        assert_eq!(m.processes().count(), 3);
        assert_eq!(m.voters(), vec![0, 1, 2]);
        // Slot 4 lives on server 1: its mirror is the next process, 2, never a slot.
        assert_eq!(m.process_of(ServerId(4)), ServerId(1));
        assert_eq!(m.mirrors_of(ServerId(4)), vec![ServerId(2)]);
        assert_eq!(m.mirrors_of(ServerId(1)), vec![ServerId(2)]);
        assert!(m.mirrored_by(ServerId(2)).contains(&ServerId(4)));
        assert_eq!(m.slots_on(ServerId(1)), vec![ServerId(1), ServerId(4), ServerId(7)]);
        // A move adds its destination as one more mirror.
        m.servers.iter_mut().find(|e| e.id == 4).unwrap().moving_to = Some(0);
        m.validate().unwrap();
        assert_eq!(m.mirrors_of(ServerId(4)), vec![ServerId(2), ServerId(0)]);
        m.servers.iter_mut().find(|e| e.id == 4).unwrap().moving_to = Some(1);
        assert!(m.validate().unwrap_err().contains("moving_to 1"));
        m.servers.iter_mut().find(|e| e.id == 4).unwrap().moving_to = Some(7);
        assert!(m.validate().unwrap_err().contains("moving_to 7"));
        m.servers.iter_mut().find(|e| e.id == 4).unwrap().moving_to = None;
        m.servers.iter_mut().find(|e| e.id == 4).unwrap().host = Some(5);
        assert!(m.validate().unwrap_err().contains("host 5"));
        // A server added later holds nothing of its own in placement.
        m.servers.iter_mut().find(|e| e.id == 4).unwrap().host = Some(1);
        let mut joined = m.servers[0].clone();
        joined.id = 9;
        joined.addr = "127.0.0.1:7999".into();
        joined.placed = false;
        m.servers.push(joined);
        m.validate().unwrap();
        assert!(m.placeable().all(|e| e.id != 9));
        assert!((0..1000).all(|i| m.home_of(Ino(i)).0 != 9));
    }

    #[test]
    fn voters_default_to_the_first_three_or_five_and_are_checked() {
        assert_eq!(map(1).voters(), vec![0]);
        assert_eq!(map(4).voters(), vec![0, 1, 2]);
        assert_eq!(map(7).voters(), vec![0, 1, 2, 3, 4]);
        let mut m = map(4);
        m.membership.voters = Some(vec![3, 1]);
        m.validate().unwrap();
        assert_eq!(m.voters(), vec![3, 1]);
        let back: ClusterMap = toml::from_str(&m.to_toml()).unwrap();
        assert_eq!(back, m);
        m.membership.voters = Some(vec![9]);
        assert_eq!(
            m.validate().unwrap_err(),
            "membership.voters: server 9 is not a [[server]] of this map with a process of its own"
        );
        m.membership.voters = Some(vec![1, 1]);
        assert_eq!(m.validate().unwrap_err(), "membership.voters: server 1 is listed twice");
        m.membership.voters = Some(vec![]);
        assert!(m.validate().unwrap_err().starts_with("membership.voters is empty"));
        m.membership.voters = None;
        m.membership.down_after_ms = 10;
        assert!(m.validate().unwrap_err().starts_with("membership.down_after_ms 10"));
        m.membership.down_after_ms = 3000;
        m.membership.refused_down_after_ms = 100;
        assert_eq!(
            m.validate().unwrap_err(),
            "membership.refused_down_after_ms 100 must be 0 (off) or from 250 to down_after_ms (3000)"
        );
        m.membership.refused_down_after_ms = 0;
        m.validate().unwrap();
    }

    #[test]
    fn a_bad_map_file_is_refused_on_load_with_its_path() {
        let dir = std::env::temp_dir().join(format!("shoal-map-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cluster.toml");
        std::fs::write(&path, "[cluster]\nversion = 0\n[[server]]\nid = 0\naddr = \"127.0.0.1:7400\"\n").unwrap();
        let err = ClusterMap::load(&path).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(err, format!("cluster config {}: cluster.version must be ≥ 1 (it is 0)", path.display()));
    }

    #[test]
    fn a_misspelt_key_is_refused_in_one_line_naming_it() {
        let dir = std::env::temp_dir().join(format!("shoal-map-typo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cluster.toml");
        std::fs::write(
            &path,
            "[cluster]\nversion = 1\nstripe_cout = 2\n[[server]]\nid = 0\naddr = \"127.0.0.1:7400\"\n",
        )
        .unwrap();
        let err = ClusterMap::load(&path).unwrap_err().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("line 3") && err.contains("unknown field `stripe_cout`"), "{err}");
    }

    #[test]
    fn placement_spreads_evenly() {
        let m = map(4);
        let mut counts = [0u32; 4];
        for k in 0..40_000u64 {
            counts[m.home_of(Ino(k)).0 as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }

    proptest! {
        #[test]
        fn home_is_the_first_of_the_ranking(keys in proptest::collection::vec(any::<u64>(), 1..200), w in 0.1f64..4.0) {
            let mut m = map(5);
            m.servers[2].weight = w;
            m.servers[3].state = ServerState::Out;
            for k in keys {
                prop_assert_eq!(m.home_of(Ino(k)), m.rank(k)[0]);
            }
        }

        #[test]
        fn adding_a_server_moves_keys_only_to_it(keys in proptest::collection::vec(any::<u64>(), 1..200)) {
            let before = map(4);
            let after = map(5);
            for k in keys {
                let (a, b) = (before.home_of(Ino(k)), after.home_of(Ino(k)));
                prop_assert!(a == b || b == ServerId(4));
            }
        }
    }
}

#[cfg(test)]
mod mirror_tests {
    use super::*;

    #[test]
    fn a_drained_server_keeps_its_copies_until_the_mirrors_replacing_it_are_in_sync() {
        let mut map = ClusterMap::local(4, 7000, Path::new("/tmp"));
        map.cluster.replicas = 2;
        map.set_draining(ServerId(1));
        // Slot 0's mirror was 1: server 2 replaces it, behind, and 1 keeps its copy after it.
        assert_eq!(map.mirrors_of(ServerId(0)), vec![ServerId(2), ServerId(1)]);
        assert_eq!(map.server(ServerId(0)).unwrap().behind, vec![2]);
        assert_eq!(map.awaiting_replacement(ServerId(1)), vec![ServerId(0)]);
        // Other slots are as before; slot 1's own mirror is 2.
        assert_eq!(map.mirrors_of(ServerId(1)), vec![ServerId(2)]);
        assert_eq!(map.mirrors_of(ServerId(3)), vec![ServerId(0)]);
        // Server 0 down: its in-sync copy on the drained server is not promoted.
        map.servers[0].state = ServerState::Down;
        assert_eq!(map.promotion_of(ServerId(0)), None);
        map.servers[0].state = ServerState::Up;
        // Server 2 in sync: the drained server's copy goes.
        map.servers[0].behind.clear();
        assert_eq!(map.mirrors_of(ServerId(0)), vec![ServerId(2)]);
        assert_eq!(map.mirrored_by(ServerId(1)), Vec::<ServerId>::new());
        assert!(map.awaiting_replacement(ServerId(1)).is_empty());
        // With no server to replace it, it keeps its copies until it leaves.
        let mut two = ClusterMap::local(2, 7000, Path::new("/tmp"));
        two.cluster.replicas = 2;
        two.set_draining(ServerId(1));
        assert_eq!(two.mirrors_of(ServerId(0)), vec![ServerId(1)]);
        assert!(two.server(ServerId(0)).unwrap().behind.is_empty());
        assert!(two.awaiting_replacement(ServerId(1)).is_empty(), "nothing to wait for");
        // A new incarnation of slot 0 (promoted, say): every mirror behind, the kept copy too.
        map.set_draining(ServerId(1));
        map.servers[0].behind = vec![2];
        map.set_all_behind(ServerId(0));
        assert_eq!(map.server(ServerId(0)).unwrap().behind, vec![2, 1]);
    }

    #[test]
    fn mirrors_are_the_next_servers_and_the_inverse_agrees() {
        let mut map = ClusterMap::local(4, 7000, Path::new("/tmp"));
        assert!(map.mirrors_of(ServerId(2)).is_empty(), "one copy: no mirror");
        map.cluster.replicas = 2;
        assert_eq!(map.mirrors_of(ServerId(3)), vec![ServerId(0)], "wraps around");
        map.cluster.replicas = 3;
        assert_eq!(map.mirrors_of(ServerId(1)), vec![ServerId(2), ServerId(3)]);
        for s in 0..4 {
            let by = map.mirrored_by(ServerId(s));
            assert_eq!(by.len(), 2);
            assert!(by.iter().all(|&slot| map.mirrors_of(slot).contains(&ServerId(s))));
        }
        map.cluster.replicas = 5;
        assert!(map.validate().unwrap_err().contains("cluster.replicas 5"));
    }

    #[test]
    fn a_drained_server_leaves_the_voters_and_a_retired_one_becomes_a_slot_of_another() {
        let mut map = ClusterMap::local(5, 7000, Path::new("/d"));
        map.cluster.replicas = 2;
        assert_eq!(map.voters(), vec![0, 1, 2]);
        map.set_draining(ServerId(1));
        map.validate().unwrap();
        assert_eq!(map.voters(), vec![0, 2, 3], "a drained server is replaced among the voters");
        map.membership.voters = Some(vec![1, 2, 4]);
        assert_eq!(map.voters(), vec![2, 4, 0], "named voters too, keeping their number");
        // Nothing may move to a drained server, and no copy of it is promoted.
        map.servers[3].moving_to = Some(1);
        assert!(map.validate().unwrap_err().contains("moving_to 1"));
        map.servers[3].moving_to = None;
        map.servers[0].state = ServerState::Down;
        assert_eq!(
            map.promotion_of(ServerId(0)),
            None,
            "the mirror of 0 is server 1, being drained, and server 2 replacing it is behind"
        );

        map.servers[0].state = ServerState::Up;
        map.servers[4].behind = vec![1];
        map.retire(ServerId(1), ServerId(3));
        map.cluster.version += 1;
        map.validate().unwrap();
        let e = map.server(ServerId(1)).unwrap();
        assert_eq!((e.host, e.draining, e.data_dir.clone()), (Some(3), false, None));
        assert_eq!(map.processes().count(), 4);
        assert_eq!(map.membership.voters, Some(vec![2, 4, 0]), "the retired voter replaced");
        assert!(map.servers[4].behind.is_empty(), "the retired server mirrors nothing now");
        assert_eq!(map.mirrors_of(ServerId(1)), vec![ServerId(4)]);
        assert_eq!(e.behind, vec![4], "a new mirror is behind until resynchronised");
        assert_eq!(map.server(ServerId(0)).unwrap().behind, vec![2], "so is every slot's");
    }

    #[test]
    fn an_absent_server_is_skipped_so_every_slot_gets_its_copies_back() {
        let mut map = ClusterMap::local(4, 7000, Path::new("/d"));
        map.cluster.replicas = 2;
        // Server 1 died: its slot failed over to its mirror, server 2, and runs with one copy.
        map.servers[1].state = ServerState::Down;
        map.servers[1].served_by = Some(2);
        assert!(map.mirrors_of(ServerId(1)).is_empty());
        assert_eq!(map.mirrors_of(ServerId(0)), vec![ServerId(1)], "a down mirror is not replaced");

        map.set_absent(ServerId(1), true);
        map.validate().unwrap();
        assert_eq!(map.mirrors_of(ServerId(1)), vec![ServerId(3)], "the next server after the copy serving it");
        assert_eq!(map.mirrors_of(ServerId(0)), vec![ServerId(2)], "the next server in place of the absent one");
        assert_eq!(map.mirrors_of(ServerId(3)), vec![ServerId(0)], "unchanged");
        assert_eq!(map.server(ServerId(1)).unwrap().behind, vec![3]);
        assert_eq!(map.server(ServerId(0)).unwrap().behind, vec![2]);
        assert!(map.server(ServerId(3)).unwrap().behind.is_empty());
        assert!(map.mirrored_by(ServerId(1)).is_empty(), "an absent server mirrors nothing");

        // Back: the mirror sets are as before, and it is behind where it mirrors again.
        map.servers[1].served_by = None;
        map.servers[1].state = ServerState::Up;
        map.set_absent(ServerId(1), false);
        assert_eq!(map.mirrors_of(ServerId(0)), vec![ServerId(1)]);
        assert_eq!(map.server(ServerId(0)).unwrap().behind, vec![1]);
        assert_eq!(map.mirrors_of(ServerId(1)), vec![ServerId(2)]);

        // Only a process can be absent; the grace is at least the down delay.
        map.servers[3].host = Some(0);
        map.servers[3].data_dir = None;
        map.servers[3].http = None;
        map.servers[3].absent = true;
        assert!(map.validate().unwrap_err().contains("absent is only for a server with a process"));
        map.servers[3].absent = false;
        map.membership.absent_after_ms = 1000;
        assert!(map.validate().unwrap_err().contains("membership.absent_after_ms 1000"));
    }
}
