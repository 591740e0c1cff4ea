//! `shoal top`: the cluster's status page in a terminal (docs/metrics.md). The figures come
//! from the same `shoal_server::status_view::Sampler` the servers' `/api/status` uses,
//! asked through the native protocol, so it works on clusters without HTTP ports too.

use super::{usage, Ctx};
use crate::fmt::human_bytes;
use anyhow::{bail, Context, Result};
use clap::Args;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Cell, Paragraph, Row, Sparkline, Table};
use ratatui::Frame;
use shoal_server::status_view::{ClusterView, Sampler, ServerView};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

#[derive(Args)]
#[command(
    after_help = "Keys: q or Esc quits.\n\nExamples:\n  shoal top\n  shoal top --once\n  shoal top --json | jq .busiest"
)]
pub struct TopArgs {
    /// Print one table (rates over one interval) and exit, for scripts.
    #[arg(long, conflicts_with = "json")]
    once: bool,
    /// Print one sample as JSON (the same document as a server's /api/status) and exit.
    #[arg(long)]
    json: bool,
    /// Seconds between refreshes (and the interval rates are measured over).
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    interval: f64,
}

/// Samples of total requests per second the sparkline shows.
const HISTORY: usize = 120;

pub async fn top(ctx: &Ctx, a: TopArgs) -> Result<()> {
    if !(0.1..=3600.0).contains(&a.interval) {
        return Err(usage(format!("--interval {}: give 0.1 to 3600 seconds", a.interval)));
    }
    let interval = Duration::from_secs_f64(a.interval);
    let client = ctx.client()?;
    let sampler = Sampler::new();
    if a.once || a.json {
        // Two samples: rates need an interval.
        sampler.sample(&client).await;
        tokio::time::sleep(interval.max(shoal_server::status_view::MIN_INTERVAL)).await;
        let view = sampler.sample(&client).await;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&view)?);
        } else {
            print_table(&view);
        }
        let down = view.servers_total - view.servers_up;
        if down > 0 {
            bail!("{down} of {} servers do not answer", view.servers_total);
        }
        return Ok(());
    }
    if !std::io::stdout().is_terminal() {
        return Err(usage("shoal top draws on a terminal: use --once or --json for a pipe or a file"));
    }
    let mut term = ratatui::try_init().context("cannot set up the terminal")?;
    let result = interactive(&mut term, &client, &sampler, interval).await;
    ratatui::restore();
    result
}

async fn interactive(
    term: &mut ratatui::DefaultTerminal,
    client: &shoal_client::Client,
    sampler: &Sampler,
    interval: Duration,
) -> Result<()> {
    let mut history: Vec<u64> = Vec::new();
    loop {
        let view = sampler.sample(client).await;
        history.push(view.servers.iter().map(|s| s.rates.requests_per_s).sum::<f64>().round() as u64);
        if history.len() > HISTORY {
            history.remove(0);
        }
        term.draw(|f| draw(f, &view, &history)).context("cannot draw")?;
        // Wait for the next refresh, or a key (read off the async threads: it blocks).
        let until = Instant::now() + interval;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let key = tokio::task::spawn_blocking(move || -> std::io::Result<Option<Event>> {
                if event::poll(left)? {
                    event::read().map(Some)
                } else {
                    Ok(None)
                }
            })
            .await
            .context("key reader")?
            .context("cannot read the terminal")?;
            match key {
                Some(Event::Key(k)) if k.kind == KeyEventKind::Press => {
                    let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                        return Ok(());
                    }
                }
                Some(Event::Resize(..)) => {
                    term.draw(|f| draw(f, &view, &history)).map(|_| ()).context("cannot draw")?
                }
                _ => {}
            }
        }
    }
}

fn health_line(v: &ClusterView) -> String {
    let down = v.servers_total - v.servers_up;
    let health = if down == 0 {
        format!("all {} servers up", v.servers_total)
    } else {
        format!("{down} of {} servers UNREACHABLE", v.servers_total)
    };
    format!(
        "{health} · map version {} · {} used of {}",
        v.map_version,
        human_bytes(v.capacity_bytes.saturating_sub(v.free_bytes)),
        human_bytes(v.capacity_bytes)
    )
}

