//! What a benchmark run is: the target it runs on and the workload (IOR or mdtest pattern),
//! in a form that travels to the worker processes as JSON.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use shoal_proto::msg::BATCH_MAX;
use std::fmt;
use std::path::PathBuf;

/// Where a benchmark runs. The same workload code runs on every kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetSpec {
    pub kind: TargetKind,
    /// Operations in flight per process: async calls for the native client, threads for
    /// POSIX targets. `None`: the workload's `--in-flight` (default 1, mdtest/IOR semantics).
    pub in_flight: Option<usize>,
    /// Native client, mdtest: operations sent per request (`Client::create_many_at`,
    /// `lookup_many`, `unlink_many_at`): the create (empty files), stat and unlink phases
    /// send B operations in one batch request, and each of the `in_flight` slots has one
    /// batch in flight. `None`: one operation per request.
    #[serde(default)]
    pub batch: Option<usize>,
    /// Tells apart targets of one kind in one run (`native:r1` and `native:r2`, two
    /// clusters compared): set by [`disambiguate`] when labels would collide, so that
    /// tables and medians keep them apart.
    #[serde(default)]
    pub tag: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetKind {
    /// The native client (`shoal-client`) on the cluster of this configuration file; the
    /// benchmark works under `base` (a Shoal path).
    Native { config: PathBuf, base: String },
    /// A directory reached through the kernel (`std::fs`): a local disk, tmpfs or any other
    /// mount. `role` only names it in reports and decides which baseline it is.
    Posix { dir: PathBuf, role: PosixRole },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PosixRole {
    /// A Shoal FUSE mount: POSIX calls, and the servers' counters are read around each phase.
    Fuse,
    /// A Shoal FUSE mount used through the interception library: the same POSIX calls from
    /// workers started with `LD_PRELOAD` of `libshoal_preload.so` (docs/preload.md), which
    /// serves them with the native client in-process; counters as for `Fuse`.
    Preload,
    /// A plain directory on a local disk: the baseline for data.
    Local,
    /// A tmpfs directory (/dev/shm): the baseline for metadata.
    Tmpfs,
    /// Any other directory.
    Other,
}

impl TargetSpec {
    /// Parse a target as written on the command line:
    ///
    /// * `native` or `native:CONFIG` — the native client (`CONFIG` defaults to `--config`);
    /// * `fuse:DIR` — a Shoal FUSE mount (POSIX calls plus the servers' counters);
    /// * `preload:DIR` — the same mount with the workers' calls served by the interception
    ///   library (`LD_PRELOAD`, docs/preload.md);
    /// * `local` or `local:DIR` — a local directory (default: the system temp dir);
    /// * `tmpfs` or `tmpfs:DIR` — a tmpfs directory (default /dev/shm);
    /// * `posix:DIR` or just `DIR` (starting with `/` or `.`) — any directory.
    ///
    /// Any of them may end in `@K`: K operations in flight per process (`native@16`).
    /// `native` may also take `#B` before that: B operations per request, in batches
    /// (`native#16`, `native#16@4`).
    pub fn parse(s: &str, default_config: Option<&PathBuf>, native_base: &str) -> Result<TargetSpec> {
        let (body, in_flight) = split_count(s, s, '@', "in-flight count", usize::MAX)?;
        let (body, batch) = split_count(s, body, '#', "batch size", BATCH_MAX)?;
        let (kind, arg) = match body.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (body, None),
        };
        let kind = match (kind, arg) {
            ("native", a) => {
                let config = match a {
                    Some(p) if !p.is_empty() => PathBuf::from(p),
                    _ => default_config.cloned().ok_or_else(|| {
                        anyhow::anyhow!("target native needs a cluster: pass --config FILE, set SHOAL_CONFIG or write native:FILE")
                    })?,
                };
                TargetKind::Native { config, base: native_base.to_string() }
            }
            ("fuse", Some(d)) if !d.is_empty() => TargetKind::Posix { dir: PathBuf::from(d), role: PosixRole::Fuse },
            ("fuse", _) => bail!("target fuse needs the mount point: fuse:/path/to/mount (mount it with shoal mount)"),
            ("preload", Some(d)) if !d.is_empty() => {
                TargetKind::Posix { dir: PathBuf::from(d), role: PosixRole::Preload }
            }
            ("preload", _) => {
                bail!("target preload needs the mount point: preload:/path/to/mount (mount it with shoal mount)")
            }
            ("local", a) => TargetKind::Posix {
                dir: a.filter(|d| !d.is_empty()).map(PathBuf::from).unwrap_or_else(std::env::temp_dir),
                role: PosixRole::Local,
            },
            ("tmpfs", a) => TargetKind::Posix {
                dir: a.filter(|d| !d.is_empty()).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/dev/shm")),
                role: PosixRole::Tmpfs,
            },
            ("posix", Some(d)) if !d.is_empty() => TargetKind::Posix { dir: PathBuf::from(d), role: PosixRole::Other },
            (p, None) if p.starts_with('/') || p.starts_with('.') => {
                TargetKind::Posix { dir: PathBuf::from(p), role: PosixRole::Other }
            }
            _ => bail!(
                "unknown target {s:?}: expected native, native:CONFIG, fuse:DIR, preload:DIR, local[:DIR], tmpfs[:DIR] or posix:DIR (optionally ending in @K for K operations in flight)"
            ),
        };
        if batch.is_some() && !matches!(kind, TargetKind::Native { .. }) {
            bail!("target {s:?}: batches (#B) are a native client feature; POSIX targets make one call per operation");
        }
        Ok(TargetSpec { kind, in_flight, batch, tag: None })
    }

    /// Short name for tables: `native`, `native@16`, `fuse`, `preload`, `local`, `tmpfs`, `posix`.
    pub fn label(&self) -> String {
        let base = match &self.kind {
            TargetKind::Native { .. } => "native",
            TargetKind::Posix { role: PosixRole::Fuse, .. } => "fuse",
            TargetKind::Posix { role: PosixRole::Preload, .. } => "preload",
            TargetKind::Posix { role: PosixRole::Local, .. } => "local",
            TargetKind::Posix { role: PosixRole::Tmpfs, .. } => "tmpfs",
            TargetKind::Posix { role: PosixRole::Other, .. } => "posix",
        };
        let mut label = base.to_string();
        if let Some(t) = &self.tag {
            label += &format!(":{t}");
        }
        if let Some(b) = self.batch {
            label += &format!("#{b}");
        }
        if let Some(k) = self.in_flight {
            label += &format!("@{k}");
        }
        label
    }

    /// Where it is: the config file or the directory.
    pub fn location(&self) -> String {
        match &self.kind {
            TargetKind::Native { config, base } => format!("{} (Shoal path {base})", config.display()),
            TargetKind::Posix { dir, .. } => dir.display().to_string(),
        }
    }

    pub fn is_native(&self) -> bool {
        matches!(self.kind, TargetKind::Native { .. })
    }

    pub fn role(&self) -> Option<PosixRole> {
        match &self.kind {
            TargetKind::Posix { role, .. } => Some(*role),
            TargetKind::Native { .. } => None,
        }
    }

    /// Whether the servers' counters describe this target's work (native, FUSE, preload).
    pub fn uses_shoal(&self) -> bool {
        self.is_native() || self.on_mount()
    }

    /// Whether this is a directory of a Shoal mount (`fuse` or `preload`).
    pub fn on_mount(&self) -> bool {
        matches!(self.role(), Some(PosixRole::Fuse | PosixRole::Preload))
    }

    /// Whether the workers run with the interception library preloaded.
    pub fn preloaded(&self) -> bool {
        self.role() == Some(PosixRole::Preload)
    }
}

