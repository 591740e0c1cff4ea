//! `shoal token`: make a bearer token for the servers' HTTP service (docs/http.md,
//! docs/security.md "HTTP tokens"). The token is tagged under a key derived from the host
//! key, so only root on a client host (who may act as any user already) can make one; a
//! token for another user is a deliberate delegation, limited by its expiry.

use super::Ctx;
use anyhow::{Context, Result};
use clap::Args;
use shoal_auth::http_token::{self, Claims};
use shoal_auth::{KeyKind, KeyRing};
use shoal_placement::map::AuthMode;
use shoal_placement::ClusterMap;

#[derive(Args)]
pub struct TokenArgs {
    /// The uid the token acts as (default: the caller's).
    #[arg(long)]
    uid: Option<u32>,
    /// The primary gid (default: the caller's when --uid is not given, else the same as the uid).
    #[arg(long)]
    gid: Option<u32>,
    /// Supplementary groups, comma-separated gids (default: none).
    #[arg(long, value_delimiter = ',', value_name = "GID,...")]
    groups: Vec<u32>,
    /// How long the token is valid: 90s, 30m, 1h, 7d, ... (at most 366 days).
    #[arg(long, default_value = "1h", value_parser = parse_ttl)]
    ttl: std::time::Duration,
    /// Print the token and what it states as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_ttl(s: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration like 30m or 1h: {e}"))?;
    if d.is_zero() || d > std::time::Duration::from_secs(366 * 86400) {
        return Err(format!("{s:?}: the lifetime must be more than 0 and at most 366 days"));
    }
    Ok(d)
}

pub fn token(ctx: &Ctx, a: TokenArgs) -> Result<()> {
    let config = ctx.config_path()?;
    let map = ClusterMap::load(&config)?;
    let me = shoal_proto::msg::Cred::current();
    let uid = a.uid.unwrap_or(me.uid);
    let gid = a.gid.unwrap_or(if a.uid.is_some() { uid } else { me.gid });
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let claims = Claims { uid, gid, groups: a.groups, expires: now + a.ttl.as_secs() };
    let token = match map.security.auth {
        AuthMode::Keys => {
            let path = &map.security.host_key;
            let ring = KeyRing::load(path, KeyKind::Host)
                .with_context(|| "a token is tagged with the host key, which only root on a client host reads")?;
            http_token::mint(&ring, &claims)
        }
        // No keys under auth = "none": the servers take the token's identity as stated.
        AuthMode::None => http_token::mint_unsigned(&claims),
    };
    if a.json {
        let v = serde_json::json!({
            "token": token, "uid": claims.uid, "gid": claims.gid, "groups": claims.groups, "expires": claims.expires,
        });
        println!("{v}");
    } else {
        println!("{token}");
    }
    Ok(())
}
