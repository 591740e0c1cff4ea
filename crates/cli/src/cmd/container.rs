//! `shoal container dump | split | cat | defrag`: SIONlib's siondump, sionsplit, sioncat and
//! siondefrag, for the task-local I/O containers of `shoal-container` (docs/container-tools.md;
//! the format is docs/container-format.md).
//!
//! A container (and split's OUTDIR, defrag's NEWNAME) is named as `shoal cp` names files:
//! `shoal://dir/name` is on Shoal, reached through the cluster configuration; anything else is
//! a local path (any POSIX directory: a local disk, a FUSE mount, another parallel file
//! system), which needs no cluster. The name is that of the container's first physical file;
//! the others are `name.000001`, `name.000002`, ….
//!
//! Every command first reads the whole metadata (`Container::open` reads and checks each
//! physical file's header, tail and trailer, with their CRC32C), so a damaged container is
//! refused before any data is read or written. Data is then read from the chunks each task's
//! `Location` names, through one open handle per physical file (`Container::reader` would
//! open the physical file again for every task: 100,000 opens for 100,000 tasks), in pieces
//! of at most [`PIECE`] bytes with several in flight.

use super::{shoal_path, usage, Ctx, Exit};
use crate::fmt::{human_bytes, parse_size};
use anyhow::{anyhow, Context, Result};
use clap::{Args, Subcommand};
use futures::{Stream, StreamExt, TryStreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use shoal_client::Client;
use shoal_container::format::{FLAG_COALESCED, FLAG_KEY_VALUE, FORMAT_VERSION};
use shoal_container::meta::physical_name;
use shoal_container::store::PhysFile;
use shoal_container::{Container, SerialWriter, Target, WriteOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Exit status when the container is not readable as one: not a container, cut short, never
/// closed, or a metadata block whose checksum or contents are wrong.
pub const EXIT_DAMAGED: u8 = 3;
/// Largest read (and write) of data: big enough to keep a stripe's servers busy, small enough
/// that several in flight stay within a few tens of MiB.
const PIECE: u64 = 8 << 20;
/// Pieces read ahead of the one being written, for `cat` and `defrag` (which write in order).
const READ_AHEAD: usize = 8;
/// `split`: output files written at once, and pieces read ahead within each.
const SPLIT_FILES: usize = 8;
const SPLIT_READ_AHEAD: usize = 2;
/// Rows of the per-task table `dump` prints without `--tasks`.
const TASK_ROWS: u64 = 32;
/// Progress bars from this many bytes of data, or this many tasks, on.
const BAR_BYTES: u64 = 32 << 20;
const BAR_TASKS: u64 = 10_000;

#[derive(Subcommand)]
pub enum ContainerCmd {
    /// Show a container's structure: format, physical files and, per task, its chunks and how
    /// full they are (siondump).
    #[command(
        after_help = "Examples:\n  shoal container dump ./ckpt\n  shoal container dump --tasks shoal://runs/ckpt\n  \
shoal container dump --json shoal://runs/ckpt | jq '.tasks[] | select(.fill_percent < 50)'"
    )]
    Dump(DumpArgs),
    /// Extract every task's logical file, or one task's, into plain files OUTDIR/NAME.RANK
    /// (sionsplit).
    #[command(
        long_about = "Extract every task's logical file, or one task's (--rank), into plain files \
OUTDIR/PREFIX.RANK: PREFIX is the container's file name (or --prefix), RANK the task's rank in \
decimal without padding (ckpt.0, ckpt.1, …, ckpt.12). OUTDIR is made if missing; existing files \
are replaced. A task that wrote nothing gives an empty file.",
        after_help = "Examples:\n  shoal container split ./ckpt ./ckpt.d\n  shoal container split shoal://runs/ckpt ./out --rank 17"
    )]
    Split(SplitArgs),
    /// Write one task's logical file to standard output (sioncat).
    #[command(after_help = "Example:\n  shoal container cat shoal://runs/ckpt --rank 3 | od -A d -t x1 | head")]
    Cat(CatArgs),
    /// Rewrite a container with one chunk per task, sized to its data (rounded up to the block
    /// size), and no gaps (siondefrag).
    #[command(
        long_about = "Rewrite a container as NEWNAME with one chunk per task, sized to the task's data \
rounded up to the block size, and no gaps: every logical file is copied byte for byte. The new \
container keeps the number of physical files (--files changes it), the block size when NEWNAME \
is on the same kind of target as NAME (both local or both on Shoal; else the destination's own, \
--block-size sets it), the key-value mode and the collector groups of coalescing I/O (whose chunks \
are packed, sized to the data without rounding). A task that wrote nothing still gets one block \
(the format has no empty chunks). NEWNAME may be on the other kind of target: defrag also \
copies a container between Shoal and a local directory.",
        after_help = "Examples:\n  shoal container defrag ./ckpt ./ckpt.packed\n  shoal container defrag shoal://runs/ckpt ./ckpt --block-size 4K"
    )]
    Defrag(DefragArgs),
}