/// `s` ends in `SEP` and a number (1 ..= `max`): the rest and the number; else `s` as is.
/// `whole` is the target as written, for messages.
fn split_count<'a>(whole: &str, s: &'a str, sep: char, what: &str, max: usize) -> Result<(&'a str, Option<usize>)> {
    match s.rsplit_once(sep) {
        Some((b, k)) if !k.is_empty() && k.chars().all(|c| c.is_ascii_digit()) => {
            let k: usize = k.parse().with_context(|| format!("bad {what} in target {whole:?}"))?;
            if k == 0 || k > max {
                bail!("target {whole:?}: {what} must be between 1 and {max}");
            }
            Ok((b, Some(k)))
        }
        _ => Ok((s, None)),
    }
}

/// Give targets whose labels collide a tag from where they are (the folder of a native
/// target's configuration, a directory's last component; their position when those are
/// alike too), so that each has a label of its own.
pub fn disambiguate(targets: &mut [TargetSpec]) {
    let labels: Vec<String> = targets.iter().map(TargetSpec::label).collect();
    let collides = |i: usize| labels.iter().filter(|l| **l == labels[i]).count() > 1;
    let colliding: Vec<usize> = (0..targets.len()).filter(|&i| collides(i)).collect();
    for &i in &colliding {
        let place = match &targets[i].kind {
            TargetKind::Native { config, .. } => {
                let stem = config.file_stem().map(|s| s.to_string_lossy().into_owned());
                match stem.as_deref() {
                    // The usual name: the cluster's folder says which one it is.
                    Some("cluster") | None => config.parent().and_then(|p| p.file_name()),
                    Some(_) => config.file_stem(),
                }
            }
            TargetKind::Posix { dir, .. } => dir.file_name(),
        };
        targets[i].tag = place.map(|p| p.to_string_lossy().into_owned());
    }
    // Still alike (the same folder twice, or none to name): number them.
    let labels: Vec<String> = targets.iter().map(TargetSpec::label).collect();
    for &i in &colliding {
        if labels.iter().filter(|l| **l == labels[i]).count() > 1 {
            targets[i].tag = Some(format!("{}{}", targets[i].tag.clone().unwrap_or_default(), i + 1));
        }
    }
}

