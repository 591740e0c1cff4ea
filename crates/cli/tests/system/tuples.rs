//! The tuple space (docs/tuples.md) on real servers: matching by template, reads that leave
//! and takes that remove, blocking takes with a timeout, concurrent takers, watches that
//! resume from a cursor with nothing missed or repeated, tuples and their log across
//! `kill -9`, and the CLI.

use shoal_client::{Client, Field, Template, Tuple, TupleEventKind, Value, ValueKind, WatchFrom};
use shoal_client::{Errno, WATCH_TAKEN, WATCH_WRITTEN};
use shoal_testkit::Cluster;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn tuple(fields: &[&str]) -> Tuple {
    Tuple(fields.iter().map(|f| Value::parse(f)).collect())
}

fn template(fields: &[&str]) -> Template {
    Template(fields.iter().map(|f| Field::parse(f)).collect())
}

const NOW: Option<Duration> = Some(Duration::ZERO);

#[test]
fn tuples_are_matched_by_value_type_and_arity_and_read_or_taken_oldest_first() {
    let c = Cluster::start(3);
    let rt = rt();
    let fs = c.client();
    rt.block_on(async {
        for t in [
            tuple(&["job", "1", "first"]),
            tuple(&["job", "2", "second"]),
            tuple(&["job", "s:3", "third"]),
            tuple(&["job", "4"]),
            tuple(&["other", "1", "first"]),
            Tuple(vec![Value::Int(7), Value::Bytes(vec![0, 1, 2])]),
        ] {
            fs.tuple_write(&t).await.unwrap();
        }
        let read = |t: Template| {
            let fs = fs.clone();
            async move { fs.tuple_read(&t, NOW).await.unwrap() }
        };
        // Oldest first, and a read leaves the tuple.
        assert_eq!(read(template(&["job", "?", "?"])).await, Some(tuple(&["job", "1", "first"])));
        assert_eq!(read(template(&["job", "?", "?"])).await, Some(tuple(&["job", "1", "first"])));
        assert_eq!(read(template(&["job", "2", "?"])).await, Some(tuple(&["job", "2", "second"])));
        // Types: "3" is a string, and no integer 3 was written.
        assert_eq!(read(template(&["job", "3", "?"])).await, None);
        assert_eq!(read(template(&["job", "?str", "?"])).await, Some(tuple(&["job", "s:3", "third"])));
        assert_eq!(read(template(&["job", "?int", "third"])).await, None);
        // Arity.
        assert_eq!(read(template(&["job", "?"])).await, Some(tuple(&["job", "4"])));
        assert_eq!(read(template(&["job", "?", "?", "?"])).await, None);
        // First fields of other types and values are other tuples.
        assert_eq!(read(template(&["other", "?int", "first"])).await, Some(tuple(&["other", "1", "first"])));
        assert_eq!(
            read(Template(vec![Field::Is(Value::Int(7)), Field::AnyOf(ValueKind::Bytes)])).await.unwrap().0[1],
            Value::Bytes(vec![0, 1, 2])
        );
        assert_eq!(read(template(&["s:7", "?"])).await, None);

        // A take removes: each tuple once, oldest first, then none.
        let take = |t: Template| {
            let fs = fs.clone();
            async move { fs.tuple_take(&t, NOW).await.unwrap() }
        };
        assert_eq!(take(template(&["job", "?int", "?"])).await, Some(tuple(&["job", "1", "first"])));
        assert_eq!(take(template(&["job", "?int", "?"])).await, Some(tuple(&["job", "2", "second"])));
        assert_eq!(take(template(&["job", "?int", "?"])).await, None);
        assert_eq!(read(template(&["job", "?", "?"])).await, Some(tuple(&["job", "s:3", "third"])));

        // Bad tuples and templates: EINVAL, before anything is sent.
        for bad in [template(&["?", "1"]), template(&["?int"]), Template(vec![])] {
            assert_eq!(fs.tuple_read(&bad, NOW).await.unwrap_err().errno, Errno::EINVAL);
        }
        assert_eq!(fs.tuple_write(&Tuple(vec![])).await.unwrap_err().errno, Errno::EINVAL);
        let huge =
            Tuple(vec![Value::Str("big".into()), Value::Bytes(vec![0; shoal_proto::tuple::TUPLE_BYTES_MAX + 1])]);
        assert_eq!(fs.tuple_write(&huge).await.unwrap_err().errno, Errno::EINVAL);
        // The biggest tuple allowed is stored and read back.
        let biggest =
            Tuple(vec![Value::Str("big".into()), Value::Bytes(vec![9; shoal_proto::tuple::TUPLE_BYTES_MAX - 3])]);
        fs.tuple_write(&biggest).await.unwrap();
        assert_eq!(fs.tuple_take(&template(&["big", "?"]), NOW).await.unwrap(), Some(biggest));
    });
}

