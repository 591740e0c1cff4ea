//! Jepsen-style history tests: concurrent clients record every operation while servers are
//! killed (`kill -9`), restarted and paused at random; afterwards every acknowledged write
//! and namespace operation must be there and every read must have seen a possible state
//! (`crates/testkit/src/history.rs` says what is checked, `docs/testing.md` how to run it longer).
//! Also the checker's own tests: hand-made histories that must fail and must pass.

use shoal_testkit::faults::{run_history, FaultConfig};
use shoal_testkit::history::{self, *};
use shoal_testkit::Cluster;

/// One history run at a time: each loads the machine on its own (its timing is part of
/// what it tests), and two at once on the 2 cores of CI made timeouts of their own.
static ONE_RUN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_run() -> std::sync::MutexGuard<'static, ()> {
    ONE_RUN.lock().unwrap_or_else(|p| p.into_inner())
}

/// 45 s in CI; `SHOAL_HISTORY_SECS=600` for the long run (docs/testing.md).
#[test]
fn history_with_kills_and_pauses() {
    let _one = one_run();
    let mut cluster = Cluster::start(4);
    let cfg = FaultConfig { kill: true, pause: true, ..FaultConfig::default() };
    let secs = history::duration_from_env(45);
    run_history(&mut cluster, None, &cfg, secs, &CheckOptions::default());
}

/// With two copies of everything (`replicas = 2`), servers frozen at random (`SIGSTOP` for
/// up to 3 s) must cost clients nothing: no operation may fail or stay unanswered. A server
/// frozen past the silence bound fails over to its mirror; resumed, it stands by and takes
/// its slot back (docs/failover.md, "Rejoining"), so the next fault finds two copies again.
/// 45 s in CI; `SHOAL_HISTORY_SECS=600` for the long run (docs/testing.md).
#[test]
fn history_with_replicas_and_pauses_has_no_client_error() {
    let _one = one_run();
    let mut cluster = Cluster::start_with(4, |m| m.cluster.replicas = 2);
    let cfg = FaultConfig { kill: false, pause: true, ..FaultConfig::default() };
    let secs = history::duration_from_env(45);
    run_history(&mut cluster, None, &cfg, secs, &CheckOptions { expect_no_errors: true });
    let moves = (0..4).map(|i| cluster.log(i).matches("is handed back to its own process").count()).sum::<usize>();
    eprintln!("slots handed back after a failover: {moves}");
}

/// The same with `kill -9` and restarts too: a primary killed and restarted before its slot
/// failed over must not serve its own stores, which may hold a change it never acknowledged
/// (a retry would be applied a second time, its cached reply having died with the process:
/// an append written twice, found by this test). It hands its slot to its mirror first
/// (docs/failover.md, "A server restarted after a crash hands its slot off first").
/// 45 s in CI; `SHOAL_HISTORY_SECS=600` for the long run (docs/testing.md).
#[test]
fn history_with_replicas_kills_and_pauses_has_no_client_error() {
    let _one = one_run();
    let mut cluster = Cluster::start_with(4, |m| m.cluster.replicas = 2);
    let cfg = FaultConfig { kill: true, pause: true, ..FaultConfig::default() };
    let secs = history::duration_from_env(45);
    run_history(&mut cluster, None, &cfg, secs, &CheckOptions { expect_no_errors: true });
}

// ---------------------------------------------------------------- the checker itself

const A: Loc = Loc { dir: 0, renamed: false };
const B: Loc = Loc { dir: 1, renamed: false };

/// A history built by hand: operations of worker 0 one after the other, one second each.
fn hist(ops: Vec<(Op, Outcome)>) -> Vec<Event> {
    ops.into_iter()
        .enumerate()
        .map(|(i, (op, outcome))| Event { worker: 0, op, invoke: i as f64 + 1.0, complete: i as f64 + 1.5, outcome })
        .collect()
}

fn ok() -> Outcome {
    Outcome::Ok(Value::None)
}

fn unknown() -> Outcome {
    Outcome::Unknown("timed out".into())
}

fn bytes(s: &str) -> Outcome {
    Outcome::Ok(Value::Bytes(s.as_bytes().to_vec()))
}

fn create(token: &str) -> Op {
    Op::Create { key: 0, at: A, token: token.into() }
}

fn read() -> Op {
    Op::Read { key: 0, at: A }
}

/// The final state: key 0 of worker 0 is `state`, the listings follow from it.
fn fin(state: &[(Loc, &str)]) -> FinalState {
    let mut f = FinalState::default();
    let s: KState = state.iter().map(|(l, c)| (*l, Node::File(c.as_bytes().to_vec()))).collect();
    for dir in [0u8, 1] {
        let names = s
            .keys()
            .filter(|l| l.dir == dir)
            .map(|l| if l.renamed { "k0.r".to_string() } else { "k0".to_string() })
            .collect();
        f.dirs.insert((0, dir), names);
    }
    f.keys.insert((0, 0), s);
    f
}

fn kinds(v: &[Violation]) -> Vec<&'static str> {
    v.iter().map(|v| v.kind).collect()
}

#[test]
fn checker_passes_a_clean_history() {
    let h = hist(vec![
        (create("t1;"), ok()),
        (Op::Append { key: 0, at: A, token: "t2;".into() }, ok()),
        (read(), bytes("t1;t2;")),
        (Op::Rename { key: 0, from: A, to: B }, ok()),
        (Op::Stat { key: 0, at: A }, Outcome::Fail(libc::ENOENT)),
        (Op::Stat { key: 0, at: B }, Outcome::Ok(Value::Size(6))),
        (Op::List { dir: 1 }, Outcome::Ok(Value::Names(vec!["k0".into()]))),
    ]);
    assert_eq!(kinds(&check(&h, &fin(&[(B, "t1;t2;")]), &CheckOptions::default())), Vec::<&str>::new());
}

