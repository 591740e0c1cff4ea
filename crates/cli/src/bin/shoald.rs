//! `shoald`: a Shoal server. A thin `main` around `shoal_server::run`: parse the command
//! line, set up logging, run until SIGINT/SIGTERM, and turn a start-up failure into one
//! line on stderr and exit status 1.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

/// Shoal server: holds directory objects, inodes and data objects for its share of the
/// cluster, and serves clients and other servers until SIGINT or SIGTERM.
///
/// Logging goes to stderr; set SHOAL_LOG to a tracing filter (default "info", e.g.
/// SHOAL_LOG=debug or SHOAL_LOG=shoal_server=debug).
#[derive(Parser, Debug)]
#[command(name = "shoald", version)]
struct Args {
    /// The cluster map (TOML) listing every server of the cluster.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,

    /// This server's id: which [[server]] entry of the map this process is.
    #[arg(long, value_name = "N")]
    id: u32,

    /// Where to keep the metadata store and data objects (default: the map entry's data_dir).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,

    /// Address to listen on, host:port (default: the map entry's addr).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,

    /// Address of the HTTP service, host:port (default: the map entry's http; no HTTP
    /// service when neither is set).
    #[arg(long, value_name = "ADDR")]
    http_listen: Option<String>,

    /// Threads that serve requests: 0 = one per CPU; 1 = a single thread (no hand-offs
    /// between threads: best when several servers share a machine, as `shoal cluster up`
    /// arranges). File I/O runs on a separate pool either way.
    #[arg(long, value_name = "N", default_value_t = 0, env = "SHOALD_THREADS")]
    threads: usize,

    /// Client connections held at once (peers' connections have a small reserve beyond).
    /// Beyond it, a connection that has not said Hello yet is closed to make room, or the
    /// new connection is refused with EAGAIN ("server N: connection limit L reached").
    /// 0 = derived from the descriptor limit (raised to the hard limit at start): what is
    /// left after the descriptors kept for object files and RocksDB, two per connection.
    #[arg(long, value_name = "N", default_value_t = 0, env = "SHOALD_MAX_CONNECTIONS")]
    max_connections: usize,

    /// Seconds a new connection has to complete its Hello before it is closed.
    #[arg(long, value_name = "SECS", default_value_t = 10, env = "SHOALD_HANDSHAKE_TIMEOUT",
          value_parser = clap::value_parser!(u64).range(1..))]
    handshake_timeout: u64,

    /// Seconds a file removed while a client had it open stays after that client's last
    /// connection to this server closed (a client that died or lost touch: its files are
    /// deleted then). A client that closes the file releases it at once.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, env = "SHOALD_ORPHAN_GRACE")]
    orphan_grace: u64,

    /// Failpoints to arm, for crash tests: `name=action[;name=action…]` with names
    /// `<operation>.<step>.<before|after>` on the steps of operations that span servers
    /// (mkdir, rmdir, rename, link, unlink, set_parent; e.g. `rename.target.after`) and
    /// actions of the `fail` crate, or `return` to die on the spot as `kill -9` would.
    /// See docs/architecture.md, "Failpoints".
    #[arg(long, value_name = "SPEC", env = "FAILPOINTS")]
    failpoints: Option<String>,
    /// Longest lease, in milliseconds, a client may hold on a directory (it then answers
    /// lookups and listings of it from its cache; a change waits for the holders to let go,
    /// at most this long for one that does not answer). 0 grants no leases.
    #[arg(long, value_name = "MS", default_value_t = 5000, env = "SHOALD_LEASE_MAX_MS")]
    lease_max_ms: u64,

    /// Slow this server on purpose: limit its data reads and writes to this many MB/s
    /// (10^6 bytes; a token bucket). A tool for tests and benchmarks of load-aware
    /// placement (docs/architecture.md, "Load-aware placement"), not a quality of service.
    #[arg(long, value_name = "MB_PER_S", env = "SHOALD_THROTTLE", value_parser = parse_throttle)]
    throttle: Option<f64>,

    /// Most MiB per second a resync ships to one mirror: a slot moving to another server
    /// (`shoal server rebalance`, `drain`), a new mirror, a server back after a failure. Lower
    /// keeps more of the foreground I/O's speed while slots move; higher moves them sooner.
    #[arg(long = "resync-mb-s", value_name = "MIB_PER_S", env = "SHOALD_RESYNC_MB_S",
          default_value_t = shoal_server::RESYNC_MIB_PER_S,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    resync_mib_s: u32,

    /// The same while clients read or write file data on this server (within the last
    /// second): recovery yields to them, and runs at `--resync-mb-s` when they are quiet.
    /// Capped at `--resync-mb-s`.
    #[arg(long = "resync-busy-mb-s", value_name = "MIB_PER_S", env = "SHOALD_RESYNC_BUSY_MB_S",
          default_value_t = shoal_server::RESYNC_BUSY_MIB_PER_S,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    resync_busy_mib_s: u32,
}

/// A positive, finite number of MB/s.
fn parse_throttle(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number of MB/s")),
    }
}

fn main() -> ExitCode {
    // Write requests arrive in buffers of their size: reuse them instead of faulting in
    // fresh pages for each.
    shoal_proto::frame::keep_freed_frame_memory();
    // Everything a server creates (metadata store, objects, membership log, certificates)
    // is for it alone: 0600 files in 0700 directories, whatever the caller's umask.
    // SAFETY: umask(2) only sets the process's file-creation mask.
    unsafe { libc::umask(0o077) };
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("SHOAL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let mut builder = match args.threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            if n > 1 {
                b.worker_threads(n);
            }
            b
        }
    };
    let runtime = match builder.enable_all().thread_name("shoald").build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("shoald: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(spec) = &args.failpoints {
        if let Err(e) = shoal_server::configure_failpoints(spec) {
            eprintln!("shoald: {e}");
            return ExitCode::FAILURE;
        }
    }
    let opts = shoal_server::ServerOptions {
        config: args.config,
        id: args.id,
        data_dir: args.data_dir,
        listen: args.listen,
        http_listen: args.http_listen,
        max_connections: args.max_connections,
        handshake_timeout: std::time::Duration::from_secs(args.handshake_timeout),
        orphan_grace: std::time::Duration::from_secs(args.orphan_grace),
        lease_max: std::time::Duration::from_millis(args.lease_max_ms),
        throttle_mb_s: args.throttle,
        resync_mib_s: args.resync_mib_s,
        resync_busy_mib_s: args.resync_busy_mib_s,
    };
    match runtime.block_on(shoal_server::run(opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shoald: {e:#}");
            ExitCode::FAILURE
        }
    }
}