impl fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.label(), self.location())
    }
}

/// An IOR pattern, in IOR's terms: every process moves `segments × block` bytes in
/// transfers of `transfer` bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoSpec {
    /// Bytes per I/O call (IOR -t).
    pub transfer: u64,
    /// Contiguous bytes per process per segment (IOR -b); a multiple of `transfer`.
    pub block: u64,
    /// Segments (IOR -s). In a shared file segment `s` holds every process's block in rank
    /// order, so small blocks with many segments interleave the processes (IO500 ior-hard).
    pub segments: u64,
    /// One file per process (IOR -F) instead of one shared file.
    pub file_per_proc: bool,
    /// Transfers in a random order (IOR -z) instead of sequential.
    pub random: bool,
    /// Each process reads what its neighbour wrote (IOR -C), so a reader never finds its
    /// own writes in a client-side cache.
    pub reorder: bool,
    /// fsync before close in the write phase (IOR -e). The native client's close always
    /// makes the file durable (it fsyncs); this flag adds it to POSIX targets.
    pub fsync: bool,
    /// Check every byte read against the pattern written.
    pub verify: bool,
    /// Native client: stripe count of the files (`u32::MAX` = all servers) and stripe size.
    pub stripe_count: Option<u32>,
    pub stripe_size: Option<u64>,
    /// Native client: placement policy of the files (`load` to measure load-aware
    /// placement against `same`/`spread`); default the directory's.
    #[serde(default)]
    pub policy: Option<shoal_proto::msg::PlacementPolicy>,
}

impl IoSpec {
    pub fn bytes_per_proc(&self) -> u64 {
        self.block * self.segments
    }

    pub fn transfers_per_proc(&self) -> u64 {
        self.bytes_per_proc() / self.transfer
    }

    pub fn check(&self) -> Result<()> {
        if self.transfer == 0 || self.block == 0 || self.segments == 0 {
            bail!("transfer size, block size and segment count must be positive");
        }
        if self.block.checked_rem(self.transfer) != Some(0) {
            bail!("block size {} is not a multiple of the transfer size {}", self.block, self.transfer);
        }
        if self.transfer > 1 << 30 {
            bail!("transfer size {} is over 1 GiB", self.transfer);
        }
        Ok(())
    }

    /// File offset of transfer `k` (0-based, in sequential order) of the data owned by
    /// process `owner` among `nprocs`.
    pub fn offset(&self, owner: u64, nprocs: u64, k: u64) -> u64 {
        let per_block = self.block / self.transfer;
        let seg = k / per_block;
        let within = (k % per_block) * self.transfer;
        if self.file_per_proc {
            seg * self.block + within
        } else {
            (seg * nprocs + owner) * self.block + within
        }
    }
}

