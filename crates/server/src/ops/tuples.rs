//! The tuple space (docs/tuples.md): `TupleWrite`, `TupleRead` (read or take) and
//! `TupleWatch` on the tuples this server keeps.
//!
//! Records (`store/meta.rs`): `T` space seq holds a tuple, `space` the hash of its first
//! field, `seq` the event that wrote it, so a space's tuples sort oldest first and a read
//! scans only the tuples whose first field hashes alike. `N` seq is the tuple log: every
//! tuple written or taken, numbered from 1 without gap; a change and its event are one
//! batch, so the log holds exactly what happened, across `kill -9`, and is mirrored with
//! the rest of the store.
//!
//! Invariants: changes (writes and takes) are serialised by [`TupleSpace::lock`], which
//! also makes "find the oldest match and delete it" one step, so two takers never get the
//! same tuple. Events are numbered under it from the last `N` key, so the numbering goes on
//! after a restart or a failover. The log keeps the newest [`EVENTS_KEPT`] events.

use crate::error::{Fail, R};
use crate::state::State;
use crate::store::meta::{decode, encode, key, TupleEventRecord, TupleRecord};
use rocksdb::WriteBatch;
use shoal_proto::msg::{Cred, Reply, Timestamp};
use shoal_proto::tuple::{Template, Trigger, Tuple, TupleEvent, TupleEventKind, TupleEvents, Value};
use shoal_proto::Errno;
use std::sync::Arc;
use std::time::Duration;

/// Longest wait of one request: a client waiting longer sends another (its calls time out
/// after 30 s by default).
pub const WAIT_MAX: Duration = Duration::from_secs(10);
/// Events the log keeps: older ones are dropped, 1,024 at a time.
pub const EVENTS_KEPT: u64 = 65_536;
/// Events one watch answer holds, at most.
pub const EVENTS_MAX: u32 = 1024;
/// Events one watch request looks at, at most (matching or not).
const SCAN_MAX: u64 = 50_000;

/// The tuple space's share of a server's state.
pub struct TupleSpace {
    /// Serialises changes: see the module's invariants.
    lock: parking_lot::Mutex<()>,
    /// The number of the last event, for requests waiting for a change.
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for TupleSpace {
    fn default() -> TupleSpace {
        TupleSpace { lock: parking_lot::Mutex::new(()), changed: tokio::sync::watch::channel(0).0 }
    }
}

/// Where tuples whose first field is `first` are kept here (the hash also places them on a
/// server: `Client::tuple_home`).
pub fn space_of(first: &Value) -> u64 {
    shoal_placement::bytes_hash(&first.key_bytes())
}

pub async fn write(st: &Arc<State>, cred: Cred, tuple: Tuple, then: Option<Trigger>) -> R<Reply> {
    tuple.check().map_err(|e| Fail::new(Errno::EINVAL, e))?;
    if let Some(t) = &then {
        t.check(&tuple).map_err(|e| Fail::new(Errno::EINVAL, e))?;
    }
    let (seq, last) = st
        .blocking(move |st| {
            let _changing = st.tuples.lock.lock();
            let seq = last_event(st)? + 1;
            let mut batch = WriteBatch::default();
            put_tuple(&mut batch, seq, &tuple, cred.uid);
            let mut last = seq;
            // The registered action: counted with the new tuple, decided under the lock,
            // committed with it, so it fires once and a crash never splits the two.
            if let Some(t) = then {
                // The new tuple is not in the store yet: counted apart.
                let count = count_matching(st, &t.count, t.reaches as usize)? + usize::from(t.count.matches(&tuple));
                if count >= t.reaches as usize && first_matching(st, &Template::exactly(&t.write), false)?.is_none() {
                    last += 1;
                    put_tuple(&mut batch, last, &t.write, cred.uid);
                }
            }
            st.meta.write(batch)?;
            Ok((seq, last))
        })
        .await?;
    st.tuples.changed.send_replace(last);
    Ok(Reply::Tuple { tuple: None, seq })
}

/// Add tuple `tuple`, written by event `seq`, and that event, to `batch`.
fn put_tuple(batch: &mut WriteBatch, seq: u64, tuple: &Tuple, uid: u32) {
    let first = tuple.first().expect("checked");
    batch.put(key::tuple(space_of(first), seq), encode(&TupleRecord { tuple: tuple.clone(), uid }));
    log_event(batch, seq, TupleEventKind::Written, tuple.clone(), uid);
}

/// Tuples stored here matching `template`, counted up to `max`.
fn count_matching(st: &State, template: &Template, max: usize) -> R<usize> {
    let mut n = 0;
    if max == 0 {
        return Ok(0);
    }
    st.meta.scan(&key::tuple_prefix(space_of(template.first().expect("checked"))), None, |k, v| {
        let rec: TupleRecord = decode(&format_args!("tuple {k:x?}"), v)?;
        n += usize::from(template.matches(&rec.tuple));
        Ok(n < max)
    })?;
    Ok(n)
}

pub async fn read(st: &Arc<State>, cred: Cred, template: Template, take: bool, newest: bool, wait_ms: u32) -> R<Reply> {
    template.check().map_err(|e| Fail::new(Errno::EINVAL, e))?;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms as u64).min(WAIT_MAX);
    let template = Arc::new(template);
    loop {
        // Subscribed before looking, so a tuple written after the look wakes this wait.
        let mut changed = st.tuples.changed.subscribe();
        let t = template.clone();
        let found = st
            .blocking(
                move |st| if take { take_first(st, &t, newest, cred.uid) } else { first_matching(st, &t, newest) },
            )
            .await?;
        if let Some((seq, tuple, taken)) = found {
            if let Some(taken) = taken {
                st.tuples.changed.send_replace(taken);
            }
            return Ok(Reply::Tuple { tuple: Some(tuple), seq });
        }
        if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
            return Ok(Reply::Tuple { tuple: None, seq: 0 });
        }
    }
}

