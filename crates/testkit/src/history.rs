//! A Jepsen-style history recorder and checker for Shoal's durability promise
//! (docs/architecture.md, "Durability promise": an acknowledged metadata operation or write
//! survives `kill -9` of any server; close-to-open consistency).
//!
//! **Workers** (threads, one blocking client each) run random operations; each is recorded
//! with its invocation and completion times and an outcome: `Ok(value)`, `Fail(errno)` (a
//! definite refusal: the operation did not happen) or `Unknown` (a timeout, a lost
//! connection, EIO: it may or may not have happened, and may still happen later, when a
//! paused server wakes or a restarted one finishes an intent).
//!
//! **Keyspace**, chosen so that checking stays exact and cheap:
//! * *Owned keys*: worker `w` alone touches the names of its keys, `ROOT/w<w>/{a,b}/k<n>` and
//!   `…/k<n>.r` (four places, two directories, so renames go within and across directories,
//!   i.e. across servers). A key's history is therefore sequential, and the set of states it
//!   can be in is computed by folding the worker's operations over a set of *worlds*: a
//!   state (which of the four places hold what) plus the operations of unknown outcome not
//!   yet applied. Before every operation any pending operation may apply (with any of its
//!   partial effects: a create whose write was lost leaves an empty file); an `Ok` or `Fail`
//!   keeps only the worlds in which it gives exactly what was observed, so a read collapses
//!   the branches that unknown outcomes opened. No world left = a violation. A key with two
//!   unknown operations is retired (the worker takes a new one) so worlds stay few.
//!   Some keys are directories (`mkdir`/`rmdir`); listings of `a` and `b` are checked
//!   against every key's worlds.
//! * *Shared registers*: `ROOT/shared/r<i>`, 16-byte files that every worker overwrites in
//!   place with unique 16-byte values (one write of one block: atomic at the server) and
//!   reads with fresh opens (close-to-open). Checked by [`check_registers`].
//!
//! At the end (faults healed, every server up) [`final_state`] reads what is there with a
//! fresh client and [`check`] reports every violation with the operations involved: a lost
//! acknowledged write, a value never written, a read of a state that could not exist, a
//! resurrected unlinked file, a client-visible error where none is allowed.

use shoal_client::{BlockingClient, Errno, FileKind, OpenFlags};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where an owned key's name is: directory `a` (0) or `b` (1), name `k<n>` or `k<n>.r`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Loc {
    pub dir: u8,
    pub renamed: bool,
}

impl Loc {
    pub const ALL: [Loc; 4] = [
        Loc { dir: 0, renamed: false },
        Loc { dir: 0, renamed: true },
        Loc { dir: 1, renamed: false },
        Loc { dir: 1, renamed: true },
    ];

    fn dir_name(self) -> &'static str {
        if self.dir == 0 {
            "a"
        } else {
            "b"
        }
    }

    fn name(self, key: u32) -> String {
        if self.renamed {
            format!("k{key}.r")
        } else {
            format!("k{key}")
        }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.dir_name(), if self.renamed { "k.r" } else { "k" })
    }
}

/// One operation as invoked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Create exclusively, write `token`, close.
    Create {
        key: u32,
        at: Loc,
        token: String,
    },
    /// Open with truncate, write `token`, close.
    Overwrite {
        key: u32,
        at: Loc,
        token: String,
    },
    /// Open in append mode, append `token`, close.
    Append {
        key: u32,
        at: Loc,
        token: String,
    },
    Rename {
        key: u32,
        from: Loc,
        to: Loc,
    },
    Unlink {
        key: u32,
        at: Loc,
    },
    Mkdir {
        key: u32,
        at: Loc,
    },
    Rmdir {
        key: u32,
        at: Loc,
    },
    Stat {
        key: u32,
        at: Loc,
    },
    Read {
        key: u32,
        at: Loc,
    },
    /// List directory `a` (0) or `b` (1) of the worker.
    List {
        dir: u8,
    },
    RegWrite {
        reg: u32,
        value: String,
    },
    RegRead {
        reg: u32,
    },
}

impl Op {
    fn key(&self) -> Option<u32> {
        match self {
            Op::Create { key, .. }
            | Op::Overwrite { key, .. }
            | Op::Append { key, .. }
            | Op::Rename { key, .. }
            | Op::Unlink { key, .. }
            | Op::Mkdir { key, .. }
            | Op::Rmdir { key, .. }
            | Op::Stat { key, .. }
            | Op::Read { key, .. } => Some(*key),
            _ => None,
        }
    }

    fn token(&self) -> Option<&str> {
        match self {
            Op::Create { token, .. } | Op::Overwrite { token, .. } | Op::Append { token, .. } => Some(token),
            _ => None,
        }
    }
}

/// What a successful operation returned (what the checker compares).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    None,
    /// `Stat`: a directory, or a file of this size.
    Dir,
    Size(u64),
    /// `Read`, `RegRead`: the bytes.
    Bytes(Vec<u8>),
    /// `List`: the names, sorted.
    Names(Vec<String>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok(Value),
    /// A definite refusal (ENOENT, EEXIST, …) of the operation's first request.
    Fail(i32),
    /// May or may not have happened (the error says why).
    Unknown(String),
}

