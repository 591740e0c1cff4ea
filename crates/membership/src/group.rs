//! One server's member of the group: starting it, proposing changes, answering the other
//! members, and the background tasks that keep learners in the group and detect failures.

use crate::detector::{self, Heard};
use crate::doc::{self, ApplyResult, Command, MapDoc};
use crate::network::{self, Network, RaftTransport};
use crate::store::{self, LogStore, StateMachine};
use crate::TypeConfig;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{Config, EmptyNode, Raft, ServerState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The leader's heartbeat interval. Elections start after 5 to 10 of them unheard: long
/// enough that a busy machine (tests run several servers on two cores) does not depose a
/// healthy leader, short enough that a dead one is replaced in a few seconds.
pub const HEARTBEAT_MS: u64 = 150;

/// Entries per append (see `MapGroup::start`).
const MAX_PAYLOAD_ENTRIES: u64 = 32;
/// Entries between snapshots; a follower twice as far behind is sent the snapshot.
const SNAPSHOT_EVERY: u64 = 1000;

/// How long a proposal that lost the compare-and-set waits for this member to apply the
/// map it lost to, so that the caller's next try is made against it.
const CATCH_UP_WAIT: Duration = Duration::from_secs(2);

/// How long a proposal waits for a leader to exist before it answers `NoLeader`.
const LEADER_WAIT: Duration = Duration::from_secs(5);

/// How long the leader waits for a majority to accept a change.
const COMMIT_WAIT: Duration = Duration::from_secs(3);

/// Why a proposal did not change the map.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ProposeError {
    #[error("the map is at version {current}, not the version the change was made against")]
    Conflict { current: u64 },
    #[error("no leader of the map group (is a majority of its voters up?)")]
    NoLeader,
    #[error("not a valid next map: {0}")]
    Invalid(String),
    /// Answered by a member asked to commit a forwarded proposal while it is not the
    /// leader (leadership moved); the proposer tries again.
    #[error("this member is not the leader")]
    NotLeader,
    #[error("{0}")]
    Failed(String),
}

/// What `shoal status` and `shoal map show` say about the group, as one member sees it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupStatus {
    pub node: u32,
    /// "leader", "follower", "candidate" or "learner".
    pub role: String,
    pub leader: Option<u32>,
    pub term: u64,
    pub last_log_index: Option<u64>,
    pub voters: Vec<u32>,
    pub learners: Vec<u32>,
    pub map_version: u64,
}

struct Inner {
    node: u32,
    raft: Raft<TypeConfig>,
    docs: watch::Receiver<Arc<MapDoc>>,
    transport: Arc<dyn RaftTransport>,
    heard: Arc<Heard>,
    /// Learners named at start (the leader adds them, and every server of a later map).
    learners: Vec<u32>,
    /// The background tasks; they hold the group weakly and are stopped with it.
    tasks: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
    }
}

/// This server's member of the map group. Cheap to clone.
#[derive(Clone)]
pub struct MapGroup {
    inner: Arc<Inner>,
}

