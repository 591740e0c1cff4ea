//! How the driver and the benchmark ranks talk: lines of text (the protocol is described in
//! [`worker`](crate::worker)) over one of three transports:
//!
//! * a child's stdin/stdout: the workers the driver starts itself (`shoal bench worker`);
//! * a TCP connection: the other ranks of an `mpirun` job (see [`mpi`](crate::mpi));
//! * in-process channels: rank 0's own worker under `mpirun`, a thread of the driver's process.
//!
//! The lock-step phase code in [`driver`](crate::driver) sees only [`Ranks`]: send a line
//! to one rank or to all, take the next line from any rank, whatever carries it. On the
//! worker's side, lines arrive in an [`Inbox`] and leave through an [`Outbox`].

use crate::driver::WorkerCmd;
use crate::spec::Job;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::os::fd::AsRawFd;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// What the driver hears from a rank.
#[derive(Debug)]
pub enum Event {
    Line(String),
    /// The rank's transport ended (process exited, connection closed or broken, thread
    /// ended), with the cause.
    Closed(String),
}

pub type EventTx = mpsc::UnboundedSender<(usize, Event)>;

/// Pass each line rank `rank` writes on `from` (a worker's stdout, a rank's connection) to
/// the driver's events, then the cause of its end: `ended` when the stream closes, or
/// `broken: the error` when it fails.
async fn forward_lines(
    from: impl tokio::io::AsyncRead + Unpin,
    rank: usize,
    tx: EventTx,
    ended: &'static str,
    broken: &'static str,
) {
    let mut lines = tokio::io::BufReader::new(from).lines();
    let cause = loop {
        match lines.next_line().await {
            Ok(Some(l)) => {
                if tx.send((rank, Event::Line(l))).is_err() {
                    return;
                }
            }
            Ok(None) => break ended.to_string(),
            Err(e) => break format!("{broken}: {e}"),
        };
    };
    let _ = tx.send((rank, Event::Closed(cause)));
}

/// Lines from the driver, as the worker reads them. The transport's reader ends the
/// channel when the driver closes its side.
pub type Inbox = mpsc::UnboundedReceiver<String>;

/// The worker's way back to the driver. Usable from any thread (the progress reporter is a
/// plain thread), synchronously.
#[derive(Clone)]
pub enum Outbox {
    /// Standard output (a worker the driver started itself).
    Stdout,
    /// A TCP connection to rank 0 (this process is rank `rank` of an mpirun job). A write
    /// that fails means rank 0 has gone: the process stops (exit status 1).
    Tcp { stream: Arc<Mutex<std::net::TcpStream>>, rank: u64 },
    /// Straight into the driver's event queue (rank 0's own worker thread).
    Local { rank: usize, events: EventTx },
    /// Nowhere (unit tests).
    Null,
}

impl Outbox {
    pub fn say(&self, line: &str) {
        match self {
            Outbox::Stdout => {
                let out = std::io::stdout();
                let mut out = out.lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }
            Outbox::Tcp { stream, rank } => {
                let mut buf = Vec::with_capacity(line.len() + 1);
                buf.extend_from_slice(line.as_bytes());
                buf.push(b'\n');
                let mut s = stream.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = s.write_all(&buf) {
                    lost_rank0(*rank, &e.to_string());
                }
            }
            Outbox::Local { rank, events } => {
                let _ = events.send((*rank, Event::Line(line.to_string())));
            }
            Outbox::Null => {}
        }
    }
}

/// A rank other than 0 whose connection to rank 0 ended before rank 0 said `exit`: there
/// is nothing left to do, whatever this process is in the middle of.
pub fn lost_rank0(rank: u64, cause: &str) -> ! {
    eprintln!("shoal: rank {rank}: lost the connection to rank 0 ({cause}); stopping");
    std::process::exit(1)
}

