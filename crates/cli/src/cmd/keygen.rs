//! `shoal keygen`: make, rotate or retire the cluster's keys (docs/security.md).

use super::Ctx;
use anyhow::{bail, Result};
use clap::Args;
use shoal_auth::{KeyKind, KeyRing};
use shoal_placement::map::AuthMode;
use shoal_placement::ClusterMap;
use shoal_rpc::tls_certs::CertReport;
use std::path::Path;

#[derive(Args)]
pub struct KeygenArgs {
    /// Add a new key epoch to the existing cluster key (old epochs keep verifying until
    /// retired): copy the new files to every server and client host, reload, then --retire.
    #[arg(long, conflicts_with_all = ["retire", "force"])]
    rotate: bool,
    /// Keep only the newest epoch of the existing cluster key.
    #[arg(long, conflicts_with = "force")]
    retire: bool,
    /// Replace an existing cluster key with a new one (servers holding the old key can no
    /// longer talk to those holding the new one until every server has it); under
    /// `[security] tls`, also a new TLS CA (every host needs its certificate).
    #[arg(long)]
    force: bool,
    /// Print what was written as JSON.
    #[arg(long)]
    json: bool,
}

/// Write the cluster key ring and the host key ring derived from it where the map's
/// `[security]` table says (both mode 0600). Without flags an existing cluster key is kept
/// and only a missing host key is written.
pub fn write_keys(map: &ClusterMap, rotate: bool, retire: bool, force: bool) -> Result<KeyRing> {
    let (cluster_path, host_path) = (&map.security.cluster_key, &map.security.host_key);
    let existing = if cluster_path.exists() { Some(KeyRing::load(cluster_path, KeyKind::Cluster)?) } else { None };
    let ring = match existing {
        None if rotate || retire => bail!("no cluster key at {} to rotate or retire", cluster_path.display()),
        None => KeyRing::generate(KeyKind::Cluster),
        Some(_) if force => KeyRing::generate(KeyKind::Cluster),
        Some(r) if rotate => r.rotated(),
        Some(r) if retire => r.retired(),
        Some(r) => r,
    };
    ring.save(cluster_path, true)?;
    ring.host_ring().save(host_path, true)?;
    Ok(ring)
}

pub fn keygen(ctx: &Ctx, a: KeygenArgs) -> Result<()> {
    let config = ctx.config_path()?;
    let map = ClusterMap::load(&config)?;
    if map.security.auth == AuthMode::None {
        eprintln!(
            "shoal: note: {} says auth = \"none\"; the keys are not used until it says \"keys\"",
            config.display()
        );
    }
    let ring = write_keys(&map, a.rotate, a.retire, a.force)?;
    // Under TLS: the CA (kept unless --force) and a new server certificate naming the
    // map's hosts as they are now.
    let tls = if map.security.tls {
        Some(shoal_rpc::tls_certs::make_certs(&map, a.force).map_err(anyhow::Error::msg)?)
    } else {
        None
    };
    report(&map.security.cluster_key, &map.security.host_key, &ring, a.json, &map, tls.as_ref());
    Ok(())
}

fn report(cluster: &Path, host: &Path, ring: &KeyRing, json: bool, map: &ClusterMap, tls: Option<&CertReport>) {
    let sec = &map.security;
    if json {
        let mut v = serde_json::json!({
            "cluster_key": cluster, "host_key": host, "epochs": ring.epochs(), "current_epoch": ring.current().0,
        });
        if let Some(t) = tls {
            v["tls"] = serde_json::json!({
                "ca": sec.tls_ca, "ca_key": sec.tls_ca_key, "cert": sec.tls_cert, "key": sec.tls_key,
                "new_ca": t.new_ca, "names": t.names,
            });
        }
        println!("{v}");
    } else {
        println!("cluster key {} (servers only), epochs {:?}", cluster.display(), ring.epochs());
        println!("host key    {} (root on client hosts)", host.display());
        if let Some(t) = tls {
            let made = if t.new_ca { "new" } else { "kept" };
            println!(
                "TLS CA      {} ({made}; every host), key {} (keep it safe)",
                sec.tls_ca.display(),
                sec.tls_ca_key.display()
            );
            println!(
                "TLS server  {} and {} (servers only), for {}",
                sec.tls_cert.display(),
                sec.tls_key.display(),
                t.names.join(", ")
            );
        }
    }
}
