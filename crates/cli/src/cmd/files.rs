//! File commands on Shoal paths: ls, stat, mkdir, rm, mv, cat, ln, chmod.

use super::{only_shoal, Ctx};
use crate::fmt::{human_bytes, mode_string, parse_mode, time_string};
use anyhow::{Context, Result};
use clap::Args;
use shoal_client::{Attr, Client, FileKind, Ino, ROOT_INO};
use std::io::Write;

#[derive(Args)]
pub struct LsArgs {
    /// Long listing: mode, links, owner, group, size, modification time, name.
    #[arg(short = 'l')]
    long: bool,
    /// List subdirectories recursively.
    #[arg(short = 'R')]
    recursive: bool,
    /// Include the entries . and .. (with -l, their attributes).
    #[arg(short = 'a')]
    all: bool,
    /// Sizes in K/M/G (with -l).
    #[arg(short = 'H', long = "human")]
    human: bool,
    /// Paths to list (default: the root).
    paths: Vec<String>,
}

#[derive(Args)]
pub struct StatArgs {
    /// Do not follow a symbolic link given as the last component.
    #[arg(short = 'L', long = "no-follow")]
    no_follow: bool,
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(Args)]
pub struct MkdirArgs {
    /// Create missing parents; no error if the directory exists.
    #[arg(short = 'p')]
    parents: bool,
    /// Permission bits, octal (before the umask is applied).
    #[arg(short = 'm', long, default_value = "777", value_parser = parse_mode)]
    mode: u32,
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(Args)]
pub struct RmArgs {
    /// Remove directories and their contents.
    #[arg(short = 'r', short_alias = 'R')]
    recursive: bool,
    /// Ignore paths that do not exist.
    #[arg(short = 'f')]
    force: bool,
    /// With -r, also accept the root of the file system (its contents are removed; the
    /// root stays). Without it, `rm -r /` is refused, as GNU rm's --preserve-root does.
    #[arg(long)]
    no_preserve_root: bool,
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(Args)]
pub struct MvArgs {
    /// What to move.
    src: String,
    /// Where to: a new name, or an existing directory to move into.
    dst: String,
}

#[derive(Args)]
pub struct CatArgs {
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(Args)]
pub struct LnArgs {
    /// Make a symbolic link (TARGET is stored as given) instead of a hard link.
    #[arg(short = 's')]
    symbolic: bool,
    target: String,
    link: String,
}

#[derive(Args)]
pub struct ChmodArgs {
    /// Octal mode such as 755.
    #[arg(value_parser = parse_mode)]
    mode: u32,
    #[arg(required = true)]
    paths: Vec<String>,
}

fn print_long(out: &mut impl Write, a: &Attr, name: &str, human: bool, link: Option<&str>) -> std::io::Result<()> {
    let size = if human { human_bytes(a.size) } else { a.size.to_string() };
    let target = link.map(|l| format!(" -> {l}")).unwrap_or_default();
    writeln!(
        out,
        "{} {:>3} {:>5} {:>5} {:>12} {} {}{}",
        mode_string(a.kind, a.perm),
        a.nlink,
        a.uid,
        a.gid,
        size,
        time_string(a.mtime.secs),
        name,
        target
    )
}

/// A directory still to list: its path (for the header), its inode and its parent's.
struct ToList {
    path: String,
    ino: Ino,
    parent: Option<Ino>,
}

/// A client error about an inode, said about the path the user knows: "cannot list /a/b:
/// Permission denied" (the client's own context names only inode numbers).
fn at_path(what: &str, path: &str, e: shoal_client::Error) -> anyhow::Error {
    anyhow::anyhow!("cannot {what} {path}: {}", e.cause())
}

