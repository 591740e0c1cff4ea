//! Operation codes: a stable `u16` per [`Op`] variant (requests) and per [`Reply`] variant
//! (replies), carried in every frame header (docs/protocol.md, "Operation codes").
//!
//! The header's code lets a receiver name what a frame is before (or without) decoding its
//! body, and the decoder checks it against the body (`Frame::request_body`,
//! `Frame::reply_body`). Invariants: a code, once given, never changes and is never reused;
//! 0 is never a code (a 24-byte header of protocol 4 and older has zeros there); a new
//! variant takes the next free number. The matches are exhaustive, so a variant cannot be
//! added without a code.

use crate::msg::{Op, Reply};

impl Op {
    /// This operation's code in the frame header.
    pub fn code(&self) -> u16 {
        match self {
            Op::Hello { .. } => 1,
            Op::Lookup { .. } => 2,
            Op::Create { .. } => 3,
            Op::Mkdir { .. } => 4,
            Op::Symlink { .. } => 5,
            Op::Link { .. } => 6,
            Op::Unlink { .. } => 7,
            Op::Rmdir { .. } => 8,
            Op::Rename { .. } => 9,
            Op::ReadDir { .. } => 10,
            Op::GetAttr { .. } => 11,
            Op::SetAttr { .. } => 12,
            Op::SetDirLayout { .. } => 13,
            Op::ReadLink { .. } => 14,
            Op::Access { .. } => 15,
            Op::ExtendSize { .. } => 16,
            Op::SetXattr { .. } => 17,
            Op::GetXattr { .. } => 18,
            Op::ListXattr { .. } => 19,
            Op::RemoveXattr { .. } => 20,
            Op::Read { .. } => 21,
            Op::Write { .. } => 22,
            Op::Fsync { .. } => 23,
            Op::Batch { .. } => 24,
            Op::StatFs => 25,
            Op::Status => 26,
            Op::PeerMkdirObject { .. } => 27,
            Op::PeerRmdirObject { .. } => 28,
            Op::PeerLinkDelta { .. } => 29,
            Op::PeerRenameIn { .. } => 30,
            Op::PeerSetParent { .. } => 31,
            Op::PeerDeleteObjects { .. } => 32,
            Op::PeerTruncateObject { .. } => 33,
            Op::Append { .. } => 34,
            Op::ReleaseOrphan { .. } => 35,
            Op::ScrubStart => 36,
            Op::ScrubStatus => 37,
            Op::Authenticate { .. } => 38,
            Op::Open { .. } => 39,
            Op::PeerMoveLock { .. } => 40,
            Op::LeaseAck { .. } => 41,
            Op::PeerSplitIn { .. } => 42,
            Op::PeerAddPartition { .. } => 43,
            Op::PeerPartitions { .. } => 44,
            Op::PeerSealPartitions { .. } => 45,
            Op::PeerPartitionAttr { .. } => 46,
            Op::ReadList { .. } => 47,
            Op::WriteList { .. } => 48,
            Op::PeerLoad { .. } => 49,
            Op::UrlProbe { .. } => 50,
            Op::FetchInto { .. } => 51,
            Op::PeerReplicate { .. } => 56,
            Op::PeerRaft { .. } => 52,
            Op::GetMap { .. } => 53,
            Op::ProposeMap { .. } => 54,
            Op::PeerResyncQuery { .. } => 57,
            Op::PeerResyncApply { .. } => 58,
            Op::PeerResyncDone { .. } => 59,
            Op::PeerScrubRead { .. } => 60,
            Op::SetReadMostly { .. } => 61,
            Op::Find { .. } => 62,
            Op::TupleWrite { .. } => 63,
            Op::TupleRead { .. } => 64,
            Op::TupleWatch { .. } => 65,
            Op::Changes { .. } => 66,
            Op::ChangeAck { .. } => 67,
            Op::Usage { .. } => 68,
        }
    }
}

impl Reply {
    /// This reply's code in the frame header.
    pub fn code(&self) -> u16 {
        match self {
            Reply::Hello { .. } => 1,
            Reply::Ok => 2,
            Reply::Entry(_) => 3,
            Reply::Attr(_) => 4,
            Reply::DirEntries { .. } => 5,
            Reply::Link(_) => 6,
            Reply::Xattr(_) => 7,
            Reply::XattrNames(_) => 8,
            Reply::Data => 9,
            Reply::Written { .. } => 10,
            Reply::NLink(_) => 11,
            Reply::Replaced(_) => 12,
            Reply::StatFs(_) => 13,
            Reply::Status(_) => 14,
            Reply::Batch(_) => 15,
            Reply::StaleMap { .. } => 16,
            Reply::Error { .. } => 17,
            Reply::Appended { .. } => 18,
            Reply::Scrub(_) => 19,
            Reply::Opened { .. } => 20,
            Reply::Leased { .. } => 21,
            Reply::Partitions { .. } => 22,
            Reply::DataList { .. } => 23,
            Reply::Load(_) => 24,
            Reply::UrlInfo(_) => 25,
            Reply::Fetched { .. } => 26,
            Reply::Replicated { .. } => 30,
            Reply::Raft { .. } => 27,
            Reply::Map { .. } => 28,
            Reply::Resync(_) => 31,
            Reply::ScrubRead { .. } => 32,
            Reply::Found(_) => 33,
            Reply::Tuple { .. } => 34,
            Reply::TupleEvents(_) => 35,
            Reply::Changes(_) => 36,
            Reply::Usage(_) => 37,
        }
    }
}
