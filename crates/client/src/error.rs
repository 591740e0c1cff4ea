//! The client's error type: an errno that callers can match on, plus a sentence of context
//! naming what was being done ("mkdir /a/b") and, for an unreachable server, which one, and
//! the cause as the server (or the connection to it) described it.

use shoal_proto::Errno;
use std::fmt;

/// An errno plus context and detail. `Display` is `"{context}: {errno text} ({detail})"`,
/// e.g. `rmdir /a/b: Directory not empty (server s1: directory 7 is not empty)`; without
/// context just the errno text, without detail no parenthesis. Match on [`Error::errno`]
/// to handle specific conditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// What went wrong, as a POSIX errno (the server's answer, handed on unchanged).
    pub errno: Errno,
    /// What was being done: the operation and the path or inode, and for a server that
    /// could not be reached, which server (`server s2 (127.0.0.1:7402) unreachable`).
    pub context: String,
    /// Why, in the words of the server that answered (`server s1: directory 7 is not
    /// empty`) or of the connection (`connection closed by the server`); may be empty.
    pub detail: String,
}

/// Result of every fallible client call.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error with `errno` and `context`.
    pub fn new(errno: Errno, context: impl Into<String>) -> Error {
        Error { errno, context: context.into(), detail: String::new() }
    }

    /// An error with no context yet (the public call adds it).
    pub(crate) fn bare(errno: Errno) -> Error {
        Error { errno, context: String::new(), detail: String::new() }
    }

    /// The same error with `detail` as its cause.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Error {
        self.detail = detail.into();
        self
    }

    /// The errno's text, then the detail in parentheses if there is one.
    fn errno_text(&self) -> String {
        if self.detail.is_empty() {
            self.errno.to_string()
        } else {
            format!("{} ({})", self.errno, self.detail)
        }
    }

    /// Prefix the context with `what` ("stat /a: server s1 (…) unreachable").
    pub(crate) fn within(mut self, what: impl fmt::Display) -> Error {
        self.context = if self.context.is_empty() { what.to_string() } else { format!("{what}: {}", self.context) };
        self
    }

    /// The error without the operation it names first ("stat /x: No such file…" →
    /// "No such file…"; "stat /x: server s2 (…) unreachable: …" → "server s2 (…)
    /// unreachable: …"): for callers whose own message already says what was being done.
    pub fn cause(&self) -> String {
        match self.context.split_once(": ") {
            Some((_, rest)) => format!("{rest}: {}", self.errno_text()),
            None => self.errno_text(),
        }
    }

    /// The errno carried by an I/O error that came out of this library (or any I/O error):
    /// the wrapped [`Error`]'s errno if there is one, else the OS error code, else EIO.
    pub fn errno_of_io(err: &std::io::Error) -> Errno {
        if let Some(e) = err.get_ref().and_then(|inner| inner.downcast_ref::<Error>()) {
            return e.errno;
        }
        Errno(err.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.context.is_empty() {
            write!(f, "{}", self.errno_text())
        } else {
            write!(f, "{}: {}", self.context, self.errno_text())
        }
    }
}

impl std::error::Error for Error {}

impl From<Errno> for Error {
    fn from(errno: Errno) -> Error {
        Error::bare(errno)
    }
}

/// Keeps the message and the error kind of the errno; the original [`Error`] (and so the
/// exact errno) can be recovered with [`Error::errno_of_io`].
impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        let kind = std::io::Error::from_raw_os_error(e.errno.0).kind();
        std::io::Error::new(kind, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_context() {
        let e = Error::bare(Errno::ENOENT);
        assert_eq!(e.to_string(), "No such file or directory");
        let e = e.within("server s2 (127.0.0.1:7402) unreachable").within("mkdir /a/b");
        assert_eq!(e.context, "mkdir /a/b: server s2 (127.0.0.1:7402) unreachable");
        assert_eq!(e.to_string(), "mkdir /a/b: server s2 (127.0.0.1:7402) unreachable: No such file or directory");
        assert_eq!(e.cause(), "server s2 (127.0.0.1:7402) unreachable: No such file or directory");
        assert_eq!(Error::new(Errno::ENOENT, "stat /x").cause(), "No such file or directory");
        assert_eq!(Error::bare(Errno::EIO).cause(), "Input/output error");
        let e = Error::bare(Errno::ENOTEMPTY).with_detail("server s1: directory 7 is not empty").within("rmdir /d");
        assert_eq!(e.to_string(), "rmdir /d: Directory not empty (server s1: directory 7 is not empty)");
        assert_eq!(e.cause(), "Directory not empty (server s1: directory 7 is not empty)");
    }

    #[test]
    fn io_round_trip() {
        let io: std::io::Error = Error::new(Errno::ENOTEMPTY, "rmdir /d").into();
        assert_eq!(Error::errno_of_io(&io), Errno::ENOTEMPTY);
        assert!(io.to_string().contains("rmdir /d"));
        let io: std::io::Error = Error::new(Errno::ENOENT, "x").into();
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(Error::errno_of_io(&std::io::Error::from_raw_os_error(libc::EACCES)), Errno::EACCES);
    }
}