/// One recorded operation. Times are seconds since the history began.
#[derive(Clone, Debug)]
pub struct Event {
    pub worker: u32,
    pub op: Op,
    pub invoke: f64,
    pub complete: f64,
    pub outcome: Outcome,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[w{} {:8.3}..{:8.3}] {:?} -> {:?}", self.worker, self.invoke, self.complete, self.op, self.outcome)
    }
}

/// Errnos that mean "refused, nothing done": the answer of a server that looked.
/// Everything else (ETIMEDOUT, EIO, ECONNREFUSED, …) is an unknown outcome.
fn definite(errno: Errno) -> bool {
    [libc::ENOENT, libc::EEXIST, libc::ENOTDIR, libc::EISDIR, libc::ENOTEMPTY].contains(&errno.0)
}

// ---------------------------------------------------------------- the model of a key

/// What is at a place of a key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Node {
    File(Vec<u8>),
    Dir,
}

/// A key's state: what each of its four places holds.
pub type KState = BTreeMap<Loc, Node>;

/// `op` applied to `s` as it would go if it ran alone: the new state and what it returns,
/// or the errno it is refused with.
fn apply(s: &KState, op: &Op) -> Result<(KState, Value), i32> {
    let mut n = s.clone();
    match op {
        Op::Create { at, token, .. } => {
            if s.contains_key(at) {
                return Err(libc::EEXIST);
            }
            n.insert(*at, Node::File(token.as_bytes().to_vec()));
            Ok((n, Value::None))
        }
        Op::Overwrite { at, token, .. } => match s.get(at) {
            Some(Node::File(_)) => {
                n.insert(*at, Node::File(token.as_bytes().to_vec()));
                Ok((n, Value::None))
            }
            Some(Node::Dir) => Err(libc::EISDIR),
            None => Err(libc::ENOENT),
        },
        Op::Append { at, token, .. } => match s.get(at) {
            Some(Node::File(c)) => {
                let mut c = c.clone();
                c.extend_from_slice(token.as_bytes());
                n.insert(*at, Node::File(c));
                Ok((n, Value::None))
            }
            Some(Node::Dir) => Err(libc::EISDIR),
            None => Err(libc::ENOENT),
        },
        Op::Rename { from, to, .. } => {
            let node = n.remove(from).ok_or(libc::ENOENT)?;
            n.insert(*to, node);
            Ok((n, Value::None))
        }
        Op::Unlink { at, .. } => match n.remove(at) {
            Some(Node::File(_)) => Ok((n, Value::None)),
            Some(Node::Dir) => Err(libc::EISDIR),
            None => Err(libc::ENOENT),
        },
        Op::Mkdir { at, .. } => {
            if s.contains_key(at) {
                return Err(libc::EEXIST);
            }
            n.insert(*at, Node::Dir);
            Ok((n, Value::None))
        }
        Op::Rmdir { at, .. } => match n.remove(at) {
            Some(Node::Dir) => Ok((n, Value::None)),
            Some(Node::File(_)) => Err(libc::ENOTDIR),
            None => Err(libc::ENOENT),
        },
        Op::Stat { at, .. } => match s.get(at) {
            Some(Node::Dir) => Ok((n, Value::Dir)),
            Some(Node::File(c)) => Ok((n, Value::Size(c.len() as u64))),
            None => Err(libc::ENOENT),
        },
        Op::Read { at, .. } => match s.get(at) {
            Some(Node::File(c)) => Ok((n, Value::Bytes(c.clone()))),
            Some(Node::Dir) => Err(libc::EISDIR),
            None => Err(libc::ENOENT),
        },
        Op::List { .. } | Op::RegWrite { .. } | Op::RegRead { .. } => Ok((n, Value::None)),
    }
}

/// Every state an operation of unknown outcome can leave, applied to `s`: unchanged, done,
/// and the partial effects of the compound ones (a create or overwrite whose write was
/// lost leaves an empty file).
fn effects(s: &KState, op: &Op) -> Vec<KState> {
    let mut out = vec![s.clone()];
    if let Ok((done, _)) = apply(s, op) {
        if let Op::Create { at, .. } | Op::Overwrite { at, .. } = op {
            let mut empty = s.clone();
            empty.insert(*at, Node::File(Vec::new()));
            out.push(empty);
        }
        out.push(done);
    }
    out
}

/// A possible world of one key: its state and the unknown operations (indices into the
/// history) that have not applied yet.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct World {
    state: KState,
    pending: Vec<usize>,
}

/// Bound on worlds per key: more means the workload lets unknown outcomes pile up.
const MAX_WORLDS: usize = 20_000;

/// Every world reachable by applying any of the pending operations, in any order.
fn closure(worlds: &BTreeSet<World>, events: &[Event]) -> BTreeSet<World> {
    let mut all = worlds.clone();
    let mut todo: Vec<World> = worlds.iter().cloned().collect();
    while let Some(w) = todo.pop() {
        for (i, &p) in w.pending.iter().enumerate() {
            let mut rest = w.pending.clone();
            rest.remove(i);
            for s in effects(&w.state, &events[p].op) {
                let nw = World { state: s, pending: rest.clone() };
                if all.insert(nw.clone()) {
                    todo.push(nw);
                }
            }
        }
        assert!(all.len() <= MAX_WORLDS, "more than {MAX_WORLDS} possible worlds for one key");
    }
    all
}

