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
    /// Run this shell command (`sh -c`) for each event. The path is its first argument,
    /// "$1"; a {} in the command stands for it, quoted or not. The path never becomes
    /// shell code. SHOAL_EVENT, SHOAL_PATH, SHOAL_TO_PATH, SHOAL_INO, SHOAL_SERVER and
    /// SHOAL_SEQ are set.
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
        run_exec(cmd, c);
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

/// Run `--exec CMD` for event `c`: `sh -c SCRIPT sh PATH`, the path passed as an argument
/// (never spliced into the script: a name may hold quotes, `$(…)`, backticks or newlines)
/// and the event in the environment. A command that fails is reported, not fatal.
fn run_exec(cmd: &str, c: &Change) {
    use std::os::unix::ffi::OsStrExt;
    let script = substitute_path_argument(cmd);
    let path = std::ffi::OsStr::from_bytes(c.any_path().as_bytes());
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .arg("sh")
        .arg(path)
        .env("SHOAL_EVENT", c.kind.name())
        .env("SHOAL_PATH", c.path.as_deref().unwrap_or(""))
        .env("SHOAL_TO_PATH", c.to_path.as_deref().unwrap_or(""))
        .env("SHOAL_INO", c.ino.0.to_string())
        .env("SHOAL_SERVER", c.server.0.to_string())
        .env("SHOAL_SEQ", c.seq.to_string())
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => eprintln!("shoal: {cmd:?} for {} failed ({s})", c.line()),
        Err(e) => eprintln!("shoal: cannot run {cmd:?} for {}: {e}", c.line()),
    }
}

/// `cmd` with each `{}` replaced by a reference to the first positional parameter, written
/// for the quoting context `{}` stands in, so that the shell expands it to exactly the
/// path, one word, whatever the path holds:
/// - unquoted: `"$1"`;
/// - inside double quotes: `${1}` (already quoted there);
/// - inside single quotes: `'"$1"'` (close the quotes, the quoted parameter, reopen).
///
/// Backslash escapes are followed as sh does (outside quotes it escapes any character;
/// inside double quotes, `$`, `` ` ``, `"`, `\` and newline), so `\{}` is left alone. The
/// path's bytes never enter the script: this function does not see them.
pub(crate) fn substitute_path_argument(cmd: &str) -> String {
    #[derive(Clone, Copy, PartialEq)]
    enum Quote {
        None,
        Single,
        Double,
    }
    let mut out = String::with_capacity(cmd.len() + 8);
    let mut quote = Quote::None;
    let mut chars = cmd.chars().peekable();
    while let Some(ch) = chars.next() {
        match (quote, ch) {
            (_, '{') if chars.peek() == Some(&'}') => {
                chars.next();
                out.push_str(match quote {
                    Quote::None => "\"$1\"",
                    Quote::Double => "${1}",
                    Quote::Single => "'\"$1\"'",
                });
                continue;
            }
            (Quote::None, '\\') => {
                out.push(ch);
                if let Some(next) = chars.next() {
                    out.push(next);
                }
                continue;
            }
            (Quote::Double, '\\') => {
                out.push(ch);
                if let Some(&next) = chars.peek() {
                    if matches!(next, '$' | '`' | '"' | '\\' | '\n') {
                        out.push(next);
                        chars.next();
                    }
                }
                continue;
            }
            (Quote::None, '\'') => quote = Quote::Single,
            (Quote::Single, '\'') => quote = Quote::None,
            (Quote::None, '"') => quote = Quote::Double,
            (Quote::Double, '"') => quote = Quote::None,
            _ => {}
        }
        out.push(ch);
    }
    out
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "f",
        FileKind::Dir => "d",
        FileKind::Symlink => "l",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `sh -c SCRIPT sh PATH` prints when SCRIPT comes from `cmd`: each {} must come
    /// out as exactly PATH, and nothing in PATH may run.
    fn run(cmd: &str, path: &[u8]) -> Vec<u8> {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("sh")
            .current_dir(dir.path())
            .arg("-c")
            .arg(substitute_path_argument(cmd))
            .arg("sh")
            .arg(std::ffi::OsStr::from_bytes(path))
            .output()
            .unwrap();
        assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "{cmd:?} with {path:?} made a file");
        out.stdout
    }

    const HOSTILE: &[&[u8]] = &[
        b"/w/$(touch PWNED)",
        b"/w/`touch PWNED`",
        b"/w/a'b\"c",
        b"/w/'; touch PWNED; '",
        b"/w/\"; touch PWNED; \"",
        b"/w/new\nline; touch PWNED",
        b"/w/*",
        b"/w/two  spaces\tand tab",
        b"/w/\xff\xfe not utf-8",
        b"/w/-n",
        b"/w/$1 ${HOME} \\",
    ];

    #[test]
    fn a_path_comes_out_whole_in_every_quoting_context() {
        for path in HOSTILE {
            let want = |n: usize| {
                let mut v = Vec::new();
                for _ in 0..n {
                    v.extend_from_slice(b"<");
                    v.extend_from_slice(path);
                    v.extend_from_slice(b">");
                }
                v.push(b'\n');
                v
            };
            assert_eq!(run("printf '<%s>' {}; echo", path), want(1), "unquoted");
            assert_eq!(run("printf \"<%s>\" \"{}\"; echo", path), want(1), "double quotes");
            assert_eq!(run("printf '<%s>' '{}'; echo", path), want(1), "single quotes");
            assert_eq!(run("printf '<%s>' {} \"{}\"; echo", path), want(2), "twice");
            assert_eq!(run("printf '<%s>' \"$1\"; echo", path), want(1), "as $1");
        }
    }

    #[test]
    fn the_issue_s_command_runs_nothing_from_the_name() {
        // `--exec 'echo "got {}" >> log'` with a file named `$(id>PWNED)` (issue 51).
        assert_eq!(run("echo \"got {}\"", b"/w/$(id>PWNED)"), b"got /w/$(id>PWNED)\n");
    }

    #[test]
    fn escaped_braces_and_quotes_are_left_to_the_shell() {
        assert_eq!(substitute_path_argument("echo \\{}"), "echo \\{}");
        assert_eq!(substitute_path_argument("echo \"a\\\"{}\""), "echo \"a\\\"${1}\"");
        assert_eq!(substitute_path_argument("echo 'it''s' {}"), "echo 'it''s' \"$1\"");
        assert_eq!(substitute_path_argument("echo {x}"), "echo {x}");
    }
}