#[derive(Args)]
pub struct DumpArgs {
    /// The container: a local path, or shoal://dir/name.
    name: String,
    /// List every task (without it, the first 32 only).
    #[arg(long)]
    tasks: bool,
    /// Print JSON instead of tables (the same rows, every field).
    #[arg(long)]
    json: bool,
    /// Sizes in K/M/G instead of bytes (tables only).
    #[arg(short = 'H', long = "human")]
    human: bool,
}

#[derive(Args)]
pub struct SplitArgs {
    /// The container: a local path, or shoal://dir/name.
    name: String,
    /// Directory for the extracted files: a local path, or shoal://dir.
    outdir: String,
    /// Only this task's logical file.
    #[arg(short = 'r', long, value_name = "R")]
    rank: Option<u64>,
    /// Name the files PREFIX.RANK instead of NAME.RANK (NAME: the container's file name).
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,
    /// Never show a progress bar.
    #[arg(short = 'q', long)]
    quiet: bool,
}

#[derive(Args)]
pub struct CatArgs {
    /// The container: a local path, or shoal://dir/name.
    name: String,
    /// The task whose logical file to print.
    #[arg(short = 'r', long, value_name = "R")]
    rank: u64,
}

#[derive(Args)]
pub struct DefragArgs {
    /// The container: a local path, or shoal://dir/name.
    name: String,
    /// The new container: a local path, or shoal://dir/name (replaced if it exists).
    newname: String,
    /// Physical files of the new container (default: as many as NAME has).
    #[arg(long, value_name = "N")]
    files: Option<u32>,
    /// Block size to align chunks to (a multiple of 512; on Shoal the stripe size, a multiple
    /// of 4K).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    block_size: Option<u64>,
    /// No progress bar and no summary line.
    #[arg(short = 'q', long)]
    quiet: bool,
}

pub async fn run(ctx: &Ctx, c: ContainerCmd) -> Result<()> {
    let mut targets = Targets { ctx, client: None };
    match c {
        ContainerCmd::Dump(a) => dump(&mut targets, a).await,
        ContainerCmd::Split(a) => split(&mut targets, a).await,
        ContainerCmd::Cat(a) => cat(&mut targets, a).await,
        ContainerCmd::Defrag(a) => defrag(&mut targets, a).await,
    }
}

/// Where a container or an output lives: `shoal://…` on Shoal (the path inside Shoal),
/// anything else on the local file system.
#[derive(Clone, Debug)]
enum Place {
    Local(String),
    Shoal(String),
}

impl Place {
    fn parse(s: &str) -> Place {
        match shoal_path(s) {
            Some(p) => Place::Shoal(p),
            None => Place::Local(s.to_string()),
        }
    }

    fn path(&self) -> &str {
        match self {
            Place::Local(p) | Place::Shoal(p) => p,
        }
    }

    fn is_shoal(&self) -> bool {
        matches!(self, Place::Shoal(_))
    }

    /// `p`, a path on the same side, as the user writes it.
    fn show_path(&self, p: &str) -> String {
        match self {
            Place::Local(_) => p.to_string(),
            Place::Shoal(_) => format!("shoal:/{p}"),
        }
    }

    fn show(&self) -> String {
        self.show_path(self.path())
    }

    fn join(&self, name: &str) -> Place {
        match self {
            Place::Local(d) => Place::Local(Path::new(d).join(name).to_string_lossy().into_owned()),
            Place::Shoal(d) => Place::Shoal(format!("{}/{name}", d.trim_end_matches('/'))),
        }
    }