// ---------------------------------------------------------------- violations

/// One thing the history shows Shoal did wrong.
#[derive(Clone, Debug)]
pub struct Violation {
    /// "lost acknowledged write", "value never written", "stale read", "impossible state",
    /// "resurrected unlinked file", "client-visible error", …
    pub kind: &'static str,
    pub what: String,
    /// The operations involved.
    pub ops: Vec<Event>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}: {}", self.kind, self.what)?;
        for e in &self.ops {
            writeln!(f, "    {e}")?;
        }
        Ok(())
    }
}

/// What is there at the end, read after healing and restarting everything.
#[derive(Clone, Debug, Default)]
pub struct FinalState {
    /// (worker, key) → its state.
    pub keys: HashMap<(u32, u32), KState>,
    /// (worker, dir) → names listed.
    pub dirs: HashMap<(u32, u8), Vec<String>>,
    /// register → value.
    pub registers: HashMap<u32, Vec<u8>>,
}

/// How to judge a history.
#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    /// Every operation must succeed or be definitely refused: an unknown outcome (a
    /// timeout, a lost connection) is itself a violation. For clusters with replicas >= 2.
    pub expect_no_errors: bool,
}

/// Tokens (file contents are concatenations of them, each ending in `;`).
fn tokens(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes).split_terminator(';').map(|t| format!("{t};")).collect()
}

/// Name the failure of a key whose observed state (by a read, or at the end) matches no
/// world. `removed`: places of the key a definite unlink, rmdir or rename emptied.
fn classify(
    observed: &KState,
    worlds: &BTreeSet<World>,
    written: &BTreeSet<String>,
    acked: &BTreeSet<String>,
    removed: &BTreeSet<Loc>,
) -> &'static str {
    for node in observed.values() {
        if let Node::File(c) = node {
            if tokens(c).iter().any(|t| !written.contains(t)) {
                return "value never written";
            }
        }
    }
    if observed.keys().any(|l| removed.contains(l) && worlds.iter().all(|w| !w.state.contains_key(l))) {
        return "resurrected unlinked file";
    }
    let seen: BTreeSet<String> = observed
        .values()
        .filter_map(|n| if let Node::File(c) = n { Some(tokens(c)) } else { None })
        .flatten()
        .collect();
    let needed = worlds.iter().all(|w| {
        w.state
            .values()
            .any(|n| matches!(n, Node::File(c) if tokens(c).iter().any(|t| acked.contains(t) && !seen.contains(t))))
    });
    if needed {
        return "lost acknowledged write";
    }
    "impossible state"
}

fn show_worlds(worlds: &BTreeSet<World>) -> String {
    let states: BTreeSet<String> = worlds.iter().map(|w| show_state(&w.state)).collect();
    states.into_iter().take(12).collect::<Vec<_>>().join(" | ")
}

fn show_state(s: &KState) -> String {
    if s.is_empty() {
        return "{}".into();
    }
    let parts: Vec<String> = s
        .iter()
        .map(|(l, n)| match n {
            Node::Dir => format!("{l}: dir"),
            Node::File(c) => format!("{l}: {:?}", String::from_utf8_lossy(c)),
        })
        .collect();
    format!("{{{}}}", parts.join(", "))
}

/// Check a history against its final state. Returns every violation found (empty: the
/// history is consistent with the promise).
pub fn check(events: &[Event], fin: &FinalState, opts: &CheckOptions) -> Vec<Violation> {
    let mut v = Vec::new();
    if opts.expect_no_errors {
        for e in events {
            if let Outcome::Unknown(why) = &e.outcome {
                v.push(Violation { kind: "client-visible error", what: why.clone(), ops: vec![e.clone()] });
            }
        }
    }
    let written: BTreeSet<String> = events.iter().filter_map(|e| e.op.token().map(str::to_string)).collect();
    let acked: BTreeSet<String> = events
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Ok(_)))
        .filter_map(|e| e.op.token().map(str::to_string))
        .collect();
    let workers: BTreeSet<u32> = events.iter().map(|e| e.worker).collect();
    for &w in &workers {
        let idx: Vec<usize> = (0..events.len()).filter(|&i| events[i].worker == w).collect();
        check_worker(w, &idx, events, fin, &written, &acked, &mut v);
    }
    v.extend(check_registers(events, &fin.registers));
    v
}

