//! [`MountOptions`]: every setting of a mount, and the parser of `-o` option lists
//! (`mount -t fuse.shoal … -o attr_timeout=2,allow_other`).

use anyhow::{anyhow, bail, Result};
use std::time::Duration;

/// How a mount behaves. `Default` gives the documented defaults (see `docs/mount.md`).
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// How long the kernel may trust the attributes it was given (`attr_timeout=S`). Default 1 s.
    pub attr_timeout: Duration,
    /// How long the kernel may trust a name → inode entry (`entry_timeout=S`). Default 1 s.
    pub entry_timeout: Duration,
    /// How long the kernel may remember that a name does not exist (`negative_timeout=S`).
    /// Default 0: every lookup of a missing name asks the servers.
    pub negative_timeout: Duration,
    /// Cache lifetime inside the client library (`client_cache=S`), on top of the kernel's.
    /// Default 0: the kernel's caches are the only ones.
    pub client_cache: Duration,
    /// Term of the directory leases the mount asks for (`dir_lease=S`): while it holds one,
    /// the servers revoke it before another client changes the directory, so the mount
    /// answers the kernel's lookups of names it knows there, also of missing names (the
    /// lookup before every create), without a request. Default 3 s; 0 turns leases off.
    pub dir_lease: Duration,
    /// How long one request to a server may take before the call fails with EIO
    /// (`timeout=S`; the `shoal --timeout` flag). Default 30 s.
    pub timeout: Duration,
    /// Kernel write-back cache (`writeback_cache`): writes are gathered in the page cache
    /// and sent later, in large pieces. Off by default.
    pub writeback_cache: bool,
    /// Keep the page cache of a file across opens (`keep_cache`). Off by default: every
    /// open starts with an empty cache, so it sees what other clients closed.
    pub keep_cache: bool,
    /// Bypass the page cache for reads and writes (`direct_io`); mmap still works.
    pub direct_io: bool,
    /// Listings carry attributes (`readdirplus`, FUSE READDIRPLUS in the kernel's
    /// adaptive mode; `noreaddirplus` turns it off): `ls -l` of N files costs a lookup
    /// request per server per 128 names instead of a LOOKUP and a request per name.
    /// Default on.
    pub readdirplus: bool,
    /// Let users other than the one who mounted use the mount (`allow_other`;
    /// `noallow_other` restricts it). Default: on when root mounts (a parallel file system
    /// is mounted for every user of the node; permissions are still checked for each user
    /// by `default_permissions` and the servers), off otherwise (a non-root mount needs
    /// `user_allow_other` in /etc/fuse.conf for it).
    pub allow_other: bool,
    /// Let root use the mount besides its owner (`allow_root`).
    pub allow_root: bool,
    /// Let the kernel check permissions from the mode bits it caches, in addition to the
    /// servers' checks (`default_permissions`, the default; `nodefault_permissions` turns
    /// it off). Without it the kernel does not check search permission on directories it
    /// has cached, so one user's lookups would open a path to another user for the entry
    /// timeout.
    pub default_permissions: bool,
    /// Read-only mount (`ro`).
    pub read_only: bool,
    /// Threads running requests (`threads=N`). Default: 2 × cores, at least 4.
    pub threads: usize,
    /// Threads reading requests from the kernel (`fuse_threads=N`). Default 2.
    pub fuse_threads: usize,
    /// Largest write the kernel sends in one request (`max_write=BYTES`). Default 1 MiB.
    pub max_write: u32,
    /// Read-ahead window (`max_readahead=BYTES`). Default 4 MiB (set through the mount's
    /// backing device in /sys/class/bdi, which needs root; otherwise the kernel's 128 KiB).
    pub max_readahead: u32,
    /// Most asynchronous requests (read-ahead, write-back) the kernel keeps in flight
    /// (`max_background=N`). Default 64.
    pub max_background: u16,
    /// Make a written file durable (fsync on every server) when its last descriptor on
    /// this mount is closed (`sync_close`, default) or not (`nosync_close`).
    pub sync_close: bool,
    /// Name shown as the source in `/proc/mounts` and `df` (`fsname=NAME`).
    pub fsname: Option<String>,
    /// Unmount when the mount process dies (`auto_unmount`; needs fusermount3).
    pub auto_unmount: bool,
    /// Kernel mount flags passed on as they are: `dev`, `nodev`, `suid`, `nosuid`, `exec`,
    /// `noexec`, `atime`, `noatime`, `sync`, `async`, `dirsync`.
    pub flags: Vec<String>,
    /// Where to serve the mount's Prometheus metrics (`GET /metrics`, `--metrics ADDR`);
    /// none by default.
    pub metrics_listen: Option<String>,
    /// The coop group this mount reads read-mostly trees with (`coop=FILE`: the members'
    /// addresses, one per line, the same file for every member; docs/loading.md,
    /// "Cooperative reads"). None by default.
    pub coop_members: Option<std::path::PathBuf>,
    /// This mount's address in the coop group (`coop_addr=IP:PORT`, one of the file's).
    pub coop_addr: Option<std::net::SocketAddr>,
    /// How long a question waits for the group before it goes to the servers
    /// (`coop_wait=S`). Default 2 s.
    pub coop_wait: Duration,
}

