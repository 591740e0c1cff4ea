//! `shoal map show` and `shoal map set`: the replicated cluster map (docs/membership.md).

use super::{usage, Ctx};
use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};
use shoal_client::{Client, ServerId};
use shoal_placement::map::ServerState;
use shoal_placement::ClusterMap;

#[derive(Subcommand)]
pub enum MapCmd {
    /// The newest map the servers hold: version, the group's leader and voters, each server.
    Show(ShowArgs),
    /// Change one server's state or weight through the map group (root only).
    Set(SetArgs),
}

#[derive(Args)]
pub struct ShowArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
#[command(after_help = "Examples:\n  shoal map set 2 --state down\n  shoal map set 1 --weight 2")]
pub struct SetArgs {
    /// The server's id in the map.
    server: u32,
    /// New state: up, down or out.
    #[arg(long, value_parser = ["up", "down", "out"])]
    state: Option<String>,
    /// New placement weight (> 0).
    #[arg(long)]
    weight: Option<f64>,
}

pub async fn run(ctx: &Ctx, c: MapCmd) -> Result<()> {
    match c {
        MapCmd::Show(a) => show(ctx, a).await,
        MapCmd::Set(a) => set(ctx, a).await,
    }
}

/// What one server says of the map: (server asked, version, text, leader, voters).
type Answer = (ServerId, u64, String, Option<u32>, Vec<u32>);

/// The newest map any server answers with.
pub(crate) async fn newest(client: &Client) -> Result<Answer> {
    let servers: Vec<ServerId> = client.map().servers.iter().map(|s| s.server_id()).collect();
    let answers = futures::future::join_all(servers.iter().map(|&s| client.get_map(s))).await;
    let mut best: Option<Answer> = None;
    let mut last_err = None;
    for (s, a) in servers.into_iter().zip(answers) {
        match a {
            Ok((v, toml, leader, voters)) => {
                if best.as_ref().is_none_or(|b| v > b.1 || (v == b.1 && b.3.is_none())) {
                    best = Some((s, v, toml, leader, voters));
                }
            }
            Err(e) => last_err = Some(e),
        }
    }
    best.ok_or_else(|| {
        anyhow!("no server answered: {}", last_err.map_or_else(|| "the map lists none".to_string(), |e| e.to_string()))
    })
}

async fn show(ctx: &Ctx, a: ShowArgs) -> Result<()> {
    let client = ctx.client()?;
    let (_, version, toml, leader, voters) = newest(&client).await?;
    let map: ClusterMap = toml::from_str(&toml).map_err(|e| anyhow!("the servers' map does not parse: {e}"))?;
    if a.json {
        let servers: Vec<serde_json::Value> = map
            .servers
            .iter()
            .map(|s| serde_json::json!({"id": s.id, "addr": s.addr, "state": s.state, "weight": s.weight}))
            .collect();
        let out = serde_json::json!({"version": version, "leader": leader, "voters": voters, "servers": servers});
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let leader = leader.map_or("none".to_string(), |l| l.to_string());
    println!("map version {version}, leader {leader}, voters {voters:?}");
    println!("{:>4}  {:<24} {:<5} {:>6}", "id", "addr", "state", "weight");
    for s in &map.servers {
        let state = match s.state {
            ServerState::Up => "up",
            ServerState::Down => "down",
            ServerState::Out => "out",
        };
        println!("{:>4}  {:<24} {:<5} {:>6}", s.id, s.addr, state, s.weight);
    }
    Ok(())
}

async fn set(ctx: &Ctx, a: SetArgs) -> Result<()> {
    if a.state.is_none() && a.weight.is_none() {
        return Err(usage("say what to change: --state up|down|out or --weight W"));
    }
    let client = ctx.client()?;
    let (via, version, toml, _, _) = newest(&client).await?;
    let mut map: ClusterMap = toml::from_str(&toml).map_err(|e| anyhow!("the servers' map does not parse: {e}"))?;
    let entry = map
        .servers
        .iter_mut()
        .find(|s| s.id == a.server)
        .ok_or_else(|| usage(format!("server {} is not in the cluster map", a.server)))?;
    if let Some(st) = &a.state {
        entry.state = match st.as_str() {
            "up" => ServerState::Up,
            "down" => ServerState::Down,
            _ => ServerState::Out,
        };
    }
    if let Some(w) = a.weight {
        entry.weight = w;
    }
    map.cluster.version = version + 1;
    map.validate().map_err(|m| usage(format!("the changed map would not be valid: {m}")))?;
    let new = client.propose_map(via, version, map.to_toml()).await?;
    println!("map version {new}");
    Ok(())
}
