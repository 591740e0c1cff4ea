//! `shoal status` and `shoal df`.

use super::Ctx;
use crate::fmt::human_bytes;
use anyhow::{bail, Result};
use clap::Args;
use shoal_proto::msg::{MirrorStatus, MirrorSync};
use shoal_proto::ServerId;

#[derive(Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct DfArgs {
    /// Sizes in K/M/G instead of bytes.
    #[arg(short = 'H', long = "human")]
    human: bool,
}

pub async fn status(ctx: &Ctx, a: StatusArgs) -> Result<()> {
    let client = ctx.client()?;
    // The servers' map: slots may have moved, or be served at addresses the file lacks.
    let _ = client.refresh_map().await;
    let all = client.status_all().await;
    let map = client.map();
    // Where a slot lives when not on a process of its own, and where it is moving.
    let placement = |id: ServerId| -> String {
        let Some(e) = map.server(id) else { return String::new() };
        let mut v = Vec::new();
        if let Some(h) = e.host {
            v.push(format!("on s{h}"));
        }
        if let Some(by) = e.served_by {
            v.push(format!("served by s{by}"));
        }
        if let Some(to) = e.moving_to {
            v.push(format!("moving to s{to}"));
        }
        if e.draining {
            v.push("draining".to_string());
        }
        if e.absent {
            v.push("absent: its copies are made elsewhere".to_string());
        }
        v.join(", ")
    };
    if a.json {
        let rows: Vec<serde_json::Value> = all
            .iter()
            .map(|(id, r)| {
                let addr = map.server(*id).map(|s| s.addr.clone()).unwrap_or_default();
                match r {
                    Ok(s) => serde_json::json!({
                        "id": id.0, "addr": addr, "up": true,
                        "capacity_bytes": s.capacity_bytes, "free_bytes": s.free_bytes, "used_bytes": s.used_bytes,
                        "inodes": s.inodes, "entries": s.entries, "data_objects": s.data_objects,
                        "pending_intents": s.pending_intents, "uptime_secs": s.uptime_secs,
                        "client_requests": s.counters.client_requests, "peer_requests": s.counters.peer_requests,
                        "bytes_received": s.counters.bytes_received, "bytes_sent": s.counters.bytes_sent,
                        "errors": s.counters.errors,
                        "mirrors": s.mirrors.iter().map(mirror_json).collect::<Vec<_>>(),
                        "host": map.server(*id).and_then(|e| e.host),
                        "draining": map.server(*id).is_some_and(|e| e.draining),
                        "absent": map.server(*id).is_some_and(|e| e.absent),
                        "moving_to": map.server(*id).and_then(|e| e.moving_to),
                        "ops": s.counters.ops.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
                    }),
                    Err(e) => serde_json::json!({"id": id.0, "addr": addr, "up": false, "error": e.to_string()}),
                }
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"map_version": map.version(), "servers": rows}))?
        );
    } else {
        println!(
            "{:<4} {:<21} {:<5} {:>8} {:>8} {:>9} {:>9} {:>10} {:>10} {:>8}  slot",
            "id", "address", "state", "size", "free", "inodes", "objects", "requests", "peer-reqs", "uptime"
        );
        for (id, r) in &all {
            let addr = map.server(*id).map(|s| s.addr.as_str()).unwrap_or("?");
            match r {
                Ok(s) => println!(
                    "{:<4} {:<21} {:<5} {:>8} {:>8} {:>9} {:>9} {:>10} {:>10} {:>7}s  {}",
                    id.to_string(),
                    addr,
                    "up",
                    human_bytes(s.capacity_bytes),
                    human_bytes(s.free_bytes),
                    s.inodes,
                    s.data_objects,
                    s.counters.client_requests,
                    s.counters.peer_requests,
                    s.uptime_secs,
                    placement(*id)
                ),
                Err(e) => println!("{:<4} {:<21} {:<5} {}  {}", id.to_string(), addr, "DOWN", e.errno, placement(*id)),
            }
        }
        // Where each server's stores are mirrored, and how far each mirror has got.
        for (id, r) in &all {
            for m in r.as_ref().map(|s| s.mirrors.as_slice()).unwrap_or_default() {
                println!("mirror of {id} on {}: {}", m.server, mirror_state(m));
            }
        }
    }
    let down = all.iter().filter(|(_, r)| r.is_err()).count();
    if down > 0 {
        bail!("{down} of {} servers do not answer", all.len());
    }
    Ok(())
}

pub async fn df(ctx: &Ctx, a: DfArgs) -> Result<()> {
    let client = ctx.client()?;
    let s = client.statfs().await?;
    let f = |n: u64| if a.human { human_bytes(n) } else { n.to_string() };
    let used = s.capacity_bytes.saturating_sub(s.free_bytes);
    let pct = (used * 100).checked_div(s.capacity_bytes).unwrap_or(0);
    println!(
        "{:<12} {:>14} {:>14} {:>14} {:>5} {:>8} {:>8}",
        "filesystem", "size", "used", "avail", "use%", "inodes", "servers"
    );
    println!(
        "{:<12} {:>14} {:>14} {:>14} {:>4}% {:>8} {:>8}",
        "shoal",
        f(s.capacity_bytes),
        f(used),
        f(s.free_bytes),
        pct,
        s.inodes,
        format!("{}/{}", s.servers_up, s.servers_total)
    );
    Ok(())
}

/// A mirror's state in words: "in sync", "resyncing 12.0 MiB of 1.0 GiB (5%)", "out of sync".
fn mirror_state(m: &MirrorStatus) -> String {
    let shipped = if m.resyncs > 0 || m.resync_shipped_bytes > 0 {
        format!(" ({} resyncs shipped {})", m.resyncs, human_bytes(m.resync_shipped_bytes))
    } else {
        String::new()
    };
    match m.state {
        MirrorSync::InSync => format!("in sync at position {}{shipped}", m.applied),
        MirrorSync::OutOfSync => format!("OUT OF SYNC{shipped}"),
        MirrorSync::Resyncing => format!(
            "resyncing, {} of {} compared ({}%){shipped}",
            human_bytes(m.resync_done_bytes),
            human_bytes(m.resync_total_bytes),
            (m.resync_done_bytes * 100).checked_div(m.resync_total_bytes).unwrap_or(0)
        ),
    }
}

fn mirror_json(m: &MirrorStatus) -> serde_json::Value {
    serde_json::json!({
        "server": m.server.0,
        "state": match m.state { MirrorSync::InSync => "in_sync", MirrorSync::Resyncing => "resyncing", MirrorSync::OutOfSync => "out_of_sync" },
        "applied": m.applied,
        "resync_done_bytes": m.resync_done_bytes,
        "resync_total_bytes": m.resync_total_bytes,
        "resync_shipped_bytes": m.resync_shipped_bytes,
        "resyncs": m.resyncs,
    })
}
