//! `shoal`: the command line of the Shoal parallel file system.
//!
//! Exit codes: 0 success; 1 the operation failed (a one-line message names the path and the
//! cause); 2 the command line itself was wrong (usage error); `shoal scrub` adds 3 (damage
//! found) and 4 (a server could not be scrubbed); `shoal container` adds 3 (not a readable
//! container).

mod cmd;
mod fmt;
mod job;
mod local_cluster;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "shoal",
    version,
    about = "Shoal parallel file system: manage a cluster and work with its files",
    long_about = "Shoal parallel file system: manage a cluster and work with its files.\n\n\
Paths that name Shoal files are written shoal://dir/file (commands that only take Shoal \
paths also accept /dir/file). The cluster is found through --config, else $SHOAL_CONFIG.\n\n\
Exit status: 0 success, 1 failure (one line on stderr names the path and the cause), 2 usage error \
(`shoal scrub` adds 3 and 4, `shoal container` adds 3, see their --help).",
    after_help = "Start here:\n  shoal cluster up --servers 4 --dir /tmp/shoal\n  export SHOAL_CONFIG=/tmp/shoal/cluster.toml\n  shoal cp -r ./data shoal://data && shoal ls -l shoal://data"
)]
struct Cli {
    /// Cluster configuration file (default: $SHOAL_CONFIG).
    #[arg(long, global = true, env = "SHOAL_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Seconds a request may take before it fails (a down server gives an error, not a hang).
    #[arg(long, global = true, default_value_t = 30, value_name = "SECS")]
    timeout: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start, stop or describe a local cluster of shoald processes.
    #[command(subcommand)]
    Cluster(cmd::cluster::ClusterCmd),
    /// The replicated cluster map: show it, change a server's state or weight.
    #[command(subcommand)]
    Map(cmd::map::MapCmd),
    /// Add, drain or remove a server of a running cluster, move slots between servers, rebalance.
    #[command(subcommand)]
    Server(cmd::server::ServerCmd),
    /// Servers, whether they answer, their capacity, contents and requests served.
    Status(cmd::status::StatusArgs),
    /// The cluster live in the terminal: health, capacity, rates, busiest operations.
    Top(cmd::top::TopArgs),
    /// Capacity and free space of the whole file system.
    Df(cmd::status::DfArgs),
    /// List directory contents.
    Ls(cmd::files::LsArgs),
    /// Show a file's attributes and layout.
    Stat(cmd::files::StatArgs),
    /// Search the metadata of a tree (like find): every server scans the entries it holds at once.
    #[command(
        long_about = "Search the metadata of a tree, like find(1) (docs/find.md). Every server \
scans the directory entries and inodes it holds at the same time and sends back those that match; \
this process names them by their path below PATH and prints them sorted by path. No directory is \
walked: the time is that of the largest server's scan, not of the tree's depth.\n\n\
The tests are find's, written with two dashes, and all must hold: --name, --iname, --type, \
--size, --mtime/--mmin, --atime/--amin, --ctime/--cmin, --user, --group, --perm, plus Shoal's \
--stripe-count, --stripe-size, --xattr NAME[=VALUE] and --read-mostly. --maxdepth and --mindepth \
limit the depth below PATH (PATH itself is depth 0).\n\n\
You see what find run as you would print: entries of directories you may read and search, \
reached from PATH. The answer is not a snapshot of a tree being changed.\n\n\
Exit status: 0 success (also when nothing matched); 1 failure (no such PATH, a server down or too \
old); 2 usage error.",
        after_help = "Examples:\n  shoal find /proj --name '*.h5' --size +1G\n  shoal find /scratch --user alice --mtime +30 --type f --count\n  shoal find /data --xattr user.tag=hot --json"
    )]
    Find(cmd::find::FindArgs),
    /// How much trees hold (like du -s), added up from the usage every server keeps per directory.
    #[command(
        long_about = "How much trees hold, like du -s (docs/du.md): bytes (apparent size, as du \
--apparent-size) and inodes (files, symbolic links and directories, the tree's top included; as \
du --inodes). Every server keeps, per directory, how many inodes it holds in it and their bytes, \
updated in the same step as each change; this command reads those records from every server at \
once and adds up the tree below PATH. No file is visited: the time grows with the number of \
directories, not of files.\n\n\
A file with several hard links counts once, in the directory it was created in or last renamed \
into. You see what du run as you would count: directories you may not read add only themselves, \
and are reported. The answer is not a snapshot of a tree being changed.\n\n\
Exit status: 0 success; 1 failure (no such PATH, a server down or too old) or a directory could \
not be read; 2 usage error.",
        after_help = "Examples:\n  shoal du /proj\n  shoal du -d 1 /scratch/alice\n  shoal du --bytes --json /data /proj -c"
    )]
    Du(cmd::du::DuArgs),
    /// The tuple space: write, read, take and watch tuples of typed values (docs/tuples.md).
    #[command(
        subcommand,
        after_help = "Fields: 42 is an integer, s:42 or any text a string, x:00ff bytes; in templates ? \
matches any value, ?int ?str ?bytes any value of that type. The first field must be a value: it \
places the tuple.\n\nExamples:\n  shoal tuple write ckpt 7 rank-3 done\n  shoal tuple take ckpt 7 ? \
done --wait 30\n  shoal tuple watch ckpt ? ? ? --taken --json\n  shoal tuple files /proj file ? f ? 1000 ? ? ?   \
# files as tuples: (file, path, type, size, uid, gid, mode, mtime)\n\nExit status: 0 success; 1 no tuple \
matched in time (read, take) or a failure; 2 usage error."
    )]
    Tuple(cmd::tuple::TupleCmd),
    /// Follow the changes under a directory as they happen: print them or run a command per event.
    #[command(
        long_about = "Follow the change log under a directory (docs/changes.md): every server logs the namespace and data events it commits (create, mkdir, symlink, link, unlink, rmdir, rename, setattr, xattr, and close of a file that was written), numbered, durably, in the same step as the change. This command reads every server's log at once and prints each event under PATH as it comes, or runs --exec for it.