#[test]
fn checker_finds_a_lost_acknowledged_write() {
    let h = hist(vec![(create("t1;"), ok()), (Op::Overwrite { key: 0, at: A, token: "t2;".into() }, ok())]);
    assert_eq!(kinds(&check(&h, &fin(&[(A, "t1;")]), &CheckOptions::default())), ["lost acknowledged write"]);
    assert_eq!(kinds(&check(&h, &fin(&[]), &CheckOptions::default())), ["lost acknowledged write"]);
}

#[test]
fn checker_finds_a_resurrected_file() {
    let h = hist(vec![(create("t1;"), ok()), (Op::Unlink { key: 0, at: A }, ok())]);
    assert_eq!(kinds(&check(&h, &fin(&[(A, "t1;")]), &CheckOptions::default())), ["resurrected unlinked file"]);
}

#[test]
fn checker_finds_stale_reads_and_values_never_written() {
    let h = hist(vec![
        (create("t1;"), ok()),
        (Op::Overwrite { key: 0, at: A, token: "t2;".into() }, ok()),
        (read(), bytes("t1;")),
    ]);
    assert_eq!(kinds(&check(&h, &fin(&[(A, "t2;")]), &CheckOptions::default())), ["stale read"]);
    let h = hist(vec![(create("t1;"), ok()), (read(), bytes("zz;"))]);
    assert_eq!(kinds(&check(&h, &fin(&[(A, "t1;")]), &CheckOptions::default())), ["value never written"]);
}

#[test]
fn checker_lets_an_unknown_operation_happen_late_but_never_undo_itself() {
    // The overwrite timed out: the first read does not see it, the second does (it applied
    // late: allowed), the third no longer does (undone: impossible).
    let over = (Op::Overwrite { key: 0, at: A, token: "t2;".into() }, unknown());
    let h = hist(vec![(create("t1;"), ok()), over.clone(), (read(), bytes("t1;")), (read(), bytes("t2;"))]);
    assert!(check(&h, &fin(&[(A, "t2;")]), &CheckOptions::default()).is_empty());
    let h = hist(vec![(create("t1;"), ok()), over.clone(), (read(), bytes("t2;")), (read(), bytes("t1;"))]);
    assert_eq!(kinds(&check(&h, &fin(&[(A, "t1;")]), &CheckOptions::default())), ["stale read",]);
    // A create that timed out may have left the file, empty or written, or nothing.
    let h = hist(vec![(create("t1;"), unknown())]);
    for f in [fin(&[]), fin(&[(A, "")]), fin(&[(A, "t1;")])] {
        assert!(check(&h, &f, &CheckOptions::default()).is_empty());
    }
    // ... unless no client-visible error is allowed (replicas >= 2).
    let v = check(&h, &fin(&[(A, "t1;")]), &CheckOptions { expect_no_errors: true });
    assert_eq!(kinds(&v), ["client-visible error"]);
}

#[test]
fn checker_finds_listings_of_impossible_states() {
    let h = hist(vec![
        (create("t1;"), ok()),
        (Op::List { dir: 0 }, Outcome::Ok(Value::Names(vec!["k0".into(), "k9".into()]))),
        (Op::Unlink { key: 0, at: A }, ok()),
        (Op::List { dir: 0 }, Outcome::Ok(Value::Names(vec!["k0".into()]))),
    ]);
    let v = check(&h, &fin(&[]), &CheckOptions::default());
    assert_eq!(kinds(&v), ["name never created", "listing of a state that could not exist"]);
}

#[test]
fn checker_finds_stale_register_reads() {
    let ev = |worker, op, invoke: f64, complete: f64, outcome| Event { worker, op, invoke, complete, outcome };
    let v1 = format!("{:<16}", "v1");
    let v2 = format!("{:<16}", "v2");
    let w1 = ev(0, Op::RegWrite { reg: 0, value: v1.clone() }, 1.0, 2.0, ok());
    let w2 = ev(1, Op::RegWrite { reg: 0, value: v2.clone() }, 3.0, 4.0, ok());
    let read_at = |t: f64, v: &str| ev(2, Op::RegRead { reg: 0 }, t, t + 0.5, bytes(v));
    let last = |v: &str| std::collections::HashMap::from([(0u32, v.as_bytes().to_vec())]);
    // Clean: v1 while v2 was being written, then v2.
    let h = vec![w1.clone(), w2.clone(), read_at(3.2, &v1), read_at(5.0, &v2)];
    assert!(check_registers(&h, &last(&v2)).is_empty());
    // Stale: v1 read after v2 was acknowledged.
    let h = vec![w1.clone(), w2.clone(), read_at(5.0, &v1)];
    assert_eq!(kinds(&check_registers(&h, &last(&v2))), ["stale read"]);
    // New-old inversion: v2 seen, then v1 (though both reads overlap v2's write).
    let h = vec![w1.clone(), w2.clone(), read_at(3.1, &v2), read_at(3.7, &v1)];
    assert_eq!(kinds(&check_registers(&h, &last(&v2))), ["stale read"]);
    // Lost: the final value is the older one.
    assert_eq!(kinds(&check_registers(&[w1.clone(), w2.clone()], &last(&v1))), ["lost acknowledged write"]);
    // Never written.
    assert_eq!(kinds(&check_registers(std::slice::from_ref(&w1), &last("garbage-garbage!"))), ["value never written"]);
    // An unknown write may land any time later, even after the final read began.
    let w2u = Event { outcome: unknown(), ..w2.clone() };
    assert!(check_registers(&[w1, w2u, read_at(5.0, &v1)], &last(&v2)).is_empty());
}