impl Default for MountOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        MountOptions {
            attr_timeout: Duration::from_secs(1),
            entry_timeout: Duration::from_secs(1),
            negative_timeout: Duration::ZERO,
            client_cache: Duration::ZERO,
            dir_lease: Duration::from_secs(3),
            timeout: Duration::from_secs(30),
            writeback_cache: false,
            keep_cache: false,
            direct_io: false,
            readdirplus: true,
            // SAFETY: geteuid has no preconditions.
            allow_other: unsafe { libc::geteuid() } == 0,
            allow_root: false,
            default_permissions: true,
            read_only: false,
            threads: (2 * cores).max(4),
            fuse_threads: 2,
            max_write: 1 << 20,
            max_readahead: 4 << 20,
            max_background: 64,
            sync_close: true,
            fsname: None,
            auto_unmount: false,
            flags: Vec::new(),
            metrics_listen: None,
            coop_members: None,
            coop_addr: None,
            coop_wait: Duration::from_secs(2),
        }
    }
}

/// Options that only matter to mount(8) or /etc/fstab and are accepted and ignored.
const IGNORED: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "user",
    "users",
    "nouser",
    "nofail",
    "_netdev",
    "rw",
    "relatime",
    "norelatime",
    "strictatime",
    "lazytime",
    "nolazytime",
    "loud",
    "silent",
];

const FLAGS: &[&str] =
    &["dev", "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime", "sync", "async", "dirsync"];

fn seconds(key: &str, v: &str) -> Result<Duration> {
    let s: f64 = v.parse().map_err(|_| anyhow!("option {key}={v}: not a number of seconds"))?;
    if !(0.0..=1e9).contains(&s) {
        bail!("option {key}={v}: out of range");
    }
    Ok(Duration::from_secs_f64(s))
}

