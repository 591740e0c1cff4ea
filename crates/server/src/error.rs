//! The error type of every handler: an errno for the wire plus a sentence for humans.
//!
//! Handlers return `R<T>`; the dispatcher turns a [`Fail`] into `Reply::Error`. Keeping the
//! errno separate from the message lets the client hand the errno on unchanged (POSIX
//! semantics) while logs and the CLI still say *what* failed.

use shoal_proto::msg::Reply;
use shoal_proto::{Errno, ServerId};
use std::fmt;

/// A failed operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fail {
    pub errno: Errno,
    pub message: String,
    /// The request named an entry of this split directory in a partition held by another
    /// server: answered `Reply::Partitions` (`partitions::misrouted`, `dispatch.rs`).
    pub misrouted: Option<shoal_proto::Ino>,
}

/// Result of a handler step.
pub type R<T> = Result<T, Fail>;

impl Fail {
    pub fn new(errno: Errno, message: impl Into<String>) -> Fail {
        Fail { errno, message: message.into(), misrouted: None }
    }

    /// Internal inconsistency (a record that does not decode, a key of the wrong shape):
    /// EIO, never a panic.
    pub fn corrupt(what: impl fmt::Display) -> Fail {
        Fail::new(Errno::EIO, format!("metadata store corrupt: {what}"))
    }

    /// A local file-system error on `what`; ENOSPC stays ENOSPC so a full disk is reported as such.
    pub fn io(what: impl fmt::Display, err: &std::io::Error) -> Fail {
        Fail::new(Errno::from_io(err), format!("{what}: {err}"))
    }

    /// An error answered by (or on the way to) a peer server. Transport failures become EIO
    /// for the client: the peer's state is unknown, and EIO is what a file system says then.
    pub fn peer(server: ServerId, errno: Errno) -> Fail {
        if is_transport(errno) {
            Fail::new(Errno::EIO, format!("server {server} unreachable: {errno}"))
        } else {
            Fail::new(errno, format!("server {server}: {errno}"))
        }
    }

    pub fn into_reply(self) -> Reply {
        Reply::Error { errno: self.errno, message: self.message }
    }
}

impl From<Errno> for Fail {
    fn from(errno: Errno) -> Fail {
        Fail { errno, message: errno.description(), misrouted: None }
    }
}

impl From<rocksdb::Error> for Fail {
    fn from(e: rocksdb::Error) -> Fail {
        let text = e.to_string();
        let errno = if text.contains("No space left") { Errno::ENOSPC } else { Errno::EIO };
        Fail::new(errno, format!("metadata store: {text}"))
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.errno)
    }
}

/// True for errors that say "the peer could not be asked or did not answer", as opposed to
/// an answer. After such an error a remote step may or may not have been applied, so the
/// intent that covers it is kept for the recovery loop.
pub fn is_transport(errno: Errno) -> bool {
    // EAGAIN: the peer refused the connection at its limit; the request was never sent.
    matches!(errno, Errno::ENOTCONN | Errno::ETIMEDOUT | Errno::EPROTO | Errno::ESTALE | Errno::EAGAIN)
}

/// `Err(Fail)` with a message, for early returns.
pub fn fail<T>(errno: Errno, message: impl Into<String>) -> R<T> {
    Err(Fail::new(errno, message))
}
