//! Per-directory usage (docs/du.md): what `shoal du` adds up instead of walking a tree.
//!
//! Every server keeps, for each directory `D`, how many inodes it holds whose parent is
//! `D` (files and directories apart) and the bytes of those files, updated in the batch of
//! every change to those inodes. A directory's usage is therefore spread over the servers
//! that hold its children's inodes. `Op::Usage` pages through one server's records, joined
//! with the directories whose inodes it holds (their parent, and whether the caller may
//! read them), so that a client can rebuild the directory tree, find the subtree of a path,
//! and add up what its directories hold.

use crate::Ino;
use serde::{Deserialize, Serialize};

/// One directory as one server knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    pub dir: Ino,
    /// The directory's parent, when this server holds the directory's inode (its home);
    /// the root's parent is itself. `None`: only usage is held here.
    pub parent: Option<Ino>,
    /// When `parent` is set: whether the caller may read and search the directory (as
    /// `du` needs to count what is in it).
    pub readable: bool,
    /// Inodes held here whose parent is `dir` that are not directories (files, symbolic
    /// links), counted once however many names they have.
    pub files: u64,
    /// Directories held here whose parent is `dir`.
    pub dirs: u64,
    /// Size in bytes of those files and links (apparent size: what `stat` reports).
    pub bytes: u64,
}

/// One page of a server's answer to `Op::Usage`: rows in directory order; `next` is the
/// `after` of the following page (`None`: the server has sent every directory it knows).
/// Rows of directories the caller may not read carry no counts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsagePage {
    pub rows: Vec<UsageRow>,
    pub next: Option<Ino>,
}

/// Rows one page holds at most (and by default): a page stays well inside a frame.
pub const USAGE_PAGE_MAX: u32 = 16_384;
