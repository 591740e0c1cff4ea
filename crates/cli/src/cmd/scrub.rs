//! `shoal scrub`: have the servers verify every data block and metadata record they hold,
//! follow them with progress bars, and report what they found (docs/scrub.md).

use super::{usage, Ctx, Exit};
use crate::fmt::human_bytes;
use anyhow::Result;
use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use shoal_client::{Client, ScrubStatus, ServerId};
use std::time::Duration;

/// Exit status when a server found damaged data or records it could not repair.
pub const EXIT_DAMAGED: u8 = 3;
/// Exit status when no damage was found but a server could not be reached (or could not
/// finish its scrub): the report is incomplete.
pub const EXIT_UNREACHABLE: u8 = 4;

#[derive(Args)]
#[command(
    long_about = "Verify every block of every data object (against its CRC32C) and decode every \
metadata record, on every server or on one. The servers do the work in the background, throttled \
so that they keep serving; this command starts them, shows their progress and prints a report: \
per server the objects, blocks, bytes and records verified, the damage found, repaired and left \
unrepairable, and each damaged object file with the offset of its bad block, or each damaged \
record with its key. With replicas >= 2 a damaged block or a missing object file is rewritten \
from a good copy on another server (a mirror, or the primary of a mirrored copy).\n\n\
Exit status: 0 nothing left damaged (all damage found was repaired); 3 damage that could not be \
repaired (listed in the report); 4 nothing damaged found but a server could not be reached or \
could not finish (the report is incomplete); 1 other failures; 2 usage error.",
    after_help = "Examples:\n  shoal scrub\n  shoal scrub --server 2\n  shoal scrub --json | jq '.servers[].errors'"
)]
pub struct ScrubArgs {
    /// Only this server (its id in the cluster map).
    #[arg(long, value_name = "N")]
    server: Option<u32>,
    /// Print the report as JSON (no progress bars).
    #[arg(long)]
    json: bool,
}

/// What one server's scrub came to.
enum Outcome {
    Done(ScrubStatus),
    Unreachable(String),
    /// The server refused to start it: the user is not an administrator (EPERM).
    Refused(String),
}

pub async fn scrub(ctx: &Ctx, a: ScrubArgs) -> Result<()> {
    let client = ctx.client()?;
    let servers: Vec<ServerId> = match a.server {
        Some(n) => {
            if client.map().server(ServerId(n)).is_none() {
                return Err(usage(format!("server {n} is not in the cluster map")));
            }
            vec![ServerId(n)]
        }
        None => client.map().servers.iter().map(|s| s.server_id()).collect(),
    };
    let bars = MultiProgress::with_draw_target(if a.json {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    });
    let style = ProgressStyle::with_template("server {prefix:>3} {wide_bar} {bytes}/{total_bytes} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    let runs = servers.iter().map(|&s| {
        let bar = bars.add(ProgressBar::new(0).with_style(style.clone()).with_prefix(s.to_string()));
        follow(&client, s, bar)
    });
    let outcomes = futures::future::join_all(runs).await;
    let _ = bars.clear();
    let results: Vec<(ServerId, Outcome)> = servers.into_iter().zip(outcomes).collect();
    // Not allowed is one answer for the whole cluster, not a table of failures.
    if let Some(why) = results.iter().find_map(|(_, o)| match o {
        Outcome::Refused(e) => Some(e),
        _ => None,
    }) {
        anyhow::bail!("{why}");
    }

    let damaged: u64 = results
        .iter()
        .map(|(_, o)| match o {
            Outcome::Done(s) => still_damaged(s),
            Outcome::Unreachable(_) | Outcome::Refused(_) => 0,
        })
        .sum();
    let incomplete = results.iter().filter(|(_, o)| !matches!(o, Outcome::Done(s) if s.failure.is_none())).count();
    if a.json {
        print_json(&client, &results, damaged)?;
    } else {
        print_table(&client, &results);
    }
    if damaged > 0 {
        return Err(Exit::new(
            EXIT_DAMAGED,
            format!("scrub found {damaged} damaged blocks, objects or records it could not repair"),
        )
        .into());
    }
    if incomplete > 0 {
        return Err(Exit::new(
            EXIT_UNREACHABLE,
            format!("{incomplete} of {} servers could not be scrubbed", results.len()),
        )
        .into());
    }
    Ok(())
}

/// Damage a server found and left as found (no good copy to repair it from). A server
/// older than repairs counts no `corrupt`: everything it listed is still damaged.
fn still_damaged(s: &ScrubStatus) -> u64 {
    if s.corrupt == 0 {
        s.errors.len() as u64 + s.errors_unlisted
    } else {
        s.unrepairable
    }
}