fn check_worker(
    w: u32,
    idx: &[usize],
    events: &[Event],
    fin: &FinalState,
    written: &BTreeSet<String>,
    acked: &BTreeSet<String>,
    v: &mut Vec<Violation>,
) {
    let mut worlds: BTreeMap<u32, BTreeSet<World>> = BTreeMap::new();
    let mut ops_of: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    // Places a definite unlink, rmdir or rename emptied, per key (to name resurrections).
    let mut removed: BTreeMap<u32, BTreeSet<Loc>> = BTreeMap::new();
    let fresh = || BTreeSet::from([World { state: KState::new(), pending: Vec::new() }]);
    for &i in idx {
        let e = &events[i];
        if let Op::List { dir } = e.op {
            let Outcome::Ok(Value::Names(names)) = &e.outcome else { continue };
            check_listing(w, dir, names, &worlds, events, &ops_of, i, v);
            continue;
        }
        let Some(key) = e.op.key() else { continue };
        ops_of.entry(key).or_default().push(i);
        let ws = worlds.entry(key).or_insert_with(fresh);
        if ws.is_empty() {
            continue; // already reported
        }
        match &e.outcome {
            Outcome::Unknown(_) => {
                if !matches!(e.op, Op::Stat { .. } | Op::Read { .. }) {
                    *ws = ws
                        .iter()
                        .map(|w| World { state: w.state.clone(), pending: [w.pending.clone(), vec![i]].concat() })
                        .collect();
                }
            }
            outcome => {
                let all = closure(ws, events);
                let next: BTreeSet<World> = all
                    .iter()
                    .filter_map(|wd| match (apply(&wd.state, &e.op), outcome) {
                        (Ok((s, got)), Outcome::Ok(seen)) if &got == seen => {
                            Some(World { state: s, pending: wd.pending.clone() })
                        }
                        (Err(errno), Outcome::Fail(seen)) if errno == *seen => Some(wd.clone()),
                        _ => None,
                    })
                    .collect();
                if next.is_empty() {
                    let observed = match (&e.op, outcome) {
                        (Op::Read { at, .. }, Outcome::Ok(Value::Bytes(b))) => {
                            Some(KState::from([(*at, Node::File(b.clone()))]))
                        }
                        _ => None,
                    };
                    let kind = match observed {
                        Some(o)
                            if o.values().any(
                                |n| matches!(n, Node::File(c) if tokens(c).iter().any(|t| !written.contains(t))),
                            ) =>
                        {
                            "value never written"
                        }
                        Some(_) if matches!(outcome, Outcome::Ok(_)) => "stale read",
                        _ => "impossible state",
                    };
                    v.push(Violation {
                        kind,
                        what: format!(
                            "worker {w} key {key}: {:?} gave {outcome:?}, which no possible state allows; possible: {}",
                            e.op,
                            show_worlds(&all)
                        ),
                        ops: ops_of[&key].iter().map(|&j| events[j].clone()).collect(),
                    });
                    // No world is left to go on from: the key is reported once and
                    // not checked further.
                    ws.clear();
                    continue;
                }
                if let (Op::Unlink { at, .. } | Op::Rmdir { at, .. } | Op::Rename { from: at, .. }, Outcome::Ok(_)) =
                    (&e.op, outcome)
                {
                    removed.entry(key).or_default().insert(*at);
                }
                if let (Op::Create { at, .. } | Op::Mkdir { at, .. } | Op::Rename { to: at, .. }, Outcome::Ok(_)) =
                    (&e.op, outcome)
                {
                    removed.entry(key).or_default().remove(at);
                }
                *ws = next;
            }
        }
    }
    // The end: every pending operation may have applied; what is there must be a world.
    // A key found wrong here is left out of the final listings (one fault, one report).
    let mut bad = BTreeSet::new();
    for (key, ws) in &worlds {
        if ws.is_empty() {
            continue; // already reported
        }
        let all = closure(ws, events);
        let observed = fin.keys.get(&(w, *key)).cloned().unwrap_or_default();
        if !all.iter().any(|wd| wd.state == observed) {
            let none = BTreeSet::new();
            let kind = classify(&observed, &all, written, acked, removed.get(key).unwrap_or(&none));
            v.push(Violation {
                kind,
                what: format!(
                    "worker {w} key {key}: final state {} is none of the possible {}",
                    show_state(&observed),
                    show_worlds(&all)
                ),
                ops: ops_of[key].iter().map(|&j| events[j].clone()).collect(),
            });
            bad.insert(*key);
        }
    }
    for dir in [0u8, 1] {
        if let Some(names) = fin.dirs.get(&(w, dir)) {
            let mut ws = worlds.clone();
            for (key, s) in ws.iter_mut() {
                // At the end every pending operation may have applied.
                *s = if bad.contains(key) { BTreeSet::new() } else { closure(s, events) };
            }
            check_listing(w, dir, names, &ws, events, &ops_of, usize::MAX, v);
        }
    }
}

/// A listing of directory `dir` of worker `w`: every name must be a place of one of its keys,
/// and for every key some world must put exactly the listed places of it in `dir`.
#[allow(clippy::too_many_arguments)]
fn check_listing(
    w: u32,
    dir: u8,
    names: &[String],
    worlds: &BTreeMap<u32, BTreeSet<World>>,
    events: &[Event],
    ops_of: &BTreeMap<u32, Vec<usize>>,
    at: usize,
    v: &mut Vec<Violation>,
) {
    let listing = if at == usize::MAX { "final listing".to_string() } else { format!("{}", events[at]) };
    let mut by_key: BTreeMap<u32, BTreeSet<Loc>> = BTreeMap::new();
    for n in names {
        let (stem, renamed) = match n.strip_suffix(".r") {
            Some(s) => (s, true),
            None => (n.as_str(), false),
        };
        match stem.strip_prefix('k').and_then(|k| k.parse::<u32>().ok()).filter(|k| worlds.contains_key(k)) {
            Some(k) => {
                by_key.entry(k).or_default().insert(Loc { dir, renamed });
            }
            None => v.push(Violation {
                kind: "name never created",
                what: format!("worker {w} dir {}: {n:?} in {listing}", Loc { dir, renamed: false }.dir_name()),
                ops: Vec::new(),
            }),
        }
    }
    for (key, ws) in worlds {
        if ws.is_empty() {
            continue;
        }
        let listed = by_key.remove(key).unwrap_or_default();
        // Pending operations may apply before the listing: the closure (the end's is already closed).
        let all = if at == usize::MAX { ws.clone() } else { closure(ws, events) };
        let ok =
            all.iter().any(|wd| wd.state.keys().filter(|l| l.dir == dir).copied().collect::<BTreeSet<_>>() == listed);
        if !ok {
            let mut ops: Vec<Event> = ops_of[key].iter().filter(|&&j| j < at).map(|&j| events[j].clone()).collect();
            if at != usize::MAX {
                ops.push(events[at].clone());
            }
            v.push(Violation {
                kind: "listing of a state that could not exist",
                what: format!("worker {w} key {key}: listed {listed:?} in {listing}; possible: {}", show_worlds(&all)),
                ops,
            });
        }
    }
}

