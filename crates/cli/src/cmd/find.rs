//! `shoal find`: a metadata query run by every server over the entries it holds
//! (docs/find.md). The flags follow find(1), written with two dashes; all must hold.

use super::{only_shoal, usage, Ctx};
use crate::fmt::{mode_string, time_string};
use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use shoal_client::{parse_kind, AgeTest, PermTest, SizeTest, TimeField};
use shoal_client::{FileKind, FindOptions, FindQuery};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

#[derive(Args)]
pub struct FindArgs {
    /// Where to search (shoal://path or /path).
    path: String,
    /// Names matching this shell pattern (quote it: --name '*.h5').
    #[arg(long)]
    name: Option<String>,
    /// As --name, ignoring case.
    #[arg(long, conflicts_with = "name")]
    iname: Option<String>,
    /// f (regular file), d (directory) or l (symbolic link).
    #[arg(long = "type", value_parser = parse_kind)]
    kind: Option<FileKind>,
    /// Size in units rounded up, as find: N, +N (more), -N (less); units c (bytes), k, M, G,
    /// none = 512-byte blocks. --size +1G: over a GiB; --size -1M: empty files.
    #[arg(long, allow_hyphen_values = true)]
    size: Option<String>,
    /// Modified N days ago (whole days; +N more, -N less), as find -mtime.
    #[arg(long, allow_hyphen_values = true)]
    mtime: Option<String>,
    /// Modified N minutes ago (+N, -N).
    #[arg(long, allow_hyphen_values = true)]
    mmin: Option<String>,
    /// Accessed N days ago (+N, -N).
    #[arg(long, allow_hyphen_values = true)]
    atime: Option<String>,
    /// Accessed N minutes ago (+N, -N).
    #[arg(long, allow_hyphen_values = true)]
    amin: Option<String>,
    /// Status changed N days ago (+N, -N).
    #[arg(long, allow_hyphen_values = true)]
    ctime: Option<String>,
    /// Status changed N minutes ago (+N, -N).
    #[arg(long, allow_hyphen_values = true)]
    cmin: Option<String>,
    /// Owned by this user (name or number).
    #[arg(long)]
    user: Option<String>,
    /// Owned by this group (name or number).
    #[arg(long)]
    group: Option<String>,
    /// Permission bits: MODE exactly, -MODE all of them, /MODE any of them (octal).
    #[arg(long, allow_hyphen_values = true)]
    perm: Option<String>,
    /// Regular files striped over exactly N servers.
    #[arg(long)]
    stripe_count: Option<u32>,
    /// Regular files of exactly this stripe size (4096, 64K, 1M).
    #[arg(long, value_parser = crate::fmt::parse_size)]
    stripe_size: Option<u64>,
    /// Having extended attribute NAME (NAME=VALUE: with exactly that value).
    #[arg(long)]
    xattr: Option<String>,
    /// Marked read-mostly (docs/loading.md).
    #[arg(long)]
    read_mostly: bool,
    /// Descend at most N levels below PATH (0: PATH itself only).
    #[arg(long)]
    maxdepth: Option<usize>,
    /// Report nothing shallower than N levels below PATH.
    #[arg(long, default_value_t = 0)]
    mindepth: usize,
    /// A line per match as `ls -l` prints it.
    #[arg(long, conflicts_with = "json")]
    ls: bool,
    /// Only the number of matches.
    #[arg(long, conflicts_with_all = ["json", "ls"])]
    count: bool,
    /// One JSON object per match and line (path, ino, type, size, mode, uid, gid, times).
    #[arg(long)]
    json: bool,
    /// What the query cost (servers, entries scanned, requests, time) on standard error.
    #[arg(long)]
    stats: bool,
}