pub async fn watch(
    st: &Arc<State>,
    template: Template,
    kinds: u8,
    after: Option<u64>,
    limit: u32,
    wait_ms: u32,
) -> R<Reply> {
    template.check().map_err(|e| Fail::new(Errno::EINVAL, e))?;
    let limit = if limit == 0 { EVENTS_MAX } else { limit.min(EVENTS_MAX) } as usize;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms as u64).min(WAIT_MAX);
    let template = Arc::new(template);
    let mut after = after;
    loop {
        let mut changed = st.tuples.changed.subscribe();
        let t = template.clone();
        let (page, more) = st.blocking(move |st| events_after(st, &t, kinds, after, limit)).await?;
        if !page.events.is_empty() || page.lost > 0 || tokio::time::Instant::now() >= deadline {
            return Ok(Reply::TupleEvents(page));
        }
        after = Some(page.next);
        if more {
            continue; // none matched in a full scan: look at the next ones at once
        }
        if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
            return Ok(Reply::TupleEvents(TupleEvents { events: Vec::new(), next: page.next, lost: 0 }));
        }
    }
}

/// The number of the last event logged here (0: none yet).
fn last_event(st: &State) -> R<u64> {
    Ok(st.meta.last_under(&[key::TUPLE_EVENT])?.and_then(|k| key::number(&k)).unwrap_or(0))
}

/// The number of the oldest event still in the log (`None`: the log is empty).
fn first_event(st: &State) -> R<Option<u64>> {
    let mut first = None;
    st.meta.scan(&[key::TUPLE_EVENT], None, |k, _| {
        first = key::number(k);
        Ok(false)
    })?;
    Ok(first)
}

/// Add event `seq` to `batch`, and drop the log's oldest events past [`EVENTS_KEPT`] every
/// 1,024 events.
fn log_event(batch: &mut WriteBatch, seq: u64, kind: TupleEventKind, tuple: Tuple, uid: u32) {
    let event = TupleEventRecord { kind, tuple, uid, at: Timestamp::now() };
    batch.put(key::tuple_event(seq), encode(&event));
    if seq.is_multiple_of(1024) && seq > EVENTS_KEPT {
        batch.delete_range(key::tuple_event(0), key::tuple_event(seq - EVENTS_KEPT + 1));
    }
}

/// The oldest (`newest`: the newest) tuple here matching `template`: its event number and
/// the tuple.
fn first_matching(st: &State, template: &Template, newest: bool) -> R<Option<(u64, Tuple, Option<u64>)>> {
    let space = space_of(template.first().expect("checked"));
    let mut found = None;
    st.meta.scan(&key::tuple_prefix(space), None, |k, v| {
        let rec: TupleRecord = decode(&format_args!("tuple {k:x?}"), v)?;
        if template.matches(&rec.tuple) {
            found = Some((key_seq(k), rec.tuple, None));
            return Ok(newest); // the newest: the last match of the whole space
        }
        Ok(true)
    })?;
    Ok(found)
}

/// Take the oldest (`newest`: newest) tuple matching `template`: also the number of the
/// event recording the take.
fn take_first(st: &State, template: &Template, newest: bool, uid: u32) -> R<Option<(u64, Tuple, Option<u64>)>> {
    let _changing = st.tuples.lock.lock();
    let Some((seq, tuple, _)) = first_matching(st, template, newest)? else { return Ok(None) };
    let event = last_event(st)? + 1;
    let mut batch = WriteBatch::default();
    batch.delete(key::tuple(space_of(tuple.first().expect("stored tuples have a field")), seq));
    log_event(&mut batch, event, TupleEventKind::Taken, tuple.clone(), uid);
    st.meta.write(batch)?;
    Ok(Some((seq, tuple, Some(event))))
}

/// The event number in a `T` key.
fn key_seq(k: &[u8]) -> u64 {
    k.get(9..17).and_then(|b| b.try_into().ok()).map_or(0, u64::from_be_bytes)
}

/// Up to `limit` events after `after` of the `kinds` wanted whose tuple matches, and
/// whether events are left after the page.
fn events_after(
    st: &State,
    template: &Template,
    kinds: u8,
    after: Option<u64>,
    limit: usize,
) -> R<(TupleEvents, bool)> {
    let last = last_event(st)?;
    let after = match after {
        // From now on; a cursor past the end (a log that lost its tail with its disk) too.
        None => return Ok((TupleEvents { events: Vec::new(), next: last, lost: 0 }, false)),
        Some(a) if a > last => return Ok((TupleEvents { events: Vec::new(), next: last, lost: 0 }, false)),
        Some(a) => a,
    };
    let mut page = TupleEvents { events: Vec::new(), next: after, lost: 0 };
    if after == last {
        return Ok((page, false));
    }
    if let Some(first) = first_event(st)? {
        page.lost = first.saturating_sub(after + 1);
    }
    let mut scanned = 0;
    st.meta.scan(&[key::TUPLE_EVENT], Some(&key::tuple_event(after + 1)), |k, v| {
        let Some(seq) = key::number(k) else { return Ok(true) };
        let e: TupleEventRecord = decode(&format_args!("tuple event {seq}"), v)?;
        page.next = seq;
        scanned += 1;
        if kinds & e.kind.bit() != 0 && template.matches(&e.tuple) {
            page.events.push(TupleEvent { seq, kind: e.kind, tuple: e.tuple, uid: e.uid, at: e.at });
        }
        Ok(page.events.len() < limit && scanned < SCAN_MAX)
    })?;
    let more = page.next < last;
    Ok((page, more))
}
