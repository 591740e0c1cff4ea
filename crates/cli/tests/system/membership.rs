//! The replicated cluster map (docs/membership.md) on real servers: every server serves the
//! same map, a change made through any of them reaches all, the group survives `kill -9`
//! of its leader, the failure detector marks a killed server down, and a server that comes
//! back marks itself up again.

use shoal_testkit::Cluster;
use std::time::{Duration, Instant};

/// `shoal map show --json` as (version, leader, states by server id).
fn show(c: &Cluster) -> Option<(u64, Option<u64>, Vec<String>)> {
    let (code, out, _) = c.shoal(&["map", "show", "--json"]);
    if code != 0 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    let states = v["servers"].as_array()?.iter().map(|s| s["state"].as_str().unwrap_or("?").to_string()).collect();
    Some((v["version"].as_u64()?, v["leader"].as_u64(), states))
}

/// Wait up to `limit` for `ok` to hold of the shown map.
fn wait_for(
    c: &Cluster,
    limit: Duration,
    what: &str,
    ok: impl Fn(&(u64, Option<u64>, Vec<String>)) -> bool,
) -> (u64, Option<u64>, Vec<String>) {
    let start = Instant::now();
    loop {
        if let Some(m) = show(c) {
            if ok(&m) {
                return m;
            }
        }
        assert!(start.elapsed() < limit, "{what} within {limit:?}: last map {:?}", show(c));
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_map_is_changed_through_the_group_survives_its_leader_and_follows_failures() {
    let mut c = Cluster::start(3);
    let (v0, leader, _) = wait_for(&c, Duration::from_secs(20), "a leader", |m| m.1.is_some());
    let leader = leader.unwrap() as u32;

    // A change through the group reaches every server.
    let (code, out, err) = c.shoal(&["map", "set", "2", "--weight", "2"]);
    assert_eq!(code, 0, "{out}{err}");
    let (v1, _, _) = wait_for(&c, Duration::from_secs(10), "the change", |m| m.0 > v0);
    let client = c.client();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for s in 0..3 {
        // A follower applies the change with the leader's next message after the commit.
        let start = Instant::now();
        let (v, toml) = loop {
            let (v, toml, _, _) = rt.block_on(client.get_map(shoal_proto::ServerId(s))).unwrap();
            if v >= v1 || start.elapsed() > Duration::from_secs(5) {
                break (v, toml);
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(v, v1, "server {s} serves version {v}");
        assert!(toml.contains("weight = 2"), "server {s}: {toml}");
    }

    // The leader dies: another is elected and the killed server is marked down.
    c.kill9(leader);
    let (v2, new_leader, states) =
        wait_for(&c, Duration::from_secs(30), "a new leader marking the old one down", |m| {
            m.1.is_some_and(|l| l as u32 != leader) && m.2[leader as usize] == "down"
        });
    assert!(v2 > v1);
    assert_ne!(new_leader.unwrap() as u32, leader);
    assert_eq!(states.iter().filter(|s| *s == "down").count(), 1, "only the dead server is down: {states:?}");

    // A change made now works, and the returning server catches up and marks itself up.
    let (code, out, err) = c.shoal(&["map", "set", "1", "--weight", "3"]);
    assert_eq!(code, 0, "{out}{err}");
    c.restart(leader);
    let (v3, _, states) = wait_for(&c, Duration::from_secs(30), "the returned server up again", |m| {
        m.2[leader as usize] == "up" && m.0 > v2 + 1
    });
    assert!(states.iter().all(|s| s == "up"), "{states:?}");
    let (v, toml, _, _) = rt.block_on(client.get_map(shoal_proto::ServerId(leader))).unwrap();
    assert!(v >= v3 && toml.contains("weight = 3"), "the returned server follows the group: version {v}\n{toml}");
}

#[test]
fn a_bad_change_is_refused_with_one_line() {
    let c = Cluster::start(1);
    wait_for(&c, Duration::from_secs(20), "a leader", |m| m.1.is_some());
    let (code, _, err) = c.shoal(&["map", "set", "7", "--weight", "2"]);
    assert_ne!(code, 0);
    assert!(err.contains("server 7 is not in the cluster map"), "{err}");
    let (code, _, err) = c.shoal(&["map", "set", "0", "--weight=0"]);
    assert_ne!(code, 0);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
