//! Key rings and their files.
//!
//! A ring holds one or more keys, each under an *epoch* number. The newest epoch signs;
//! every epoch in the ring verifies. That is how keys rotate without downtime: add a new
//! epoch to every server's ring (`shoal keygen --rotate`, then reload), and once nothing
//! made under the old epoch can still be in use, retire it (`shoal keygen --retire`).
//!
//! The file is TOML, readable by its owner only (mode 0600; anything that lets group or
//! others read it is refused, as ssh does for private keys):
//!
//! ```toml
//! kind = "cluster"        # or "host"
//! [[key]]
//! epoch = 1
//! secret = "…64 hex digits…"
//! ```

use rand::RngCore;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// 32 secret bytes. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; 32]);

impl Secret {
    pub fn random() -> Secret {
        let mut b = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut b);
        Secret(b)
    }

    pub fn from_bytes(b: [u8; 32]) -> Secret {
        Secret(b)
    }

    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyKind {
    /// Held by servers: authenticates servers to each other, keys capabilities.
    Cluster,
    /// Held by root on client hosts: vouches for the users of the host.
    Host,
}

impl std::fmt::Display for KeyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeyKind::Cluster => "cluster",
            KeyKind::Host => "host",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{kind} key {path}: {source}")]
    Read { kind: KeyKind, path: PathBuf, source: std::io::Error },
    #[error("{kind} key {path} can be read by group or others (mode {mode:04o}): run `chmod 600 {path}`")]
    Exposed { kind: KeyKind, path: PathBuf, mode: u32 },
    #[error("{kind} key {path} is not a valid key file: {message}")]
    Parse { kind: KeyKind, path: PathBuf, message: String },
    #[error("cannot write key file {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    kind: KeyKind,
    key: Vec<KeyEntry>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    epoch: u32,
    secret: String,
}

/// One or more keys by epoch. Invariant: not empty, epochs unique and ascending.
#[derive(Clone, Debug)]
pub struct KeyRing {
    kind: KeyKind,
    keys: Vec<(u32, Secret)>,
}

impl KeyRing {
    /// A new ring with one random key at epoch 1.
    pub fn generate(kind: KeyKind) -> KeyRing {
        KeyRing { kind, keys: vec![(1, Secret::random())] }
    }

    pub fn kind(&self) -> KeyKind {
        self.kind
    }

    /// The newest key, which makes new tags.
    pub fn current(&self) -> (u32, &Secret) {
        let (epoch, secret) = self.keys.last().expect("a key ring is never empty");
        (*epoch, secret)
    }

    /// The key of `epoch`, if the ring still holds it.
    pub fn get(&self, epoch: u32) -> Option<&Secret> {
        self.keys.iter().find(|(e, _)| *e == epoch).map(|(_, s)| s)
    }

    /// Epochs held, oldest first.
    pub fn epochs(&self) -> Vec<u32> {
        self.keys.iter().map(|(e, _)| *e).collect()
    }

    /// This ring with a new random key at the next epoch (the old keys still verify).
    pub fn rotated(&self) -> KeyRing {
        let mut keys = self.keys.clone();
        keys.push((self.current().0 + 1, Secret::random()));
        KeyRing { kind: self.kind, keys }
    }

    /// This ring with only its newest key.
    pub fn retired(&self) -> KeyRing {
        let (epoch, secret) = self.current();
        KeyRing { kind: self.kind, keys: vec![(epoch, secret.clone())] }
    }

    /// The host ring of a cluster ring: the same epochs, each key derived one-way.
    pub fn host_ring(&self) -> KeyRing {
        assert_eq!(self.kind, KeyKind::Cluster, "host keys are derived from the cluster key");
        KeyRing { kind: KeyKind::Host, keys: self.keys.iter().map(|(e, s)| (*e, crate::derive(s, "host"))).collect() }
    }