/// Lines of standard input (a reader thread; the channel ends at end of input).
pub fn stdin_inbox() -> Inbox {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Lines from rank 0 over TCP (a reader thread). After `exit` the thread stops reading;
/// an end of the connection before it stops the process ([`lost_rank0`]), so that a rank
/// never outlives its driver, even in the middle of a phase.
pub fn tcp_inbox(stream: std::net::TcpStream, rank: u64) -> Inbox {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let mut r = std::io::BufReader::new(stream);
        loop {
            let mut line = String::new();
            match r.read_line(&mut line) {
                Ok(0) => lost_rank0(rank, "connection closed"),
                Err(e) => lost_rank0(rank, &e.to_string()),
                Ok(_) => {
                    let line = line.trim_end().to_string();
                    let last = line == "exit";
                    if tx.send(line).is_err() || last {
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// TCP settings of every rank connection: no Nagle delay (the `go` and the ping-pong must
/// leave at once), and keepalive plus a user timeout so that a host that disappears without
/// closing the connection is noticed within about 30 s, not never.
pub fn tune_tcp(fd: &impl AsRawFd) {
    let fd = fd.as_raw_fd();
    let set = |level: libc::c_int, opt: libc::c_int, v: libc::c_int| {
        // SAFETY: setsockopt reads an int from the pointer we pass, for a socket we own.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                opt,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    };
    set(libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 10);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 5);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
    set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, 30_000);
}

/// The driver's end of one rank's transport.
enum Tx {
    Pipe(ChildStdin),
    Tcp(tokio::net::tcp::OwnedWriteHalf),
    Local(mpsc::UnboundedSender<String>),
    /// Closed by the driver (after `exit`, or an abort).
    Gone,
}

/// Rank 0's own worker under mpirun: a thread of this process with its own
/// current-thread runtime, like a worker process's.
struct LocalWorker {
    thread: std::thread::JoinHandle<()>,
    stop: Arc<AtomicBool>,
}

/// Under mpirun: who the ranks are and how their clocks relate to rank 0's (reported in
/// the JSON output).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MpiInfo {
    pub ranks: u64,
    /// Per rank: host name and process id.
    pub hosts: Vec<String>,
    /// Where rank 0 listened, and the rendezvous file.
    pub listen: String,
    pub rendezvous_file: String,
    /// Per rank: its CLOCK_MONOTONIC minus rank 0's, in ns, as used to place start times;
    /// and how it was found ("same boot" = the same kernel clock, offset 0; "ping-pong" =
    /// the sample with the shortest round trip).
    pub clock_offset_ns: Vec<i64>,
    pub clock: Vec<String>,
    /// Per rank: the shortest round trip to rank 0 seen while measuring, in µs.
    pub rtt_us: Vec<f64>,
}

impl MpiInfo {
    /// One line for the terminal: where the ranks run and how their clocks were aligned.
    pub fn describe(&self) -> String {
        let mut hosts: Vec<&str> = self.hosts.iter().map(|h| h.rsplit_once(':').map(|(h, _)| h).unwrap_or(h)).collect();
        hosts.sort();
        hosts.dedup();
        let measured: Vec<usize> = (0..self.clock.len()).filter(|&r| self.clock[r] == "ping-pong").collect();
        let clocks = if measured.is_empty() {
            "one kernel clock for all ranks".to_string()
        } else {
            let off = measured.iter().map(|&r| self.clock_offset_ns[r].unsigned_abs()).max().unwrap_or(0);
            let rtt = measured.iter().map(|&r| self.rtt_us[r]).fold(0.0, f64::max);
            format!(
                "{} of {} ranks' clocks placed by ping-pong (offsets up to {:.1} µs, round trips up to {:.1} µs)",
                measured.len(),
                self.ranks,
                off as f64 / 1000.0,
                rtt
            )
        };
        format!(
            "mpirun: {} ranks on {} ({}); rank 0 listened on {}; {clocks}",
            self.ranks,
            if hosts.len() == 1 { "1 host".to_string() } else { format!("{} hosts", hosts.len()) },
            hosts.join(", "),
            self.listen
        )
    }
}

/// The driver's connections to every rank. Index = rank.
pub struct Ranks {
    tx: Vec<Tx>,
    events: mpsc::UnboundedReceiver<(usize, Event)>,
    events_tx: EventTx,
    children: Vec<Option<Child>>,
    local: Option<LocalWorker>,
    /// Per rank: its CLOCK_MONOTONIC minus the driver's (0 on the same machine).
    offsets: Vec<i64>,
    /// How errors name a rank: "worker 3" (spawned) or "rank 3 (host:pid)" (mpirun).
    names: Vec<String>,
    /// Ranks whose transport has ended, and why.
    closed: Vec<Option<String>>,
    pub mpi: Option<MpiInfo>,
}

impl Ranks {
    fn new(n: usize) -> Ranks {
        let (events_tx, events) = mpsc::unbounded_channel();
        Ranks {
            tx: (0..n).map(|_| Tx::Gone).collect(),
            events,
            events_tx,
            children: (0..n).map(|_| None).collect(),
            local: None,
            offsets: vec![0; n],
            names: (0..n).map(|r| format!("rank {r}")).collect(),
            closed: vec![None; n],
            mpi: None,
        }
    }

    pub fn len(&self) -> usize {
        self.tx.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tx.is_empty()
    }

    /// Start one worker process per job (`cmd`, e.g. `shoal bench worker`) and send each
    /// its job.
    pub async fn spawn(cmd: &WorkerCmd, jobs: &[Job]) -> Result<Ranks> {
        let mut ranks = Ranks::new(jobs.len());
        // The `preload` target: its workers' file calls are served by the interception
        // library, loaded into them.
        let preload = match jobs.first() {
            Some(j) if j.target.preloaded() => Some(crate::preload::library()?),
            _ => None,
        };
        for rank in 0..jobs.len() {
            let mut command = Command::new(&cmd.program);
            if let Some(lib) = &preload {
                command.env("LD_PRELOAD", lib);
            }
            let mut child = command
                .args(&cmd.args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("cannot start worker {}", cmd.program.display()))?;
            let stdin = child.stdin.take().expect("piped");
            let stdout = child.stdout.take().expect("piped");
            tokio::spawn(forward_lines(stdout, rank, ranks.events_tx.clone(), "exited", "unreadable output"));
            ranks.tx[rank] = Tx::Pipe(stdin);
            ranks.children[rank] = Some(child);
            ranks.names[rank] = format!("worker {rank}");
        }
        ranks.start_jobs(jobs).await?;
        Ok(ranks)
    }

    /// An mpirun job's ranks, before any has a transport (see [`mpi::gather`](crate::mpi::gather)).
    pub fn for_mpi(n: usize) -> Ranks {
        Ranks::new(n)
    }

    /// Rank `rank` speaks over this TCP connection (its handshake done).
    pub fn add_tcp(&mut self, rank: usize, stream: tokio::net::TcpStream, name: String) {
        let (read, write) = stream.into_split();
        tokio::spawn(forward_lines(
            read,
            rank,
            self.events_tx.clone(),
            "connection closed (its process has ended)",
            "connection lost",
        ));
        self.tx[rank] = Tx::Tcp(write);
        self.names[rank] = name;
    }

    /// Rank `rank`'s worker runs in this process, on a thread of its own.
    pub fn add_local(&mut self, rank: usize, name: String) -> Result<()> {
        let (tx, inbox) = mpsc::unbounded_channel();
        let stop = Arc::new(AtomicBool::new(false));
        let out = Outbox::Local { rank, events: self.events_tx.clone() };
        let events = self.events_tx.clone();
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("bench-rank{rank}"))
            .spawn(move || {
                let r = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(anyhow::Error::from)
                    .and_then(|rt| rt.block_on(crate::worker::session(inbox, out, s)));
                let cause = match r {
                    Ok(()) => "its worker ended".to_string(),
                    Err(e) => format!("its worker failed: {}", format!("{e:#}").replace('\n', " ")),
                };
                let _ = events.send((rank, Event::Closed(cause)));
            })
            .context("cannot start rank 0's worker thread")?;
        self.tx[rank] = Tx::Local(tx);
        self.local = Some(LocalWorker { thread, stop });
        self.names[rank] = name;
        Ok(())
    }

    /// The clock offset of `rank`: its CLOCK_MONOTONIC minus the driver's.
    pub fn offset(&self, rank: usize) -> i64 {
        self.offsets[rank]
    }

    pub fn set_offset(&mut self, rank: usize, offset: i64) {
        self.offsets[rank] = offset;
    }

    pub fn name(&self, rank: usize) -> &str {
        &self.names[rank]
    }

    pub async fn send(&mut self, rank: usize, line: &str) -> Result<()> {
        let name = &self.names[rank];
        let r = match &mut self.tx[rank] {
            Tx::Pipe(s) => async {
                s.write_all(line.as_bytes()).await?;
                s.write_all(b"\n").await?;
                s.flush().await
            }
            .await
            .map_err(|e| anyhow!("{e}")),
            Tx::Tcp(s) => {
                let mut buf = Vec::with_capacity(line.len() + 1);
                buf.extend_from_slice(line.as_bytes());
                buf.push(b'\n');
                s.write_all(&buf).await.map_err(|e| anyhow!("connection lost: {e}"))
            }
            Tx::Local(s) => s.send(line.to_string()).map_err(|_| anyhow!("its worker has ended")),
            Tx::Gone => Err(anyhow!("already closed")),
        };
        r.with_context(|| format!("{name} does not listen"))
    }

    pub async fn send_all(&mut self, line: &str) -> Result<()> {
        for rank in 0..self.len() {
            self.send(rank, line).await?;
        }
        Ok(())
    }

    /// Hand every rank its job for the next run (`job {json}`).
    pub async fn start_jobs(&mut self, jobs: &[Job]) -> Result<()> {
        if jobs.len() != self.len() {
            bail!("{} jobs for {} ranks", jobs.len(), self.len());
        }
        for (rank, job) in jobs.iter().enumerate() {
            let line = format!("job {}", serde_json::to_string(job)?);
            self.send(rank, &line).await.context("cannot send the job")?;
        }
        Ok(())
    }

    /// The next line from any rank. An `error` line, or a rank whose transport ended, is an
    /// error naming the rank.
    pub async fn next(&mut self) -> Result<(usize, String)> {
        match self.events.recv().await {
            Some((rank, Event::Line(l))) => {
                if let Some(msg) = l.strip_prefix("error ") {
                    bail!("{}: {msg}", self.names[rank]);
                }
                Ok((rank, l))
            }
            Some((rank, Event::Closed(cause))) => {
                self.closed[rank] = Some(cause.clone());
                if let Some(child) = self.children[rank].as_mut() {
                    let status = child.wait().await.ok();
                    bail!("{} {cause}{}", self.names[rank], status.map(|s| format!(" ({s})")).unwrap_or_default())
                }
                bail!("{}: {cause}", self.names[rank])
            }
            None => bail!("every rank has gone"),
        }
    }

    /// End the current run's job on every rank (`quit`). Spawned workers then see the end
    /// of their input and exit; mpirun ranks wait for the next job.
    pub async fn end_jobs(&mut self) -> Result<()> {
        self.send_all("quit").await
    }

    /// The end of a successful benchmark. Spawned workers: end of input, wait for them (and
    /// kill any that lingers). mpirun ranks: `exit`, then wait until each has closed its
    /// connection, so that none is cut off before it has read the `exit`.
    pub async fn shutdown(mut self) {
        if self.mpi.is_some() {
            let _ = self.send_all("exit").await;
        }
        for t in &mut self.tx {
            *t = Tx::Gone;
        }
        for c in self.children.iter_mut().flatten() {
            match tokio::time::timeout(Duration::from_secs(10), c.wait()).await {
                Ok(_) => {}
                Err(_) => {
                    let _ = c.kill().await;
                }
            }
        }
        if self.mpi.is_some() {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while self.closed.iter().any(|c| c.is_none()) {
                match tokio::time::timeout_at(deadline, self.events.recv()).await {
                    Ok(Some((rank, Event::Closed(cause)))) => self.closed[rank] = Some(cause),
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
        }
        if let Some(l) = self.local.take() {
            let _ = l.thread.join();
        }
    }

    /// After a failure: stop every rank now. Spawned workers are killed; mpirun ranks see
    /// their connection close and exit with an error; rank 0's own worker stops after the
    /// operation it is in. Returns when rank 0's worker thread has ended, so the run
    /// directory can be cleaned up.
    pub async fn abort(&mut self) {
        if let Some(l) = &self.local {
            l.stop.store(true, Ordering::Relaxed);
        }
        for t in &mut self.tx {
            *t = Tx::Gone;
        }
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill().await;
        }
        if let Some(l) = self.local.take() {
            let _ = tokio::task::spawn_blocking(move || l.thread.join()).await;
        }
    }

    /// Clock offset of rank `rank` by ping-pong: `rounds` times, note the driver's clock
    /// before (t0) and after (t1) a `ping` and the rank's clock in its `pong`; keep the
    /// sample with the shortest round trip. Returns (offset, round trip) in ns.
    pub async fn ping_pong(&mut self, rank: usize, rounds: usize) -> Result<(i64, u64)> {
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let t0 = crate::clock::mono_ns();
            self.send(rank, "ping").await?;
            let (from, line) = tokio::time::timeout(Duration::from_secs(10), self.next())
                .await
                .map_err(|_| anyhow!("{} did not answer a ping within 10 s", self.names[rank]))??;
            let t1 = crate::clock::mono_ns();
            let tw = match line.strip_prefix("pong ") {
                Some(t) if from == rank => {
                    t.trim().parse::<u64>().map_err(|_| anyhow!("{}: bad pong {line:?}", self.names[rank]))?
                }
                _ => bail!("{} said {line:?} while its clock was being measured", self.names[from]),
            };
            samples.push((t0, tw, t1));
        }
        best_offset(&samples).ok_or_else(|| anyhow!("no clock sample"))
    }
}

/// From (t0, tw, t1) samples (driver clock before, rank clock, driver clock after), the
/// offset of the rank's clock (tw − midpoint of t0 and t1) of the sample with the shortest
/// round trip, and that round trip. If both clocks are one, |offset| ≤ round trip / 2.
pub fn best_offset(samples: &[(u64, u64, u64)]) -> Option<(i64, u64)> {
    samples.iter().min_by_key(|(t0, _, t1)| t1.saturating_sub(*t0)).map(|&(t0, tw, t1)| {
        let mid = t0 as i128 + (t1 as i128 - t0 as i128) / 2;
        ((tw as i128 - mid) as i64, t1.saturating_sub(t0))
    })
}

/// `t` on a clock that is `offset` ahead of this one, or back (`-offset`).
pub fn shift(t: u64, offset: i64) -> u64 {
    (t as i128 + offset as i128).max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_offset_takes_the_shortest_round_trip() {
        // The rank's clock is 1000 ahead; the second sample is the tightest.
        let s = [(0, 1_600, 800), (2_000, 3_050, 2_100), (5_000, 6_900, 5_500)];
        assert_eq!(best_offset(&s), Some((1_000, 100)));
        assert_eq!(best_offset(&[]), None);
        // Behind, and a large clock.
        let big = 1u64 << 50;
        assert_eq!(best_offset(&[(big, big - 450, big + 100)]), Some((-500, 100)));
        assert_eq!(shift(100, -30), 70);
        assert_eq!(shift(10, -30), 0);
        assert_eq!(shift(10, 30), 40);
    }
}