fn decode<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, String> {
    rmp_serde::from_slice(payload).map_err(|e| format!("undecodable Raft message: {e}"))
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, String> {
    rmp_serde::to_vec_named(v).map_err(|e| format!("cannot encode a Raft answer: {e}"))
}

impl MapGroup {
    /// Open the group's storage under `dir` and join the group as `node`. The lowest of
    /// `voters` initializes the group on its very first start (a restarted member, or one
    /// whose group exists already, does not). `learners` are added by the leader; so is any
    /// server that appears in a later map. `initial` is the document until the group applies
    /// its first change (see `StateMachine::open`).
    pub async fn start(
        node: u32,
        voters: &[u32],
        learners: &[u32],
        dir: &Path,
        initial: MapDoc,
        transport: Arc<dyn RaftTransport>,
    ) -> anyhow::Result<MapGroup> {
        let db = store::open_db(dir)?;
        let log = LogStore::new(db.clone());
        let (sm, docs) = StateMachine::open(db, initial)?;
        let config = Config {
            cluster_name: "shoal-map".into(),
            heartbeat_interval: HEARTBEAT_MS,
            election_timeout_min: HEARTBEAT_MS * 5,
            election_timeout_max: HEARTBEAT_MS * 10,
            // openraft gives every append one heartbeat interval (150 ms) to be answered.
            // Each entry is a whole map, so its default batch of 300 did not fit in that
            // on a loaded machine: a follower far behind timed out on the same batch again
            // and again and never caught up (seen in the 10-minute kills run, docs/testing.md).
            // Small batches fit; a follower further behind than a snapshot's worth gets the
            // snapshot (one map) instead of the entries.
            max_payload_entries: MAX_PAYLOAD_ENTRIES,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY),
            replication_lag_threshold: 2 * SNAPSHOT_EVERY,
            ..Default::default()
        };
        let config = Arc::new(config.validate().map_err(|e| anyhow::anyhow!("map group configuration: {e}"))?);
        let heard = Arc::new(Heard::default());
        let net = Network { transport: transport.clone(), heard: heard.clone() };
        let raft = Raft::new(node as u64, config, net, log, sm)
            .await
            .map_err(|e| anyhow::anyhow!("cannot start the map group: {e}"))?;
        let first = voters.iter().min().copied();
        if first == Some(node) && !raft.is_initialized().await.map_err(|e| anyhow::anyhow!("map group: {e}"))? {
            let members: BTreeSet<u64> = voters.iter().map(|&v| v as u64).collect();
            // Initializing twice with the same voters is safe (openraft refuses the second
            // as "not allowed"), so a failure here is only logged.
            if let Err(e) = raft.initialize(members).await {
                tracing::debug!("map group initialization: {e}");
            }
        }
        let inner = Arc::new(Inner {
            node,
            raft,
            docs,
            transport,
            heard,
            learners: learners.to_vec(),
            tasks: Default::default(),
        });
        let tasks = vec![
            tokio::spawn(keep_members(Arc::downgrade(&inner))),
            tokio::spawn(detect_failures(Arc::downgrade(&inner))),
        ];
        *inner.tasks.lock() = tasks;
        Ok(MapGroup { inner })
    }

    /// The newest map this member has applied.
    pub fn current(&self) -> Arc<MapDoc> {
        self.inner.docs.borrow().clone()
    }

    /// Every map this member applies from now on.
    pub fn watch(&self) -> watch::Receiver<Arc<MapDoc>> {
        self.inner.docs.clone()
    }

    /// The leader as this member knows it.
    pub fn leader(&self) -> Option<u32> {
        self.inner.raft.metrics().borrow().current_leader.map(|l| l as u32)
    }

    /// This member's server id.
    pub fn node(&self) -> u32 {
        self.inner.node
    }

    /// Record that `server` was heard from (a reply on a peer connection): the failure
    /// detector counts it as alive.
    pub fn on_heard(&self, server: u32) {
        self.inner.heard.heard(server);
    }

    /// The group as this member sees it.
    pub fn status(&self) -> GroupStatus {
        let m = self.inner.raft.metrics().borrow().clone();
        let role = match m.state {
            ServerState::Leader => "leader",
            ServerState::Candidate => "candidate",
            ServerState::Follower => "follower",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "shut down",
        };
        let mem = m.membership_config.membership();
        let voters: Vec<u32> = mem.voter_ids().map(|v| v as u32).collect();
        let learners: Vec<u32> = mem.learner_ids().map(|v| v as u32).collect();
        GroupStatus {
            node: self.inner.node,
            role: role.to_string(),
            leader: m.current_leader.map(|l| l as u32),
            term: m.current_term,
            last_log_index: m.last_log_index,
            voters,
            learners,
            map_version: self.current().version,
        }
    }

    /// Replace the map by `toml` if it is still at `expect_version` (compare-and-set; `toml`
    /// must declare version `expect_version + 1`). Works on any member: a member that does not
    /// lead forwards the proposal to the leader. Returns the new version once this member
    /// has applied it too (so that [`MapGroup::current`] here shows it).
    pub async fn propose(&self, expect_version: u64, toml: String) -> Result<u64, ProposeError> {
        doc::check_next(expect_version, &toml).map_err(ProposeError::Invalid)?;
        let deadline = Instant::now() + LEADER_WAIT;
        let version = loop {
            let attempt = match self.wait_for_leader(deadline).await {
                None => Err(ProposeError::NoLeader),
                Some(l) if l == self.inner.node => self.propose_here(expect_version, toml.clone()).await,
                Some(l) => self.forward(l, expect_version, &toml).await,
            };
            match attempt {
                Ok(v) => break v,
                // Leadership moved, or the leader was unreachable: ask again until the
                // deadline (an election takes a few heartbeats).
                Err(ProposeError::NotLeader) | Err(ProposeError::Failed(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(HEARTBEAT_MS)).await;
                }
                Err(ProposeError::NotLeader) => return Err(ProposeError::NoLeader),
                Err(ProposeError::Conflict { current }) => {
                    // Callers read `current()` and try again at once: made against this
                    // member's map until it has applied the newer one, each try would lose
                    // again, as fast as the leader answers (a member behind, whose caller
                    // retried thousands of times, filled the log: docs/testing.md).
                    let mut docs = self.inner.docs.clone();
                    let _ = tokio::time::timeout(CATCH_UP_WAIT, docs.wait_for(|d| d.version >= current)).await;
                    return Err(ProposeError::Conflict { current });
                }
                Err(e) => return Err(e),
            }
        };
        let mut docs = self.inner.docs.clone();
        // Bounded: the leader has committed it, so this member gets it within heartbeats
        // (unless it is cut off, and then its caller learns the version anyway).
        let _ = tokio::time::timeout(Duration::from_secs(2), docs.wait_for(|d| d.version >= version)).await;
        Ok(version)
    }

    async fn wait_for_leader(&self, deadline: Instant) -> Option<u32> {
        let mut m = self.inner.raft.metrics();
        let wait = deadline.saturating_duration_since(Instant::now());
        let found = tokio::time::timeout(wait, m.wait_for(|m| m.current_leader.is_some())).await;
        match found {
            Ok(Ok(m)) => m.current_leader.map(|l| l as u32),
            _ => None,
        }
    }

    async fn forward(&self, leader: u32, expect_version: u64, toml: &str) -> Result<u64, ProposeError> {
        let payload = encode(&(expect_version, toml)).map_err(ProposeError::Failed)?;
        let answer = self
            .inner
            .transport
            .call(leader, network::KIND_PROPOSE, payload, Duration::from_secs(5))
            .await
            .map_err(|e| ProposeError::Failed(format!("forwarding to the leader, server {leader}: {e}")))?;
        decode::<Result<u64, ProposeError>>(&answer).map_err(ProposeError::Failed)?
    }

    /// Commit a proposal as the leader.
    async fn propose_here(&self, expect_version: u64, toml: String) -> Result<u64, ProposeError> {
        // A change made against an older version than this leader applied can only lose:
        // answered without an entry (every entry goes to every member's log).
        let applied = self.current().version;
        if expect_version < applied {
            return Err(ProposeError::Conflict { current: applied });
        }
        // Bounded: a leader cut off from its quorum does not know it and would wait forever.
        let write = self.inner.raft.client_write(Command::Replace { expect_version, toml });
        let Ok(written) = tokio::time::timeout(COMMIT_WAIT, write).await else {
            return Err(ProposeError::Failed(format!(
                "not committed within {} s (is a majority of the group's voters reachable?)",
                COMMIT_WAIT.as_secs()
            )));
        };
        match written {
            Ok(r) => match r.data {
                ApplyResult::Applied { version } => Ok(version),
                ApplyResult::Conflict { current } => Err(ProposeError::Conflict { current }),
                ApplyResult::Invalid { message } => Err(ProposeError::Invalid(message)),
                ApplyResult::NotACommand => Err(ProposeError::Failed("the group answered a map change oddly".into())),
            },
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => Err(ProposeError::NotLeader),
            Err(e) => Err(ProposeError::Failed(e.to_string())),
        }
    }

    /// The receiving side of the transport: answer a message another member sent.
    pub async fn handle(&self, kind: u8, payload: &[u8]) -> Result<Vec<u8>, String> {
        let raft = &self.inner.raft;
        match kind {
            // A message from the leader (appends) or a candidate (votes) is word from it: a
            // member that becomes leader later knows it was alive (detector.rs: only then is
            // a refused connection taken for its death).
            network::KIND_APPEND => {
                let req: openraft::raft::AppendEntriesRequest<TypeConfig> = decode(payload)?;
                self.heard_from_sender(req.vote.leader_id().voted_for());
                encode(&raft.append_entries(req).await)
            }
            network::KIND_VOTE => {
                let req: openraft::raft::VoteRequest<u64> = decode(payload)?;
                self.heard_from_sender(req.vote.leader_id().voted_for());
                encode(&raft.vote(req).await)
            }
            network::KIND_SNAPSHOT => encode(&raft.install_snapshot(decode(payload)?).await),
            network::KIND_PROPOSE => {
                let (expect, toml): (u64, String) = decode(payload)?;
                encode(&self.propose_here(expect, toml).await)
            }
            network::KIND_PING => Ok(Vec::new()),
            other => Err(format!("unknown Raft message kind {other}")),
        }
    }

    fn heard_from_sender(&self, sender: Option<u64>) {
        if let Some(id) = sender.filter(|&id| id != u64::from(self.inner.node)) {
            self.inner.heard.heard(id as u32);
        }
    }

    /// Stop this member (its Raft task and background tasks).
    pub async fn shutdown(&self) {
        for t in self.inner.tasks.lock().drain(..) {
            t.abort();
        }
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!("stopping the map group: {e}");
        }
    }
}

