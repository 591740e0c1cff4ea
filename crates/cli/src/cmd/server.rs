//! `shoal server add`, `drain`, `remove`, `move` and `rebalance`: servers joining and
//! leaving a running cluster, and slots moving between servers (docs/membership.md,
//! "Moving slots", "Draining and removing a server").

use super::map::newest;
use super::{usage, Ctx};
use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use shoal_client::{Client, ServerId};
use shoal_placement::map::{ServerEntry, ServerState};
use shoal_placement::rebalance::{plan, Move};
use shoal_placement::ClusterMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum ServerCmd {
    /// Add a server to the running cluster's map (root only), and write the new map to the
    /// configuration file; start its shoald next, then `shoal server rebalance`.
    #[command(after_help = "Example:\n  shoal server add 4 --addr 10.0.0.5:7100 --data-dir /srv/shoal\n  \
                            shoald --config cluster.toml --id 4\n  shoal server rebalance")]
    Add(AddArgs),
    /// Move every slot off a running server (root only), its own last, with progress; the
    /// server then leaves the cluster and its shoald stops.
    #[command(after_help = "The server stops taking new slots and failovers, leaves the map group's voters, \
                            and its slots move one at a time to the servers holding the fewest (resynchronised \
                            while it serves, then switched). At the end its entry is a slot living on another \
                            server and the configuration file is rewritten.\n\nExample:\n  shoal server drain 3")]
    Drain(DrainArgs),
    /// Take a server that is gone for good out of the cluster (root only): the copies that
    /// took over its slots in a failover keep them, and get new mirrors.
    #[command(after_help = "For a server that is down and will not come back (its disk or machine is lost). \
                            Refused while it is up (drain it instead) or while a slot living on it has no copy \
                            serving it (replicas = 1: removing it would lose that slot's data).\n\nExample:\n  \
                            shoal server remove 3")]
    Remove(RemoveArgs),
    /// Move one slot to another server (root only), and wait until it serves there.
    Move(MoveArgs),
    /// Move slots until every server that is up holds its share (root only), one after the
    /// other, with progress.
    Rebalance(RebalanceArgs),
}

#[derive(Args)]
pub struct AddArgs {
    /// The new server's id (not in the map yet).
    id: u32,
    /// host:port it listens on.
    #[arg(long)]
    addr: String,
    /// Where it keeps its data (else given to its shoald with --data-dir).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// host:port of its HTTP service.
    #[arg(long)]
    http: Option<String>,
    /// Placement weight.
    #[arg(long, default_value_t = 1.0)]
    weight: f64,
    /// Also start its shoald here, as `shoal cluster up` starts a local cluster's (pid and
    /// log files in the configuration file's folder; `shoal cluster down` stops it too).
    #[arg(long)]
    start: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct DrainArgs {
    /// The server to drain (a server of the map with a process of its own).
    id: u32,
    /// Give up waiting for one move after this many seconds (it goes on in the servers).
    #[arg(long, default_value_t = 3600)]
    wait_secs: u64,
    /// Print JSON (the moves made).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct RemoveArgs {
    /// The server to remove.
    id: u32,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct MoveArgs {
    /// The slot (a server id of the map).
    slot: u32,
    /// The server to move it to.
    #[arg(long)]
    to: u32,
    /// Give up waiting after this many seconds (the move goes on in the servers).
    #[arg(long, default_value_t = 3600)]
    wait_secs: u64,
}

#[derive(Args)]
pub struct RebalanceArgs {
    /// Only print the moves a rebalance would make.
    #[arg(long)]
    dry_run: bool,
    /// Give up waiting for one move after this many seconds (it goes on in the servers).
    #[arg(long, default_value_t = 3600)]
    wait_secs: u64,
    /// Print JSON (the moves made, or planned with --dry-run).
    #[arg(long)]
    json: bool,
}

pub async fn run(ctx: &Ctx, c: ServerCmd) -> Result<()> {
    match c {
        ServerCmd::Add(a) => add(ctx, a).await,
        ServerCmd::Move(a) => {
            let client = ctx.client()?;
            let m = one_move(&client, ServerId(a.slot), ServerId(a.to)).await?;
            let moved = wait_moved(&client, m, Duration::from_secs(a.wait_secs), None).await?;
            println!("server {} moved from server {} to server {} in {:.1} s", m.slot, m.from, m.to, moved);
            Ok(())
        }
        ServerCmd::Rebalance(a) => rebalance(ctx, a).await,
        ServerCmd::Drain(a) => drain(ctx, a).await,
        ServerCmd::Remove(a) => remove(ctx, a).await,
    }
}

/// The newest map and the server it came from.
async fn current(client: &Client) -> Result<(ServerId, u64, ClusterMap)> {
    // Route by it too: the slots asked for their status below may have moved.
    let _ = client.refresh_map().await;
    let (via, version, toml, _, _) = newest(client).await?;
    let map: ClusterMap = toml::from_str(&toml).map_err(|e| anyhow!("the servers' map does not parse: {e}"))?;
    Ok((via, version, map))
}

/// Propose `change` applied to the newest map (retried when another change wins the race).
async fn change_map(client: &Client, change: impl Fn(&mut ClusterMap) -> Result<()>) -> Result<(u64, ClusterMap)> {
    let mut last = None;
    for _ in 0..10 {
        let (via, version, mut map) = current(client).await?;
        change(&mut map)?;
        map.cluster.version = version + 1;
        map.validate().map_err(|m| usage(format!("the changed map would not be valid: {m}")))?;
        match client.propose_map(via, version, map.to_toml()).await {
            Ok(v) => return Ok((v, map)),
            Err(e) if e.errno == shoal_proto::Errno::EAGAIN => last = Some(e),
            Err(e) => return Err(e.into()),
        }
    }
    Err(anyhow!("the map kept changing under this change: {}", last.map_or_else(String::new, |e| e.to_string())))
}

async fn add(ctx: &Ctx, a: AddArgs) -> Result<()> {
    let client = ctx.client()?;
    let (version, map) = change_map(&client, |map| {
        if map.server(ServerId(a.id)).is_some() {
            return Err(usage(format!("server {} is in the map already", a.id)));
        }
        map.servers.push(ServerEntry {
            id: a.id,
            addr: a.addr.clone(),
            data_dir: a.data_dir.clone(),
            weight: a.weight,
            state: ServerState::Up,
            http: a.http.clone(),
            served_by: None,
            behind: Vec::new(),
            home: None,
            member_at: None,
            host: None,
            moving_to: None,
            // Nothing new is placed on its own slot: that would move existing inodes.
            placed: false,
            draining: false,
            absent: false,
        });
        Ok(())
    })
    .await?;
    // The new server finds its entry in the configuration file it is started with.
    let _ = map;
    let path = write_config(ctx, &client).await?;
    if a.start {
        let dir = path.parent().map_or_else(|| PathBuf::from("."), PathBuf::from);
        let (dir2, path2, id) = (dir.clone(), path.clone(), a.id);
        tokio::task::spawn_blocking(move || crate::local_cluster::start_server(&dir2, &path2, id, None)).await??;
        wait_accepting(&a.addr, Duration::from_secs(30), &dir.join(format!("s{}.log", a.id))).await?;
    }
    if a.json {
        println!("{}", serde_json::json!({"server": a.id, "map_version": version, "config": path, "started": a.start}));
    } else if a.start {
        println!("server {} added (map version {version}) and started; move slots to it: shoal server rebalance", a.id);
    } else {
        println!(
            "server {} added (map version {version}); {} names it now.\nStart it (shoald --config {} --id {}), then move slots to it: shoal server rebalance",
            a.id,
            path.display(),
            path.display(),
            a.id
        );
    }
    Ok(())
}

/// Wait until something accepts connections at `addr` (a server just started; its log
/// `log` names the cause if it does not come up).
async fn wait_accepting(addr: &str, within: Duration, log: &std::path::Path) -> Result<()> {
    let started = Instant::now();
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if started.elapsed() > within {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no log output");
            return Err(anyhow!("the new server did not accept connections on {addr} within {within:?}: {last}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Ask the servers to move `slot` to `to` (the `moving_to` map change).
async fn one_move(client: &Client, slot: ServerId, to: ServerId) -> Result<Move> {
    let (_, _, map) = current(client).await?;
    let from = map.process_of(slot);
    let entry = map.server(slot).ok_or_else(|| usage(format!("server {slot} is not in the map")))?;
    if entry.host.is_none() && !entry.draining {
        return Err(usage(format!(
            "server {slot} is a server's own slot: it moves only when the server is drained (shoal server drain {slot})"
        )));
    }
    match map.server(to) {
        Some(e) if e.host.is_none() && !e.draining => {}
        Some(e) if e.draining => return Err(usage(format!("server {to} is being drained: nothing moves to it"))),
        _ => return Err(usage(format!("server {to} is not a server of the map (with a process of its own)"))),
    }
    if from == to {
        return Err(usage(format!("server {slot} lives on server {to} already")));
    }
    change_map(client, |map| {
        let e = map.servers.iter_mut().find(|e| e.id == slot.0).ok_or_else(|| anyhow!("server {slot} left the map"))?;
        e.moving_to = Some(to.0);
        Ok(())
    })
    .await?;
    Ok(Move { slot, from, to })
}

/// Wait until `m` is done: the slot lives on its destination and is served there. Returns
/// the seconds it took. `bar`: shows the destination's resync meanwhile.
async fn wait_moved(client: &Client, m: Move, within: Duration, bar: Option<&ProgressBar>) -> Result<f64> {
    let started = Instant::now();
    loop {
        let (_, _, map) = current(client).await?;
        let e = map.server(m.slot).ok_or_else(|| anyhow!("server {} left the map", m.slot))?;
        if e.host == Some(m.to.0) && e.moving_to.is_none() && !e.addr.is_empty() && e.state == ServerState::Up {
            // Served there once the new address answers.
            if client.server_status(m.slot).await.is_ok() {
                return Ok(started.elapsed().as_secs_f64());
            }
        } else if e.moving_to != Some(m.to.0) && e.host != Some(m.to.0) {
            return Err(anyhow!("the move of server {} to server {} was called off (the map changed)", m.slot, m.to));
        }
        if let Some(bar) = bar {
            bar.set_message(resync_note(client, m).await);
        }
        if started.elapsed() > within {
            return Err(anyhow!(
                "server {} is still moving to server {} after {:?} (the move goes on: see shoal status)",
                m.slot,
                m.to,
                within
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How far the destination's copy of the moving slot is, from the slot's status.
async fn resync_note(client: &Client, m: Move) -> String {
    let Ok(st) = client.server_status(m.slot).await else {
        return format!("server {} → {}: switching", m.slot, m.to);
    };
    match st.mirrors.iter().find(|x| x.server == m.to) {
        Some(x) if x.resync_total_bytes > 0 && x.resync_done_bytes < x.resync_total_bytes => format!(
            "server {} → {}: copying {:.0} %",
            m.slot,
            m.to,
            100.0 * x.resync_done_bytes as f64 / x.resync_total_bytes as f64
        ),
        Some(_) => format!("server {} → {}: catching up", m.slot, m.to),
        None => format!("server {} → {}: starting", m.slot, m.to),
    }
}

async fn rebalance(ctx: &Ctx, a: RebalanceArgs) -> Result<()> {
    let client = ctx.client()?;
    let (_, _, map) = current(&client).await?;
    let moves = plan(&map);
    let as_json = moves_json;
    if a.dry_run {
        if a.json {
            println!("{}", as_json(&moves.iter().map(|m| (*m, 0.0)).collect::<Vec<_>>()));
        } else if moves.is_empty() {
            println!("balanced: nothing to move");
        }
        for m in moves.iter().filter(|_| !a.json) {
            println!("move server {} from server {} to server {}", m.slot, m.from, m.to);
        }
        return Ok(());
    }
    let done = make_moves(&client, &moves, Duration::from_secs(a.wait_secs)).await?;
    if a.json {
        println!("{}", as_json(&done));
    } else if done.is_empty() {
        println!("balanced: nothing to move");
    } else {
        print_moves(&done);
    }
    Ok(())
}

/// Make `moves` one after the other, with a progress bar; each one's seconds.
async fn make_moves(client: &Client, moves: &[Move], wait: Duration) -> Result<Vec<(Move, f64)>> {
    let bar = ProgressBar::new(moves.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} slots  {msg}")
            .map_err(|e| anyhow!("{e}"))?
            .progress_chars("=> "),
    );
    let mut done = Vec::new();
    for m in moves {
        let m = one_move(client, m.slot, m.to).await?;
        let secs = wait_moved(client, m, wait, Some(&bar)).await?;
        bar.inc(1);
        done.push((m, secs));
    }
    bar.finish_and_clear();
    Ok(done)
}

fn print_moves(done: &[(Move, f64)]) {
    for (m, s) in done {
        println!("moved server {} from server {} to server {} in {s:.1} s", m.slot, m.from, m.to);
    }
}

fn moves_json(done: &[(Move, f64)]) -> serde_json::Value {
    serde_json::json!(done
        .iter()
        .map(|(m, s)| serde_json::json!({"slot": m.slot.0, "from": m.from.0, "to": m.to.0, "seconds": s}))
        .collect::<Vec<_>>())
}

/// Write the newest map to the configuration file (a server started with it finds itself
/// as the cluster has it now).
async fn write_config(ctx: &Ctx, client: &Client) -> Result<PathBuf> {
    let (_, _, map) = current(client).await?;
    let path = ctx.config_path()?;
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, map.to_toml()).map_err(|e| anyhow!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &path).map_err(|e| anyhow!("cannot replace {}: {e}", path.display()))?;
    Ok(path)
}

/// The process `id` of `map`, or why it is not one.
fn process_entry(map: &ClusterMap, id: ServerId) -> Result<&ServerEntry> {
    let e = map.server(id).ok_or_else(|| usage(format!("server {id} is not in the map")))?;
    if let Some(h) = e.host {
        return Err(usage(format!(
            "server {id} is a slot living on server {h}, not a server with a process of its own"
        )));
    }
    Ok(e)
}

async fn drain(ctx: &Ctx, a: DrainArgs) -> Result<()> {
    let client = ctx.client()?;
    let id = ServerId(a.id);
    let (_, _, map) = current(&client).await?;
    let e = process_entry(&map, id)?;
    if e.state != ServerState::Up {
        return Err(usage(format!(
            "server {id} is {:?}: only a server that is up can be drained (one that is gone for good: shoal server remove {id})",
            e.state
        )
        .to_lowercase()));
    }
    let staying = map.processes().filter(|p| p.id != id.0 && !p.draining && p.state == ServerState::Up).count();
    if staying == 0 {
        return Err(usage(format!("server {id} is the only server that is up: there is nowhere to move its slots")));
    }
    // Mark it drained; moves to it are called off (their destination's copy is dropped), and
    // the slots it mirrors get new mirrors (it keeps its copies until those are in sync).
    change_map(&client, |map| {
        if map.server(id).is_none() {
            return Err(anyhow!("server {id} left the map"));
        }
        map.set_draining(id);
        Ok(())
    })
    .await?;
    wait_not_voter(&client, id, Duration::from_secs(60)).await?;
    let wait = Duration::from_secs(a.wait_secs);
    let mut done = Vec::new();
    // One plan at a time: a failover meanwhile can change where slots are.
    loop {
        let (_, _, map) = current(&client).await?;
        let moves: Vec<Move> = plan(&map).into_iter().filter(|m| m.from == id).collect();
        let Some(first) = moves.first().copied() else { break };
        // Its own slot only once nothing else lives on it.
        let next = if moves.len() > 1 && first.slot == id { moves[1] } else { first };
        if next.slot == id {
            // Moving its own slot retires it: first the mirrors replacing its copies.
            wait_replaced(&client, id, wait).await?;
        }
        done.extend(make_moves(&client, &[next], wait).await?);
    }
    let path = write_config(ctx, &client).await?;
    if a.json {
        println!("{}", serde_json::json!({"server": a.id, "moves": moves_json(&done), "config": path}));
    } else {
        print_moves(&done);
        println!(
            "server {id} is drained: it holds nothing and has left the cluster (its shoald stops; {} no longer names it as a server)",
            path.display()
        );
    }
    Ok(())
}

/// Wait until every slot that keeps a copy on the drained server `id` has the mirror
/// replacing it in sync (`ClusterMap::awaiting_replacement`), so that leaving takes no copy
/// away.
async fn wait_replaced(client: &Client, id: ServerId, within: Duration) -> Result<()> {
    let started = Instant::now();
    let spinner = ProgressBar::new_spinner();
    loop {
        let (_, _, map) = current(client).await?;
        let waiting = map.awaiting_replacement(id);
        if waiting.is_empty() {
            spinner.finish_and_clear();
            return Ok(());
        }
        let slots: Vec<String> = waiting.iter().map(|s| s.to_string()).collect();
        spinner.set_message(format!("waiting for the new mirrors of slots {} (shoal status)", slots.join(", ")));
        spinner.tick();
        if started.elapsed() > within {
            spinner.finish_and_clear();
            return Err(anyhow!(
                "the mirrors replacing server {id}'s copies of slots {} are not in sync after {within:?} (see shoal status); \
                 run the drain again to go on waiting",
                slots.join(", ")
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Wait until the map group's voters leave out `id` (the leader changes them once the map
/// says it is drained).
async fn wait_not_voter(client: &Client, id: ServerId, within: Duration) -> Result<()> {
    let started = Instant::now();
    loop {
        let (_, _, _, _, voters) = newest(client).await?;
        if !voters.contains(&id.0) {
            return Ok(());
        }
        if started.elapsed() > within {
            return Err(anyhow!(
                "server {id} is still a voter of the map group after {within:?} (is a majority of the voters up? see shoal status)"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn remove(ctx: &Ctx, a: RemoveArgs) -> Result<()> {
    let client = ctx.client()?;
    let id = ServerId(a.id);
    let (_, _, map) = current(&client).await?;
    process_entry(&map, id)?;
    if client.server_status(id).await.is_ok() && map.server(id).and_then(|e| e.served_by).is_none() {
        return Err(usage(format!(
            "server {id} is up and serving: drain it instead (shoal server drain {id}), which moves its slots while it serves"
        )));
    }
    let (version, map) = change_map(&client, |map| {
        let e = process_entry(map, id)?;
        if e.home.is_some() {
            return Err(usage(format!(
                "server {id} is running again, standing by to take its slot back: drain it once it serves (shoal server drain {id})"
            )));
        }
        let Some(by) = e.served_by else {
            return Err(usage(format!(
                "server {id}'s slot is not served by a copy elsewhere (replicas = 1, its mirrors are behind, or the failover \
                 is not done yet: see shoal status): removing it would lose that slot's data; start it again and drain it"
            )));
        };
        let left: Vec<u32> = map.slots_on(id).into_iter().filter(|&s| s != id).map(|s| s.0).collect();
        if !left.is_empty() {
            return Err(usage(format!(
                "slots {left:?} live on server {id} and no copy serves them yet: removing it would lose their data"
            )));
        }
        map.retire(id, ServerId(by));
        Ok(())
    })
    .await?;
    let path = write_config(ctx, &client).await?;
    let host = map.process_of(id);
    if a.json {
        println!("{}", serde_json::json!({"server": a.id, "map_version": version, "slot_on": host.0, "config": path}));
    } else {
        println!(
            "server {id} is removed (map version {version}): its slot lives on server {host}, which served it since the \
             failover; its new mirrors are being resynchronised (shoal status)"
        );
    }
    Ok(())
}
