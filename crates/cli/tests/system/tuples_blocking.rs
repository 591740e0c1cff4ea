//! The tuple space through `BlockingClient` (docs/tuples.md), with no async runtime of the
//! caller's, on real servers: writes, reads oldest and newest, takes that wait and time
//! out, a take that a write from another thread wakes, an action, and a watch resumed from
//! its cursor with nothing missed or repeated.

use shoal_client::{BlockingClient, Errno, Field, Template, Trigger, Tuple, TupleEventKind, Value, ValueKind};
use shoal_client::{WatchFrom, WATCH_TAKEN, WATCH_WRITTEN};
use shoal_testkit::Cluster;
use std::time::{Duration, Instant};

const NOW: Option<Duration> = Some(Duration::ZERO);

fn tuple(fields: &[&str]) -> Tuple {
    Tuple(fields.iter().map(|f| Value::parse(f)).collect())
}

fn template(fields: &[&str]) -> Template {
    Template(fields.iter().map(|f| Field::parse(f)).collect())
}

#[test]
fn blocking_client_writes_reads_takes_and_watches_tuples() {
    let c = Cluster::start(3);
    let fs = BlockingClient::from_config(&c.config, c.options()).unwrap();

    // Writes, then reads oldest and newest first; a read leaves the tuple.
    let first = fs.tuple_write(&tuple(&["bjob", "1", "a"])).unwrap();
    let second = fs.tuple_write(&tuple(&["bjob", "2", "b"])).unwrap();
    assert!(first > 0 && second > first, "{first} {second}");
    fs.tuple_write(&Tuple(vec![Value::Str("bjob".into()), Value::Bytes(vec![0, 255])])).unwrap();
    assert_eq!(fs.tuple_read(&template(&["bjob", "?int", "?"]), NOW).unwrap(), Some(tuple(&["bjob", "1", "a"])));
    assert_eq!(fs.tuple_read_newest(&template(&["bjob", "?int", "?"]), NOW).unwrap(), Some(tuple(&["bjob", "2", "b"])));
    assert_eq!(
        fs.tuple_read(&template(&["bjob", "?bytes"]), NOW).unwrap(),
        Some(Tuple(vec![Value::Str("bjob".into()), Value::Bytes(vec![0, 255])]))
    );
    assert_eq!(fs.tuple_read(&template(&["bjob", "s:1", "?"]), NOW).unwrap(), None, "\"1\" is not 1");

    // Takes remove, oldest first; then none is left, and a wait of 300 ms is waited.
    assert_eq!(fs.tuple_take(&template(&["bjob", "?int", "?"]), NOW).unwrap(), Some(tuple(&["bjob", "1", "a"])));
    assert_eq!(fs.tuple_take(&template(&["bjob", "?int", "?"]), NOW).unwrap(), Some(tuple(&["bjob", "2", "b"])));
    let t0 = Instant::now();
    assert_eq!(fs.tuple_take(&template(&["bjob", "?int", "?"]), Some(Duration::from_millis(300))).unwrap(), None);
    assert!(t0.elapsed() >= Duration::from_millis(300), "{:?}", t0.elapsed());

    // A take waiting forever in one thread is answered by a write from another.
    let taker = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.tuple_take(&template(&["bqueue", "?"]), None))
    };
    std::thread::sleep(Duration::from_millis(200));
    fs.tuple_write(&tuple(&["bqueue", "work"])).unwrap();
    assert_eq!(taker.join().unwrap().unwrap(), Some(tuple(&["bqueue", "work"])));

    // An action: the second of two parts writes "done" in the same step, once.
    let then = Trigger { count: template(&["bparts", "?int"]), reaches: 2, write: tuple(&["bparts", "done"]) };
    fs.tuple_write_then(&tuple(&["bparts", "0"]), Some(&then)).unwrap();
    assert_eq!(fs.tuple_read(&template(&["bparts", "done"]), NOW).unwrap(), None);
    fs.tuple_write_then(&tuple(&["bparts", "1"]), Some(&then)).unwrap();
    assert_eq!(fs.tuple_read(&template(&["bparts", "done"]), NOW).unwrap(), Some(tuple(&["bparts", "done"])));

    // Bad input is EINVAL before any request.
    let e = fs.tuple_read(&Template(vec![Field::Any, Field::AnyOf(ValueKind::Int)]), NOW).unwrap_err();
    assert_eq!(e.errno, Errno::EINVAL, "{e}");
    assert_eq!(fs.tuple_write(&Tuple(vec![])).unwrap_err().errno, Errno::EINVAL);
    assert_eq!(fs.tuple_watch(&template(&["bw", "?"]), 0, WatchFrom::Now).unwrap_err().errno, Errno::EINVAL);

    // A watch from now: writes and takes of matching tuples, in order; others are skipped.
    let mut w = fs.tuple_watch(&template(&["bw", "?int"]), WATCH_WRITTEN | WATCH_TAKEN, WatchFrom::Now).unwrap();
    assert_eq!(w.next(Some(Duration::from_millis(100))).unwrap(), None);
    fs.tuple_write(&tuple(&["bw", "1"])).unwrap();
    fs.tuple_write(&tuple(&["bw", "not a number"])).unwrap();
    fs.tuple_take(&template(&["bw", "1"]), NOW).unwrap().unwrap();
    let e = w.next(Some(Duration::from_secs(10))).unwrap().unwrap();
    assert_eq!((e.kind, e.tuple), (TupleEventKind::Written, tuple(&["bw", "1"])));
    let e = w.next(Some(Duration::from_secs(10))).unwrap().unwrap();
    assert_eq!((e.kind, e.tuple), (TupleEventKind::Taken, tuple(&["bw", "1"])));
    assert_eq!(e.seq, w.cursor());
    assert_eq!(w.next(Some(Duration::from_millis(100))).unwrap(), None);
    assert_eq!(w.lost(), 0);

    // A watch waiting forever in one thread is woken by a write from another.
    let waiter = std::thread::spawn(move || {
        let e = w.next(None).unwrap().unwrap();
        (e, w)
    });
    std::thread::sleep(Duration::from_millis(200));
    fs.tuple_write(&tuple(&["bw", "2"])).unwrap();
    let (e, w) = waiter.join().unwrap();
    assert_eq!(e.tuple, tuple(&["bw", "2"]));

    // Resumed from the cursor (as after a restart): exactly the events after it.
    let cursor = w.cursor();
    drop(w);
    fs.tuple_write(&tuple(&["bw", "3"])).unwrap();
    fs.tuple_write(&tuple(&["bw", "4"])).unwrap();
    let mut again = fs.tuple_watch(&template(&["bw", "?int"]), WATCH_WRITTEN, WatchFrom::After(cursor)).unwrap();
    let mut seen = Vec::new();
    while let Some(e) = again.next(Some(Duration::from_millis(300))).unwrap() {
        seen.push(e.tuple);
    }
    assert_eq!(seen, vec![tuple(&["bw", "3"]), tuple(&["bw", "4"])]);
}