// ---------------------------------------------------------------- registers

/// Length of every register value.
pub const REG_LEN: usize = 16;

/// The value a register holds before any write.
pub fn reg_initial(reg: u32) -> String {
    format!("{:<16}", format!("init-r{reg}"))
}

/// Check the shared registers. Each value is written once, so a read names its write.
/// With `W(v)` the write of the value `v` a read returned (the initial value: a write that
/// completed at time 0), an unknown write completing at +∞ (it may take effect any time
/// after its invocation), and the final read happening at +∞, these are violations:
///
/// 1. *value never written*: `v` is no write's value;
/// 2. *read from the future*: `W(v).invoke > R.complete`;
/// 3. *stale read*: some acknowledged write `W2 ≠ W(v)` on the register has
///    `W(v).complete < W2.invoke` and `W2.complete < R.invoke` — `W2` certainly replaced `v`
///    before `R` began (for the final read: a lost acknowledged write);
/// 4. *new-old inversion*: reads `R1`, `R2` with `R1.complete < R2.invoke` returned `v1 ≠ v2`
///    with `W(v2).complete < W(v1).invoke` — once `R1` saw `v1`, `v2` was already overwritten.
///
/// These are the conditions a linearizable register with unique values must meet that
/// involve one read or two; a history meeting them all is linearizable unless three or
/// more writes overlap in a cycle, which these checks do not look for.
pub fn check_registers(events: &[Event], fin: &HashMap<u32, Vec<u8>>) -> Vec<Violation> {
    let mut v = Vec::new();
    let regs: BTreeSet<u32> = events
        .iter()
        .filter_map(|e| match e.op {
            Op::RegWrite { reg, .. } | Op::RegRead { reg } => Some(reg),
            _ => None,
        })
        .chain(fin.keys().copied())
        .collect();
    for reg in regs {
        // value → (invoke, complete, event)
        let mut writes: HashMap<Vec<u8>, (f64, f64, Option<&Event>)> = HashMap::new();
        writes.insert(reg_initial(reg).into_bytes(), (0.0, 0.0, None));
        for e in events {
            if let Op::RegWrite { reg: r, value } = &e.op {
                if *r == reg {
                    let done = match e.outcome {
                        Outcome::Ok(_) => e.complete,
                        _ => f64::INFINITY,
                    };
                    if !matches!(e.outcome, Outcome::Fail(_)) {
                        writes.insert(value.clone().into_bytes(), (e.invoke, done, Some(e)));
                    }
                }
            }
        }
        let mut reads: Vec<(f64, f64, Vec<u8>, Option<&Event>)> = events
            .iter()
            .filter_map(|e| match (&e.op, &e.outcome) {
                (Op::RegRead { reg: r }, Outcome::Ok(Value::Bytes(b))) if *r == reg => {
                    Some((e.invoke, e.complete, b.clone(), Some(e)))
                }
                _ => None,
            })
            .collect();
        if let Some(b) = fin.get(&reg) {
            reads.push((f64::INFINITY, f64::INFINITY, b.clone(), None));
        }
        let evs = |a: &[Option<&Event>]| a.iter().flatten().map(|e| (*e).clone()).collect::<Vec<_>>();
        let show = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        for (ri, rc, val, re) in &reads {
            let Some(&(wi, wc, we)) = writes.get(val) else {
                v.push(Violation {
                    kind: "value never written",
                    what: format!("register r{reg} read {:?}", show(val)),
                    ops: evs(&[*re]),
                });
                continue;
            };
            if wi > *rc {
                v.push(Violation {
                    kind: "read from the future",
                    what: format!("register r{reg}: {:?} read before its write began", show(val)),
                    ops: evs(&[we, *re]),
                });
            }
            for (v2, &(w2i, w2c, w2e)) in &writes {
                if v2 != val && w2e.is_some_and(|e| matches!(e.outcome, Outcome::Ok(_))) && wc < w2i && w2c < *ri {
                    let kind = if re.is_none() { "lost acknowledged write" } else { "stale read" };
                    v.push(Violation {
                        kind,
                        what: format!(
                            "register r{reg}: read {:?} though {:?} replaced it before the read began",
                            show(val),
                            show(v2)
                        ),
                        ops: evs(&[we, w2e, *re]),
                    });
                }
            }
        }
        for (r1i, (_, r1c, v1, e1)) in reads.iter().enumerate() {
            for (r2i, (r2_inv, _, v2, e2)) in reads.iter().enumerate() {
                if r1i == r2i || v1 == v2 || r1c >= r2_inv {
                    continue;
                }
                let (Some(&(w1i, _, w1e)), Some(&(_, w2c, w2e))) = (writes.get(v1), writes.get(v2)) else { continue };
                if w2c < w1i {
                    v.push(Violation {
                        kind: "stale read",
                        what: format!(
                            "register r{reg}: read {:?} after another read had seen the newer {:?}",
                            show(v2),
                            show(v1)
                        ),
                        ops: evs(&[w2e, w1e, *e1, *e2]),
                    });
                }
            }
        }
    }
    v
}