    /// The last component of the path (a container's own name, without its directory).
    fn file_name(&self) -> String {
        self.path().trim_end_matches('/').rsplit('/').next().unwrap_or("").to_string()
    }

    /// A key under which two spellings of one path compare equal (to refuse writing over the
    /// container being read): the canonical path of a local file (of its directory when it
    /// does not exist yet), a Shoal path without empty and `.` components.
    fn identity(&self, p: &str) -> String {
        match self {
            Place::Local(_) => {
                let path = Path::new(p);
                let canon = std::fs::canonicalize(path).ok().or_else(|| {
                    let parent = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
                    Some(std::fs::canonicalize(parent).ok()?.join(path.file_name()?))
                });
                format!("local:{}", canon.unwrap_or_else(|| PathBuf::from(p)).display())
            }
            Place::Shoal(_) => {
                let parts: Vec<&str> = p.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
                format!("shoal:/{}", parts.join("/"))
            }
        }
    }
}

/// The client, made on first use: commands on local containers need no cluster configuration.
struct Targets<'a> {
    ctx: &'a Ctx,
    client: Option<Client>,
}

impl Targets<'_> {
    fn client(&mut self) -> Result<Client> {
        if self.client.is_none() {
            self.client = Some(self.ctx.client()?);
        }
        Ok(self.client.clone().expect("made above"))
    }

    fn of(&mut self, p: &Place) -> Result<Target> {
        Ok(match p {
            Place::Local(_) => Target::Posix,
            Place::Shoal(_) => Target::Shoal(self.client()?),
        })
    }
}

/// A library error as the command reports it: a damaged container exits with
/// [`EXIT_DAMAGED`], a call the container cannot answer (no such rank, bad option) is a usage
/// error, anything else (the file system's errors) a failure. Paths are shown as the user
/// writes them.
fn lib_err(e: shoal_container::Error, at: &Place) -> anyhow::Error {
    use shoal_container::Error as E;
    match e {
        E::Corrupt { path, what } => {
            Exit::new(EXIT_DAMAGED, format!("{}: not a readable container: {what}", at.show_path(&path))).into()
        }
        E::Io { path, errno, message } => anyhow!("{}: {}", at.show_path(&path), io_text(&path, errno, &message)),
        E::Usage(m) => usage(m),
        E::Comm(m) => anyhow!(m),
    }
}

/// The cause of an I/O error without what the message already shares with its path: the
/// client's "open /c: No such file…" after "/c:", or the OS's " (os error 2)".
fn io_text(path: &str, errno: i32, message: &str) -> String {
    let m = message.strip_suffix(&format!(" (os error {errno})")).unwrap_or(message);
    match m.split_once(": ") {
        Some((head, rest)) if head.ends_with(path) => rest.to_string(),
        _ => m.to_string(),
    }
}

/// A span of one task's data in one physical file.
#[derive(Clone, Copy, Debug)]
struct Piece {
    rank: u64,
    file: u32,
    /// Its chunk (block number) and where it starts in the physical file.
    chunk: u64,
    at: u64,
    len: u64,
}

/// An open container: its metadata, checked, and one read handle per physical file.
struct Source {
    place: Place,
    c: Container,
    files: Vec<PhysFile>,
}

impl Source {
    async fn open(targets: &mut Targets<'_>, name: &str) -> Result<Source> {
        let place = Place::parse(name);
        let target = targets.of(&place)?;
        let c = Container::open(&target, place.path()).await.map_err(|e| lib_err(e, &place))?;
        let mut files = Vec::with_capacity(c.files().len());
        for m in c.files() {
            files.push(PhysFile::open(&target, &m.path, false).await.map_err(|e| lib_err(e, &place))?);
        }
        Ok(Source { place, c, files })
    }

    fn check_rank(&self, r: u64) -> Result<()> {
        let n = self.c.ntasks();
        if r >= n {
            let ranks = if n == 0 { String::new() } else { format!(", ranks 0 to {}", n - 1) };
            return Err(usage(format!("{}: no rank {r} (the container holds {n} tasks{ranks})", self.place.show())));
        }
        Ok(())
    }

    /// Bytes of task `r`'s logical file.
    fn bytes_of(&self, r: u64) -> Result<u64> {
        Ok(self.c.location(r).map_err(|e| lib_err(e, &self.place))?.used.iter().sum())
    }