fn number<T: std::str::FromStr>(key: &str, v: &str) -> Result<T> {
    let v = v.trim();
    // Accept a K/M/G suffix (powers of 1024) for byte counts.
    let (digits, mult) = match v.char_indices().last() {
        Some((i, 'k' | 'K')) => (&v[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&v[..i], 1u64 << 20),
        Some((i, 'g' | 'G')) => (&v[..i], 1u64 << 30),
        _ => (v, 1),
    };
    let n: u64 = digits.parse().map_err(|_| anyhow!("option {key}={v}: not a number"))?;
    let n = n.checked_mul(mult).ok_or_else(|| anyhow!("option {key}={v}: too large"))?;
    n.to_string().parse::<T>().map_err(|_| anyhow!("option {key}={v}: out of range"))
}

impl MountOptions {
    /// Every setting as a `-o` list that [`MountOptions::apply_list`] reads back into the
    /// same options (a daemon hands its settings to the process it starts this way).
    pub fn to_option_string(&self) -> String {
        let secs = |d: Duration| {
            let s = format!("{:.9}", d.as_secs_f64());
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        };
        let mut v = vec![
            format!("attr_timeout={}", secs(self.attr_timeout)),
            format!("entry_timeout={}", secs(self.entry_timeout)),
            format!("negative_timeout={}", secs(self.negative_timeout)),
            format!("client_cache={}", secs(self.client_cache)),
            format!("dir_lease={}", secs(self.dir_lease)),
            format!("timeout={}", secs(self.timeout)),
            format!("threads={}", self.threads),
            format!("fuse_threads={}", self.fuse_threads),
            format!("max_write={}", self.max_write),
            format!("max_readahead={}", self.max_readahead),
            format!("max_background={}", self.max_background),
            if self.sync_close { "sync_close" } else { "nosync_close" }.to_string(),
            // Always said: the default depends on who reads the string back.
            if self.allow_other { "allow_other" } else { "noallow_other" }.to_string(),
        ];
        let flags = [
            (self.writeback_cache, "writeback_cache"),
            (self.keep_cache, "keep_cache"),
            (self.direct_io, "direct_io"),
            (!self.readdirplus, "noreaddirplus"),
            (self.allow_root, "allow_root"),
            (!self.default_permissions, "nodefault_permissions"),
            (self.read_only, "ro"),
            (self.auto_unmount, "auto_unmount"),
        ];
        v.extend(flags.iter().filter(|(on, _)| *on).map(|(_, n)| n.to_string()));
        if let Some(n) = &self.fsname {
            v.push(format!("fsname={n}"));
        }
        if let (Some(m), Some(a)) = (&self.coop_members, &self.coop_addr) {
            v.push(format!("coop={},coop_addr={a},coop_wait={}", m.display(), secs(self.coop_wait)));
        }
        v.extend(self.flags.iter().cloned());
        v.join(",")
    }

    /// Apply a comma-separated list of options, as given to `-o`.
    pub fn apply_list(&mut self, list: &str) -> Result<()> {
        for opt in list.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            self.apply(opt)?;
        }
        Ok(())
    }

    /// Apply one option (`name` or `name=value`).
    pub fn apply(&mut self, opt: &str) -> Result<()> {
        let (key, val) = match opt.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (opt.trim(), None),
        };
        fn need<'a>(key: &str, v: Option<&'a str>) -> Result<&'a str> {
            v.ok_or_else(|| anyhow!("option {key} needs a value ({key}=…)"))
        }
        match key {
            "attr_timeout" => self.attr_timeout = seconds(key, need(key, val)?)?,
            "entry_timeout" => self.entry_timeout = seconds(key, need(key, val)?)?,
            "negative_timeout" => self.negative_timeout = seconds(key, need(key, val)?)?,
            "client_cache" => self.client_cache = seconds(key, need(key, val)?)?,
            "dir_lease" => self.dir_lease = seconds(key, need(key, val)?)?,
            "timeout" => {
                self.timeout = seconds(key, need(key, val)?)?;
                if self.timeout.is_zero() {
                    bail!("option timeout=0: a timeout must be positive");
                }
            }
            "writeback_cache" => self.writeback_cache = true,
            "nowriteback_cache" => self.writeback_cache = false,
            "keep_cache" => self.keep_cache = true,
            "nokeep_cache" => self.keep_cache = false,
            "direct_io" => self.direct_io = true,
            "nodirect_io" => self.direct_io = false,
            "readdirplus" => self.readdirplus = true,
            "noreaddirplus" => self.readdirplus = false,
            "allow_other" => self.allow_other = true,
            "noallow_other" => self.allow_other = false,
            "allow_root" => self.allow_root = true,
            "default_permissions" => self.default_permissions = true,
            "nodefault_permissions" => self.default_permissions = false,
            "ro" => self.read_only = true,
            "threads" => {
                self.threads = number(key, need(key, val)?)?;
                if self.threads == 0 {
                    bail!("option threads=0: at least one thread is needed");
                }
            }
            "fuse_threads" => {
                self.fuse_threads = number(key, need(key, val)?)?;
                if self.fuse_threads == 0 {
                    bail!("option fuse_threads=0: at least one thread is needed");
                }
            }
            "max_write" => {
                self.max_write = number(key, need(key, val)?)?;
                if self.max_write < 4096 {
                    bail!("option max_write: at least 4096");
                }
            }
            "max_readahead" => self.max_readahead = number(key, need(key, val)?)?,
            "max_background" => {
                self.max_background = number(key, need(key, val)?)?;
                if self.max_background == 0 {
                    bail!("option max_background=0: at least 1");
                }
            }
            "sync_close" => self.sync_close = true,
            "nosync_close" => self.sync_close = false,
            "fsname" => self.fsname = Some(need(key, val)?.to_string()),
            "auto_unmount" => self.auto_unmount = true,
            "coop" => self.coop_members = Some(need(key, val)?.into()),
            "coop_addr" => {
                let v = need(key, val)?;
                let a = v.parse().map_err(|_| anyhow!("option coop_addr={v}: not an address IP:PORT"))?;
                self.coop_addr = Some(a);
            }
            "coop_wait" => self.coop_wait = seconds(key, need(key, val)?)?,
            // Handled by the `shoal mount` command line (accepted here so that one option
            // string serves mount(8) and `shoal mount -o`).
            "config" | "log" | "foreground" => {}
            k if FLAGS.contains(&k) => {
                if val.is_some() {
                    bail!("option {k} takes no value");
                }
                self.flags.retain(|f| f != k);
                self.flags.push(k.to_string());
            }
            k if IGNORED.contains(&k) || k.starts_with("x-") || k == "comment" => {}
            _ => bail!("unknown mount option {opt:?} (see docs/mount.md for the list)"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_units() {
        let mut o = MountOptions::default();
        o.apply_list("attr_timeout=2.5,entry_timeout=0,allow_other,max_write=512K,threads=3,noatime,_netdev,defaults,x-systemd.automount")
            .unwrap();
        assert_eq!(o.attr_timeout, Duration::from_millis(2500));
        assert_eq!(o.entry_timeout, Duration::ZERO);
        assert!(o.allow_other);
        assert_eq!(o.max_write, 512 * 1024);
        assert_eq!(o.threads, 3);
        assert_eq!(o.flags, vec!["noatime".to_string()]);
        o.apply_list("nosync_close,writeback_cache,fsname=lab,config=/etc/shoal.toml").unwrap();
        assert!(!o.sync_close && o.writeback_cache);
        assert_eq!(o.fsname.as_deref(), Some("lab"));
        o.apply("noallow_other").unwrap();
        assert!(!o.allow_other);
    }

    #[test]
    fn allow_other_is_the_default_for_root_only_and_survives_the_option_string() {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert_eq!(MountOptions::default().allow_other, root);
        for on in [false, true] {
            let o = MountOptions { allow_other: on, ..MountOptions::default() };
            let mut back = MountOptions { allow_other: !on, ..MountOptions::default() };
            back.apply_list(&o.to_option_string()).unwrap();
            assert_eq!(back.allow_other, on);
        }
    }

    #[test]
    fn option_string_round_trips() {
        let mut o = MountOptions::default();
        o.apply_list("attr_timeout=0.25,negative_timeout=3,allow_other,default_permissions,nosync_close,fsname=x,noatime,timeout=7.5")
            .unwrap();
        let mut back = MountOptions::default();
        back.apply_list(&o.to_option_string()).unwrap();
        assert_eq!(format!("{o:?}"), format!("{back:?}"));
    }

    #[test]
    fn coop_options_parse_and_round_trip() {
        let mut o = MountOptions::default();
        o.apply_list("coop=/etc/job/members,coop_addr=127.0.0.1:7700,coop_wait=0.5").unwrap();
        assert_eq!(o.coop_members.as_deref(), Some(std::path::Path::new("/etc/job/members")));
        assert_eq!(o.coop_addr, Some("127.0.0.1:7700".parse().unwrap()));
        assert_eq!(o.coop_wait, Duration::from_millis(500));
        let mut back = MountOptions::default();
        back.apply_list(&o.to_option_string()).unwrap();
        assert_eq!(format!("{o:?}"), format!("{back:?}"));
        assert!(o.apply("coop_addr=nonsense").unwrap_err().to_string().contains("IP:PORT"));
        assert!(o.apply("coop").is_err());
    }

    #[test]
    fn rejects_nonsense() {
        let mut o = MountOptions::default();
        assert!(o.apply("bogus").is_err());
        assert!(o.apply("attr_timeout").is_err());
        assert!(o.apply("attr_timeout=x").is_err());
        assert!(o.apply("timeout=0").is_err());
        assert!(o.apply("threads=0").is_err());
        assert!(o.apply("max_write=1").is_err());
        assert!(o.apply("noatime=1").is_err());
    }
}
