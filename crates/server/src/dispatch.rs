//! From a decoded request to its reply: the map-version check, routing each `Op` to its
//! handler, counting, and turning failures into `Reply::Error`.

use crate::caps;
use crate::error::{fail, Fail, R};
use crate::ops::{data, fetch, inode, namespace, peer};
use crate::state::State;
use crate::store::write_crcs::PieceCrcs;
use bytes::Bytes;
use futures::future::BoxFuture;
use shoal_proto::cap::{RIGHT_READ, RIGHT_WRITE};
use shoal_proto::msg::{BatchOp, BatchReply, Cred, Op, Reply, Request, BATCH_MAX};
use shoal_proto::Errno;
use std::sync::Arc;

/// How long a request naming a newer map than the server's waits for it to arrive.
const NEWER_MAP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The data section of a reply.
pub enum Payload {
    /// Bytes in memory.
    Bytes(Bytes),
}

impl Payload {
    pub fn none() -> Payload {
        Payload::Bytes(Bytes::new())
    }
}

/// Handle one request that arrived over the network. `from_peer`: sent by another server.
/// `crcs`: for a `Write` whose data checksum the connection verified, the CRC32C of the
/// data's block pieces it computed to do so (`net.rs`), which the data store reuses.
pub async fn handle(
    st: &Arc<State>,
    req: Request,
    data: Bytes,
    crcs: Option<PieceCrcs>,
    from_peer: bool,
) -> (Reply, Payload) {
    let name = req.op.name();
    // The load exchange is the servers' own upkeep: counted nowhere, so that request
    // counts stay those of the workload (`load.rs`).
    // So is the map group's traffic (heartbeats several times a second).
    let exchange = matches!(req.op, Op::PeerLoad { .. } | Op::PeerRaft { .. });
    if !exchange {
        st.counters.request(name, from_peer || req.op.is_peer());
    }
    let _timed = (!exchange).then(|| st.metrics.request(name));
    let data_bytes = crate::load::data_bytes(&req.op, &data);
    let mut _busy = (!exchange).then(|| st.load.begin(data_bytes.is_some()));
    // The slot is changing hands (`quiesce.rs`): wait, uncounted, until it is released or
    // stopped. Counted first and checked after, so the hand-over sees this request either
    // running or held.
    while !crate::rejoin::answers_in_standby(&req.op) && st.quiesce.holding() {
        _busy = None;
        if !st.quiesce.wait(&st.stop).await {
            return (Reply::StaleMap { current: st.map.version() }, Payload::none());
        }
        _busy = Some(st.load.begin(data_bytes.is_some()));
    }
    if let Some(n) = data_bytes {
        if !from_peer && !req.op.is_peer() {
            st.load.client_data();
        }
        st.load.throttle(n).await;
    }
    // 0 means "any map" (tools that do not route by the map, and local peer steps). The
    // map group's messages and `GetMap` are how a server or client behind catches up, so
    // they are answered whatever map the sender has.
    let routes_by_map = !matches!(req.op, Op::PeerRaft { .. } | Op::GetMap { .. } | Op::ProposeMap { .. });
    if routes_by_map && req.map_version != 0 && req.map_version != st.map.version() {
        // The sender saw a newer map than ours: ours is on its way through the group.
        if req.map_version > st.map.version() {
            st.map.wait_for(req.map_version, NEWER_MAP_WAIT).await;
        }
        if req.map_version != st.map.version() {
            return (Reply::StaleMap { current: st.map.version() }, Payload::none());
        }
    }
    if st.rejoin.standby && !crate::rejoin::answers_in_standby(&req.op) {
        // Standing by after a crash while the map still names this server for the slot
        // (`rejoin::mirror_to_hand_off`): hold the request until the map moves the slot to
        // its mirror, then send the client to that map (it resends, same request id, to the
        // copy, whose replies answer a retry).
        let v = st.map.version();
        if st.rejoin.handing_off() && req.map_version == v && st.map.wait_for(v + 1, NEWER_MAP_WAIT).await {
            return (Reply::StaleMap { current: st.map.version() }, Payload::none());
        }
        let msg = format!(
            "server {} stands by while its slot is served from a copy (a failover): its stores are out of date",
            st.id
        );
        return (crate::dispatch::refuse(Errno::ESTALE, msg), Payload::none());
    }
    let op_desc = if tracing::enabled!(tracing::Level::DEBUG) { format!("{:?}", req.op) } else { String::new() };
    match route(st, req, data, crcs).await {
        Ok(r) => r,
        Err(Fail { misrouted: Some(dir), .. }) => {
            (crate::ops::namespace::split::misrouted_reply(st, dir).await, Payload::none())
        }
        Err(f) => {
            st.counters.error();
            st.metrics.error(f.errno);
            if f.errno == Errno::EIO {
                tracing::warn!("{name} failed: {f}");
            } else {
                tracing::debug!("{name} {op_desc} failed: {f}");
            }
            (f.into_reply(), Payload::none())
        }
    }
}