/// An mdtest pattern.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdSpec {
    /// Items per process (mdtest -n).
    pub files: u64,
    /// All processes in one shared directory ("hard") instead of one directory each
    /// ("easy", mdtest -u).
    pub shared_dir: bool,
    /// Bytes written into each file at create and read back in the read phase (mdtest -w/-e).
    pub size: u64,
    /// Stat and read the files of the next process (mdtest -N 1).
    pub shift: bool,
    /// Check the bytes read back.
    pub verify: bool,
}

/// The phases a workload has, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PhaseKind {
    Write,
    Read,
    Mkdir,
    Rmdir,
    Create,
    Stat,
    ReadFiles,
    Unlink,
    /// md: list the directory and check that every name made there is listed exactly once
    /// (see [`listing`](crate::listing)); the rate is entries listed per second.
    List,
}

impl PhaseKind {
    pub fn name(self) -> &'static str {
        match self {
            PhaseKind::Write => "write",
            PhaseKind::Read => "read",
            PhaseKind::Mkdir => "mkdir",
            PhaseKind::Rmdir => "rmdir",
            PhaseKind::Create => "create",
            PhaseKind::Stat => "stat",
            PhaseKind::ReadFiles => "read",
            PhaseKind::Unlink => "unlink",
            PhaseKind::List => "list",
        }
    }

    pub fn is_io(self) -> bool {
        matches!(self, PhaseKind::Write | PhaseKind::Read)
    }
}

/// One phase of a run: what it does, what it is called in reports, and whether the page
/// cache is dropped before it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Phase {
    pub kind: PhaseKind,
    pub label: String,
    pub drop_caches: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Workload {
    Io(IoSpec),
    Md(MdSpec),
}

/// Everything a worker process needs: sent as one JSON line on its standard input.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Job {
    pub rank: u64,
    pub nprocs: u64,
    pub target: TargetSpec,
    pub in_flight: usize,
    /// The run's directory on the target (a Shoal path for native, a local path otherwise).
    pub run_dir: String,
    pub workload: Workload,
    /// Seed of the data pattern and of the random order.
    pub seed: u64,
    /// Native client: request timeout in seconds, and how long cached entries are trusted
    /// (0 = every lookup is a request; the default, so a stat is always measured).
    pub timeout_secs: u64,
    pub cache_ttl_ms: u64,
    /// Native client's write-behind and readahead, if not the defaults.
    #[serde(default)]
    pub tuning: NativeTuning,
}

/// Native client settings a benchmark may change (`None`: the client's default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeTuning {
    pub write_behind: Option<u64>,
    pub readahead: Option<u64>,
}

/// Name of the file process `rank` works on (IOR) or item `i` of `rank` (mdtest).
pub fn io_file_name(spec: &IoSpec, rank: u64) -> String {
    if spec.file_per_proc {
        format!("ior.{rank:05}")
    } else {
        "ior.shared".to_string()
    }
}

/// mdtest: the directory holding process `rank`'s items, relative to the run directory.
pub fn md_dir_name(spec: &MdSpec, rank: u64) -> String {
    if spec.shared_dir {
        "shared".to_string()
    } else {
        format!("d.{rank:05}")
    }
}

pub fn md_item_name(rank: u64, i: u64) -> String {
    format!("f.{rank}.{i}")
}