// ---------------------------------------------------------------- the recorder

/// A history being recorded by several workers.
#[derive(Clone)]
pub struct Recorder {
    start: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder { start: Instant::now(), events: Arc::new(Mutex::new(Vec::new())) }
    }
}

impl Recorder {
    /// When the history began.
    pub fn started(&self) -> Instant {
        self.start
    }

    /// Seconds since the history began.
    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Run `f` as operation `op` of `worker` and record it.
    pub fn record(&self, worker: u32, op: Op, f: impl FnOnce() -> Outcome) -> Outcome {
        let invoke = self.now();
        let outcome = f();
        let complete = self.now();
        self.events.lock().unwrap().push(Event { worker, op, invoke, complete, outcome: outcome.clone() });
        outcome
    }

    pub fn events(&self) -> Vec<Event> {
        let mut e = self.events.lock().unwrap().clone();
        e.sort_by(|a, b| a.invoke.total_cmp(&b.invoke));
        e
    }
}

/// The workload's shape.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Folder everything is made under (`/h`).
    pub root: String,
    pub workers: u32,
    pub registers: u32,
    /// Keys each worker works on at a time.
    pub active_keys: u32,
}

impl Default for Workload {
    fn default() -> Self {
        Workload { root: "/h".into(), workers: 6, registers: 4, active_keys: 4 }
    }
}

impl Workload {
    fn path(&self, w: u32, key: u32, at: Loc) -> String {
        format!("{}/w{w}/{}/{}", self.root, at.dir_name(), at.name(key))
    }

    fn reg_path(&self, reg: u32) -> String {
        format!("{}/shared/r{reg}", self.root)
    }

    /// Make the folders and registers (before any fault).
    pub fn setup(&self, c: &BlockingClient) {
        c.mkdir_all(&format!("{}/shared", self.root), 0o755).unwrap();
        for w in 0..self.workers {
            for d in ["a", "b"] {
                c.mkdir_all(&format!("{}/w{w}/{d}", self.root), 0o755).unwrap();
            }
        }
        for r in 0..self.registers {
            let f = c.create(&self.reg_path(r), 0o644, None).unwrap();
            f.write_at(0, reg_initial(r).as_bytes()).unwrap();
            f.close().unwrap();
        }
    }

