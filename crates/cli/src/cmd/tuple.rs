//! `shoal tuple`: the tuple space from the shell (docs/tuples.md). Fields are written one
//! per argument: a number is an integer, `s:TEXT` a string (any other text is a string
//! too), `x:HEX` bytes; in templates `?` matches any value and `?int`, `?str`, `?bytes` any
//! value of that type.

use super::{usage, Ctx, Exit};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use shoal_client::{Field, Template, Tuple, TupleEvent, TupleEventKind, Value, WatchFrom};
use shoal_client::{WATCH_TAKEN, WATCH_WRITTEN};
use std::time::Duration;

#[derive(Subcommand)]
pub enum TupleCmd {
    /// Store a tuple (Linda's out).
    Write(WriteArgs),
    /// Print the oldest tuple matching a template, leaving it (rd).
    Read(GetArgs),
    /// Print the oldest tuple matching a template and remove it (in): of several takers,
    /// each tuple goes to one.
    Take(GetArgs),
    /// Print tuples matching a template as they are written (and with --taken, taken).
    Watch(WatchArgs),
    /// Print the files under ROOT whose tuple ("file", path, type, size, uid, gid, mode,
    /// mtime) matches a template: the servers' metadata in the tuple space's terms.
    Files(FilesArgs),
}

#[derive(Args)]
pub struct FilesArgs {
    /// The directory whose tree is matched (a template giving the path exactly looks at
    /// that file only).
    root: String,
    /// The template: file PATH TYPE SIZE UID GID MODE MTIME, each a value (as for write)
    /// or ? (any); e.g. file ? f ? 1000 ? ? ? for alice's files.
    #[arg(required = true, allow_negative_numbers = true)]
    template: Vec<String>,
    /// One JSON array per file.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct WriteArgs {
    /// The fields: 42 (integer), s:42 or any text (string), x:00ff (bytes).
    #[arg(required = true, allow_negative_numbers = true)]
    fields: Vec<String>,
    /// Print the event number that recorded it, as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct GetArgs {
    /// The template: a value as for write, ? (any), ?int, ?str, ?bytes. The first field
    /// must be a value.
    #[arg(required = true, allow_negative_numbers = true)]
    template: Vec<String>,
    /// Wait up to SECONDS for a matching tuple (default: look once).
    #[arg(long, value_name = "SECONDS", conflicts_with = "forever")]
    wait: Option<f64>,
    /// Wait until a matching tuple comes.
    #[arg(long)]
    forever: bool,
    /// Print the tuple as a JSON array.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct WatchArgs {
    /// The template (as for read).
    #[arg(required = true, allow_negative_numbers = true)]
    template: Vec<String>,
    /// Also tuples taken (printed with "taken").
    #[arg(long)]
    taken: bool,
    /// Only tuples taken.
    #[arg(long, conflicts_with = "taken")]
    only_taken: bool,
    /// Start after this event number (a cursor printed by an earlier watch; 0: every event
    /// the server keeps). Default: from now on.
    #[arg(long, value_name = "SEQ")]
    after: Option<u64>,
    /// Stop after N events.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Stop after SECONDS without an event.
    #[arg(long, value_name = "SECONDS")]
    idle: Option<f64>,
    /// One JSON object per event: seq, event, tuple, uid, at.
    #[arg(long)]
    json: bool,
}

pub async fn run(ctx: &Ctx, cmd: TupleCmd) -> Result<()> {
    match cmd {
        TupleCmd::Write(a) => write(ctx, a).await,
        TupleCmd::Read(a) => get(ctx, a, false).await,
        TupleCmd::Take(a) => get(ctx, a, true).await,
        TupleCmd::Watch(a) => watch(ctx, a).await,
        TupleCmd::Files(a) => files(ctx, a).await,
    }
}

async fn files(ctx: &Ctx, a: FilesArgs) -> Result<()> {
    let template = Template(a.template.iter().map(|f| Field::parse(f)).collect());
    let client = ctx.client()?;
    let found =
        client.file_tuples(&a.root, &template).await.with_context(|| format!("cannot match files under {}", a.root))?;
    if found.is_empty() {
        return Err(Exit::new(1, "no file matched").into());
    }
    for t in found {
        if a.json {
            println!("{}", json_of(&t));
        } else {
            println!("{t}");
        }
    }
    Ok(())
}