/// [`handle`] as a boxed future: the entry point for steps a server addresses to itself
/// (a peer step whose target is local), which would otherwise make handler futures recursive.
pub fn handle_boxed(
    st: Arc<State>,
    req: Request,
    data: Bytes,
    from_peer: bool,
) -> BoxFuture<'static, (Reply, Payload)> {
    Box::pin(async move { handle(&st, req, data, None, from_peer).await })
}

fn ok(r: Reply) -> (Reply, Payload) {
    (r, Payload::none())
}

async fn route(st: &Arc<State>, req: Request, data: Bytes, crcs: Option<PieceCrcs>) -> R<(Reply, Payload)> {
    match req.op {
        Op::Batch { ops } => Ok(ok(batch(st, req.cred, ops).await?)),
        op => route_op(st, req.cred, op, data, crcs).await,
    }
}

/// Run the operations of a batch one after the other, each as if it had come alone (same
/// handlers, same errors), and answer with all their results. Why sequentially: they were
/// independent requests of one client, so any order is one it could have seen, and one
/// task running them costs less than a task each (the point of batching: one frame, one
/// task and one reply for many small operations). Each counts under its own name in the
/// per-operation counters; the request count counts the batch once.
async fn batch(st: &Arc<State>, cred: Cred, ops: Vec<BatchOp>) -> R<Reply> {
    if ops.len() > BATCH_MAX {
        return fail(Errno::EINVAL, format!("a batch of {} operations (at most {BATCH_MAX})", ops.len()));
    }
    let mut replies = Vec::with_capacity(ops.len());
    for op in ops {
        let op = op.into_op();
        st.counters.batched(op.name());
        let reply = match route_op(st, cred.clone(), op, Bytes::new(), None).await {
            Ok((reply, _)) => reply,
            Err(Fail { misrouted: Some(dir), .. }) => crate::ops::namespace::split::misrouted_reply(st, dir).await,
            Err(f) => {
                st.counters.error();
                st.metrics.error(f.errno);
                f.into_reply()
            }
        };
        replies.push(BatchReply::from_reply(reply));
    }
    Ok(Reply::Batch(replies))
}

/// Bytes of disk an operation will take, if it takes any: such operations are refused with
/// ENOSPC when the disk is nearly full (`store::space`), while those that free space or
/// take only a log record (unlink, rmdir, rename, truncate, setattr, size publication,
/// removals) go on. A size extension by `SetAttr` is checked by its handler.
fn space_needed(op: &Op, data: &Bytes) -> Option<u64> {
    match op {
        Op::Write { .. } | Op::WriteList { .. } => Some(data.len() as u64),
        Op::FetchInto { pieces, .. } => Some(pieces.iter().map(|p| p.len).sum()),
        Op::Create { .. }
        | Op::Mkdir { .. }
        | Op::Symlink { .. }
        | Op::Link { .. }
        | Op::SetXattr { .. }
        | Op::PeerMkdirObject { .. } => Some(crate::store::space::RECORD_ROOM),
        // The moved entries: about a record each.
        Op::PeerSplitIn { entries, .. } => Some(crate::store::space::RECORD_ROOM * (1 + entries.len() as u64)),
        _ => None,
    }
}