    /// Task `r`'s data, chunk by chunk, cut into pieces of at most [`PIECE`] bytes.
    fn pieces_of(&self, r: u64) -> Result<Vec<Piece>> {
        let loc = self.c.location(r).map_err(|e| lib_err(e, &self.place))?;
        let mut v = Vec::new();
        for (chunk, (&start, &used)) in loc.chunk_starts.iter().zip(&loc.used).enumerate() {
            let mut off = 0;
            while off < used {
                let len = (used - off).min(PIECE);
                v.push(Piece { rank: r, file: loc.file_number, chunk: chunk as u64, at: start + off, len });
                off += len;
            }
        }
        Ok(v)
    }

    async fn read_piece(&self, p: Piece) -> Result<(Piece, Vec<u8>)> {
        let file = &self.files[p.file as usize];
        let data = file.read_at(p.at, p.len as usize).await.map_err(|e| lib_err(e, &self.place))?;
        if (data.len() as u64) < p.len {
            // The metadata checks rule this out for a file that stays as it was opened (the
            // tail sits after the last block); one cut short while it is read gets here.
            return Err(Exit::new(
                EXIT_DAMAGED,
                format!(
                    "{}: not a readable container: chunk {} of rank {} ends at byte {} of the file, before the {} bytes the tail says it holds (the file is cut short)",
                    self.place.show_path(file.path()),
                    p.chunk,
                    p.rank,
                    p.at + data.len() as u64,
                    p.len
                ),
            )
            .into());
        }
        Ok((p, data))
    }

    /// The data of `ranks`, in order, piece by piece, with `ahead` reads in flight.
    fn data<'a>(
        &'a self,
        ranks: impl Iterator<Item = u64> + 'a,
        ahead: usize,
    ) -> impl Stream<Item = Result<(Piece, Vec<u8>)>> + 'a {
        let pieces = ranks
            .flat_map(move |r| self.pieces_of(r).map_or_else(|e| vec![Err(e)], |v| v.into_iter().map(Ok).collect()));
        futures::stream::iter(pieces).map(move |p| async move { self.read_piece(p?).await }).buffered(ahead)
    }
}

