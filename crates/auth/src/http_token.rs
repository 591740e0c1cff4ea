//! Bearer tokens for the servers' HTTP service (docs/http.md, docs/security.md "HTTP tokens").
//!
//! A token states an identity (uid, gid, supplementary groups) until an expiry time, and
//! carries an HMAC-SHA256 [`tag`](crate::tag) over those fields under a key derived from
//! one epoch of the **host** key ring. Only root on a client host (who may already act as
//! any user through the host key) and servers (who derive the host ring from the cluster
//! key) can therefore mint one; anyone holding a token acts as its identity until it
//! expires, as with any bearer credential.
//!
//! Text form, made only of characters RFC 6750 allows in a bearer token:
//! `shoal1.EPOCH.UID.GID.GROUPS.EXPIRES.TAG` with GROUPS the gids joined by `_` (empty for
//! none), EXPIRES Unix seconds and TAG 64 hex digits, e.g.
//! `shoal1.1.1000.1000.27_100.1767225600.9f…`.
//!
//! Under `auth = "none"` there are no keys: [`mint_unsigned`] writes `-` as the tag and
//! [`parse`] accepts any tag without checking it, as the binary protocol trusts the
//! identity a client states in that mode.

use crate::key::{KeyRing, Secret};

/// Domain label of the key tokens are tagged with (derived from a host key epoch).
const KEY_LABEL: &str = "http token";
/// Domain label of the tag itself.
const TAG_LABEL: &str = "shoal http token";
const PREFIX: &str = "shoal1";

/// What a token states.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claims {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// Unix seconds after which the token is refused.
    pub expires: u64,
}

/// Why a token was refused (the HTTP service puts this in its 401 body).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    #[error("token expired {0} s ago")]
    Expired(u64),
    #[error("token signed with key epoch {0}, which the servers no longer hold (make a new one with `shoal token`)")]
    UnknownEpoch(u32),
    #[error("token signature is not valid (forged, altered or made for another cluster)")]
    Forged,
}

fn token_key(host_secret: &Secret) -> Secret {
    crate::derive(host_secret, KEY_LABEL)
}

fn body(epoch: u32, c: &Claims) -> String {
    let groups: Vec<String> = c.groups.iter().map(u32::to_string).collect();
    format!("{PREFIX}.{epoch}.{}.{}.{}.{}", c.uid, c.gid, groups.join("_"), c.expires)
}

/// A token for `claims`, tagged under the newest epoch of `host_ring` (a host ring, or
/// the host ring a server derives from its cluster ring).
pub fn mint(host_ring: &KeyRing, claims: &Claims) -> String {
    let (epoch, secret) = host_ring.current();
    let b = body(epoch, claims);
    let t = crate::tag(&token_key(secret), TAG_LABEL, &[b.as_bytes()]);
    format!("{b}.{}", hex::encode(t))
}

/// A token without a tag, for clusters under `auth = "none"` (see the module docs).
pub fn mint_unsigned(claims: &Claims) -> String {
    format!("{}.-", body(0, claims))
}