    /// Read a ring of `kind` from `path`, refusing a file that group or others can read.
    pub fn load(path: &Path, kind: KeyKind) -> Result<KeyRing, KeyError> {
        let read_err = |source| KeyError::Read { kind, path: path.into(), source };
        let file = std::fs::File::open(path).map_err(read_err)?;
        let mode = file.metadata().map_err(read_err)?.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Exposed { kind, path: path.into(), mode });
        }
        let text = std::io::read_to_string(file).map_err(read_err)?;
        let parse_err = |message: String| KeyError::Parse { kind, path: path.into(), message };
        let f: KeyFile = toml::from_str(&text).map_err(|e| parse_err(e.message().trim_end().to_string()))?;
        if f.kind != kind {
            return Err(parse_err(format!("it holds a {} key", f.kind)));
        }
        let mut keys = Vec::with_capacity(f.key.len());
        for k in f.key {
            let mut b = [0u8; 32];
            hex::decode_to_slice(k.secret.trim(), &mut b)
                .map_err(|_| parse_err(format!("epoch {}: secret must be 64 hex digits", k.epoch)))?;
            keys.push((k.epoch, Secret(b)));
        }
        keys.sort_by_key(|(e, _)| *e);
        if keys.is_empty() {
            return Err(parse_err("no [[key]] entries".into()));
        }
        if keys.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(parse_err("an epoch is listed twice".into()));
        }
        Ok(KeyRing { kind, keys })
    }

    /// The file text (secrets included).
    pub fn to_text(&self) -> String {
        let file = KeyFile {
            kind: self.kind,
            key: self.keys.iter().map(|(e, s)| KeyEntry { epoch: *e, secret: hex::encode(s.0) }).collect(),
        };
        let who = match self.kind {
            KeyKind::Cluster => "act as a Shoal server",
            KeyKind::Host => "act as any user of this host towards Shoal",
        };
        format!(
            "# Shoal {} key ring: whoever can read this file can {who}.\n# Keep it readable by its owner only (mode 0600).\n{}",
            self.kind,
            toml::to_string(&file).expect("key files serialise")
        )
    }

    /// Write the ring to `path` with mode 0600, atomically (a temporary file renamed over
    /// it, synced first). With `replace` false an existing file is an error.
    pub fn save(&self, path: &Path, replace: bool) -> Result<(), KeyError> {
        let write_err = |source| KeyError::Write { path: path.into(), source };
        if !replace && path.exists() {
            return Err(write_err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "it already exists (keep it, or replace it on purpose)",
            )));
        }
        let tmp = path.with_extension("key.tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(write_err)?;
        use std::io::Write;
        f.write_all(self.to_text().as_bytes()).and_then(|_| f.sync_all()).map_err(write_err)?;
        std::fs::rename(&tmp, path).map_err(write_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_ring_loads_back_and_rotation_keeps_old_epochs_verifying() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        let ring = KeyRing::generate(KeyKind::Cluster).rotated();
        ring.save(&path, false).unwrap();
        let back = KeyRing::load(&path, KeyKind::Cluster).unwrap();
        assert_eq!(back.epochs(), vec![1, 2]);
        assert_eq!(back.current().0, 2);
        assert_eq!(back.get(1), ring.get(1));
        assert_eq!(back.retired().epochs(), vec![2]);
        assert!(ring.save(&path, false).is_err(), "an existing key is never overwritten by accident");
        let host = back.host_ring();
        assert_eq!(host.epochs(), vec![1, 2]);
        assert_ne!(host.get(1), back.get(1));
    }

    #[test]
    fn a_key_file_others_can_read_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        KeyRing::generate(KeyKind::Cluster).save(&path, false).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = KeyRing::load(&path, KeyKind::Cluster).unwrap_err().to_string();
        assert!(err.contains("chmod 600") && err.contains("0644"), "{err}");
    }

    #[test]
    fn wrong_kind_bad_hex_and_missing_files_are_one_line_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        KeyRing::generate(KeyKind::Cluster).save(&path, false).unwrap();
        let err = KeyRing::load(&path, KeyKind::Host).unwrap_err().to_string();
        assert!(err.contains("holds a cluster key"), "{err}");
        std::fs::write(&path, "kind = \"host\"\n[[key]]\nepoch = 1\nsecret = \"zz\"\n").unwrap();
        let err = KeyRing::load(&path, KeyKind::Host).unwrap_err().to_string();
        assert!(err.contains("64 hex digits") && !err.contains('\n'), "{err}");
        let err = KeyRing::load(&dir.path().join("none"), KeyKind::Host).unwrap_err().to_string();
        assert!(err.contains("No such file"), "{err}");
    }
}