    /// Worker `w`: random operations with `client` until `stop`, recorded in `rec`.
    pub fn run_worker(&self, w: u32, client: &BlockingClient, rec: &Recorder, seed: u64, stop: &AtomicBool) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (u64::from(w) << 32));
        // What the worker believes of each active key (unknown outcomes taken as done),
        // and how many unknown outcomes each had: at two it is retired.
        let mut next_key = 0u32;
        let mut active: Vec<(u32, bool, KState, u32)> = Vec::new(); // (key, is_dir, belief, unknowns)
        let mut seq = 0u64;
        while !stop.load(Ordering::Relaxed) {
            while active.len() < self.active_keys as usize {
                active.push((next_key, next_key % 4 == 3, KState::new(), 0));
                next_key += 1;
            }
            seq += 1;
            let roll = rng.gen_range(0..100);
            if roll < 8 {
                let dir = rng.gen_range(0..2u8);
                let path = format!("{}/w{w}/{}", self.root, Loc { dir, renamed: false }.dir_name());
                let outcome = rec.record(w, Op::List { dir }, || match client.readdir(&path) {
                    Ok(entries) => {
                        let mut n: Vec<String> = entries.into_iter().map(|e| e.name).collect();
                        n.sort();
                        Outcome::Ok(Value::Names(n))
                    }
                    Err(e) => outcome_of_err(e.errno, &e.to_string(), true),
                });
                backoff(&outcome);
                continue;
            }
            if roll < 25 && self.registers > 0 {
                let reg = rng.gen_range(0..self.registers);
                let path = self.reg_path(reg);
                let outcome = if rng.gen_bool(0.5) {
                    let value = format!("w{w:02}-{seq:012}");
                    rec.record(w, Op::RegWrite { reg, value: value.clone() }, || {
                        let f = match client.open(&path, OpenFlags { write: true, ..OpenFlags::default() }) {
                            Ok(f) => f,
                            Err(e) => return outcome_of_err(e.errno, &e.to_string(), true),
                        };
                        match f.write_at(0, value.as_bytes()).and_then(|_| f.close()) {
                            Ok(()) => Outcome::Ok(Value::None),
                            Err(e) => outcome_of_err(e.errno, &e.to_string(), false),
                        }
                    })
                } else {
                    rec.record(w, Op::RegRead { reg }, || read_whole(client, &path))
                };
                backoff(&outcome);
                continue;
            }
            let slot = rng.gen_range(0..active.len());
            let (key, is_dir, belief, _) = active[slot].clone();
            let here = belief.keys().next().copied();
            let token = format!("w{w}k{key}#{seq};");
            let op = match (is_dir, here) {
                (true, None) => Op::Mkdir { key, at: Loc { dir: rng.gen_range(0..2), renamed: false } },
                (true, Some(at)) => {
                    if rng.gen_bool(0.5) {
                        Op::Rmdir { key, at }
                    } else {
                        Op::Stat { key, at }
                    }
                }
                (false, None) => Op::Create { key, at: Loc::ALL[rng.gen_range(0..4)], token },
                (false, Some(at)) => match rng.gen_range(0..100) {
                    0..=19 => Op::Overwrite { key, at, token },
                    20..=39 => Op::Append { key, at, token },
                    40..=54 => {
                        let to = *Loc::ALL.iter().filter(|l| **l != at).nth(rng.gen_range(0..3)).unwrap();
                        Op::Rename { key, from: at, to }
                    }
                    55..=64 => Op::Unlink { key, at },
                    65..=79 => Op::Stat { key, at },
                    _ => Op::Read { key, at },
                },
            };
            let outcome = rec.record(w, op.clone(), || self.perform(w, client, &op));
            let entry = &mut active[slot];
            let reads = matches!(op, Op::Stat { .. } | Op::Read { .. });
            match (&outcome, &op) {
                (Outcome::Ok(_), _) => {
                    entry.2 = apply(&entry.2, &op).map(|(s, _)| s).unwrap_or_else(|_| entry.2.clone())
                }
                // A refusal corrects the belief (an unknown outcome taken as done was not).
                (
                    Outcome::Fail(libc::ENOENT),
                    Op::Overwrite { at, .. } | Op::Append { at, .. } | Op::Rename { from: at, .. },
                )
                | (Outcome::Fail(libc::ENOENT), Op::Unlink { at, .. } | Op::Rmdir { at, .. } | Op::Stat { at, .. })
                | (Outcome::Fail(libc::ENOENT), Op::Read { at, .. }) => {
                    entry.2.remove(at);
                }
                (Outcome::Fail(_), _) => {}
                (Outcome::Unknown(_), _) if reads => {}
                (Outcome::Unknown(_), _) => {
                    if let Ok((s, _)) = apply(&entry.2, &op) {
                        entry.2 = s;
                    }
                    entry.3 += 1;
                }
            }
            backoff(&outcome);
            if entry.3 >= 2 {
                active.swap_remove(slot);
            }
        }
    }

    fn perform(&self, w: u32, c: &BlockingClient, op: &Op) -> Outcome {
        let write_then_close = |f: shoal_client::BlockingFile, data: &[u8], append: bool| {
            let r = if append { f.append(data).map(|_| ()) } else { f.write(data).map(|_| ()) };
            match r.and_then(|_| f.close()) {
                Ok(()) => Outcome::Ok(Value::None),
                Err(e) => outcome_of_err(e.errno, &e.to_string(), false),
            }
        };
        let first = |e: shoal_client::Error| outcome_of_err(e.errno, &e.to_string(), true);
        match op {
            Op::Create { key, at, token } => {
                let flags = OpenFlags { write: true, create: true, exclusive: true, ..OpenFlags::default() };
                match c.open(&self.path(w, *key, *at), flags) {
                    Ok(f) => write_then_close(f, token.as_bytes(), false),
                    Err(e) => first(e),
                }
            }
            Op::Overwrite { key, at, token } => {
                let flags = OpenFlags { write: true, truncate: true, ..OpenFlags::default() };
                match c.open(&self.path(w, *key, *at), flags) {
                    Ok(f) => write_then_close(f, token.as_bytes(), false),
                    Err(e) => first(e),
                }
            }
            Op::Append { key, at, token } => {
                let flags = OpenFlags { write: true, append: true, ..OpenFlags::default() };
                match c.open(&self.path(w, *key, *at), flags) {
                    Ok(f) => write_then_close(f, token.as_bytes(), true),
                    Err(e) => first(e),
                }
            }
            Op::Rename { key, from, to } => c
                .rename(&self.path(w, *key, *from), &self.path(w, *key, *to))
                .map_or_else(first, |_| Outcome::Ok(Value::None)),
            Op::Unlink { key, at } => {
                c.unlink(&self.path(w, *key, *at)).map_or_else(first, |_| Outcome::Ok(Value::None))
            }
            Op::Mkdir { key, at } => {
                c.mkdir(&self.path(w, *key, *at), 0o755).map_or_else(first, |_| Outcome::Ok(Value::None))
            }
            Op::Rmdir { key, at } => c.rmdir(&self.path(w, *key, *at)).map_or_else(first, |_| Outcome::Ok(Value::None)),
            Op::Stat { key, at } => match c.stat(&self.path(w, *key, *at)) {
                Ok(a) if a.kind == FileKind::Dir => Outcome::Ok(Value::Dir),
                Ok(a) => Outcome::Ok(Value::Size(a.size)),
                Err(e) => first(e),
            },
            Op::Read { key, at } => read_whole(c, &self.path(w, *key, *at)),
            Op::List { .. } | Op::RegWrite { .. } | Op::RegRead { .. } => unreachable!("performed by run_worker"),
        }
    }

    /// Read what is there at the end (call after healing and restarting everything; with a
    /// fresh client): every key the history names, both folders of every worker, every register.
    pub fn final_state(&self, c: &BlockingClient, events: &[Event]) -> Result<FinalState, String> {
        let mut fin = FinalState::default();
        let keys: BTreeSet<(u32, u32)> = events.iter().filter_map(|e| e.op.key().map(|k| (e.worker, k))).collect();
        for (w, key) in keys {
            let mut s = KState::new();
            for at in Loc::ALL {
                let path = self.path(w, key, at);
                match c.stat(&path) {
                    Ok(a) if a.kind == FileKind::Dir => {
                        s.insert(at, Node::Dir);
                    }
                    Ok(_) => match read_whole(c, &path) {
                        Outcome::Ok(Value::Bytes(b)) => {
                            s.insert(at, Node::File(b));
                        }
                        other => return Err(format!("final read of {path}: {other:?}")),
                    },
                    Err(e) if e.errno == Errno::ENOENT => {}
                    Err(e) => return Err(format!("final stat of {path}: {e}")),
                }
            }
            fin.keys.insert((w, key), s);
        }
        for w in 0..self.workers {
            for dir in [0u8, 1] {
                let path = format!("{}/w{w}/{}", self.root, Loc { dir, renamed: false }.dir_name());
                let mut names: Vec<String> =
                    c.readdir(&path).map_err(|e| format!("final listing: {e}"))?.into_iter().map(|e| e.name).collect();
                names.sort();
                fin.dirs.insert((w, dir), names);
            }
        }
        for r in 0..self.registers {
            match read_whole(c, &self.reg_path(r)) {
                Outcome::Ok(Value::Bytes(b)) => {
                    fin.registers.insert(r, b);
                }
                other => return Err(format!("final read of register {r}: {other:?}")),
            }
        }
        Ok(fin)
    }
}