/// List directory `top` (and, with -R, every directory below it, depth first, each after
/// its parent and in name order). The walk keeps an explicit stack of directories still
/// to list and works by inode, so neither the depth of the tree nor the length of its
/// paths (PATH_MAX) limits it.
async fn list_dir(client: &Client, top: &str, top_ino: Ino, a: &LsArgs, out: &mut Vec<u8>, header: bool) -> Result<()> {
    let mut stack = vec![ToList { path: top.to_string(), ino: top_ino, parent: None }];
    let mut first = true;
    while let Some(dir) = stack.pop() {
        let path = dir.path;
        let mut entries = client.readdir_at(dir.ino).await.map_err(|e| at_path("list", &path, e))?;
        entries.sort_by(|x, y| x.name.cmp(&y.name));
        if !first {
            writeln!(out)?;
        }
        if header || !first {
            writeln!(out, "{path}:")?;
        }
        first = false;
        if a.all {
            if a.long {
                let me = client.getattr(dir.ino).await.map_err(|e| at_path("access", &path, e))?;
                print_long(out, &me, ".", a.human, None)?;
                let up = match dir.parent {
                    Some(p) => client.getattr(p).await.map_err(|e| at_path("access", &format!("{path}/.."), e))?,
                    None => client.stat(&parent_of(&path)).await?,
                };
                print_long(out, &up, "..", a.human, None)?;
            } else {
                writeln!(out, ".\n..")?;
            }
        }
        let join = |name: &str| if path == "/" { format!("/{name}") } else { format!("{path}/{name}") };
        for e in &entries {
            if a.long {
                match client.lookup(dir.ino, &e.name).await {
                    Ok(attr) => {
                        let link =
                            if attr.kind == FileKind::Symlink { client.readlink_at(attr.ino).await.ok() } else { None };
                        print_long(out, &attr, &e.name, a.human, link.as_deref())?;
                    }
                    // Removed between readdir and stat: skip it, as ls does.
                    Err(err) if err.errno == shoal_client::Errno::ENOENT => continue,
                    Err(err) => return Err(at_path("access", &join(&e.name), err)),
                }
            } else {
                writeln!(out, "{}", e.name)?;
            }
        }
        if a.recursive {
            // Pushed last to first, so that the first subdirectory is listed next.
            for e in entries.iter().rev().filter(|e| e.kind == FileKind::Dir) {
                stack.push(ToList { path: join(&e.name), ino: e.ino, parent: Some(dir.ino) });
            }
        }
    }
    Ok(())
}

fn parent_of(path: &str) -> String {
    match path.trim_end_matches('/').rsplit_once('/') {
        Some(("", _)) | None => "/".into(),
        Some((p, _)) => p.into(),
    }
}

pub async fn ls(ctx: &Ctx, a: LsArgs) -> Result<()> {
    let client = ctx.client()?;
    let paths: Vec<String> =
        if a.paths.is_empty() { vec!["/".into()] } else { a.paths.iter().map(|p| only_shoal(p)).collect() };
    let mut failed = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let mut out = Vec::new();
        let r = async {
            let attr = client.stat(p).await.with_context(|| format!("cannot access {p}"))?;
            if attr.kind == FileKind::Dir {
                if i > 0 {
                    writeln!(out)?;
                }
                list_dir(&client, p, attr.ino, &a, &mut out, paths.len() > 1 || a.recursive).await
            } else {
                if a.long {
                    print_long(&mut out, &attr, p, a.human, None)?;
                } else {
                    writeln!(out, "{p}")?;
                }
                Ok(())
            }
        }
        .await;
        std::io::stdout().write_all(&out)?;
        if let Err(e) = r {
            failed.push(e);
        }
    }
    // One failing path: its error is the command's. Several: one line each, as ls does.
    match failed.len() {
        0 => Ok(()),
        1 => Err(failed.remove(0)),
        n => {
            for e in &failed {
                eprintln!("shoal: {e:#}");
            }
            Err(anyhow::anyhow!("{n} of {} paths could not be listed", paths.len()))
        }
    }
}

pub async fn stat(ctx: &Ctx, a: StatArgs) -> Result<()> {
    let client = ctx.client()?;
    for p in &a.paths {
        let path = only_shoal(p);
        let attr = if a.no_follow { client.lstat(&path).await } else { client.stat(&path).await }
            .with_context(|| format!("cannot stat {path}"))?;
        let kind = match attr.kind {
            FileKind::File => "regular file",
            FileKind::Dir => "directory",
            FileKind::Symlink => "symbolic link",
        };
        println!("  File: {path}");
        println!("  Size: {:<12} Type: {kind}", attr.size);
        println!(" Inode: {:<12} Links: {}   Home: {}", attr.ino, attr.nlink, client.map().home_of(attr.ino));
        println!(
            "Access: ({:04o}/{})  Uid: {}  Gid: {}",
            attr.perm,
            mode_string(attr.kind, attr.perm),
            attr.uid,
            attr.gid
        );
        println!("Access: {}.{:09}", time_string(attr.atime.secs), attr.atime.nsecs);
        println!("Modify: {}.{:09}", time_string(attr.mtime.secs), attr.mtime.nsecs);
        println!("Change: {}.{:09}", time_string(attr.ctime.secs), attr.ctime.nsecs);
        if let Some(l) = &attr.layout {
            let servers: Vec<String> = l.servers.iter().map(|s| s.to_string()).collect();
            println!(
                "Layout: stripe_size={} stripe_count={} servers={} replicas={}",
                l.stripe_size,
                l.servers.len(),
                servers.join(","),
                l.replicas
            );
        }
    }
    Ok(())
}