/// A progress bar over `total` bytes of `ntasks` tasks, hidden for small containers (and by
/// indicatif when stderr is not a terminal).
fn bar(total: u64, ntasks: u64, quiet: bool) -> ProgressBar {
    if quiet || (total < BAR_BYTES && ntasks < BAR_TASKS) {
        return ProgressBar::hidden();
    }
    ProgressBar::new(total).with_style(
        ProgressStyle::with_template(
            "{spinner} {wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    )
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (part as f64 * 1000.0 / whole as f64).round() / 10.0
    }
}

/// The header's flags by name: "0x0 (plain)", "0x3 (key-value, coalesced in groups of 4)".
fn flags_text(flags: u32, collector_size: u32) -> String {
    let mut names = Vec::new();
    if flags & FLAG_KEY_VALUE != 0 {
        names.push("key-value".to_string());
    }
    if flags & FLAG_COALESCED != 0 {
        names.push(format!("coalesced in groups of {collector_size}"));
    }
    let unknown = flags & !(FLAG_KEY_VALUE | FLAG_COALESCED);
    if unknown != 0 {
        names.push(format!("unknown {unknown:#x}"));
    }
    if names.is_empty() {
        names.push("plain".into());
    }
    format!("{flags:#x} ({})", names.join(", "))
}

/// One row of the per-task table.
struct TaskRow {
    rank: u64,
    file: u32,
    chunk_size: u64,
    chunk_starts: Vec<u64>,
    used: Vec<u64>,
}

impl TaskRow {
    fn bytes(&self) -> u64 {
        self.used.iter().sum()
    }

    /// Of the chunks the task reached.
    fn fill(&self) -> f64 {
        percent(self.bytes(), self.used.len() as u64 * self.chunk_size)
    }
}

async fn dump(targets: &mut Targets<'_>, a: DumpArgs) -> Result<()> {
    let src = Source::open(targets, &a.name).await?;
    let c = &src.c;
    let n = c.ntasks();
    let listed = if a.tasks { n } else { n.min(TASK_ROWS) };
    let mut rows = Vec::with_capacity(listed as usize);
    for r in 0..listed {
        let loc = c.location(r).map_err(|e| lib_err(e, &src.place))?;
        rows.push(TaskRow {
            rank: r,
            file: loc.file_number,
            chunk_size: loc.chunk_len,
            chunk_starts: loc.chunk_starts,
            used: loc.used,
        });
    }
    let file_data: Vec<u64> = c.files().iter().map(|m| m.tail.used.iter().flatten().sum()).collect();
    let data: u64 = file_data.iter().sum();
    let on_disk: u64 = c.files().iter().map(|m| m.len).sum();
    let (flags, collector_size) = (c.files()[0].header.flags, c.files()[0].header.collector_size);

    if a.json {
        let files: Vec<serde_json::Value> = c
            .files()
            .iter()
            .zip(&file_data)
            .map(|(m, &d)| {
                let h = &m.header;
                serde_json::json!({
                    "number": h.file_number, "path": src.place.show_path(&m.path), "size": m.len,
                    "tasks": h.tasks.len(), "first_rank": h.tasks.first().map(|t| t.rank),
                    "block_size": h.fs_block, "block_len": h.block_len, "data_start": h.data_start,
                    "blocks": m.tail.nblocks, "data_bytes": d,
                    "fill_percent": percent(d, m.tail.nblocks * h.block_len),
                })
            })
            .collect();
        let tasks: Vec<serde_json::Value> = rows
            .iter()
            .map(|t| {
                serde_json::json!({
                    "rank": t.rank, "file": t.file, "chunk_size": t.chunk_size, "chunks": t.used.len(),
                    "bytes": t.bytes(), "fill_percent": t.fill(),
                    "chunk_offsets": t.chunk_starts, "chunk_bytes": t.used,
                })
            })
            .collect();
        let out = serde_json::json!({
            "container": src.place.show(),
            "target": if src.place.is_shoal() { "shoal" } else { "local" },
            "format_version": FORMAT_VERSION,
            "byte_order": "little-endian",
            "flags": flags, "key_value": flags & FLAG_KEY_VALUE != 0, "coalesced": flags & FLAG_COALESCED != 0,
            "collector_size": collector_size,
            "ntasks": n, "nfiles": c.nfiles(),
            "data_bytes": data, "file_bytes": on_disk, "fill_percent": percent(data, on_disk),
            "files": files,
            "tasks": tasks, "tasks_omitted": n - listed,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }

    let size = |v: u64| if a.human { human_bytes(v) } else { v.to_string() };
    let amount = |v: u64| if a.human { human_bytes(v) } else { format!("{v} bytes") };
    let mut out = String::new();
    use std::fmt::Write as _;
    writeln!(out, "container   {}", src.place.show())?;
    writeln!(out, "format      version {FORMAT_VERSION} (little-endian, CRC32C on each metadata block)")?;
    writeln!(out, "flags       {}", flags_text(flags, collector_size))?;
    writeln!(out, "tasks       {n}")?;
    writeln!(out, "files       {}", c.nfiles())?;
    writeln!(
        out,
        "data        {} in logical files, {} in physical files ({:.1}% data)",
        amount(data),
        amount(on_disk),
        percent(data, on_disk)
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:>4} {:>12} {:>7} {:>10} {:>12} {:>7} {:>6}  path",
        "file", "size", "tasks", "block size", "block len", "blocks", "fill%"
    )?;
    for (m, &d) in c.files().iter().zip(&file_data) {
        let h = &m.header;
        writeln!(
            out,
            "{:>4} {:>12} {:>7} {:>10} {:>12} {:>7} {:>6.1}  {}",
            h.file_number,
            size(m.len),
            h.tasks.len(),
            size(h.fs_block),
            size(h.block_len),
            m.tail.nblocks,
            percent(d, m.tail.nblocks * h.block_len),
            src.place.show_path(&m.path)
        )?;
    }
    writeln!(out)?;
    writeln!(out, "{:>8} {:>4} {:>10} {:>7} {:>12} {:>6}", "rank", "file", "chunk size", "chunks", "bytes", "fill%")?;
    for t in &rows {
        writeln!(
            out,
            "{:>8} {:>4} {:>10} {:>7} {:>12} {:>6.1}",
            t.rank,
            t.file,
            size(t.chunk_size),
            t.used.len(),
            size(t.bytes()),
            t.fill()
        )?;
    }
    if listed < n {
        writeln!(out, "({} more tasks: --tasks lists them all)", n - listed)?;
    }
    std::io::stdout().lock().write_all(out.as_bytes())?;
    Ok(())
}

/// An output file of `split`, local or on Shoal.
enum Sink {
    Local(std::fs::File),
    Shoal(shoal_client::File),
}

impl Sink {
    async fn create(client: Option<&Client>, out: &Place) -> Result<Sink> {
        Ok(match (out, client) {
            (Place::Local(p), _) => {
                Sink::Local(std::fs::File::create(p).with_context(|| format!("cannot create {p}"))?)
            }
            (Place::Shoal(p), Some(c)) => Sink::Shoal(
                c.create(p, 0o644, None).await.map_err(|e| anyhow!("cannot create {}: {}", out.show(), e.cause()))?,
            ),
            (Place::Shoal(_), None) => unreachable!("a Shoal output comes with a client"),
        })
    }

    async fn write_at(&self, off: u64, data: &[u8], out: &Place) -> Result<()> {
        match self {
            Sink::Local(f) => std::os::unix::fs::FileExt::write_all_at(f, data, off)
                .with_context(|| format!("cannot write {}", out.show())),
            Sink::Shoal(f) => {
                f.write_at(off, data).await.map_err(|e| anyhow!("cannot write {}: {}", out.show(), e.cause()))?;
                Ok(())
            }
        }
    }

    async fn close(self, out: &Place) -> Result<()> {
        match self {
            Sink::Local(_) => Ok(()),
            Sink::Shoal(f) => f.close().await.map_err(|e| anyhow!("cannot write {}: {}", out.show(), e.cause())),
        }
    }
}

async fn split(targets: &mut Targets<'_>, a: SplitArgs) -> Result<()> {
    let src = Source::open(targets, &a.name).await?;
    let outdir = Place::parse(&a.outdir);
    let prefix = a.prefix.clone().unwrap_or_else(|| src.place.file_name());
    if prefix.is_empty() || prefix.contains('/') {
        return Err(usage(format!("{prefix:?} cannot name files in {}", outdir.show())));
    }
    let ranks: Vec<u64> = match a.rank {
        Some(r) => {
            src.check_rank(r)?;
            vec![r]
        }
        None => (0..src.c.ntasks()).collect(),
    };
    // Never write over the container being read (an OUTDIR that is the container's own
    // directory with the default prefix names ckpt.1, ckpt.2, … next to ckpt.000001, …).
    let out_of = |r: u64| outdir.join(&format!("{prefix}.{r}"));
    if outdir.is_shoal() == src.place.is_shoal() {
        let inputs: std::collections::HashSet<String> =
            src.c.files().iter().map(|m| src.place.identity(&m.path)).collect();
        if let Some(r) = ranks.iter().find(|&&r| inputs.contains(&outdir.identity(out_of(r).path()))) {
            return Err(usage(format!(
                "{} is a physical file of the container: choose another OUTDIR or --prefix",
                out_of(*r).show()
            )));
        }
    }
    let client = if outdir.is_shoal() { Some(targets.client()?) } else { None };
    match (&outdir, &client) {
        (Place::Local(d), _) => std::fs::create_dir_all(d).with_context(|| format!("cannot create directory {d}"))?,
        (Place::Shoal(d), Some(c)) => {
            c.mkdir_all(d, 0o755)
                .await
                .map_err(|e| anyhow!("cannot create directory {}: {}", outdir.show(), e.cause()))?;
        }
        (Place::Shoal(_), None) => unreachable!("made above"),
    }

    let mut total = 0;
    for &r in &ranks {
        total += src.bytes_of(r)?;
    }
    let bar = bar(total, ranks.len() as u64, a.quiet);
    let done = std::sync::atomic::AtomicU64::new(0);
    let nranks = ranks.len();
    let one = |r: u64| {
        let (src, bar, client, done) = (&src, &bar, client.as_ref(), &done);
        let out = out_of(r);
        async move {
            let sink = Sink::create(client, &out).await?;
            let mut off = 0;
            let mut data = std::pin::pin!(src.data(std::iter::once(r), SPLIT_READ_AHEAD));
            while let Some(piece) = data.next().await {
                let (_, bytes) = piece?;
                sink.write_at(off, &bytes, &out).await?;
                off += bytes.len() as u64;
                bar.inc(bytes.len() as u64);
            }
            sink.close(&out).await?;
            let d = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            bar.set_message(format!("{d}/{nranks} files"));
            Ok::<(), anyhow::Error>(())
        }
    };
    let result =
        futures::stream::iter(ranks.iter().copied()).map(one).buffer_unordered(SPLIT_FILES).try_collect::<()>().await;
    bar.finish_and_clear();
    result
}

async fn cat(targets: &mut Targets<'_>, a: CatArgs) -> Result<()> {
    let src = Source::open(targets, &a.name).await?;
    src.check_rank(a.rank)?;
    let mut data = std::pin::pin!(src.data(std::iter::once(a.rank), READ_AHEAD));
    let mut stdout = std::io::stdout().lock();
    while let Some(piece) = data.next().await {
        stdout.write_all(&piece?.1).context("cannot write to standard output")?;
    }
    stdout.flush().context("cannot write to standard output")
}

async fn defrag(targets: &mut Targets<'_>, a: DefragArgs) -> Result<()> {
    let src = Source::open(targets, &a.name).await?;
    let dst = Place::parse(&a.newname);
    let n = src.c.ntasks();
    if n == 0 {
        return Err(usage(format!("{} holds no tasks: nothing to defragment", src.place.show())));
    }
    let nfiles = a.files.unwrap_or(src.c.nfiles());
    if nfiles == 0 || nfiles as u64 > n {
        return Err(usage(format!("--files {nfiles}: a container of {n} tasks has 1 to {n} physical files")));
    }
    // Creating NEWNAME truncates its physical files: none may be one of NAME's.
    if dst.is_shoal() == src.place.is_shoal() {
        let inputs: std::collections::HashSet<String> =
            src.c.files().iter().map(|m| src.place.identity(&m.path)).collect();
        for f in 0..nfiles {
            let p = physical_name(dst.path(), f);
            if inputs.contains(&dst.identity(&p)) {
                return Err(usage(format!(
                    "{} is a physical file of {}: defrag writes a new container, give it another name",
                    dst.show_path(&p),
                    src.place.show()
                )));
            }
        }
    }
    let first = &src.c.files()[0].header;
    let fs_block = a.block_size.unwrap_or(if dst.is_shoal() == src.place.is_shoal() { first.fs_block } else { 0 });
    let key_value = first.flags & FLAG_KEY_VALUE != 0;
    // Coalesced containers keep their collector groups: their chunks stay packed (sized to
    // the data, not to the block), which is what defragmenting aims at anyway.
    let collector_size = first.collector_size;
    // One chunk per task, of its data (the library rounds it up to the block size and refuses
    // empty chunks, so a task without data gets the smallest: one block).
    let mut sizes = Vec::with_capacity(n as usize);
    for r in 0..n {
        sizes.push(src.bytes_of(r)?);
    }
    let total: u64 = sizes.iter().sum();
    let chunk_sizes: Vec<u64> = sizes.iter().map(|&s| s.max(1)).collect();
    let opts = WriteOptions { nfiles, fs_block, key_value, collector_size, ..WriteOptions::default() };
    let target = targets.of(&dst)?;
    let mut w = SerialWriter::create(&target, dst.path(), &chunk_sizes, &opts).await.map_err(|e| lib_err(e, &dst))?;

    let bar = bar(total, n, a.quiet);
    let mut data = std::pin::pin!(src.data(0..n, READ_AHEAD));
    while let Some(piece) = data.next().await {
        let (p, bytes) = piece?;
        w.task(p.rank).map_err(|e| lib_err(e, &dst))?.write(&bytes).await.map_err(|e| lib_err(e, &dst))?;
        bar.inc(bytes.len() as u64);
        bar.set_message(format!("task {}/{n}", p.rank + 1));
    }
    w.close().await.map_err(|e| lib_err(e, &dst))?;
    bar.finish_and_clear();

    // Read the new container back: its metadata must check, and it says how large it is.
    let new = Container::open(&target, dst.path()).await.map_err(|e| lib_err(e, &dst))?;
    if !a.quiet {
        let before: u64 = src.c.files().iter().map(|m| m.len).sum();
        let after: u64 = new.files().iter().map(|m| m.len).sum();
        println!(
            "{} -> {}: {n} tasks, {total} bytes of data; physical files {before} -> {after} bytes",
            src.place.show(),
            dst.show()
        );
    }
    Ok(())
}
