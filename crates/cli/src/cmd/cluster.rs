//! `shoal cluster up|down|config`: a cluster of shoald processes on this machine.

use super::Ctx;
use crate::local_cluster::{self, UpOptions};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Start N shoald servers on loopback with their data under DIR (restarts the cluster
    /// already described by DIR/cluster.toml if there is one). Prints the config path.
    Up(UpArgs),
    /// Stop the servers started by `cluster up` (SIGTERM, then SIGKILL after --grace).
    Down(DownArgs),
}

#[derive(Args)]
pub struct UpArgs {
    /// Number of servers.
    #[arg(long, short = 'n', default_value_t = 4)]
    servers: u32,
    /// Folder for the config, logs, pid files and each server's data (DIR/s<id>).
    #[arg(long)]
    dir: PathBuf,
    /// First TCP port: servers use consecutive ports from it, then their HTTP ports follow
    /// (N servers take 2N ports); default: free ports chosen by the kernel.
    #[arg(long)]
    base_port: Option<u16>,
    /// Default stripe size of new files (e.g. 1M, 64K).
    #[arg(long, value_parser = crate::fmt::parse_size)]
    stripe_size: Option<u64>,
    /// Default stripe count of new files (0 = all servers).
    #[arg(long)]
    stripe_count: Option<u32>,
    /// Default placement of data objects: "same" (first object with the inode), "spread" or
    /// "load" (the least-loaded servers).
    #[arg(long, value_parser = shoal_placement::map::parse_policy)]
    policy: Option<shoal_client::PlacementPolicy>,
    /// Make every connection TLS 1.3 (`tls = true` under [security]), with a cluster CA
    /// and a server certificate for 127.0.0.1 made in DIR (docs/security.md, "TLS").
    #[arg(long)]
    tls: bool,
    /// Slow server ID on purpose: its data reads and writes limited to MBPS MB/s
    /// (`shoald --throttle`; repeatable). For benchmarks of load-aware placement.
    #[arg(long, value_name = "ID=MBPS", value_parser = local_cluster::parse_throttle)]
    throttle: Vec<(u32, f64)>,
    /// Copies of every server's metadata and data, 1 to 3 (`[cluster] replicas`): each
    /// server's stores are mirrored on the next N-1 servers (docs/architecture.md,
    /// "Redundancy").
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=3))]
    replicas: Option<u8>,
    /// Slots in all (at least the servers): the slots beyond the servers' own live on the
    /// servers in turn, so that a server added later takes whole slots from them
    /// (`shoal server add`, `shoal server rebalance`; docs/membership.md, "Moving slots").
    /// Default: one per server (such a cluster grows only by new files placed elsewhere).
    #[arg(long)]
    slots: Option<u32>,
}

#[derive(Args)]
pub struct DownArgs {
    /// The folder given to `cluster up` (default: the folder of --config / $SHOAL_CONFIG).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Seconds to wait for a clean exit before SIGKILL.
    #[arg(long, default_value_t = 10)]
    grace: u64,
}

pub async fn run(ctx: &Ctx, cmd: ClusterCmd) -> Result<()> {
    match cmd {
        ClusterCmd::Up(a) => {
            let opts = UpOptions {
                servers: a.servers,
                dir: a.dir,
                base_port: a.base_port,
                stripe_size: a.stripe_size,
                stripe_count: a.stripe_count,
                policy: a.policy,
                tls: a.tls,
                throttle: a.throttle,
                replicas: a.replicas,
                slots: a.slots,
            };
            let config = tokio::task::spawn_blocking(move || local_cluster::up(&opts)).await??;
            let map = shoal_placement::ClusterMap::load(&config)?;
            println!("started {} servers; configuration written to {}", map.processes().count(), config.display());
            for s in map.processes() {
                match &s.http {
                    Some(http) => println!("  s{} {}  http://{http}/ (status page; files under /fs/)", s.id, s.addr),
                    None => println!("  s{} {}", s.id, s.addr),
                }
            }
            println!("export SHOAL_CONFIG={}", config.display());
            Ok(())
        }
        ClusterCmd::Down(a) => {
            let dir = match a.dir {
                Some(d) => d,
                None => ctx
                    .config_path()?
                    .parent()
                    .map(PathBuf::from)
                    .context("cannot tell the cluster folder from the config path")?,
            };
            let grace = std::time::Duration::from_secs(a.grace);
            let d = dir.clone();
            let report = tokio::task::spawn_blocking(move || local_cluster::down(&d, grace))
                .await?
                .with_context(|| format!("cannot stop the cluster in {}", dir.display()))?;
            println!("stopped {} servers of {}", report.stopped.len(), dir.display());
            for (id, pid, why) in &report.not_stopped {
                eprintln!("shoal: server {id} (pid {pid}) was not stopped: {why}");
            }
            if !report.not_stopped.is_empty() {
                anyhow::bail!("{} of the servers of {} are still running", report.not_stopped.len(), dir.display());
            }
            Ok(())
        }
    }
}