pub fn md_subdir_name(rank: u64, i: u64) -> String {
    format!("dir.{rank}.{i}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_targets() {
        let cfg = PathBuf::from("/c.toml");
        let t = TargetSpec::parse("native", Some(&cfg), "/b").unwrap();
        assert_eq!(t.kind, TargetKind::Native { config: cfg.clone(), base: "/b".into() });
        assert_eq!(t.label(), "native");
        let mut two = vec![
            TargetSpec::parse("native:/c/r1/cluster.toml", None, "/b").unwrap(),
            TargetSpec::parse("native:/c/r2/cluster.toml", None, "/b").unwrap(),
            TargetSpec::parse("native:/c/big.toml", None, "/b").unwrap(),
            TargetSpec::parse("native:/c/big.toml", None, "/b").unwrap(),
            TargetSpec::parse("local", None, "/b").unwrap(),
        ];
        disambiguate(&mut two);
        let labels: Vec<String> = two.iter().map(TargetSpec::label).collect();
        assert_eq!(labels, ["native:r1", "native:r2", "native:big3", "native:big4", "local"]);
        let t = TargetSpec::parse("native@16", Some(&cfg), "/b").unwrap();
        assert_eq!(t.in_flight, Some(16));
        assert_eq!(t.label(), "native@16");
        let t = TargetSpec::parse("native#32@2", Some(&cfg), "/b").unwrap();
        assert_eq!((t.batch, t.in_flight), (Some(32), Some(2)));
        assert_eq!(t.label(), "native#32@2");
        assert_eq!(TargetSpec::parse("native#8", Some(&cfg), "/b").unwrap().batch, Some(8));
        assert!(TargetSpec::parse("native#0", Some(&cfg), "/b").is_err());
        assert!(TargetSpec::parse("native#5000", Some(&cfg), "/b").is_err());
        assert!(TargetSpec::parse("tmpfs#8", None, "/b").is_err());
        assert!(TargetSpec::parse("native", None, "/b").is_err());
        let t = TargetSpec::parse("native:/x.toml", None, "/b").unwrap();
        assert!(matches!(t.kind, TargetKind::Native { ref config, .. } if config == &PathBuf::from("/x.toml")));
        let t = TargetSpec::parse("tmpfs", None, "/b").unwrap();
        assert_eq!(t.kind, TargetKind::Posix { dir: "/dev/shm".into(), role: PosixRole::Tmpfs });
        let t = TargetSpec::parse("fuse:/mnt/s@4", None, "/b").unwrap();
        assert_eq!(t.kind, TargetKind::Posix { dir: "/mnt/s".into(), role: PosixRole::Fuse });
        assert_eq!(t.label(), "fuse@4");
        assert!(t.uses_shoal());
        assert!(TargetSpec::parse("fuse", None, "/b").is_err());
        let t = TargetSpec::parse("preload:/mnt/s", None, "/b").unwrap();
        assert_eq!(t.kind, TargetKind::Posix { dir: "/mnt/s".into(), role: PosixRole::Preload });
        assert_eq!(t.label(), "preload");
        assert!(t.uses_shoal() && t.preloaded());
        assert!(TargetSpec::parse("preload", None, "/b").is_err());
        assert!(TargetSpec::parse("nfs:/x", None, "/b").is_err());
        assert!(TargetSpec::parse("native@0", Some(&cfg), "/b").is_err());
        let t = TargetSpec::parse("/data/x", None, "/b").unwrap();
        assert_eq!(t.label(), "posix");
    }

    #[test]
    fn ior_offsets() {
        let s = IoSpec {
            transfer: 10,
            block: 30,
            segments: 2,
            file_per_proc: false,
            random: false,
            reorder: false,
            fsync: false,
            verify: false,
            stripe_count: None,
            stripe_size: None,
            policy: None,
        };
        // Shared file, 2 procs: segment 0 = [p0 block][p1 block], segment 1 likewise.
        assert_eq!(s.offset(0, 2, 0), 0);
        assert_eq!(s.offset(0, 2, 2), 20);
        assert_eq!(s.offset(1, 2, 0), 30);
        assert_eq!(s.offset(0, 2, 3), 60);
        assert_eq!(s.offset(1, 2, 5), 110);
        let f = IoSpec { file_per_proc: true, ..s };
        assert_eq!(f.offset(1, 2, 3), 30);
        assert_eq!(f.transfers_per_proc(), 6);
        // Every byte of the shared file is written exactly once.
        let mut seen = [0u8; 120];
        let s = IoSpec { file_per_proc: false, ..f };
        for p in 0..2 {
            for k in 0..s.transfers_per_proc() {
                let o = s.offset(p, 2, k) as usize;
                for b in &mut seen[o..o + 10] {
                    *b += 1;
                }
            }
        }
        assert!(seen.iter().all(|&b| b == 1));
    }
}