pub async fn find(ctx: &Ctx, a: FindArgs) -> Result<()> {
    let query = query_of(&a)?;
    let client = ctx.client()?;
    let path = only_shoal(&a.path);
    let bar = match std::io::IsTerminal::is_terminal(&std::io::stderr()) && !a.stats {
        true => spinner(),
        false => ProgressBar::hidden(),
    };
    let t = Instant::now();
    let opts = FindOptions { min_depth: a.mindepth, max_depth: a.maxdepth, page: 0 };
    let found = client.find(&path, &query, opts).await;
    bar.finish_and_clear();
    let (found, stats) = found.with_context(|| format!("cannot search {path}"))?;
    if a.count {
        println!("{}", found.len());
    }
    for f in found.iter().filter(|_| !a.count) {
        let at = &f.attr;
        if a.json {
            let kind = match at.kind {
                FileKind::File => "f",
                FileKind::Dir => "d",
                FileKind::Symlink => "l",
            };
            let line = serde_json::json!({
                "path": f.path, "ino": at.ino.0, "type": kind, "size": at.size,
                "mode": format!("{:o}", at.perm), "uid": at.uid, "gid": at.gid, "nlink": at.nlink,
                "atime": at.atime.secs, "mtime": at.mtime.secs, "ctime": at.ctime.secs,
                "stripe_count": at.layout.as_ref().map(|l| l.servers.len()),
                "stripe_size": at.layout.as_ref().map(|l| l.stripe_size),
                "read_mostly": at.read_mostly,
            });
            println!("{line}");
        } else if a.ls {
            println!(
                "{} {:>3} {:>5} {:>5} {:>12} {} {}",
                mode_string(at.kind, at.perm),
                at.nlink,
                at.uid,
                at.gid,
                at.size,
                time_string(at.mtime.secs),
                f.path
            );
        } else {
            println!("{}", f.path);
        }
    }
    if a.stats {
        eprintln!(
            "{} matches; {} entries scanned by {} servers; {} requests; {:.3} s",
            found.len(),
            stats.scanned,
            stats.servers,
            stats.requests,
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The query the flags describe (a usage error names the flag that is wrong).
fn query_of(a: &FindArgs) -> Result<FindQuery> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let mut q = FindQuery {
        name: a.name.clone().or_else(|| a.iname.clone()),
        ignore_case: a.iname.is_some(),
        kind: a.kind,
        stripe_count: a.stripe_count,
        stripe_size: a.stripe_size,
        read_mostly: a.read_mostly.then_some(true),
        ..Default::default()
    };
    q.pattern().map_err(usage)?;
    if let Some(s) = &a.size {
        q.size = Some(SizeTest::parse(s).map_err(|e| usage(format!("--size {s}: {e}")))?);
    }
    let ages = [
        (&a.mtime, TimeField::Modify, 86_400, "--mtime"),
        (&a.mmin, TimeField::Modify, 60, "--mmin"),
        (&a.atime, TimeField::Access, 86_400, "--atime"),
        (&a.amin, TimeField::Access, 60, "--amin"),
        (&a.ctime, TimeField::Change, 86_400, "--ctime"),
        (&a.cmin, TimeField::Change, 60, "--cmin"),
    ];
    for (arg, field, period, flag) in ages {
        if let Some(s) = arg {
            q.ages.push(AgeTest::parse(s, field, period, now).map_err(|e| usage(format!("{flag} {s}: {e}")))?);
        }
    }
    if let Some(u) = &a.user {
        q.uid = Some(id_of(u, true).ok_or_else(|| usage(format!("--user {u}: no such user")))?);
    }
    if let Some(g) = &a.group {
        q.gid = Some(id_of(g, false).ok_or_else(|| usage(format!("--group {g}: no such group")))?);
    }
    if let Some(p) = &a.perm {
        q.perm = Some(PermTest::parse(p).map_err(|e| usage(format!("--perm {p}: {e}")))?);
    }
    if let Some(x) = &a.xattr {
        let (name, value) = match x.split_once('=') {
            Some((n, v)) => (n, Some(v.as_bytes().to_vec())),
            None => (x.as_str(), None),
        };
        if name.is_empty() {
            return Err(usage("--xattr needs a name (NAME or NAME=VALUE)"));
        }
        q.xattr = Some(name.to_string());
        q.xattr_value = value;
    }
    Ok(q)
}

/// A user's or group's number, from a number or a name in the local databases.
fn id_of(s: &str, user: bool) -> Option<u32> {
    if let Ok(n) = s.parse() {
        return Some(n);
    }
    let name = std::ffi::CString::new(s).ok()?;
    // SAFETY: getpwnam/getgrnam take a NUL-terminated name and return a pointer into static
    // storage (or null) that is read at once, before any other call could reuse it.
    unsafe {
        if user {
            let p = libc::getpwnam(name.as_ptr());
            (!p.is_null()).then(|| (*p).pw_uid)
        } else {
            let g = libc::getgrnam(name.as_ptr());
            (!g.is_null()).then(|| (*g).gr_gid)
        }
    }
}

fn spinner() -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} searching every server ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_and_groups_by_number_or_name() {
        assert_eq!(id_of("0", true), Some(0));
        assert_eq!(id_of("root", true), Some(0));
        assert_eq!(id_of("root", false), Some(0));
        assert_eq!(id_of("no-such-user-here", true), None);
    }
}