async fn write(ctx: &Ctx, a: WriteArgs) -> Result<()> {
    let tuple = Tuple(a.fields.iter().map(|f| Value::parse(f)).collect());
    tuple.check().map_err(usage)?;
    let client = ctx.client()?;
    let seq = client.tuple_write(&tuple).await.with_context(|| format!("cannot write {tuple}"))?;
    if a.json {
        println!("{}", serde_json::json!({ "seq": seq, "tuple": json_of(&tuple) }));
    }
    Ok(())
}

async fn get(ctx: &Ctx, a: GetArgs, take: bool) -> Result<()> {
    let template = template_of(&a.template)?;
    let wait = match (a.forever, a.wait) {
        (true, _) => None,
        (false, Some(s)) => Some(seconds(s, "--wait")?),
        (false, None) => Some(Duration::ZERO),
    };
    let client = ctx.client()?;
    let verb = if take { "take" } else { "read" };
    let got = if take { client.tuple_take(&template, wait).await } else { client.tuple_read(&template, wait).await };
    match got.with_context(|| format!("cannot {verb} a tuple"))? {
        Some(t) if a.json => println!("{}", json_of(&t)),
        Some(t) => println!("{t}"),
        // As grep: 1 is "nothing matched", for scripts.
        None => return Err(Exit::new(1, "no tuple matched").into()),
    }
    Ok(())
}

async fn watch(ctx: &Ctx, a: WatchArgs) -> Result<()> {
    let template = template_of(&a.template)?;
    let kinds = match (a.taken, a.only_taken) {
        (_, true) => WATCH_TAKEN,
        (true, _) => WATCH_WRITTEN | WATCH_TAKEN,
        _ => WATCH_WRITTEN,
    };
    let idle = a.idle.map(|s| seconds(s, "--idle")).transpose()?;
    let from = a.after.map_or(WatchFrom::Now, WatchFrom::After);
    let client = ctx.client()?;
    let mut w = client.tuple_watch(&template, kinds, from).await.context("cannot watch the tuple space")?;
    let mut seen = 0u64;
    let mut lost = 0u64;
    while a.count.is_none_or(|c| seen < c) {
        let Some(e) = w.next(idle).await.context("watching the tuple space")? else { break };
        if w.lost() > lost {
            eprintln!("shoal: {} events were dropped by the server before they were read", w.lost() - lost);
            lost = w.lost();
        }
        print_event(&e, a.json);
        seen += 1;
    }
    // Where to go on from: `--after` of the next watch.
    eprintln!("cursor {}", w.cursor());
    Ok(())
}

fn print_event(e: &TupleEvent, json: bool) {
    let what = match e.kind {
        TupleEventKind::Written => "written",
        TupleEventKind::Taken => "taken",
    };
    if json {
        let j = serde_json::json!({
            "seq": e.seq, "event": what, "tuple": json_of(&e.tuple), "uid": e.uid, "at": e.at.secs,
        });
        println!("{j}");
    } else {
        println!("{} {what} {}", e.seq, e.tuple);
    }
}

fn template_of(fields: &[String]) -> Result<Template> {
    let t = Template(fields.iter().map(|f| Field::parse(f)).collect());
    t.check().map_err(usage)?;
    Ok(t)
}

fn seconds(s: f64, flag: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| usage(format!("{flag} {s}: not a number of seconds")))
}

/// A tuple as a JSON array: integers as numbers, strings as strings, bytes as {"hex": …}.
fn json_of(t: &Tuple) -> serde_json::Value {
    t.0.iter()
        .map(|v| match v {
            Value::Int(n) => serde_json::json!(n),
            Value::Str(s) => serde_json::json!(s),
            Value::Bytes(b) => {
                serde_json::json!({ "hex": b.iter().map(|x| format!("{x:02x}")).collect::<String>() })
            }
        })
        .collect()
}
