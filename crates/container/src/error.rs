//! What can go wrong, with the container (and the physical file) named in every message.

use std::fmt;

/// Which metadata block of a physical file a problem is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    Header,
    Tail,
    Trailer,
}

impl fmt::Display for Where {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Where::Header => "header (metadata block 1)",
            Where::Tail => "tail (metadata block 2)",
            Where::Trailer => "trailer",
        })
    }
}

/// How a physical file fails to be a readable container.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Corrupt {
    #[error("the {0} is cut short (truncated file)")]
    Short(Where),
    #[error("the {0} does not start with its magic number (not a Shoal container, or overwritten)")]
    Magic(Where),
    #[error("the checksum of the {0} does not match (corrupted)")]
    Checksum(Where),
    #[error("format version {0}; this library reads version 1")]
    Version(u32),
    #[error("the {0} holds an impossible {1}")]
    Field(Where, &'static str),
    #[error("no trailer at its end: the container was never closed (a writer stopped before the collective close) or the file was cut short")]
    NotClosed,
}

/// An error of the container library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A physical file is not a readable container.
    #[error("{path}: {what}")]
    Corrupt { path: String, what: Corrupt },
    /// The file system refused or failed (`errno` as the file system gave it).
    #[error("{path}: {message}")]
    Io { path: String, errno: i32, message: String },
    /// A call the container cannot do as asked (a bad argument, a mode that does not allow
    /// it, a piece larger than a chunk).
    #[error("{0}")]
    Usage(String),
    /// The communication layer failed, or the tasks disagree (a collective call made with
    /// different arguments).
    #[error("communication: {0}")]
    Comm(String),
}

impl Error {
    /// The errno a C caller sees.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Corrupt { .. } => libc::EBADMSG,
            Error::Io { errno, .. } => *errno,
            Error::Usage(_) => libc::EINVAL,
            Error::Comm(_) => libc::EIO,
        }
    }

    pub(crate) fn io(path: impl fmt::Display, e: std::io::Error) -> Error {
        Error::Io { path: path.to_string(), errno: e.raw_os_error().unwrap_or(libc::EIO), message: e.to_string() }
    }

    pub(crate) fn shoal(path: impl fmt::Display, e: shoal_client::Error) -> Error {
        Error::Io { path: path.to_string(), errno: e.errno.0, message: e.to_string() }
    }

    pub(crate) fn corrupt(path: impl fmt::Display, what: Corrupt) -> Error {
        Error::Corrupt { path: path.to_string(), what }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