fn used_percent(s: &ServerView) -> u64 {
    (s.capacity_bytes.saturating_sub(s.free_bytes) * 100).checked_div(s.capacity_bytes).unwrap_or(0)
}

/// A bar of `width` characters, `pct` percent full.
fn bar(pct: u64, width: usize) -> String {
    let full = (pct.min(100) as usize * width).div_ceil(100);
    format!("{}{}", "█".repeat(full), "·".repeat(width - full))
}

fn server_cells(s: &ServerView) -> Vec<String> {
    if !s.up {
        return vec![s.name.clone(), s.addr.clone(), "DOWN".into(), s.error.clone().unwrap_or_default()];
    }
    vec![
        s.name.clone(),
        s.addr.clone(),
        "up".into(),
        format!("{} {:>3}%", bar(used_percent(s), 10), used_percent(s)),
        human_bytes(s.free_bytes),
        s.inodes.to_string(),
        s.data_objects.to_string(),
        format!("{:.1}", s.rates.requests_per_s),
        format!("{}/s", human_bytes(s.rates.bytes_in_per_s as u64)),
        format!("{}/s", human_bytes(s.rates.bytes_out_per_s as u64)),
        format!("{:.0}%", s.rates.cpu_percent),
        s.errors.to_string(),
    ]
}

const HEADER: [&str; 12] =
    ["server", "address", "state", "used", "free", "inodes", "objects", "req/s", "in", "out", "cpu", "errors"];

fn print_table(v: &ClusterView) {
    println!("{}", health_line(v));
    let rows: Vec<Vec<String>> = v.servers.iter().map(server_cells).collect();
    let widths: Vec<usize> = (0..HEADER.len())
        .map(|i| {
            rows.iter().filter_map(|r| r.get(i)).map(|c| c.chars().count()).chain([HEADER[i].len()]).max().unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        let s: Vec<String> = cells.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(HEADER.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(r);
    }
    println!();
    println!("{:<24} {:>10} {:>12}", "busiest operation", "per second", "total");
    for o in &v.busiest {
        println!("{:<24} {:>10.1} {:>12}", o.op, o.per_s, o.total);
    }
}

fn draw(f: &mut Frame, v: &ClusterView, history: &[u64]) {
    let [head, servers, chart, busiest] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Length(v.servers.len() as u16 + 3),
        Constraint::Length(7),
        Constraint::Min(4),
    ])
    .areas(f.area());
    let healthy = v.servers_up == v.servers_total;
    let style = Style::new().fg(if healthy { Color::Green } else { Color::Red }).add_modifier(Modifier::BOLD);
    f.render_widget(Paragraph::new(vec![Line::styled(health_line(v), style), Line::raw("q quits")]), head);

    let rows = v.servers.iter().map(|s| {
        let row = Row::new(server_cells(s).into_iter().map(Cell::from));
        if s.up {
            row
        } else {
            row.style(Style::new().fg(Color::Red))
        }
    });
    let widths = [4, 21, 5, 15, 8, 8, 8, 8, 10, 10, 5, 7].map(Constraint::Length);
    let table = Table::new(rows, widths)
        .header(Row::new(HEADER).style(Style::new().add_modifier(Modifier::BOLD)))
        .block(Block::bordered().title(" servers "));
    f.render_widget(table, servers);

    let now = history.last().copied().unwrap_or(0);
    let spark = Sparkline::default()
        .block(Block::bordered().title(format!(" requests per second, all servers: {now} ")))
        .data(history)
        .style(Style::new().fg(Color::Cyan));
    f.render_widget(spark, chart);

    let rows = v.busiest.iter().map(|o| Row::new([o.op.clone(), format!("{:.1}", o.per_s), o.total.to_string()]));
    let table = Table::new(rows, [Constraint::Length(24), Constraint::Length(12), Constraint::Length(12)])
        .header(Row::new(["operation", "per second", "total"]).style(Style::new().add_modifier(Modifier::BOLD)))
        .block(Block::bordered().title(" busiest operations "));
    f.render_widget(table, busiest);
}
