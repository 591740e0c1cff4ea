//! `shoal setstripe` / `shoal getstripe`, after Lustre's `lfs setstripe/getstripe`.

use super::{only_shoal, Ctx};
use crate::fmt::{human_bytes, parse_size};
use anyhow::{bail, Context, Result};
use clap::Args;
use shoal_client::{FileKind, LayoutSpec, PlacementPolicy, ServerId};
use shoal_proto::msg::REPLICAS_MAX;

#[derive(Args)]
pub struct SetstripeArgs {
    /// Stripe size (multiple of 4K, e.g. 64K, 1M).
    #[arg(short = 'S', long = "stripe-size", value_parser = parse_size)]
    size: Option<u64>,
    /// Number of servers to stripe over (-1 = all servers).
    #[arg(short = 'c', long = "stripe-count", allow_negative_numbers = true)]
    count: Option<i64>,
    /// Server holding the first object (a server id from `shoal status`).
    #[arg(short = 'i', long = "first-server")]
    first: Option<u32>,
    /// Placement policy for the first object when -i is not given: same, spread or load
    /// (the least-loaded servers; docs/architecture.md, "Load-aware placement").
    #[arg(short = 'p', long, value_parser = shoal_placement::map::parse_policy)]
    policy: Option<PlacementPolicy>,
    /// Copies of each data object, 1 to 3 (docs/replicas.md); at most the cluster's
    /// `[cluster] replicas`, to which a larger count is capped.
    #[arg(short = 'r', long = "replicas", allow_negative_numbers = true)]
    replicas: Option<i64>,
    /// A directory (sets the default for new files in it) or a new file (created empty with this layout).
    path: String,
}

#[derive(Args)]
pub struct GetstripeArgs {
    #[arg(required = true)]
    paths: Vec<String>,
}

pub async fn setstripe(ctx: &Ctx, a: SetstripeArgs) -> Result<()> {
    let client = ctx.client()?;
    let path = only_shoal(&a.path);
    let count = match a.count {
        None => None,
        Some(-1) => Some(u32::MAX),
        Some(c) if c >= 1 && c <= u32::MAX as i64 => Some(c as u32),
        Some(c) => bail!("stripe count {c} must be -1 (all servers) or at least 1"),
    };
    if let Some(f) = a.first {
        if client.map().server(ServerId(f)).is_none() {
            bail!("server {f} is not in the cluster map");
        }
    }
    let replicas = replicas_arg(a.replicas)?;
    let spec = LayoutSpec {
        stripe_size: a.size,
        stripe_count: count,
        first_server: a.first.map(ServerId),
        policy: a.policy,
        replicas,
    };
    // Said here with the command's own words; the server refuses the same (EINVAL).
    let map = client.map();
    note_capped(map, replicas);
    if let Err(m) = shoal_placement::check_spec(map, &spec) {
        let all = if count.is_some_and(|c| c != u32::MAX && c as usize > map.placeable().count()) {
            " (-c -1 stripes over all of them)"
        } else {
            ""
        };
        bail!("invalid layout for {path}: {m}{all}");
    }
    match client.stat(&path).await {
        Ok(attr) if attr.kind == FileKind::Dir => {
            client.set_layout(&path, spec).await.with_context(|| format!("cannot set the default layout of {path}"))?;
        }
        Ok(_) => {
            bail!("{path} exists; the layout of a file is fixed when it is created (copy it to a new file instead)")
        }
        Err(e) if e.errno == shoal_client::Errno::ENOENT => {
            let f = client.create(&path, 0o666, Some(spec)).await.with_context(|| format!("cannot create {path}"))?;
            f.close().await?;
        }
        Err(e) => return Err(anyhow::Error::from(e).context(format!("cannot access {path}"))),
    }
    Ok(())
}

/// A replica count given on the command line: 1 to `REPLICAS_MAX`, refused in one line
/// otherwise (parsed as a wide integer so that `-r 300` or `-r -1` get this message, not a
/// parser's).
pub fn replicas_arg(r: Option<i64>) -> Result<Option<u8>> {
    match r {
        None => Ok(None),
        Some(r) if (1..=REPLICAS_MAX as i64).contains(&r) => Ok(Some(r as u8)),
        Some(r) => bail!("replica count {r} must be 1 to {REPLICAS_MAX}"),
    }
}

/// Say on stderr when a count asks for more copies than the cluster keeps of its metadata:
/// it is not an error (a directory default may outlive a change of the cluster's count),
/// but files get the cluster's count, and the user should know.
pub fn note_capped(map: &shoal_placement::ClusterMap, replicas: Option<u8>) {
    let most = map.cluster.replicas;
    if let Some(r) = replicas.filter(|&r| r > most) {
        eprintln!(
            "note: {r} replicas asked, but the cluster keeps {most} cop{} of its metadata ([cluster] replicas); new files get {most}",
            if most == 1 { "y" } else { "ies" }
        );
    }
}

pub async fn getstripe(ctx: &Ctx, a: GetstripeArgs) -> Result<()> {
    let client = ctx.client()?;
    let defaults = &client.map().cluster;
    for p in &a.paths {
        let path = only_shoal(p);
        let attr = client.stat(&path).await.with_context(|| format!("cannot access {path}"))?;
        println!("{path}");
        if attr.read_mostly {
            println!("  read_mostly:  yes");
        }
        match (&attr.layout, attr.kind) {
            (Some(l), _) => {
                println!("  stripe_size:  {} ({})", l.stripe_size, human_bytes(l.stripe_size));
                println!("  stripe_count: {}", l.servers.len());
                println!("  first_server: {}", l.servers[0]);
                println!("  replicas:     {}", l.replicas);
                println!("  obdidx  server  address");
                for (i, s) in l.servers.iter().enumerate() {
                    let addr = client.map().server(*s).map(|e| e.addr.as_str()).unwrap_or("?");
                    println!("  {i:>6}  {:<6}  {addr}", s.to_string());
                }
            }
            (None, FileKind::Dir) => {
                let spec = attr.dir_default.clone().unwrap_or_default();
                let count = match spec.stripe_count {
                    Some(u32::MAX) => "-1 (all servers)".to_string(),
                    Some(c) if c > 0 => c.to_string(),
                    _ => format!("{} (cluster default)", defaults.stripe_count),
                };
                let size = spec
                    .stripe_size
                    .map(|s| s.to_string())
                    .unwrap_or(format!("{} (cluster default)", defaults.stripe_size));
                let first = spec.first_server.map(|s| s.to_string()).unwrap_or("by policy".into());
                let replicas = match spec.replicas {
                    Some(r) if r > defaults.replicas => format!("{r} (capped to the cluster's {})", defaults.replicas),
                    Some(r) => r.to_string(),
                    None => format!("{} (cluster default)", defaults.replicas),
                };
                let policy = match spec.policy.unwrap_or(defaults.policy) {
                    PlacementPolicy::Same => "same",
                    PlacementPolicy::Spread => "spread",
                    PlacementPolicy::Load => "load",
                };
                println!("  default for new files: stripe_size {size}, stripe_count {count}, first_server {first}, policy {policy}, replicas {replicas}");
            }
            (None, _) => println!("  (no data layout: {:?})", attr.kind),
        }
    }
    Ok(())
}
