//! The change log (docs/changes.md): every server logs the namespace and data events it
//! commits (a create, a close after writing, an unlink, a rename, a change of attributes
//! or extended attributes), numbered from 1 without gap, in the same batch as the change
//! itself. Watchers read a server's log after a cursor (`Op::Changes`); named consumers
//! keep their cursor on the server (`Op::ChangeAck`), so one that restarts continues where
//! it stopped.
//!
//! An event names what the server knew when it committed it: an entry event (create,
//! mkdir, symlink, link, unlink, rmdir, rename) its directory and name; an inode event
//! (attributes, extended attributes, close after write) only the inode, plus a
//! directory's parent. Clients turn them into paths (`client::changes`).

use crate::msg::{FileKind, Timestamp};
use crate::Ino;
use serde::{Deserialize, Serialize};

/// What happened. Each kind is one bit of a watch's `kinds` mask ([`ChangeKind::bit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ChangeKind {
    Create,
    Mkdir,
    Symlink,
    Link,
    Unlink,
    Rmdir,
    Rename,
    /// Mode, owner, size or times changed (chmod, chown, truncate, utimes).
    Setattr,
    /// An extended attribute was set or removed.
    Xattr,
    /// A file written through a handle was closed: its data and size are durable.
    Close,
}

/// Every kind, in bit order.
pub const KINDS: [ChangeKind; 10] = [
    ChangeKind::Create,
    ChangeKind::Mkdir,
    ChangeKind::Symlink,
    ChangeKind::Link,
    ChangeKind::Unlink,
    ChangeKind::Rmdir,
    ChangeKind::Rename,
    ChangeKind::Setattr,
    ChangeKind::Xattr,
    ChangeKind::Close,
];

/// A mask of every kind.
pub const ALL_KINDS: u32 = (1 << KINDS.len()) - 1;

impl ChangeKind {
    pub fn bit(self) -> u32 {
        1 << KINDS.iter().position(|k| *k == self).expect("every kind is listed")
    }

    /// The kind's name on the command line and in JSON (`create`, `close`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ChangeKind::Create => "create",
            ChangeKind::Mkdir => "mkdir",
            ChangeKind::Symlink => "symlink",
            ChangeKind::Link => "link",
            ChangeKind::Unlink => "unlink",
            ChangeKind::Rmdir => "rmdir",
            ChangeKind::Rename => "rename",
            ChangeKind::Setattr => "setattr",
            ChangeKind::Xattr => "xattr",
            ChangeKind::Close => "close",
        }
    }

    /// The kind named `name` (see [`ChangeKind::name`]).
    pub fn parse(name: &str) -> Option<ChangeKind> {
        KINDS.iter().copied().find(|k| k.name() == name)
    }
}

/// A mask of kinds from names separated by commas (`create,close`); `all` is every kind.
pub fn parse_kinds(list: &str) -> Result<u32, String> {
    let mut mask = 0;
    for n in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        mask |= match n {
            "all" => ALL_KINDS,
            _ => ChangeKind::parse(n)
                .ok_or_else(|| {
                    let known: Vec<&str> = KINDS.iter().map(|k| k.name()).collect();
                    format!("unknown event {n:?} (known: {}, all)", known.join(", "))
                })?
                .bit(),
        };
    }
    if mask == 0 {
        return Err("no event named".into());
    }
    Ok(mask)
}

/// One event of a server's change log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeEvent {
    /// Its number in the log of the server that committed it.
    pub seq: u64,
    pub kind: ChangeKind,
    /// The inode changed, made or unnamed.
    pub ino: Ino,
    pub file_kind: FileKind,
    /// Entry events: the directory of the name (a rename: the source's). Inode events on a
    /// directory: its parent. Otherwise `None`.
    pub dir: Option<Ino>,
    /// Entry events: the name in `dir` (a rename: the old name).
    pub name: Option<String>,
    /// A rename: where the name went.
    pub to_dir: Option<Ino>,
    pub to_name: Option<String>,
    /// An `Xattr` event: the attribute's name.
    pub xattr: Option<String>,
    /// Who made the change.
    pub uid: u32,
    /// When, by the server's clock.
    pub at: Timestamp,
}

/// Answer to `Op::Changes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangePage {
    /// Events after the cursor that the caller may see, of the kinds asked, oldest first.
    pub events: Vec<ChangeEvent>,
    /// The cursor to continue from: the last event looked at (shown or not).
    pub next: u64,
    /// Events after the cursor that were dropped from the log before they were read (the
    /// server keeps what its consumers have not acknowledged, and otherwise the newest
    /// 65,536: docs/changes.md): the watcher missed this many.
    pub lost: u64,
}

/// Longest consumer name a server accepts.
pub const CONSUMER_NAME_MAX: usize = 255;

/// Whether `name` can name a consumer: 1 to 255 bytes of letters, digits, `-`, `_`, `.`.
pub fn check_consumer(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= CONSUMER_NAME_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!("consumer name {name:?}: 1 to 255 letters, digits, '-', '_' or '.'"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_have_distinct_bits_and_names() {
        let mut seen = 0;
        for k in KINDS {
            assert_eq!(seen & k.bit(), 0);
            seen |= k.bit();
            assert_eq!(ChangeKind::parse(k.name()), Some(k));
        }
        assert_eq!(seen, ALL_KINDS);
    }

    #[test]
    fn kind_lists_parse() {
        assert_eq!(parse_kinds("create,close").unwrap(), ChangeKind::Create.bit() | ChangeKind::Close.bit());
        assert_eq!(parse_kinds("all").unwrap(), ALL_KINDS);
        assert!(parse_kinds("create,bogus").unwrap_err().contains("bogus"));
        assert!(parse_kinds("").is_err());
    }

    #[test]
    fn consumer_names() {
        assert!(check_consumer("robinhood-1.a_b").is_ok());
        assert!(check_consumer("").is_err());
        assert!(check_consumer("a/b").is_err());
        assert!(check_consumer(&"x".repeat(256)).is_err());
    }
}
