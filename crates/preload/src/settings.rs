//! Settings from the environment, read once when the library is loaded (docs/preload.md):
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `SHOAL_PRELOAD` | on | `0` or `off`: intercept nothing (every call goes to the C library) |
//! | `SHOAL_PRELOAD_MOUNTS` | every `fuse.shoal` mount | colon-separated mount points to serve; others go to the kernel |
//! | `SHOAL_PRELOAD_CONFIG` | the mount's source | cluster configuration for mounts whose source does not name one (`fsname=`) |
//! | `SHOAL_PRELOAD_STATS` | off | append the counts of served calls to this file at exit (`stats.rs`) |
//! | `SHOAL_PRELOAD_DEBUG` | off | `1`: say on stderr why calls went to the kernel |
//! | `SHOAL_PRELOAD_WRITE_BEHIND` | 8 MiB | bytes of a file's writes in flight after `write` returned; 0: every write waits for the servers |
//! | `SHOAL_PRELOAD_READAHEAD` | 8 MiB | readahead window of a file read forward |
//! | `SHOAL_PRELOAD_CACHE_MS` | 1000 | how long names and attributes are trusted (the mount's `attr_timeout`/`entry_timeout`) |
//! | `SHOAL_PRELOAD_THREADS` | 0 | 0: the program's threads drive the client's connections while they wait in a call (`cluster.rs`); N: N runtime threads do |

use std::sync::OnceLock;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Settings {
    pub enabled: bool,
    pub mounts: Option<Vec<String>>,
    pub config: Option<std::path::PathBuf>,
    pub stats_file: Option<std::path::PathBuf>,
    pub debug: bool,
    pub write_behind: Option<usize>,
    pub readahead: Option<usize>,
    pub cache_ttl: Duration,
    pub threads: usize,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn number(name: &str) -> Option<u64> {
    let v = var(name)?;
    match v.parse() {
        Ok(n) => Some(n),
        Err(_) => {
            crate::debug::warn(&format!("{name}={v} is not a number; ignored"));
            None
        }
    }
}

fn read() -> Settings {
    Settings {
        enabled: !matches!(var("SHOAL_PRELOAD").as_deref(), Some("0" | "off" | "no" | "false")),
        mounts: var("SHOAL_PRELOAD_MOUNTS")
            .map(|v| v.split(':').filter(|s| !s.is_empty()).map(|s| s.trim_end_matches('/').to_string()).collect()),
        config: var("SHOAL_PRELOAD_CONFIG").map(Into::into),
        stats_file: var("SHOAL_PRELOAD_STATS").map(Into::into),
        debug: matches!(var("SHOAL_PRELOAD_DEBUG").as_deref(), Some("1" | "on" | "yes" | "true")),
        write_behind: number("SHOAL_PRELOAD_WRITE_BEHIND").map(|n| n as usize),
        readahead: number("SHOAL_PRELOAD_READAHEAD").map(|n| n as usize),
        cache_ttl: Duration::from_millis(number("SHOAL_PRELOAD_CACHE_MS").unwrap_or(1000)),
        threads: number("SHOAL_PRELOAD_THREADS").unwrap_or(0).min(64) as usize,
    }
}

/// The settings (read at the first call: the library's constructor).
pub fn get() -> &'static Settings {
    SETTINGS.get_or_init(read)
}