With --consumer NAME the servers keep the watch's place and the events it has not handled: a watch started again with the same NAME goes on after the last event it printed, with nothing missed or repeated (a watch killed with -9 may see again up to 256 events it handled but had not acknowledged). Events of one server come in order; those of different servers interleave.

You see the events of directories you may read, and of files you own or may read.

Exit status: 0 success (--count reached, --idle passed, or stopped by a signal); 1 failure (no such PATH, not a directory, a server too old); 2 usage error.",
        after_help = "Examples:
  shoal watch /proj/out --events close --match '*.h5'
  shoal watch /proj --events create,unlink,rename --json
  shoal watch /in --events close --exec 'process {}' --consumer ingest
  shoal watch /in --consumer ingest --forget"
    )]
    Watch(cmd::watch::WatchArgs),
    /// Create directories.
    Mkdir(cmd::files::MkdirArgs),
    /// Remove files (and with -r, directories and their contents).
    Rm(cmd::files::RmArgs),
    /// Rename or move a file or directory within Shoal.
    Mv(cmd::files::MvArgs),
    /// Print files to standard output.
    Cat(cmd::files::CatArgs),
    /// Make a symbolic link (-s) or a hard link.
    Ln(cmd::files::LnArgs),
    /// Change permission bits.
    Chmod(cmd::files::ChmodArgs),
    /// Copy between the local file system and Shoal, or within Shoal.
    Cp(cmd::cp::CpArgs),
    /// Copy a remote HTTP(S) file into Shoal, fetched by the servers in parallel byte ranges.
    #[command(long_about = "Copy a remote HTTP(S) file into Shoal (reverse read, docs/import.md). One server \
asks the remote for the file's size and whether it serves byte ranges; then every server of the new \
file's layout fetches the ranges its objects hold, several at once, and writes them in place: the \
bytes go from the remote to the servers that keep them, never through this process. Use -c -1 to \
stripe the file over all servers so that all of them fetch.\n\n\
A remote that does not serve byte ranges (or does not say the file's size) is streamed through \
this process instead, with a note.\n\n\
Exit status: 0 imported; 1 failure (unreachable or refusing remote, the remote file changed \
during the import, a Shoal error); 2 usage error.")]
    Import(cmd::import::ImportArgs),
    /// Send a Shoal file to an HTTP(S) URL with a streamed PUT.
    Export(cmd::import::ExportArgs),
    /// Set the stripe layout of a new file, or the default of a directory (like lfs setstripe).
    Setstripe(cmd::stripe::SetstripeArgs),
    /// Show the stripe layout of a file or the default of a directory (like lfs getstripe).
    Getstripe(cmd::stripe::GetstripeArgs),
    /// Mark files and directories read-mostly (whole-listing and negative caching for
    /// library and module searches), clear the mark, or show it.
    #[command(long_about = "Mark files and directories read-mostly, clear the mark (--off), or show it \
(--show) (docs/loading.md). Clients list a read-mostly directory whole at its first look-up and \
answer every later look-up in it, \"no such name\" included, from that listing while its lease \
holds: a library search over 20 path entries then costs one request per directory, not one per \
name. Files and directories created in a read-mostly directory inherit the mark. A change to a \
marked file is seen by the next open, as for any file.\n\n\
Owner or root only. -r walks the tree below each directory.\n\n\
Exit status: 0 success; 1 failure (no such path, not the owner, a server that predates the \
mark); 2 usage error.")]
    Readmostly(cmd::readmostly::ReadMostlyArgs),
    /// Warm this node's Shoal mount with the files and trees a job is about to open.
    #[command(long_about = "Warm this node's Shoal mount with the files and directory trees a job is \
