//! `shoal watch PATH`: follow the change log under a directory (docs/changes.md), print
//! each event or run a command for it. With `--consumer NAME` the servers keep where the
//! watch stands: each event is acknowledged once printed (or once its command has run), so
//! a watch started again with the same name goes on with the next one.

use super::{usage, Ctx};
use anyhow::{Context, Result};
use clap::Args;
use shoal_client::{parse_kinds, Change, ChangeStart, ChangeWatch, ChangeWatchOptions, FileKind};
use std::io::Write;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

#[derive(Args)]
pub struct WatchArgs {
    /// The directory to watch (its whole tree, unless --no-recursive).
    path: String,
    /// The events wanted, comma-separated: create, mkdir, symlink, link, unlink, rmdir,
    /// rename, setattr, xattr, close (a file written and closed), or all.
    #[arg(long, value_name = "LIST", default_value = "all")]
    events: String,
    /// Only events whose name matches this shell pattern (with a '/': whose path below
    /// PATH does); a rename matches by its old or new name.
    #[arg(long = "match", value_name = "GLOB")]
    pattern: Option<String>,
    /// Only PATH's own entries, not the tree below.
    #[arg(long)]
    no_recursive: bool,
    /// Keep the watch's place on the servers under this name: a watch started again with
    /// it continues after the last event handled, missing and repeating none.
    #[arg(long, value_name = "NAME", conflicts_with = "oldest")]
    consumer: Option<String>,
    /// Remove consumer NAME (its place, and the events kept for it) and stop.
    #[arg(long, requires = "consumer")]
    forget: bool,
    /// Start with the oldest event the servers keep (default: from now on).
    #[arg(long)]
    oldest: bool,
    /// Run this shell command for each event, with {} replaced by the path (quoted), and
    /// SHOAL_EVENT, SHOAL_PATH, SHOAL_TO_PATH, SHOAL_INO, SHOAL_SERVER and SHOAL_SEQ set.
    #[arg(long, value_name = "CMD")]
    exec: Option<String>,
    /// Stop after N events.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Stop after SECONDS without an event.
    #[arg(long, value_name = "SECONDS")]
    idle: Option<f64>,
    /// One JSON object per event: server, seq, event, path, to_path, ino, type, xattr,
    /// uid, at.
    #[arg(long)]
    json: bool,
}

/// Events handled between two acknowledgements while more are waiting (a watch stopped
/// by a signal acknowledges what it handled; one killed hands out again at most these).
const ACK_EVERY: u64 = 256;

pub async fn run(ctx: &Ctx, a: WatchArgs) -> Result<()> {
    let kinds = parse_kinds(&a.events).map_err(|e| usage(format!("--events: {e}")))?;
    let idle = match a.idle {
        Some(s) => {
            Some(Duration::try_from_secs_f64(s).map_err(|_| usage(format!("--idle {s}: not a number of seconds")))?)
        }
        None => None,
    };
    let client = ctx.client()?;
    if a.forget {
        let name = a.consumer.as_deref().expect("clap requires it");
        client.forget_consumer(name).await.with_context(|| format!("cannot forget consumer {name}"))?;
        return Ok(());
    }
    let start = match (&a.consumer, a.oldest) {
        (Some(c), _) => ChangeStart::Consumer(c.clone()),
        (None, true) => ChangeStart::Oldest,
        (None, false) => ChangeStart::Now,
    };
    let opts = ChangeWatchOptions { kinds, recursive: !a.no_recursive, pattern: a.pattern.clone(), start };
    let mut w = client.watch_changes(&a.path, opts).await.context("cannot watch")?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (mut seen, mut lost, mut unacked) = (0u64, 0u64, 0u64);
    let consumer = a.consumer.is_some();
    while a.count.is_none_or(|c| seen < c) {
        let next = tokio::select! {
            n = w.next(idle) => n.context("watching")?,
            _ = term.recv() => None,
            _ = int.recv() => None,
        };
        let Some(c) = next else { break };
        if w.lost() > lost {
            eprintln!("shoal: {} events were dropped by the servers before they were read", w.lost() - lost);
            lost = w.lost();
        }
        handle(&c, &a)?;
        seen += 1;
        unacked += 1;
        if consumer && (!w.has_pending() || unacked >= ACK_EVERY) {
            w.ack().await.context("cannot keep the consumer's place")?;
            unacked = 0;
        }
    }
    finish(&mut w, consumer).await
}

/// Acknowledge what was handled (a consumer's watch).
async fn finish(w: &mut ChangeWatch, consumer: bool) -> Result<()> {
    if consumer {
        w.ack().await.context("cannot keep the consumer's place")?;
    }
    Ok(())
}

/// Print event `c`, or run the command for it.
fn handle(c: &Change, a: &WatchArgs) -> Result<()> {
    if let Some(cmd) = &a.exec {
        let line = cmd.replace("{}", &shell_quote(c.any_path()));
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(&line)
            .env("SHOAL_EVENT", c.kind.name())
            .env("SHOAL_PATH", c.path.as_deref().unwrap_or(""))
            .env("SHOAL_TO_PATH", c.to_path.as_deref().unwrap_or(""))
            .env("SHOAL_INO", c.ino.0.to_string())
            .env("SHOAL_SERVER", c.server.0.to_string())
            .env("SHOAL_SEQ", c.seq.to_string())
            .status()
            .with_context(|| format!("cannot run {line:?}"))?;
        if !status.success() {
            eprintln!("shoal: {line:?} for {} failed ({status})", c.line());
        }
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    if a.json {
        let j = serde_json::json!({
            "server": c.server.0,
            "seq": c.seq,
            "event": c.kind.name(),
            "path": c.path,
            "to_path": c.to_path,
            "ino": c.ino.0,
            "type": kind_name(c.file_kind),
            "xattr": c.xattr,
            "uid": c.uid,
            "at": c.at.secs as f64 + c.at.nsecs as f64 / 1e9,
        });
        writeln!(out, "{j}")?;
    } else {
        writeln!(out, "{}", c.line())?;
    }
    // Handled means printed: the acknowledgement that follows must not run ahead of it.
    out.flush()?;
    Ok(())
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "f",
        FileKind::Dir => "d",
        FileKind::Symlink => "l",
    }
}

/// `s` quoted for `sh`.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(shell_quote("/a b"), "'/a b'");
        assert_eq!(shell_quote("/it's"), "'/it'\\''s'");
    }
}