pub async fn mkdir(ctx: &Ctx, a: MkdirArgs) -> Result<()> {
    let client = ctx.client()?;
    for p in &a.paths {
        let path = only_shoal(p);
        if a.parents { client.mkdir_all(&path, a.mode).await } else { client.mkdir(&path, a.mode).await }
            .with_context(|| format!("cannot create directory {path}"))?;
    }
    Ok(())
}

pub async fn rm(ctx: &Ctx, a: RmArgs) -> Result<()> {
    let client = ctx.client()?;
    for p in &a.paths {
        let path = only_shoal(p);
        let r = async {
            let attr = client.lstat(&path).await?;
            if attr.kind == FileKind::Dir {
                if !a.recursive {
                    return Err(shoal_client::Error::new(
                        shoal_client::Errno::EISDIR,
                        format!("{path} is a directory (use -r)"),
                    ));
                }
                // By inode, so that every spelling of the root is caught: `/`, `shoal://`,
                // `//`, `/.`, `/a/..`.
                if attr.ino == ROOT_INO && !a.no_preserve_root {
                    return Ok(false);
                }
                client.remove_all(&path).await.map(|_| true)
            } else {
                client.unlink(&path).await.map(|_| true)
            }
        }
        .await;
        match r {
            Ok(true) => {}
            Ok(false) => {
                anyhow::bail!("rm: refusing to remove the root of the file system (use --no-preserve-root to override)")
            }
            Err(e) if a.force && e.errno == shoal_client::Errno::ENOENT => {}
            Err(e) => return Err(anyhow::Error::from(e).context(format!("cannot remove {path}"))),
        }
    }
    Ok(())
}

pub async fn mv(ctx: &Ctx, a: MvArgs) -> Result<()> {
    let client = ctx.client()?;
    let src = only_shoal(&a.src);
    let mut dst = only_shoal(&a.dst);
    // Moving into an existing directory keeps the name, as mv does.
    if let Ok(attr) = client.stat(&dst).await {
        if attr.kind == FileKind::Dir {
            let name = src.trim_end_matches('/').rsplit('/').next().unwrap_or("");
            dst = format!("{}/{}", dst.trim_end_matches('/'), name);
        }
    }
    client.rename(&src, &dst).await.with_context(|| format!("cannot move {src} to {dst}"))?;
    Ok(())
}

pub async fn cat(ctx: &Ctx, a: CatArgs) -> Result<()> {
    let client = ctx.client()?;
    let mut stdout = std::io::stdout().lock();
    for p in &a.paths {
        let path = only_shoal(p);
        let file = client
            .open(&path, shoal_client::OpenFlags::read_only())
            .await
            .with_context(|| format!("cannot open {path}"))?;
        if file.attr().kind == FileKind::Dir {
            anyhow::bail!("cannot read {path}: it is a directory");
        }
        let size = file.attr().size;
        let mut off = 0u64;
        while off < size {
            let chunk = file
                .read_at(off, (8 << 20).min((size - off) as usize))
                .await
                .with_context(|| format!("cannot read {path}"))?;
            if chunk.is_empty() {
                break;
            }
            if let Err(e) = stdout.write_all(&chunk) {
                // A closed pipe (cat | head) is the reader's choice, not our failure.
                if e.kind() == std::io::ErrorKind::BrokenPipe {
                    return Ok(());
                }
                return Err(e.into());
            }
            off += chunk.len() as u64;
        }
    }
    stdout.flush().or_else(|e| if e.kind() == std::io::ErrorKind::BrokenPipe { Ok(()) } else { Err(e) })?;
    Ok(())
}

pub async fn ln(ctx: &Ctx, a: LnArgs) -> Result<()> {
    let client = ctx.client()?;
    let link = only_shoal(&a.link);
    if a.symbolic {
        // The target is stored verbatim; only strip a shoal:// prefix.
        let target = super::shoal_path(&a.target).unwrap_or(a.target.clone());
        client.symlink(&target, &link).await.with_context(|| format!("cannot create symbolic link {link}"))?;
    } else {
        let target = only_shoal(&a.target);
        client.link(&target, &link).await.with_context(|| format!("cannot link {link} to {target}"))?;
    }
    Ok(())
}

pub async fn chmod(ctx: &Ctx, a: ChmodArgs) -> Result<()> {
    let client = ctx.client()?;
    for p in &a.paths {
        let path = only_shoal(p);
        client.chmod(&path, a.mode).await.with_context(|| format!("cannot change mode of {path}"))?;
    }
    Ok(())
}