about to open (docs/loading.md, \"Preload\"): every directory is listed and every file read, \
several at once (-j), through the mount, so that the kernel keeps the pages of read-mostly files \
and the listings of read-mostly directories for the processes that follow. Run it once per node at \
the job's start (mpirun -npernode 1, srun --ntasks-per-node=1).\n\n\
Paths are local paths on the mount; --list FILE names more, one per line (- for standard input). \
Symbolic links are read through, never walked into.\n\n\
Exit status: 0 everything warmed; 1 some path could not be listed or read (each is named); 2 usage \
error (nothing to preload).")]
    Preload(cmd::preload::PreloadArgs),
    /// Mount Shoal as a POSIX file system through FUSE.
    Mount(cmd::mount::MountArgs),
    /// Unmount a Shoal FUSE mount.
    Umount(cmd::mount::UmountArgs),
    /// IOR- and mdtest-style benchmarks on Shoal and on local directories, side by side.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCmd),
    /// Make, rotate or retire the cluster key and host key named by the config's [security] table
    /// (with tls = true there, also the TLS CA and the servers' certificate).
    Keygen(cmd::keygen::KeygenArgs),
    /// Verify every data block and metadata record on the servers, with progress and a report.
    Scrub(cmd::scrub::ScrubArgs),
    /// Make a bearer token for the servers' HTTP service (root on a client host: it reads the host key).
    Token(cmd::token::TokenArgs),
    /// Run the local identity helper (as root): vouches for the uid of unprivileged local clients.
    Identityd(cmd::identityd::IdentitydArgs),
    /// Compute, without servers, how placement spreads directories, partitions, inodes and data
    /// objects over 1 to 100,000 servers, and what a server joining or leaving moves.
    Sim(cmd::sim::SimArgs),
    /// Task-local I/O containers (SIONlib): show their structure, extract or print the tasks'
    /// logical files, rewrite them without gaps.
    #[command(
        subcommand,
        long_about = "Task-local I/O containers (SIONlib, crates/container): many tasks' logical files \
in a few physical files. These commands show a container's structure (dump), extract the tasks' \
logical files into plain files (split), print one task's (cat) and rewrite a container with one \
chunk per task and no gaps (defrag): SIONlib's siondump, sionsplit, sioncat and siondefrag.\n\n\
A container is named as `shoal cp` names files: shoal://dir/name is on Shoal (through --config or \
$SHOAL_CONFIG), anything else is a local path (a local disk, a FUSE mount, another file system; \
no cluster needed). The name is that of its first physical file; the others are name.000001, \
name.000002, ….\n\n\
Exit status: 0 success; 1 failure (a missing container, a file system error); 2 usage error \
(no such rank, an output that would overwrite the container); 3 not a readable container (not \
one, cut short, never closed, or a metadata block that fails its CRC32C; the message names the \
physical file and the block). docs/container-tools.md has the details, docs/container-format.md \
the format."
    )]
    Container(cmd::container::ContainerCmd),
    /// Per-job formations: one shoald per node of a Slurm or MPI job on node-local storage,
    /// with parallel stage-in and stage-out (run by every rank; docs/job.md).
    #[command(subcommand)]
    Job(cmd::job::JobCmd),
    /// Shoal's main job: start a 4-server cluster, write, stripe, list and read back files, print a summary.
    Demo(cmd::demo::DemoArgs),
}

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`shoal ls | head`), as other Unix tools do, instead of
    // panicking in println!.
    // SAFETY: restoring the default disposition of a signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Reuse I/O buffers instead of faulting in fresh pages for each (client, mount, bench).
    shoal_proto::frame::keep_freed_frame_memory();
    let cli = Cli::parse();
    let ctx = cmd::Ctx { config: cli.config.clone(), timeout: std::time::Duration::from_secs(cli.timeout.max(1)) };
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("shoal: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = rt.block_on(async move {
        match cli.command {
            Command::Cluster(c) => cmd::cluster::run(&ctx, c).await,
            Command::Status(a) => cmd::status::status(&ctx, a).await,
            Command::Map(c) => cmd::map::run(&ctx, c).await,
            Command::Server(c) => cmd::server::run(&ctx, c).await,
            Command::Df(a) => cmd::status::df(&ctx, a).await,
            Command::Top(a) => cmd::top::top(&ctx, a).await,
            Command::Ls(a) => cmd::files::ls(&ctx, a).await,
            Command::Stat(a) => cmd::files::stat(&ctx, a).await,
            Command::Mkdir(a) => cmd::files::mkdir(&ctx, a).await,
            Command::Rm(a) => cmd::files::rm(&ctx, a).await,
            Command::Mv(a) => cmd::files::mv(&ctx, a).await,
            Command::Cat(a) => cmd::files::cat(&ctx, a).await,
            Command::Ln(a) => cmd::files::ln(&ctx, a).await,
            Command::Chmod(a) => cmd::files::chmod(&ctx, a).await,
            Command::Cp(a) => cmd::cp::cp(&ctx, a).await,
            Command::Import(a) => cmd::import::import(&ctx, a).await,
            Command::Export(a) => cmd::import::export(&ctx, a).await,
            Command::Setstripe(a) => cmd::stripe::setstripe(&ctx, a).await,
            Command::Getstripe(a) => cmd::stripe::getstripe(&ctx, a).await,
            Command::Keygen(a) => cmd::keygen::keygen(&ctx, a),
            Command::Token(a) => cmd::token::token(&ctx, a),
            Command::Identityd(a) => cmd::identityd::identityd(&ctx, a).await,
            Command::Demo(a) => cmd::demo::demo(&ctx, a).await,
            Command::Readmostly(a) => cmd::readmostly::readmostly(&ctx, a).await,
            Command::Find(a) => cmd::find::find(&ctx, a).await,
            Command::Du(a) => cmd::du::du(&ctx, a).await,
            Command::Tuple(c) => cmd::tuple::run(&ctx, c).await,
            Command::Watch(a) => cmd::watch::run(&ctx, a).await,
            Command::Preload(a) => cmd::preload::preload(a).await,
            Command::Mount(a) => cmd::mount::mount(&ctx, a).await,
            Command::Umount(a) => cmd::mount::umount(&ctx, a).await,
            Command::Bench(c) => cmd::bench::run(&ctx, c).await,
            Command::Scrub(a) => cmd::scrub::scrub(&ctx, a).await,
            Command::Container(c) => cmd::container::run(&ctx, c).await,
            Command::Sim(a) => cmd::sim::sim(a),
            Command::Job(c) => cmd::job::run(&ctx, c).await,
        }
    });
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the context chain joined, cause last. The CLI's own context already
            // names the operation and path ("cannot stat /x"), so a client error adds only
            // its cause, not its own "stat /x" again.
            let msg = one_line(&e);
            eprintln!("shoal: {msg}");
            if let Some(code) = e.downcast_ref::<cmd::UsageError>() {
                let _ = code;
                return ExitCode::from(2);
            }
            if let Some(exit) = e.downcast_ref::<cmd::Exit>() {
                return ExitCode::from(exit.code);
            }
            ExitCode::from(1)
        }
    }
}

/// An error as one line: the context chain joined, cause last. When a client error's own
/// context starts with the operation and the path the CLI's context already names
/// ("cannot stat /x" around "stat /x: No such file…"), that part is said once.
fn one_line(e: &anyhow::Error) -> String {
    let full = format!("{e:#}").replace('\n', " ");
    let Some(ce) = e.downcast_ref::<shoal_client::Error>() else { return full };
    let outer: Vec<String> =
        e.chain().take_while(|c| c.downcast_ref::<shoal_client::Error>().is_none()).map(|c| c.to_string()).collect();
    let outer = outer.join(": ");
    let first = ce.context.split(": ").next().unwrap_or("");
    match first.split_once(' ') {
        Some((_, target)) if !outer.is_empty() && outer.contains(target) => {
            format!("{outer}: {}", ce.cause()).replace('\n', " ")
        }
        _ => full,
    }
}
