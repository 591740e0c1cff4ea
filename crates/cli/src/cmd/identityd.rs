//! `shoal identityd`: the local identity helper (docs/security.md, "Users").
//!
//! An unprivileged process cannot read the host key, so it cannot prove anything to a
//! server by itself. This root-run service can: it listens on a Unix socket anyone may
//! connect to, learns each caller's uid and gid from the kernel (`SO_PEERCRED`, which the
//! caller cannot forge) and its supplementary groups (see [`caller_groups`]), checks the server's proof for the connection the caller is opening,
//! and answers with a credential for that identity bound to that connection's nonces and
//! valid for a minute (`shoal_rpc::auth`). The caller never states who it is.

use super::Ctx;
use anyhow::{bail, Context, Result};
use clap::Args;
use shoal_auth::{KeyKind, KeyRing};
use shoal_placement::ClusterMap;
use shoal_proto::msg::Cred;
use shoal_rpc::auth::{now_secs, read_message, write_message, IdentityAnswer, IdentityRequest};
use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{UnixListener, UnixStream};

#[derive(Args)]
pub struct IdentitydArgs {
    /// Socket to listen on (default: the config's [security] identity_socket).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Host key ring to sign with (default: the config's [security] host_key).
    #[arg(long, value_name = "FILE")]
    host_key: Option<PathBuf>,
}

/// How long a caller may take to send its request. A client sends it as soon as it is
/// connected; a connection that sends nothing only holds a descriptor.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Connections one uid may have open at once. A user's processes that start clients at the
/// same instant need a few each; a user who opens thousands and sends nothing (issue 51:
/// 20,000 idle connections used up the helper's descriptors, and every other user's clients
/// got EAGAIN) gets the rest closed at once, so the helper keeps serving everyone else.
const PER_UID_CONNECTIONS: usize = 64;

/// Connections in flight, per uid (from SO_PEERCRED, which the caller cannot forge).
#[derive(Default)]
struct PerUid {
    open: Mutex<HashMap<u32, usize>>,
    /// Connections closed for being over the limit, since the last line about it.
    refused: AtomicU64,
    last_logged: Mutex<Option<Instant>>,
}

/// One of a uid's places, given back on drop.
struct Place {
    table: Arc<PerUid>,
    uid: u32,
}

impl PerUid {
    /// A place for a connection of `uid`, unless it has `limit` open already.
    fn take(self: &Arc<Self>, uid: u32, limit: usize) -> Option<Place> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(uid).or_insert(0);
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(Place { table: self.clone(), uid })
    }

    /// Count a refusal; say so at most once a minute, with how many there were.
    fn refused(&self, uid: u32) {
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self.last_logged.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(60)) {
            return;
        }
        *last = Some(Instant::now());
        self.refused.store(0, Ordering::Relaxed);
        eprintln!(
            "shoal identityd: uid {uid} has {PER_UID_CONNECTIONS} connections open: further ones closed \
             ({n} closed over the limit since the last such line)"
        );
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self.table.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.uid);
            }
        }
    }
}

/// Raise this process's descriptor limit to its hard limit: each caller holds one while
/// it is served.
fn raise_descriptor_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit write and read only `lim`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

pub async fn identityd(ctx: &Ctx, a: IdentitydArgs) -> Result<()> {
    let map = match (&a.socket, &a.host_key) {
        (Some(_), Some(_)) => None,
        _ => Some(ClusterMap::load(&ctx.config_path()?)?),
    };
    let socket = a.socket.or_else(|| map.as_ref().map(|m| m.security.identity_socket.clone())).expect("checked");
    let host_key = a.host_key.or_else(|| map.as_ref().map(|m| m.security.host_key.clone())).expect("checked");
    // Fail now, in one line, rather than at the first caller.
    KeyRing::load(&host_key, KeyKind::Host)?;
    raise_descriptor_limit();
    let listener = bind(&socket).await?;
    let per_uid = Arc::new(PerUid::default());
    eprintln!("shoal identityd: answering on {} with the host key {}", socket.display(), host_key.display());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    let Ok(peer) = stream.peer_cred() else { continue };
                    let Some(place) = per_uid.take(peer.uid(), PER_UID_CONNECTIONS) else {
                        per_uid.refused(peer.uid());
                        continue; // dropped: closed at once
                    };
                    let host_key = host_key.clone();
                    tokio::spawn(async move {
                        let _place = place;
                        if let Err(e) = serve(stream, &host_key).await {
                            eprintln!("shoal identityd: {e:#}");
                        }
                    });
                }
                Err(e) => {
                    eprintln!("shoal identityd: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    let _ = std::fs::remove_file(&socket);
    Ok(())
}

/// Listen at `path`, open to every local user (that is the point: each gets only its own
/// identity). A socket file left by a helper that died is replaced; one that answers is not.
async fn bind(path: &Path) -> Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            bail!("{} exists and is not a socket", path.display());
        }
        if UnixStream::connect(path).await.is_ok() {
            bail!("another identity helper answers at {}", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
    }
    let listener = UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .with_context(|| format!("cannot open {} to every user", path.display()))?;
    Ok(listener)
}

