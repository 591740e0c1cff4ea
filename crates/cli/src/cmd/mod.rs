//! One module per group of `shoal` subcommands.

pub mod bench;
pub mod cluster;
pub mod container;
pub mod cp;
pub mod demo;
pub mod du;
pub mod files;
pub mod find;
pub mod identityd;
pub mod import;
pub mod job;
pub mod keygen;
pub mod map;
pub mod mount;
pub mod preload;
pub mod readmostly;
pub mod scrub;
pub mod server;
pub mod sim;
pub mod status;
pub mod stripe;
pub mod token;
pub mod top;
pub mod tuple;
pub mod watch;

use anyhow::{Context, Result};
use shoal_client::{Client, ClientOptions};
use std::path::PathBuf;
use std::time::Duration;

/// What every command gets from the global flags.
pub struct Ctx {
    pub config: Option<PathBuf>,
    pub timeout: Duration,
}

/// An error in how the command was called (exit code 2).
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for UsageError {}

/// A failure with an exit status of its own (documented by the command), e.g. `shoal scrub`'s
/// "damage found".
#[derive(Debug)]
pub struct Exit {
    pub code: u8,
    pub msg: String,
}

impl Exit {
    pub fn new(code: u8, msg: impl Into<String>) -> Exit {
        Exit { code, msg: msg.into() }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}
impl std::error::Error for Exit {}

pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(msg.into()))
}

impl Ctx {
    pub fn config_path(&self) -> Result<PathBuf> {
        self.config.clone().ok_or_else(|| {
            usage("no cluster configuration: pass --config FILE or set SHOAL_CONFIG (shoal cluster up prints it)")
        })
    }

    pub fn client(&self) -> Result<Client> {
        let path = self.config_path()?;
        let opts = ClientOptions { timeout: self.timeout, ..ClientOptions::default() };
        Client::from_config(&path, opts)
            .map_err(anyhow::Error::from)
            .with_context(|| "cannot use the cluster configuration")
    }
}

/// A path naming Shoal: `shoal://a/b` → `/a/b`; `/a/b` stays. Anything else is `None`.
pub fn shoal_path(p: &str) -> Option<String> {
    if let Some(rest) = p.strip_prefix("shoal://") {
        return Some(format!("/{}", rest.trim_start_matches('/')));
    }
    None
}

/// For commands that only take Shoal paths: `shoal://x` or `/x` (or `x`, taken from the root).
pub fn only_shoal(p: &str) -> String {
    shoal_path(p).unwrap_or_else(|| if p.starts_with('/') { p.to_string() } else { format!("/{p}") })
}