async fn route_op(st: &Arc<State>, cred: Cred, op: Op, data: Bytes, crcs: Option<PieceCrcs>) -> R<(Reply, Payload)> {
    if let Some(bytes) = space_needed(&op, &data) {
        st.space.check(bytes)?;
    }
    let r = match op {
        // A repeated Hello is answered as the first was (net.rs) and changes nothing.
        Op::Hello { min_version, max_version, features, .. } => {
            let agreed = shoal_proto::hello::negotiate(
                min_version,
                max_version,
                features,
                shoal_proto::hello::server_features(),
            )
            .map_err(|m| Fail::new(Errno::EPROTO, m))?;
            Reply::Hello {
                protocol_version: agreed.version,
                server: st.id,
                map_version: st.map.version(),
                features: agreed.features,
                // A repeated Hello proves nothing: the connection keeps the role it has.
                auth: None,
            }
        }
        Op::Authenticate { .. } => {
            return fail(Errno::EINVAL, "Authenticate comes once, right after a Hello that claims a role")
        }
        Op::Lookup { dir, name, lease } => crate::leases::lookup(st, cred, dir, name, lease).await?,
        Op::Create { dir, name, perm, exclusive, layout } => {
            namespace::create(st, cred, dir, name, perm, exclusive, layout).await?
        }
        Op::Mkdir { dir, name, perm } => namespace::mkdir(st, cred, dir, name, perm).await?,
        Op::Symlink { dir, name, target } => namespace::symlink(st, cred, dir, name, target).await?,
        Op::Link { ino, dir, name } => namespace::link(st, cred, ino, dir, name).await?,
        Op::Unlink { dir, name, keep } => namespace::unlink(st, cred, dir, name, keep).await?,
        Op::Rmdir { dir, name } => namespace::rmdir(st, cred, dir, name).await?,
        Op::Rename { src_dir, src_name, dst_dir, dst_name, flags, keep } => {
            namespace::rename(st, cred, src_dir, src_name, dst_dir, dst_name, flags, keep).await?
        }
        Op::ReadDir { dir, after, limit, lease, from } => {
            crate::leases::readdir(st, cred, dir, after, from, limit, lease).await?
        }
        Op::LeaseAck { ids } => crate::leases::ack(st, &ids),
        Op::Find { query, after, limit } => crate::ops::find::find(st, cred, query, after, limit).await?,
        Op::TupleWrite { tuple, then } => crate::ops::tuples::write(st, cred, tuple, then).await?,
        Op::TupleRead { template, take, newest, wait_ms } => {
            crate::ops::tuples::read(st, cred, template, take, newest, wait_ms).await?
        }
        Op::TupleWatch { template, kinds, after, limit, wait_ms } => {
            crate::ops::tuples::watch(st, template, kinds, after, limit, wait_ms).await?
        }
        Op::Changes { after, consumer, kinds, limit, wait_ms } => {
            crate::ops::changes::changes(st, cred, after, consumer, kinds, limit, wait_ms).await?
        }
        Op::Usage { after, limit } => crate::ops::usage::usage(st, cred, after, limit).await?,
        Op::ChangeAck { consumer, upto, forget } => crate::ops::changes::ack(st, cred, consumer, upto, forget).await?,

        Op::GetAttr { ino } => inode::getattr(st, ino).await?,
        Op::SetAttr { ino, set } => inode::setattr(st, cred, ino, set).await?,
        Op::SetDirLayout { ino, spec } => inode::set_dir_layout(st, cred, ino, spec).await?,
        Op::SetReadMostly { ino, on } => inode::set_read_mostly(st, cred, ino, on).await?,
        Op::ReadLink { ino } => inode::readlink(st, ino).await?,
        Op::Access { ino, mask } => inode::access(st, cred, ino, mask).await?,
        Op::ExtendSize { ino, size } => inode::extend_size(st, cred, ino, size).await?,
        Op::SetXattr { ino, name, value, create_only, replace_only } => {
            inode::set_xattr(st, cred, ino, name, value, create_only, replace_only).await?
        }
        Op::GetXattr { ino, name } => inode::get_xattr(st, cred, ino, name).await?,
        Op::ListXattr { ino } => inode::list_xattr(st, cred, ino).await?,
        Op::RemoveXattr { ino, name } => inode::remove_xattr(st, cred, ino, name).await?,

        Op::Read { ino, index, offset, len, cap } => {
            caps::check(st, cap.as_ref(), ino, RIGHT_READ)?;
            return data::read(st, ino, index, offset, len).await;
        }
        Op::Write { ino, index, offset, file_end, inode_local, cap, copies } => {
            caps::check(st, cap.as_ref(), ino, RIGHT_WRITE)?;
            data::write(st, ino, index, offset, file_end, inode_local, data, crcs, copies).await?
        }
        Op::ReadList { ino, pieces, cap } => {
            caps::check(st, cap.as_ref(), ino, RIGHT_READ)?;
            return data::read_list(st, ino, pieces).await;
        }
        Op::WriteList { ino, pieces, file_end, inode_local, cap, copies } => {
            caps::check(st, cap.as_ref(), ino, RIGHT_WRITE)?;
            data::write_list(st, ino, pieces, file_end, inode_local, data, copies).await?
        }
        Op::Append { ino, cap } => {
            caps::check(st, cap.as_ref(), ino, RIGHT_WRITE)?;
            data::append(st, ino, data).await?
        }
        Op::UrlProbe { url } => fetch::probe(st, &url).await?,
        Op::FetchInto { url, ino, index, pieces, parallel, etag, cap, copies } => {
            caps::check(st, cap.as_ref(), ino, RIGHT_WRITE)?;
            fetch::fetch_into(st, &url, ino, index, pieces, parallel, etag, copies).await?
        }
        Op::Fsync { ino, data_only, cap, closing } => {
            caps::check(st, cap.as_ref(), ino, 0)?;
            if closing {
                crate::ops::changes::closed(st, cred.uid, ino).await?;
            }
            data::fsync(st, ino, data_only).await?
        }
        Op::Open { ino, rights, renew } => caps::open(st, cred, ino, rights, renew).await?,
        Op::StatFs => data::statfs(st).await?,
        Op::Status => data::status(st).await?,

        Op::PeerMkdirObject { attr, op_id } => peer::mkdir_object(st, attr, op_id).await?,
        Op::PeerRmdirObject { ino, op_id: _ } => peer::rmdir_object(st, ino).await?,
        Op::PeerLinkDelta { ino, delta, op_id, orphan_of, .. } => {
            peer::link_delta(st, ino, delta, op_id, orphan_of).await?
        }
        Op::PeerRenameIn { dst_dir, dst_name, entry, noreplace, op_id, keep } => {
            namespace::peer_rename_in(st, cred, dst_dir, dst_name, entry, noreplace, op_id, keep).await?
        }
        Op::PeerSetParent { ino, parent } => peer::set_parent(st, ino, parent).await?,
        Op::PeerMoveLock { op_id, hold } => crate::steps::move_lock::peer(st, op_id, hold).await?,
        Op::PeerDeleteObjects { objects } => peer::delete_objects(st, objects).await?,
        Op::PeerTruncateObject { ino, index, len, copies } => {
            peer::truncate_object(st, ino, index, len, copies).await?
        }
        Op::ReleaseOrphan { ino, session } => crate::orphans::release(st, ino, session).await?,
        Op::PeerSplitIn { dir, index, depth, attr, entries, op_id } => {
            namespace::split::split_in(st, dir, index, depth, attr, entries, op_id).await?
        }
        Op::PeerAddPartition { dir, index } => namespace::split::add_partition(st, dir, index).await?,
        Op::PeerPartitions { dir } => namespace::split::partitions(st, dir).await?,
        Op::PeerSealPartitions { dir, seal, drop } => namespace::split::seal(st, dir, seal, drop).await?,
        Op::PeerPartitionAttr { attr } => namespace::split::partition_attr(st, attr).await?,
        Op::PeerLoad { load } => {
            st.load.heard(load);
            Reply::Load(st.load.report())
        }
        Op::PeerReplicate { slot, incarnation, first, changes } => match st.replica.mirror(slot) {
            Some(m) => m.apply(incarnation, first, changes, data).await?,
            None => return fail(Errno::EINVAL, format!("server {} keeps no mirror of server {slot}", st.id)),
        },
        Op::PeerResyncQuery { slot, query } => crate::replica::mirror_of(st, slot)?.resync_query(query).await?,
        Op::PeerResyncApply { slot, changes } => {
            crate::replica::mirror_of(st, slot)?.resync_apply(changes, data).await?;
            Reply::Ok
        }
        Op::PeerResyncDone { slot, incarnation, applied } => {
            crate::replica::mirror_of(st, slot)?.resync_done(incarnation, applied).await?
        }
        Op::PeerRaft { kind, payload } => crate::membership::handle(st, kind, &payload).await?,
        Op::GetMap { .. } => crate::membership::get_map(st),
        Op::ProposeMap { expect_version, toml } => crate::membership::propose(st, &cred, expect_version, toml).await?,
        Op::ScrubStart => crate::scrub::start(st, &cred).await?,
        Op::ScrubStatus => crate::scrub::status(st).await?,
        Op::PeerScrubRead { slot, ino, index, offset, len } => {
            return crate::scrub_repair::serve_read(st, slot, ino, index, offset, len).await
        }
        // Never nested: `BatchOp` has no batch.
        Op::Batch { .. } => return fail(Errno::EINVAL, "a batch inside a batch"),
    };
    Ok(ok(r))
}

/// A reply for a request the server refuses before routing (used by the connection layer).
pub fn refuse(errno: Errno, message: impl Into<String>) -> Reply {
    Fail::new(errno, message).into_reply()
}