/// Answer one caller. The host key is read for each, so a rotated key file is used at once.
async fn serve(mut stream: UnixStream, host_key: &Path) -> Result<()> {
    let peer = stream.peer_cred().context("cannot read the caller's credentials (SO_PEERCRED)")?;
    let req: IdentityRequest = tokio::time::timeout(REQUEST_TIMEOUT, read_message(&mut stream))
        .await
        .context("the caller sent no request in time")?
        .context("reading the caller's request")?;
    let (uid, gid) = (peer.uid(), peer.gid());
    let answer = match KeyRing::load(host_key, KeyKind::Host) {
        Ok(ring) => {
            let pid = peer.pid();
            let groups = tokio::task::spawn_blocking(move || caller_groups(pid, uid)).await.unwrap_or_default();
            req.answer(&ring, &Cred { uid, gid, groups }, now_secs())
        }
        Err(e) => IdentityAnswer::Refused(format!("the helper cannot read its host key: {e}")),
    };
    if let IdentityAnswer::Refused(why) = &answer {
        eprintln!("shoal identityd: refused uid {uid} (pid {:?}): {why}", peer.pid());
    }
    write_message(&mut stream, &answer).await.context("answering the caller")?;
    Ok(())
}

/// The caller's supplementary groups: those the kernel gives its process (`Groups:` of
/// `/proc/PID/status`), when that process still runs as `uid` (real and effective), so
/// that a server grants it what the local kernel grants it (an unprivileged process can
/// drop groups, never add any). Otherwise, as when the caller is gone and its pid could be
/// another's, the groups the system's databases give `uid`.
fn caller_groups(pid: Option<i32>, uid: u32) -> Vec<u32> {
    let status = pid.and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok());
    if let Some(status) = status {
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::split_whitespace);
        let uids: Vec<u32> = field("Uid:").map(|f| f.filter_map(|v| v.parse().ok()).collect()).unwrap_or_default();
        if uids.len() >= 2 && uids[0] == uid && uids[1] == uid {
            if let Some(groups) = field("Groups:") {
                return groups.filter_map(|g| g.parse().ok()).collect();
            }
        }
    }
    system_groups(uid)
}

/// The groups the system's databases give `uid` (primary group included), by
/// `getgrouplist`; none for a uid without a passwd entry.
fn system_groups(uid: u32) -> Vec<u32> {
    // SAFETY: getpwuid_r writes into `pw` and `buf` (sized as given) and sets `found` to
    // null or to `&pw`; the strings it points to live in `buf`, used before `buf` goes.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 16384];
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        if libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found) != 0 || found.is_null() {
            return Vec::new();
        }
        let mut n: libc::c_int = 64;
        loop {
            let mut groups = vec![0 as libc::gid_t; n as usize];
            let mut count = n;
            // Returns -1 and sets `count` to the number needed when the buffer is too small.
            if libc::getgrouplist(pw.pw_name, pw.pw_gid, groups.as_mut_ptr(), &mut count) >= 0 {
                groups.truncate(count.max(0) as usize);
                return groups;
            }
            if count <= n {
                return Vec::new();
            }
            n = count;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_gets_at_most_its_places_and_others_are_unaffected() {
        let t = Arc::new(PerUid::default());
        let mut held: Vec<Place> = (0..3).map(|_| t.take(5000, 3).expect("a place")).collect();
        assert!(t.take(5000, 3).is_none(), "a fourth place for uid 5000");
        let other = t.take(5001, 3).expect("another uid is not affected");
        held.pop();
        assert!(t.take(5000, 3).is_some(), "a place given back is free again");
        drop(held);
        drop(other);
        assert!(t.open.lock().unwrap().is_empty(), "no entries left behind");
    }
}