/// On the leader: keep the group's members those of the map. Every server of the map (and
/// every learner named at start) that is not a member yet is added as a learner, so that
/// it receives each new map; the voters follow `ClusterMap::voters` (a server being drained
/// leaves them, and another takes its place once it is a learner); a member that is no
/// longer a server of the map (drained or removed) leaves the group.
async fn keep_members(group: std::sync::Weak<Inner>) {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Some(g) = group.upgrade() else { return };
        let m = g.raft.metrics().borrow().clone();
        if m.state != ServerState::Leader {
            continue;
        }
        let membership = m.membership_config.membership().clone();
        let members: BTreeSet<u64> = membership.nodes().map(|(id, _)| *id).collect();
        let doc = g.docs.borrow().clone();
        let Ok(map) = doc.map() else { continue };
        // Processes only: a slot living on another server has no member of its own.
        let processes: BTreeSet<u32> = map.processes().map(|s| s.id).collect();
        let in_map = |id: u32| map.servers.iter().any(|e| e.id == id);
        let mut wanted: BTreeSet<u32> = g.learners.iter().copied().filter(|id| !in_map(*id)).collect();
        wanted.extend(processes.iter().copied());
        for id in wanted.iter().filter(|id| !members.contains(&(**id as u64))) {
            // Not blocking: the learner catches up in the background, and one that is down
            // must not hold up the others.
            if let Err(e) = g.raft.add_learner(*id as u64, EmptyNode {}, false).await {
                tracing::debug!("adding server {id} to the map group as a learner: {e}");
            }
        }
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let want_voters: BTreeSet<u64> = map.voters().into_iter().map(u64::from).collect();
        let joint = membership.get_joint_config().len() > 1;
        if (joint || voters != want_voters) && !want_voters.is_empty() && want_voters.is_subset(&members) {
            // Kept as learners (`retain`): a voter being drained still follows the map until
            // its slot has moved. A change cut short by a lost leadership (left joint) is
            // finished by the next leader here.
            tracing::warn!("map group voters {voters:?} become {want_voters:?}");
            match tokio::time::timeout(MEMBERSHIP_WAIT, g.raft.change_membership(want_voters, true)).await {
                Ok(Ok(_)) => tracing::warn!("map group voters are {:?} now", map.voters()),
                Ok(Err(e)) => tracing::warn!("changing the map group's voters: {e}"),
                Err(_) => tracing::warn!("changing the map group's voters: not committed within {MEMBERSHIP_WAIT:?}"),
            }
            continue;
        }
        let gone: BTreeSet<u64> =
            membership.learner_ids().filter(|id| !wanted.contains(&(*id as u32)) && in_map(*id as u32)).collect();
        if !gone.is_empty() {
            let removal = g.raft.change_membership(openraft::ChangeMembers::RemoveNodes(gone.clone()), false);
            match tokio::time::timeout(MEMBERSHIP_WAIT, removal).await {
                Ok(Ok(_)) => tracing::warn!("servers {gone:?} left the map group (no longer servers of the map)"),
                Ok(Err(e)) => tracing::warn!("removing servers {gone:?} from the map group: {e}"),
                Err(_) => tracing::warn!("removing servers {gone:?} from the map group: not committed in time"),
            }
        }
    }
}

