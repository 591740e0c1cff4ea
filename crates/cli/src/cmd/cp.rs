//! `shoal cp`: copies between the local file system and Shoal (either direction) and within
//! Shoal, recursively with -r, with one progress bar over all bytes.
//!
//! The copy is planned first (a walk of the sources) so the bar knows the total and so a
//! bad source is reported before anything is written.

use super::{shoal_path, usage, Ctx};
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use shoal_client::{Client, FileKind, LayoutSpec, OpenFlags};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::PathBuf;

/// Bytes moved per read/write call: several stripes, so every server works at once.
const CHUNK: usize = 16 << 20;

#[derive(Args)]
pub struct CpArgs {
    /// Copy directories and everything below them.
    #[arg(short = 'r', short_alias = 'R')]
    recursive: bool,
    /// Never show a progress bar.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Copies of each data object of the files created in Shoal, 1 to 3 (docs/replicas.md);
    /// default: the destination directory's, else the cluster's.
    #[arg(long)]
    replicas: Option<i64>,
    /// Sources then destination; Shoal paths are written shoal://dir/file.
    #[arg(required = true, num_args = 2..)]
    paths: Vec<String>,
}

#[derive(Clone, Debug)]
enum Loc {
    Local(PathBuf),
    Shoal(String),
}

impl Loc {
    fn parse(s: &str) -> Loc {
        match shoal_path(s) {
            Some(p) => Loc::Shoal(p),
            None => Loc::Local(PathBuf::from(s)),
        }
    }
    fn join(&self, name: &str) -> Loc {
        match self {
            Loc::Local(p) => Loc::Local(p.join(name)),
            Loc::Shoal(p) => {
                Loc::Shoal(if p == "/" { format!("/{name}") } else { format!("{}/{name}", p.trim_end_matches('/')) })
            }
        }
    }
    fn name(&self) -> String {
        match self {
            Loc::Local(p) => p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            Loc::Shoal(p) => p.trim_end_matches('/').rsplit('/').next().unwrap_or("").to_string(),
        }
    }
    fn show(&self) -> String {
        match self {
            Loc::Local(p) => p.display().to_string(),
            Loc::Shoal(p) => format!("shoal:/{p}"),
        }
    }
}

/// What a path is, without following a final symlink.
struct Meta {
    kind: FileKind,
    size: u64,
    perm: u32,
}