/// After an unknown outcome a worker waits a little, as a real client would before it
/// tries again: a dead server fails calls at once, and without a pause the workers would
/// fill the history with millions of failures that check nothing.
fn backoff(outcome: &Outcome) {
    if matches!(outcome, Outcome::Unknown(_)) {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Open, read everything, close.
fn read_whole(c: &BlockingClient, path: &str) -> Outcome {
    let f = match c.open(path, OpenFlags::read_only()) {
        Ok(f) => f,
        Err(e) => return outcome_of_err(e.errno, &e.to_string(), true),
    };
    let mut all = Vec::new();
    loop {
        match f.read_at(all.len() as u64, 64 << 10) {
            Ok(b) if b.is_empty() => break,
            Ok(b) => all.extend_from_slice(&b),
            Err(e) => return outcome_of_err(e.errno, &e.to_string(), false),
        }
    }
    let _ = f.close();
    Outcome::Ok(Value::Bytes(all))
}

/// The outcome of an error: a definite refusal only when it answered the operation's
/// first request (a later step's refusal leaves the earlier steps done).
fn outcome_of_err(errno: Errno, text: &str, first_request: bool) -> Outcome {
    if first_request && definite(errno) {
        Outcome::Fail(errno.0)
    } else {
        Outcome::Unknown(text.to_string())
    }
}

/// Print a history's violations and the fault log, and fail, if there are any.
pub fn assert_clean(violations: &[Violation], events: &[Event], context: &str) {
    if violations.is_empty() {
        return;
    }
    let mut msg = format!("{} violation(s) in a history of {} operations\n{context}\n", violations.len(), events.len());
    for v in violations.iter().take(30) {
        msg.push_str(&v.to_string());
    }
    panic!("{msg}");
}

/// Counts of outcomes (for the test's summary line).
pub fn summary(events: &[Event]) -> String {
    let ok = events.iter().filter(|e| matches!(e.outcome, Outcome::Ok(_))).count();
    let fail = events.iter().filter(|e| matches!(e.outcome, Outcome::Fail(_))).count();
    let unknown = events.iter().filter(|e| matches!(e.outcome, Outcome::Unknown(_))).count();
    let mut refusals: BTreeMap<String, usize> = BTreeMap::new();
    for e in events {
        if let Outcome::Fail(errno) = e.outcome {
            *refusals.entry(Errno(errno).to_string()).or_default() += 1;
        }
    }
    format!("{} operations: {ok} ok, {fail} refused {refusals:?}, {unknown} unknown", events.len())
}

/// How long the history tests run: `SHOAL_HISTORY_SECS`, or `default`.
pub fn duration_from_env(default: u64) -> Duration {
    let secs = std::env::var("SHOAL_HISTORY_SECS")
        .ok()
        .map(|s| s.parse::<u64>().unwrap_or_else(|_| panic!("SHOAL_HISTORY_SECS={s:?} is not a number of seconds")));
    Duration::from_secs(secs.unwrap_or(default))
}