/// How long the leader waits for a change of the group's members to commit.
const MEMBERSHIP_WAIT: Duration = Duration::from_secs(10);

/// Mark `servers` absent (`detector::to_mark_absent`): their copies are made elsewhere.
async fn mark_absent(group: MapGroup, doc: &crate::doc::MapDoc, servers: &[u32]) {
    let toml = match detector::marked_absent(doc, servers) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!("cannot mark servers {servers:?} absent: {e}");
            return;
        }
    };
    match group.propose_here(doc.version, toml).await {
        Ok(v) => tracing::warn!(
            "servers {servers:?} away for longer than absent_after_ms: marked absent (map version {v}); the copies \
             they held are made again on the other servers"
        ),
        // Someone changed the map meanwhile: judged again on the next round.
        Err(e) => tracing::debug!("marking servers {servers:?} absent: {e}"),
    }
}

/// On the leader: mark silent servers down, and servers away for long absent (`detector.rs`).
async fn detect_failures(group: std::sync::Weak<Inner>) {
    let mut was_leader = false;
    // Each server's address in the last map seen: a server that moved (its slot failed over
    // to a mirror's host) is another process, judged afresh from its move on.
    let mut addrs: HashMap<u32, String> = HashMap::new();
    // Since when each server has been away, as this member saw it while leading (`detector::to_mark_absent`).
    let mut away: HashMap<u32, Instant> = HashMap::new();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let Some(g) = group.upgrade() else { return };
        let leader = g.raft.metrics().borrow().state == ServerState::Leader;
        let doc = g.docs.borrow().clone();
        if let Ok(map) = doc.map() {
            for s in &map.servers {
                if addrs.get(&s.id).is_some_and(|a| *a != s.addr) {
                    g.heard.heard(s.id);
                }
                addrs.insert(s.id, s.addr.clone());
            }
        }
        if !leader {
            was_leader = false;
            continue;
        }
        if !was_leader {
            was_leader = true;
            if let Ok(map) = doc.map() {
                g.heard.reset(map.servers.iter().map(|s| s.id));
            }
            away.clear();
            continue;
        }
        detector::ping_silent(&doc, g.node, &g.heard, &g.transport);
        let down = detector::to_mark_down(&doc, g.node, &g.heard, Instant::now());
        let absent = detector::to_mark_absent(&doc, &mut away, Instant::now());
        if down.is_empty() {
            if !absent.is_empty() {
                mark_absent(MapGroup { inner: g }, &doc, &absent).await;
            }
            continue;
        }
        let toml = match detector::marked_down(&doc, &down) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("cannot mark servers {down:?} down: {e}");
                continue;
            }
        };
        let group = MapGroup { inner: g };
        match group.propose_here(doc.version, toml).await {
            Ok(v) => tracing::warn!("servers {down:?} unheard for too long: marked down (map version {v})"),
            // Someone changed the map meanwhile: judged again on the next round.
            Err(e) => tracing::debug!("marking servers {down:?} down: {e}"),
        }
    }
}