async fn lmeta(client: &Client, loc: &Loc) -> Result<Option<Meta>> {
    match loc {
        Loc::Local(p) => match std::fs::symlink_metadata(p) {
            Ok(m) => {
                let kind = if m.is_dir() {
                    FileKind::Dir
                } else if m.file_type().is_symlink() {
                    FileKind::Symlink
                } else {
                    FileKind::File
                };
                Ok(Some(Meta { kind, size: m.len(), perm: m.mode() & 0o7777 }))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot access {}", p.display())),
        },
        Loc::Shoal(p) => match client.lstat(p).await {
            Ok(a) => Ok(Some(Meta { kind: a.kind, size: a.size, perm: a.perm })),
            Err(e) if e.errno == shoal_client::Errno::ENOENT => Ok(None),
            Err(e) => Err(anyhow::Error::from(e).context(format!("cannot access {}", loc.show()))),
        },
    }
}

/// Is `loc` an existing directory (following symlinks)?
async fn is_dir(client: &Client, loc: &Loc) -> bool {
    match loc {
        Loc::Local(p) => p.is_dir(),
        Loc::Shoal(p) => matches!(client.stat(p).await, Ok(a) if a.kind == FileKind::Dir),
    }
}

enum Step {
    Mkdir(Loc, u32),
    File(Loc, Loc, u64, u32),
    Symlink(Loc, Loc),
}

async fn children(client: &Client, loc: &Loc) -> Result<Vec<String>> {
    Ok(match loc {
        Loc::Local(p) => {
            let mut v = Vec::new();
            for e in std::fs::read_dir(p).with_context(|| format!("cannot list {}", p.display()))? {
                v.push(e?.file_name().to_string_lossy().into_owned());
            }
            v
        }
        Loc::Shoal(p) => {
            let mut v: Vec<String> = client
                .readdir(p)
                .await
                .with_context(|| format!("cannot list {}", loc.show()))?
                .into_iter()
                .map(|e| e.name)
                .collect();
            // Listings come in listing order (by name hash); the plan goes by name.
            v.sort();
            v
        }
    })
}

/// Add the steps that copy `src` to `dst` (with -r, everything below it, each directory
/// before its contents, names in order). An explicit stack of what is still to visit
/// instead of recursion, so a tree of any depth is planned without exhausting the stack.
async fn plan(client: &Client, src: Loc, dst: Loc, recursive: bool, steps: &mut Vec<Step>) -> Result<()> {
    let mut todo = vec![(src, dst)];
    while let Some((src, dst)) = todo.pop() {
        let meta = lmeta(client, &src).await?.with_context(|| format!("{} does not exist", src.show()))?;
        match meta.kind {
            FileKind::File => steps.push(Step::File(src, dst, meta.size, meta.perm)),
            FileKind::Symlink => steps.push(Step::Symlink(src, dst)),
            FileKind::Dir => {
                if !recursive {
                    bail!("{} is a directory (use -r)", src.show());
                }
                steps.push(Step::Mkdir(dst.clone(), meta.perm));
                let mut names = children(client, &src).await?;
                // Last name first onto the stack, so the first comes off it next.
                names.sort_unstable_by(|a, b| b.cmp(a));
                todo.extend(names.iter().map(|n| (src.join(n), dst.join(n))));
            }
        }
    }
    Ok(())
}

pub async fn cp(ctx: &Ctx, a: CpArgs) -> Result<()> {
    let (dst, srcs) = a.paths.split_last().expect("clap requires two paths");
    let dst = Loc::parse(dst);
    let srcs: Vec<Loc> = srcs.iter().map(|s| Loc::parse(s)).collect();
    let involves_shoal = matches!(dst, Loc::Shoal(_)) || srcs.iter().any(|s| matches!(s, Loc::Shoal(_)));
    if !involves_shoal {
        return Err(usage("neither source nor destination is a Shoal path (write Shoal paths as shoal://dir/file)"));
    }
    // Checked before anything is copied, as a bad source is.
    let replicas = super::stripe::replicas_arg(a.replicas)?;
    let client = ctx.client()?;
    super::stripe::note_capped(client.map(), replicas);
    let spec = replicas.map(|r| LayoutSpec { replicas: Some(r), ..LayoutSpec::default() });
    let into_dir = is_dir(&client, &dst).await;
    if srcs.len() > 1 && !into_dir {
        bail!("copying several sources needs an existing directory as destination, {} is not one", dst.show());
    }
    let mut steps = Vec::new();
    for s in srcs {
        let target = if into_dir { dst.join(&s.name()) } else { dst.clone() };
        plan(&client, s, target, a.recursive, &mut steps).await?;
    }
    let total: u64 = steps.iter().map(|s| if let Step::File(_, _, n, _) = s { *n } else { 0 }).sum();
    let bar = if a.quiet || total < (32 << 20) { ProgressBar::hidden() } else { ProgressBar::new(total) };
    bar.set_style(
        ProgressStyle::with_template("{spinner} {wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    for step in steps {
        match step {
            Step::Mkdir(d, perm) => make_dir(&client, &d, perm).await?,
            Step::Symlink(s, d) => copy_symlink(&client, &s, &d).await?,
            Step::File(s, d, size, perm) => {
                bar.set_message(s.show());
                copy_file(&client, &s, &d, size, perm, &bar, spec.as_ref())
                    .await
                    .with_context(|| format!("cannot copy {} to {}", s.show(), d.show()))?
            }
        }
    }
    bar.finish_and_clear();
    Ok(())
}

async fn make_dir(client: &Client, d: &Loc, perm: u32) -> Result<()> {
    match d {
        Loc::Local(p) => {
            if !p.is_dir() {
                std::fs::create_dir(p).with_context(|| format!("cannot create directory {}", p.display()))?;
                let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(perm));
            }
        }
        Loc::Shoal(p) => match client.mkdir(p, perm).await {
            Ok(_) => {}
            Err(e) if e.errno == shoal_client::Errno::EEXIST && is_dir(client, d).await => {}
            Err(e) => return Err(anyhow::Error::from(e).context(format!("cannot create directory {}", d.show()))),
        },
    }
    Ok(())
}

async fn copy_symlink(client: &Client, s: &Loc, d: &Loc) -> Result<()> {
    let target = match s {
        Loc::Local(p) => std::fs::read_link(p)?.to_string_lossy().into_owned(),
        Loc::Shoal(p) => client.readlink(p).await?,
    };
    match d {
        Loc::Local(p) => {
            std::os::unix::fs::symlink(&target, p).with_context(|| format!("cannot create symlink {}", p.display()))?
        }
        Loc::Shoal(p) => {
            client.symlink(&target, p).await.with_context(|| format!("cannot create symlink {}", d.show()))?;
        }
    }
    Ok(())
}

/// `spec`: the layout of a file created in Shoal (`--replicas`); `None` inherits.
async fn copy_file(
    client: &Client,
    s: &Loc,
    d: &Loc,
    size: u64,
    perm: u32,
    bar: &ProgressBar,
    spec: Option<&LayoutSpec>,
) -> Result<()> {
    // Source.
    let local_src = match s {
        Loc::Local(p) => {
            Some(std::sync::Arc::new(std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?))
        }
        Loc::Shoal(_) => None,
    };
    let shoal_src = match s {
        Loc::Shoal(p) => Some(client.open(p, OpenFlags::read_only()).await?),
        Loc::Local(_) => None,
    };
    // Destination.
    let local_dst = match d {
        Loc::Local(p) => {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(p)
                .with_context(|| format!("cannot create {}", p.display()))?;
            let _ = f.set_permissions(std::fs::Permissions::from_mode(perm));
            Some(std::sync::Arc::new(f))
        }
        Loc::Shoal(_) => None,
    };
    let shoal_dst = match d {
        Loc::Shoal(p) => Some(client.create(p, perm, spec.cloned()).await?),
        Loc::Local(_) => None,
    };
    let mut off = 0u64;
    while off < size {
        let len = CHUNK.min((size - off) as usize);
        let data: bytes::Bytes = if let Some(f) = &local_src {
            let f = f.clone();
            tokio::task::spawn_blocking(move || -> std::io::Result<bytes::Bytes> {
                let mut buf = vec![0u8; len];
                let mut got = 0;
                while got < len {
                    let n = f.read_at(&mut buf[got..], off + got as u64)?;
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                buf.truncate(got);
                Ok(bytes::Bytes::from(buf))
            })
            .await??
        } else {
            shoal_src.as_ref().expect("one source").read_at(off, len).await?
        };
        if data.is_empty() {
            break; // the source shrank while we copied
        }
        if let Some(f) = &local_dst {
            let f = f.clone();
            let d2 = data.clone();
            tokio::task::spawn_blocking(move || f.write_all_at(&d2, off)).await??;
        } else {
            shoal_dst.as_ref().expect("one destination").write_at(off, &data).await?;
        }
        off += data.len() as u64;
        bar.inc(data.len() as u64);
    }
    if let Some(f) = shoal_dst {
        f.close().await?;
    }
    if let Some(f) = local_dst {
        f.sync_all()?;
    }
    Ok(())
}