#[test]
fn a_blocking_take_waits_for_a_tuple_and_times_out_when_none_comes() {
    let c = Cluster::start(2);
    let rt = rt();
    let fs = c.client();
    rt.block_on(async {
        let t0 = Instant::now();
        assert_eq!(fs.tuple_take(&template(&["q", "?"]), Some(Duration::from_millis(500))).await.unwrap(), None);
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(500) && waited < Duration::from_secs(5), "{waited:?}");

        // A taker waiting with no limit gets a tuple written later, promptly.
        let taker = {
            let fs = fs.clone();
            tokio::spawn(async move {
                let got = fs.tuple_take(&template(&["q", "?"]), None).await.unwrap();
                (got, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let written = Instant::now();
        fs.tuple_write(&tuple(&["q", "work"])).await.unwrap();
        let (got, at) = taker.await.unwrap();
        assert_eq!(got, Some(tuple(&["q", "work"])));
        assert!(at.duration_since(written) < Duration::from_secs(2), "woken {:?} after the write", at - written);
        assert_eq!(fs.tuple_read(&template(&["q", "?"]), NOW).await.unwrap(), None, "taken once");
    });
}

#[test]
fn concurrent_takers_on_several_clients_each_get_a_different_tuple() {
    let c = Cluster::start(2);
    let rt = rt();
    let (a, b) = (c.client(), c.client());
    rt.block_on(async {
        const N: i64 = 200;
        for i in 0..N {
            a.tuple_write(&Tuple(vec![Value::Str("task".into()), Value::Int(i)])).await.unwrap();
        }
        let takers: Vec<_> = (0..8)
            .map(|k| {
                let fs: Client = if k % 2 == 0 { a.clone() } else { b.clone() };
                tokio::spawn(async move {
                    let mut got = Vec::new();
                    while let Some(t) = fs.tuple_take(&template(&["task", "?int"]), NOW).await.unwrap() {
                        got.push(t);
                    }
                    got
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in takers {
            all.extend(t.await.unwrap());
        }
        let numbers: BTreeSet<i64> = all.iter().map(|t| if let Value::Int(n) = t.0[1] { n } else { -1 }).collect();
        assert_eq!(all.len() as i64, N, "every tuple taken exactly once");
        assert_eq!(numbers, (0..N).collect::<BTreeSet<i64>>());
    });
}

#[test]
fn a_watch_sees_writes_and_takes_and_a_restarted_watcher_misses_and_repeats_nothing() {
    let c = Cluster::start(3);
    let rt = rt();
    let fs = c.client();
    rt.block_on(async {
        let t = template(&["ev", "?int"]);
        let mut w = fs.tuple_watch(&t, WATCH_WRITTEN | WATCH_TAKEN, WatchFrom::Now).await.unwrap();
        // Before the watch started: not seen.
        fs.tuple_write(&tuple(&["ev", "text"])).await.unwrap();
        for i in 0..3 {
            fs.tuple_write(&tuple(&["ev", &i.to_string()])).await.unwrap();
        }
        fs.tuple_take(&template(&["ev", "1"]), NOW).await.unwrap().unwrap();
        let mut seen = Vec::new();
        for _ in 0..4 {
            let e = w.next(Some(Duration::from_secs(10))).await.unwrap().expect("an event");
            seen.push((e.kind, e.tuple));
        }
        assert_eq!(
            seen,
            vec![
                (TupleEventKind::Written, tuple(&["ev", "0"])),
                (TupleEventKind::Written, tuple(&["ev", "1"])),
                (TupleEventKind::Written, tuple(&["ev", "2"])),
                (TupleEventKind::Taken, tuple(&["ev", "1"])),
            ]
        );
        assert_eq!(w.next(Some(Duration::from_millis(200))).await.unwrap(), None);
        // The watcher stops; events go on; a new one from its cursor gets exactly the rest.
        let cursor = w.cursor();
        drop(w);
        for i in 3..6 {
            fs.tuple_write(&tuple(&["ev", &i.to_string()])).await.unwrap();
        }
        let mut w = fs.tuple_watch(&t, WATCH_WRITTEN, WatchFrom::After(cursor)).await.unwrap();
        let mut rest = Vec::new();
        while let Some(e) = w.next(Some(Duration::from_millis(500))).await.unwrap() {
            rest.push(e.tuple);
        }
        assert_eq!(rest, vec![tuple(&["ev", "3"]), tuple(&["ev", "4"]), tuple(&["ev", "5"])]);
        assert_eq!(w.lost(), 0);

        // Only takes.
        let mut takes = fs.tuple_watch(&t, WATCH_TAKEN, WatchFrom::Now).await.unwrap();
        fs.tuple_write(&tuple(&["ev", "9"])).await.unwrap();
        fs.tuple_take(&template(&["ev", "9"]), NOW).await.unwrap().unwrap();
        let e = takes.next(Some(Duration::from_secs(10))).await.unwrap().unwrap();
        assert_eq!((e.kind, e.tuple), (TupleEventKind::Taken, tuple(&["ev", "9"])));
    });
}

#[test]
fn tuples_and_their_log_survive_kill9_of_every_server() {
    let mut c = Cluster::start(2);
    let rt = rt();
    let fs = c.client();
    let before = rt.block_on(async {
        let mut w = fs.tuple_watch(&template(&["keep", "?"]), WATCH_WRITTEN, WatchFrom::After(0)).await.unwrap();
        for i in 0..50 {
            fs.tuple_write(&tuple(&["keep", &i.to_string()])).await.unwrap();
        }
        fs.tuple_take(&template(&["keep", "0"]), NOW).await.unwrap().unwrap();
        let mut last = 0;
        for _ in 0..50 {
            last = w.next(Some(Duration::from_secs(10))).await.unwrap().unwrap().seq;
        }
        last
    });
    for id in 0..2 {
        c.kill9(id);
        c.restart(id);
    }
    let fs = c.client();
    rt.block_on(async {
        let mut left = Vec::new();
        while let Some(t) = fs.tuple_take(&template(&["keep", "?int"]), NOW).await.unwrap() {
            left.push(t);
        }
        let want: Vec<Tuple> = (1..50).map(|i| tuple(&["keep", &i.to_string()])).collect();
        assert_eq!(left, want, "every acknowledged write, less the acknowledged take");
        // The log goes on numbering where it stopped, and still holds the events before.
        let mut w = fs.tuple_watch(&template(&["keep", "?"]), WATCH_TAKEN, WatchFrom::After(0)).await.unwrap();
        let first_take = w.next(Some(Duration::from_secs(10))).await.unwrap().unwrap();
        assert_eq!(first_take.tuple, tuple(&["keep", "0"]));
        assert_eq!(first_take.seq, before + 1);
        let second = w.next(Some(Duration::from_secs(10))).await.unwrap().unwrap();
        assert_eq!(second.seq, before + 2, "numbered on after the restart");
    });
}

#[test]
fn the_cli_writes_reads_takes_and_watches() {
    let c = Cluster::start(2);
    let (code, out, err) = c.shoal(&["tuple", "write", "cli", "5", "s:5", "x:0aff", "--json"]);
    let (code2, _, err2) = c.shoal(&["tuple", "write", "neg", "-3"]);
    assert_eq!(code2, 0, "negative numbers are values: {err2}");
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(j["tuple"], serde_json::json!(["cli", 5, "5", {"hex": "0aff"}]));
    let (code, out, _) = c.shoal(&["tuple", "read", "cli", "?int", "?str", "?"]);
    assert_eq!((code, out.trim()), (0, "(cli, 5, s:5, x:0aff)"));
    let (code, out, _) = c.shoal(&["tuple", "take", "cli", "?", "?", "?", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()[1], 5);
    // Nothing left: exit 1 (as grep), after the wait.
    let t0 = Instant::now();
    let (code, out, err) = c.shoal(&["tuple", "take", "cli", "?", "?", "?", "--wait", "0.3"]);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(err.contains("no tuple matched"), "{err}");
    assert!(t0.elapsed() >= Duration::from_millis(300));
    let (code, out, _) = c.shoal(&["tuple", "read", "neg", "?int"]);
    assert_eq!((code, out.trim()), (0, "(neg, -3)"));
    // Usage errors: exit 2 naming the cause.
    let (code, _, err) = c.shoal(&["tuple", "read", "?", "1"]);
    assert_eq!(code, 2);
    assert!(err.contains("first field"), "{err}");
    let (code, _, _) = c.shoal(&["tuple", "take", "cli", "--wait", "-1"]);
    assert_eq!(code, 2);
    // A watch from the start of the log: the write and the take, then the cursor.
    let (code, out, err) =
        c.shoal(&["tuple", "watch", "cli", "?", "?", "?", "--taken", "--after", "0", "--idle", "0.5", "--json"]);
    assert_eq!(code, 0, "{err}");
    let events: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events.len(), 2, "{out}");
    assert_eq!((events[0]["event"].as_str(), events[1]["event"].as_str()), (Some("written"), Some("taken")));
    assert!(err.contains("cursor 2"), "{err}");
}

#[test]
fn a_trigger_fires_once_in_the_step_of_the_write_that_completes_its_count() {
    let c = Cluster::start(2);
    let rt = rt();
    let fs = c.client();
    rt.block_on(async {
        let done = tuple(&["set", "done"]);
        let trigger = shoal_client::Trigger { count: template(&["set", "?int"]), reaches: 3, write: done.clone() };
        for i in 0..5 {
            fs.tuple_write_then(&tuple(&["set", &i.to_string()]), Some(&trigger)).await.unwrap();
            let fired = fs.tuple_read(&Template::exactly(&done), NOW).await.unwrap().is_some();
            assert_eq!(fired, i >= 2, "after {} tuples", i + 1);
        }
        // Once: the writes after the third found it there.
        assert!(fs.tuple_take(&Template::exactly(&done), NOW).await.unwrap().is_some());
        assert_eq!(fs.tuple_read(&Template::exactly(&done), NOW).await.unwrap(), None);
        // A trigger naming another first field is refused (it would live on another server).
        let bad = shoal_client::Trigger { count: template(&["other", "?"]), reaches: 1, write: tuple(&["set", "x"]) };
        let err = fs.tuple_write_then(&tuple(&["set", "9"]), Some(&bad)).await.unwrap_err();
        assert_eq!(err.errno, Errno::EINVAL);
    });
}

#[test]
fn micro_checkpoints_commit_without_a_barrier_and_a_restart_uses_the_newest_committed() {
    let mut c = Cluster::start(3);
    let rt = rt();
    let fs = c.client();
    rt.block_on(async {
        const PARTS: u32 = 4;
        let ck = shoal_client::MicroCheckpoint::open(&fs, "sim", "/ckpt/sim", PARTS).await.unwrap();
        assert_eq!(ck.latest().await.unwrap(), None);
        // Checkpoints 0 and 1: every task saves its part on its own schedule, in any order.
        for n in 0..2u64 {
            for part in [2, 0, 3, 1] {
                assert!(!ck.is_committed(n, NOW).await.unwrap(), "{n} committed before part {part}");
                ck.save(n, part, format!("step {n} part {part}").as_bytes()).await.unwrap();
            }
            assert!(ck.is_committed(n, NOW).await.unwrap());
        }
        // Checkpoint 2: task 3 is killed before it saves its part; the others go on to 3.
        for part in 0..3 {
            ck.save(2, part, b"partial").await.unwrap();
            ck.save(3, part, b"partial").await.unwrap();
        }
        // A part saved twice counts once.
        ck.save(2, 0, b"again").await.unwrap();
        assert!(!ck.is_committed(2, Some(Duration::from_millis(200))).await.unwrap());
        assert_eq!(ck.latest().await.unwrap(), Some(1), "2 is not committed: 1 is used");
        assert_eq!(ck.load(1, 3).await.unwrap(), b"step 1 part 3");
        assert!(ck.save(0, PARTS, b"x").await.is_err(), "no such part");
    });
    // Across kill -9 of every server: the commits and the parts stay, and the restarted
    // task completes checkpoint 2 (its part is the last one).
    for id in 0..3 {
        c.kill9(id);
        c.restart(id);
    }
    let fs = c.client();
    rt.block_on(async {
        let ck = shoal_client::MicroCheckpoint::open(&fs, "sim", "/ckpt/sim", 4).await.unwrap();
        assert_eq!(ck.latest().await.unwrap(), Some(1));
        ck.save(2, 3, b"late").await.unwrap();
        assert_eq!(ck.latest().await.unwrap(), Some(2));
        assert_eq!(ck.load(2, 0).await.unwrap(), b"again");
    });
}

#[test]
fn the_checkpoint_benchmark_runs_both_modes() {
    let c = Cluster::start(2);
    let (code, out, err) = c.shoal(&[
        "bench",
        "ckpt",
        "--tasks",
        "4",
        "--steps",
        "3",
        "--compute-ms",
        "20",
        "--size",
        "4K",
        "--json",
        "-q",
    ]);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    for m in ["barrier", "micro"] {
        assert_eq!(r[m]["latest"], 2, "{out}");
        assert!(r[m]["lost_s"].as_f64().unwrap() > 0.0);
    }
    assert!(r["lost_ratio"].as_f64().unwrap() > 0.0);
    let (code, _, err) = c.shoal(&["bench", "ckpt", "--skew", "0.5"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn files_metadata_is_matched_through_tuple_templates() {
    let c = Cluster::start(2);
    let rt = rt();
    let fs = c.client();
    let paths = |ts: Vec<Tuple>| -> Vec<String> {
        ts.into_iter()
            .map(|t| match &t.0[1] {
                Value::Str(p) => p.clone(),
                other => panic!("a path, not {other:?}"),
            })
            .collect()
    };
    rt.block_on(async {
        fs.mkdir("/m", 0o755).await.unwrap();
        fs.mkdir("/m/sub", 0o755).await.unwrap();
        for (p, data) in [("/m/a", &b"abc"[..]), ("/m/b", b"hello"), ("/m/sub/c", b"xyz")] {
            let f = fs.create(p, 0o644, None).await.unwrap();
            f.write_at(0, data).await.unwrap();
            f.close().await.unwrap();
        }
        fs.chown("/m/b", Some(1000), Some(1000)).await.unwrap();
        let get = |fields: &[&str]| {
            let (fs, t) = (fs.clone(), template(fields));
            async move { fs.file_tuples("/m", &t).await.unwrap() }
        };
        assert_eq!(paths(get(&["file", "?", "f", "3", "?", "?", "?", "?"]).await), ["/m/a", "/m/sub/c"]);
        assert_eq!(paths(get(&["file", "?", "?", "?", "1000", "?", "?", "?"]).await), ["/m/b"]);
        assert_eq!(paths(get(&["file", "?", "d", "?", "?", "?", "?", "?"]).await), ["/m", "/m/sub"]);
        assert_eq!(paths(get(&["file", "?", "f", "?", "?", "?", "420", "?int"]).await).len(), 3, "mode 0644");
        assert!(get(&["file", "?", "f", "4", "?", "?", "?", "?"]).await.is_empty());
        // A path given exactly: that file's tuple, whole.
        let b = get(&["file", "/m/b", "?", "?", "?", "?", "?", "?"]).await;
        assert_eq!(b.len(), 1);
        assert_eq!(&b[0].0[..7], &tuple(&["file", "/m/b", "f", "5", "1000", "1000", "420"]).0[..]);
        assert!(get(&["file", "/m/none", "?", "?", "?", "?", "?", "?"]).await.is_empty());
        // Templates of another shape are refused.
        for bad in [template(&["file", "?"]), template(&["other", "?", "?", "?", "?", "?", "?", "?"])] {
            assert_eq!(fs.file_tuples("/m", &bad).await.unwrap_err().errno, Errno::EINVAL);
        }
        let bad = template(&["file", "?", "f", "s:big", "?", "?", "?", "?"]);
        assert_eq!(fs.file_tuples("/m", &bad).await.unwrap_err().errno, Errno::EINVAL);
    });
    let (code, out, err) = c.shoal(&["tuple", "files", "/m", "file", "?", "f", "5", "?", "?", "?", "?", "--json"]);
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((j[1].as_str(), j[3].as_i64(), j[4].as_i64()), (Some("/m/b"), Some(5), Some(1000)));
    let (code, out, _) = c.shoal(&["tuple", "files", "/m", "file", "?", "l", "?", "?", "?", "?", "?"]);
    assert_eq!((code, out.as_str()), (1, ""), "nothing matched: exit 1");
}
