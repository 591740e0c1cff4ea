//! `shoal readmostly`: mark files and directories read-mostly, clear the mark, or show it
//! (docs/loading.md).
//!
//! A read-mostly directory is listed whole by clients at its first look-up and answered
//! from that listing ("no such name" included) while its lease holds; what is created in it
//! inherits the mark. The mark on one inode is one request to its home server; `-r` walks
//! the tree breadth first, one directory listing and one request per entry.

use super::{only_shoal, Ctx};
use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use shoal_client::{Client, FileKind};
use std::collections::VecDeque;

#[derive(Args)]
pub struct ReadMostlyArgs {
    /// Also every file and directory below the given directories.
    #[arg(short = 'r', long)]
    recursive: bool,
    /// Clear the mark instead of setting it.
    #[arg(long, conflicts_with = "show")]
    off: bool,
    /// Only show whether each path is marked; change nothing.
    #[arg(long)]
    show: bool,
    /// One JSON object per line: {"path": ..., "read_mostly": ...}.
    #[arg(long)]
    json: bool,
    /// Files or directories on Shoal (shoal://path or /path).
    #[arg(required = true)]
    paths: Vec<String>,
}

pub async fn readmostly(ctx: &Ctx, a: ReadMostlyArgs) -> Result<()> {
    let client = ctx.client()?;
    let bar = if a.recursive && !a.json { spinner() } else { ProgressBar::hidden() };
    let mut done = 0u64;
    for p in &a.paths {
        let path = only_shoal(p);
        let attr = client.stat(&path).await.with_context(|| format!("cannot access {path}"))?;
        let mut todo = VecDeque::from([(path, attr.ino, attr.kind, attr.read_mostly)]);
        while let Some((path, ino, kind, marked)) = todo.pop_front() {
            let now = if a.show {
                marked
            } else {
                client.set_read_mostly_at(ino, !a.off).await.with_context(|| format!("cannot mark {path}"))?.read_mostly
            };
            report(&a, &bar, &path, now);
            done += 1;
            bar.set_message(format!("{done} marked"));
            if a.recursive && kind == FileKind::Dir {
                below(&client, &path, &mut todo).await?;
            }
        }
    }
    bar.finish_and_clear();
    Ok(())
}

/// Queue the entries of directory `path` (symbolic links are marked, not followed).
async fn below(
    client: &Client,
    path: &str,
    todo: &mut VecDeque<(String, shoal_client::Ino, FileKind, bool)>,
) -> Result<()> {
    let dir = path.trim_end_matches('/');
    for e in client.readdir(path).await.with_context(|| format!("cannot list {path}"))? {
        let child = format!("{dir}/{}", e.name);
        let attr = client.lstat(&child).await.with_context(|| format!("cannot access {child}"))?;
        todo.push_back((child, e.ino, e.kind, attr.read_mostly));
    }
    Ok(())
}

fn report(a: &ReadMostlyArgs, bar: &ProgressBar, path: &str, on: bool) {
    if a.json {
        println!("{}", serde_json::json!({ "path": path, "read_mostly": on }));
    } else if a.show || !a.recursive {
        bar.suspend(|| println!("{path}: {}", if on { "read-mostly" } else { "not read-mostly" }));
    }
}

fn spinner() -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}