/// The claims of `token` if it is well formed, unexpired at `now` (Unix seconds) and, when
/// `host_ring` is given, tagged under one of its epochs. Without a ring (`auth = "none"`)
/// the tag is not checked.
pub fn parse(token: &str, host_ring: Option<&KeyRing>, now: u64) -> Result<Claims, TokenError> {
    let (b, tag_hex) = token.rsplit_once('.').ok_or(TokenError::Malformed("no tag"))?;
    let f: Vec<&str> = b.split('.').collect();
    if f.len() != 6 || f[0] != PREFIX {
        return Err(TokenError::Malformed("not a shoal1.EPOCH.UID.GID.GROUPS.EXPIRES.TAG token"));
    }
    let num = |s: &str, what: &'static str| s.parse::<u64>().map_err(|_| TokenError::Malformed(what));
    let epoch = u32::try_from(num(f[1], "epoch is not a number")?).map_err(|_| TokenError::Malformed("epoch"))?;
    let uid = u32::try_from(num(f[2], "uid is not a number")?).map_err(|_| TokenError::Malformed("uid"))?;
    let gid = u32::try_from(num(f[3], "gid is not a number")?).map_err(|_| TokenError::Malformed("gid"))?;
    let groups = if f[4].is_empty() {
        Vec::new()
    } else {
        f[4].split('_')
            .map(|g| g.parse::<u32>().map_err(|_| TokenError::Malformed("a group is not a number")))
            .collect::<Result<Vec<_>, _>>()?
    };
    let expires = num(f[5], "expiry is not a number")?;
    if let Some(ring) = host_ring {
        let tag = hex::decode(tag_hex).map_err(|_| TokenError::Malformed("tag is not hex"))?;
        let secret = ring.get(epoch).ok_or(TokenError::UnknownEpoch(epoch))?;
        if !crate::verify(&token_key(secret), TAG_LABEL, &[b.as_bytes()], &tag) {
            return Err(TokenError::Forged);
        }
    }
    // Checked after the tag, so that a forged token is called forged whatever it claims.
    if expires < now {
        return Err(TokenError::Expired(now - expires));
    }
    Ok(Claims { uid, gid, groups, expires })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyKind;

    fn claims() -> Claims {
        Claims { uid: 1000, gid: 100, groups: vec![27, 100], expires: 2_000_000_000 }
    }

    #[test]
    fn a_minted_token_parses_back_to_its_claims() {
        let ring = KeyRing::generate(KeyKind::Cluster).host_ring();
        let t = mint(&ring, &claims());
        assert!(t.starts_with("shoal1.1.1000.100.27_100.2000000000."), "{t}");
        assert_eq!(parse(&t, Some(&ring), 1_000_000_000), Ok(claims()));
        let none = Claims { groups: vec![], ..claims() };
        assert_eq!(parse(&mint(&ring, &none), Some(&ring), 0), Ok(none));
    }

    #[test]
    fn altered_foreign_expired_and_malformed_tokens_are_refused() {
        let ring = KeyRing::generate(KeyKind::Cluster).host_ring();
        let t = mint(&ring, &claims());
        let altered = t.replacen(".1000.", ".0.", 1);
        assert_eq!(parse(&altered, Some(&ring), 0), Err(TokenError::Forged));
        let other = KeyRing::generate(KeyKind::Cluster).host_ring();
        assert_eq!(parse(&t, Some(&other), 0), Err(TokenError::Forged));
        assert_eq!(parse(&t, Some(&ring), 2_000_000_010), Err(TokenError::Expired(10)));
        // Rotation keeps old tokens valid; retiring their epoch refuses them.
        let cluster = KeyRing::generate(KeyKind::Cluster);
        let old = mint(&cluster.host_ring(), &claims());
        let rotated = cluster.rotated();
        assert_eq!(parse(&old, Some(&rotated.host_ring()), 0), Ok(claims()));
        assert!(mint(&rotated.host_ring(), &claims()).starts_with("shoal1.2."));
        assert_eq!(parse(&old, Some(&rotated.retired().host_ring()), 0), Err(TokenError::UnknownEpoch(1)));
        assert!(matches!(parse("abc", Some(&ring), 0), Err(TokenError::Malformed(_))));
        assert!(matches!(parse("shoal1.1.x.1..5.00", Some(&ring), 0), Err(TokenError::Malformed(_))));
        assert!(matches!(
            parse(&t.replacen("shoal1.1.", "shoal1.9.", 1), Some(&ring), 0),
            Err(TokenError::UnknownEpoch(9))
        ));
        // An unsigned token passes only where nothing is checked (auth = "none").
        let u = mint_unsigned(&claims());
        assert!(matches!(parse(&u, Some(&ring), 0), Err(TokenError::Malformed(_))));
        assert_eq!(parse(&u, None, 0), Ok(claims()));
    }
}