/// Start the scrub on `server` and poll it until it is done, moving `bar`.
async fn follow(client: &Client, server: ServerId, bar: ProgressBar) -> Outcome {
    let mut status = match client.scrub_start(server).await {
        Ok(s) => s,
        Err(e) if e.errno == shoal_client::Errno::EPERM => {
            bar.finish_with_message("refused");
            return Outcome::Refused(e.to_string());
        }
        Err(e) => {
            bar.finish_with_message("unreachable");
            return Outcome::Unreachable(e.to_string());
        }
    };
    loop {
        bar.set_length(status.bytes_total.max(status.bytes));
        bar.set_position(status.bytes);
        bar.set_message(format!(
            "{}/{} objects, {} records, {} damaged, {} repaired",
            status.objects, status.objects_total, status.records, status.corrupt, status.repaired
        ));
        if status.done {
            bar.finish();
            return Outcome::Done(status);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        status = match client.scrub_status(server).await {
            Ok(s) => s,
            Err(e) => {
                bar.finish_with_message("unreachable");
                return Outcome::Unreachable(e.to_string());
            }
        };
    }
}

fn print_table(client: &Client, results: &[(ServerId, Outcome)]) {
    println!(
        "{:<4} {:<21} {:<11} {:>9} {:>10} {:>9} {:>9} {:>8} {:>9} {:>13} {:>8}",
        "id",
        "address",
        "result",
        "objects",
        "bytes",
        "blocks",
        "records",
        "corrupt",
        "repaired",
        "unrepairable",
        "time"
    );
    for (id, o) in results {
        let addr = client.map().server(*id).map(|s| s.addr.as_str()).unwrap_or("?");
        match o {
            Outcome::Done(s) => {
                let result = if still_damaged(s) > 0 {
                    "DAMAGED"
                } else if s.failure.is_some() {
                    "INCOMPLETE"
                } else if s.repaired > 0 {
                    "repaired"
                } else {
                    "clean"
                };
                println!(
                    "{:<4} {:<21} {:<11} {:>9} {:>10} {:>9} {:>9} {:>8} {:>9} {:>13} {:>7.1}s",
                    id.to_string(),
                    addr,
                    result,
                    s.objects,
                    human_bytes(s.bytes),
                    s.blocks,
                    s.records,
                    s.corrupt.max(s.errors.len() as u64 + s.errors_unlisted),
                    s.repaired,
                    still_damaged(s),
                    s.elapsed_ms as f64 / 1000.0
                );
            }
            Outcome::Unreachable(_) | Outcome::Refused(_) => {
                println!("{:<4} {:<21} {:<11}", id.to_string(), addr, "UNREACHABLE")
            }
        }
    }
    for (id, o) in results {
        match o {
            Outcome::Done(s) => {
                for e in &s.errors {
                    let id = if e.repaired { format!("{id} (repaired)") } else { id.to_string() };
                    match e.offset {
                        Some(off) => println!("server {id}: {} {} at offset {off}: {}", e.kind, e.name, e.message),
                        None => println!("server {id}: {} {}: {}", e.kind, e.name, e.message),
                    }
                }
                if s.errors_unlisted > 0 {
                    println!("server {id}: {} more errors (see its log)", s.errors_unlisted);
                }
                if let Some(f) = &s.failure {
                    println!("server {id}: scrub stopped early: {f}");
                }
            }
            Outcome::Unreachable(e) | Outcome::Refused(e) => println!("server {id}: {e}"),
        }
    }
}

fn print_json(client: &Client, results: &[(ServerId, Outcome)], damaged: u64) -> Result<()> {
    let rows: Vec<serde_json::Value> = results
        .iter()
        .map(|(id, o)| {
            let addr = client.map().server(*id).map(|s| s.addr.clone()).unwrap_or_default();
            match o {
                Outcome::Done(s) => serde_json::json!({
                    "id": id.0, "addr": addr, "reachable": true, "complete": s.failure.is_none(),
                    "objects": s.objects, "bytes": s.bytes, "blocks": s.blocks, "records": s.records,
                    "corrupt": s.corrupt, "repaired": s.repaired, "unrepairable": still_damaged(s),
                    "errors": s.errors.iter().map(|e| serde_json::json!({
                        "kind": e.kind, "name": e.name, "offset": e.offset, "message": e.message,
                        "repaired": e.repaired,
                    })).collect::<Vec<_>>(),
                    "errors_unlisted": s.errors_unlisted, "elapsed_ms": s.elapsed_ms, "failure": s.failure,
                }),
                Outcome::Unreachable(e) | Outcome::Refused(e) => serde_json::json!({
                    "id": id.0, "addr": addr, "reachable": false, "complete": false, "error": e,
                }),
            }
        })
        .collect();
    println!("{}", serde_json::to_string_pretty(&serde_json::json!({"damaged": damaged, "servers": rows}))?);
    Ok(())
}
