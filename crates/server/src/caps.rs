//! Per-open capabilities: made here by an inode's home server after its permission check
//! (`Create`, `Open`), checked here by every server holding one of the file's objects
//! before a `Read`, `Write`, `Append` or `Fsync` (docs/security.md, "Capabilities").
//!
//! A capability is `HMAC-SHA256(K_E, "shoal capability", ino, rights, issued, expires, E)`
//! with `K_E = derive(cluster key of epoch E, "capability")`: every server can make and
//! check one, nobody without the cluster key can. New ones are made with the ring's current
//! epoch; any epoch still in the ring verifies, so a rotation (`shoal keygen --rotate`,
//! SIGHUP) breaks nothing and a retirement (`--retire`, SIGHUP) makes the old ones
//! renewable-only. Under `auth = "none"` (no key ring) nothing is made or checked.

use crate::error::{fail, Fail, R};
use crate::ops::denied;
use crate::perm::{self, R_OK, W_OK};
use crate::state::State;
use shoal_auth::KeyRing;
use shoal_proto::cap::{Capability, RENEW_HINT, RIGHT_READ, RIGHT_WRITE};
use shoal_proto::msg::{FileKind, Reply};
use shoal_proto::{Errno, Ino};
use std::sync::Arc;

const LABEL: &str = "shoal capability";

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn tag(ring: &KeyRing, epoch: u32, ino: Ino, rights: u8, issued: u64, expires: u64) -> Option<shoal_auth::Tag> {
    let key = shoal_auth::derive(ring.get(epoch)?, "capability");
    Some(shoal_auth::tag(
        &key,
        LABEL,
        &[&ino.0.to_le_bytes(), &[rights], &issued.to_le_bytes(), &expires.to_le_bytes(), &epoch.to_le_bytes()],
    ))
}

/// A capability of `ino` with `rights`, made now with the current key epoch; `None` when
/// the cluster runs without keys. The caller has done the permission check.
pub fn issue(st: &State, ino: Ino, rights: u8) -> Option<Capability> {
    let ring = st.key_ring()?;
    let (epoch, _) = ring.current();
    let issued = now_secs();
    let expires = issued.saturating_add(st.map.security.capability_lifetime_secs);
    let tag = tag(&ring, epoch, ino, rights, issued, expires)?;
    Some(Capability { ino, rights, issued, expires, epoch, tag: tag.to_vec() })
}

/// How a capability fails, for the message of the `EACCES`.
fn refused(what: std::fmt::Arguments) -> Fail {
    Fail::new(Errno::EACCES, format!("capability refused: {what}"))
}

/// Whether `cap` is a genuine capability of this cluster (tag verifies under an epoch the
/// ring holds), whatever its expiry, inode or rights. `Err` names why not.
fn authentic(ring: &KeyRing, cap: &Capability) -> R<()> {
    let Some(secret) = ring.get(cap.epoch) else {
        return Err(refused(format_args!(
            "made with key epoch {}, which this server no longer holds {RENEW_HINT}",
            cap.epoch
        )));
    };
    let key = shoal_auth::derive(secret, "capability");
    let parts: [&[u8]; 5] = [
        &cap.ino.0.to_le_bytes(),
        &[cap.rights],
        &cap.issued.to_le_bytes(),
        &cap.expires.to_le_bytes(),
        &cap.epoch.to_le_bytes(),
    ];
    if !shoal_auth::verify(&key, LABEL, &parts, &cap.tag) {
        return Err(refused(format_args!("forged (its tag does not verify) for inode {}", cap.ino)));
    }
    Ok(())
}

/// Check that `cap` lets its bearer do what needs `rights` (0: any right, as `Fsync`) on
/// `ino`. Passes everything when the cluster runs without keys. Each refusal is EACCES
/// with a message naming the cause: missing, forged, another inode, expired, rights.
pub fn check(st: &State, cap: Option<&Capability>, ino: Ino, rights: u8) -> R<()> {
    let Some(ring) = st.key_ring() else { return Ok(()) };
    let Some(cap) = cap else {
        return Err(refused(format_args!("none given for inode {ino} (open the file first)")));
    };
    authentic(&ring, cap)?;
    if cap.ino != ino {
        return Err(refused(format_args!("it is a capability of inode {}, not of inode {ino}", cap.ino)));
    }
    let now = now_secs();
    if now > cap.expires {
        return Err(refused(format_args!("expired {} s ago {RENEW_HINT}", now - cap.expires)));
    }
    if !cap.allows(rights) {
        let want = if rights & RIGHT_WRITE != 0 { "write" } else { "read" };
        return Err(refused(format_args!("{want} access to inode {ino} with a {} capability", name(cap.rights))));
    }
    Ok(())
}

/// Whether `cap` may be renewed without a new permission check (`Open` with `renew`): it
/// is authentic, of `ino`, has the rights asked for, and expired at most one lifetime ago
/// (so a capability that leaked long ago cannot be renewed forever).
pub fn renewable(st: &State, cap: &Capability, ino: Ino, rights: u8) -> bool {
    let Some(ring) = st.key_ring() else { return false };
    authentic(&ring, cap).is_ok()
        && cap.ino == ino
        && cap.allows(rights)
        && now_secs() <= cap.expires.saturating_add(st.map.security.capability_lifetime_secs)
}

fn name(rights: u8) -> &'static str {
    match rights & (RIGHT_READ | RIGHT_WRITE) {
        0 => "no",
        RIGHT_READ => "read-only",
        RIGHT_WRITE => "write-only",
        _ => "read-write",
    }
}

/// `Op::Open` at the inode's home: fresh attributes and, for a regular file, a capability
/// with `rights` after the permission check access(2) would make (skipped for a renewal of
/// a capability that [`renewable`] accepts: an open handle keeps its access, as with
/// open(2), even if the mode changed since).
pub async fn open(
    st: &Arc<State>,
    cred: shoal_proto::msg::Cred,
    ino: Ino,
    rights: u8,
    renew: Option<Capability>,
) -> R<Reply> {
    st.require_home(ino)?;
    if rights & !(RIGHT_READ | RIGHT_WRITE) != 0 {
        return fail(Errno::EINVAL, format!("capability rights {rights:#x} have unknown bits"));
    }
    if rights & RIGHT_WRITE != 0 {
        // A writer must not write beyond a committed truncate before its cut is done.
        crate::ops::truncate::finish_pending(st, ino).await?;
    }
    let renewal = renew.is_some_and(|c| renewable(st, &c, ino, rights));
    st.store(move |st| {
        let rec =
            st.meta.get_inode(ino)?.ok_or_else(|| Fail::new(Errno::ENOENT, format!("inode {ino} does not exist")))?;
        let attr = st.attr_of(ino, &rec, false);
        if rec.kind != FileKind::File {
            return Ok(Reply::Opened { attr, cap: None });
        }
        if !renewal {
            let mask =
                if rights & RIGHT_READ != 0 { R_OK } else { 0 } | if rights & RIGHT_WRITE != 0 { W_OK } else { 0 };
            if mask != 0 {
                perm::check(&cred, &rec.owner(), mask).map_err(|e| denied(e, ino))?;
            }
        }
        Ok(Reply::Opened { attr, cap: issue(st, ino, rights) })
    })
    .await
}
