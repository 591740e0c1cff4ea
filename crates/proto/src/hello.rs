//! Version and feature negotiation in `Hello` (docs/protocol.md, "Hello").
//!
//! The requester sends the range of protocol versions it speaks and the feature bits it
//! supports; the answer names the version both will speak (the highest in both ranges) and
//! the features both support (the intersection). A peer whose range does not meet ours is
//! refused with a message naming both ranges.
//!
//! **The `Hello` exchange must stay decodable by every later version**: its frame header
//! layout (version 2, `frame.rs`) and the fields of `Op::Hello` and `Reply::Hello` may only
//! grow by optional fields, never change, so that any two versions can at least tell each
//! other which versions they speak.

use crate::PROTOCOL_VERSION;

/// Oldest protocol version this build speaks.
pub const MIN_PROTOCOL_VERSION: u32 = 5;

/// Bulk data sections carry a CRC32C (the header's `data crc`, flag bit 0). Without it only
/// header and body are checksummed. On unless a side turns it off (`SHOAL_DATA_CRC=off`).
pub const FEATURE_DATA_CRC: u64 = 1 << 0;

/// Directory leases (`lease.rs`): the server may grant leases on this connection and send
/// notices (frame kind 2) on it. A client that does not offer it never receives a notice,
/// and then gets no lease either.
pub const FEATURE_LEASES: u64 = 1 << 1;

/// Split directories (docs/protocol.md, "Split directories"): the client routes names by
/// the directory's partition bitmap and understands `Reply::Partitions` and the listing
/// order. A server answers a client without it, asking about a split directory, with an
/// error naming the cause instead of a reply that client could not decode.
pub const FEATURE_PARTITIONS: u64 = 1 << 2;

/// Attribute leases (`lease.rs`, "Attribute leases"): with `FEATURE_LEASES`, the client
/// asks for a lease on the attributes of every inode of this server whose attributes a reply
/// carries (`GetAttr`, `SetAttr`, and the entry of `Lookup`, `Create`, `Mkdir`, `Symlink`,
/// `Link`); the server may grant one, revoked before the inode's record changes. Offered
/// only by clients that cache attributes for that long (a FUSE mount): the server keeps a
/// record per lease.
pub const FEATURE_ATTR_LEASES: u64 = 1 << 3;

/// List I/O (docs/protocol.md, "List I/O"): the server knows `Op::ReadList` and
/// `Op::WriteList`. A client sends them only to servers that agreed; to an older server it
/// sends the same object pieces as one `Read` or `Write` each (servers of a version without
/// them close a connection that carries a request they cannot decode).
pub const FEATURE_LIST_IO: u64 = 1 << 4;

/// Load exchange (`Op::PeerLoad`, docs/architecture.md, "Load-aware placement"): the server
/// knows `PeerLoad` and answers it with its own load. A server sends it only to peers that
/// agreed, so a server of before (which would close the connection on a request it cannot
/// decode) is simply not told, and its load stays unknown.
pub const FEATURE_LOAD: u64 = 1 << 5;

/// Reverse read (docs/import.md): the server knows `Op::UrlProbe` and `Op::FetchInto`. A
/// client imports through servers that agreed and says which did not otherwise.
pub const FEATURE_FETCH: u64 = 1 << 6;

/// The replicated cluster map (docs/membership.md): the server knows `Op::PeerRaft` and
/// `Op::GetMap`. Servers send the group's messages only to peers that agreed; clients ask
/// for the map only servers that did (an older server would close the connection).
pub const FEATURE_MEMBERSHIP: u64 = 1 << 7;

/// Read-mostly files and directories (docs/loading.md): the server knows
/// `Op::SetReadMostly` and keeps the mark. A client asks only servers that agreed (an older
/// server would close the connection on the unknown operation).
pub const FEATURE_READ_MOSTLY: u64 = 1 << 8;

/// Metadata queries (docs/find.md): the server knows `Op::Find`. A client asks only
/// servers that agreed (an older server would close the connection on the unknown
/// operation; the client says which server is too old).
pub const FEATURE_FIND: u64 = 1 << 9;

/// The tuple space (docs/tuples.md): the server knows `Op::TupleWrite`, `TupleRead` and
/// `TupleWatch`.
pub const FEATURE_TUPLES: u64 = 1 << 10;

/// The change log (docs/changes.md): the server knows `Op::Changes` and `Op::ChangeAck`
/// and logs a `Close` event for an `Fsync` with `closing`.
pub const FEATURE_CHANGES: u64 = 1 << 11;

/// Per-directory usage (docs/du.md): the server keeps usage records and knows `Op::Usage`.
pub const FEATURE_USAGE: u64 = 1 << 12;

/// Every feature bit this build knows. Bits a peer sets beyond these are ignored.
pub const KNOWN_FEATURES: u64 = FEATURE_DATA_CRC
    | FEATURE_LEASES
    | FEATURE_PARTITIONS
    | FEATURE_ATTR_LEASES
    | FEATURE_LIST_IO
    | FEATURE_LOAD
    | FEATURE_FETCH
    | FEATURE_MEMBERSHIP
    | FEATURE_READ_MOSTLY
    | FEATURE_FIND
    | FEATURE_TUPLES
    | FEATURE_CHANGES
    | FEATURE_USAGE;

/// The features this process offers by default: all it knows but attribute leases (a client
/// that wants them adds the bit), less the data checksum when the environment says
/// `SHOAL_DATA_CRC=off` (or `0`), the switch used to measure its cost, and less the bits
/// named in `SHOAL_FEATURES_OFF` ([`features_off`]). A server accepts every bit it offers
/// and attribute leases ([`server_features`]).
pub fn default_features() -> u64 {
    let crc_off = matches!(std::env::var("SHOAL_DATA_CRC").as_deref(), Ok("off") | Ok("0"));
    let off = features_off() | if crc_off { FEATURE_DATA_CRC } else { 0 };
    KNOWN_FEATURES & !FEATURE_ATTR_LEASES & !off
}

/// The features a server accepts: those it offers plus attribute leases (unless switched
/// off).
pub fn server_features() -> u64 {
    (default_features() | FEATURE_ATTR_LEASES) & !features_off()
}

/// The feature bits named in the environment variable `SHOAL_FEATURES_OFF`, comma-separated
/// (`data_crc`, `leases`, `partitions`, `attr_leases`, `list_io`, `load`, `read_mostly`; other
/// names are ignored):
/// a process that behaves as a version without them, which is how the tests check that
/// peers of different versions work together.
pub fn features_off() -> u64 {
    let Ok(names) = std::env::var("SHOAL_FEATURES_OFF") else { return 0 };
    names
        .split(',')
        .map(|n| match n.trim() {
            "data_crc" => FEATURE_DATA_CRC,
            "leases" => FEATURE_LEASES,
            "partitions" => FEATURE_PARTITIONS,
            "attr_leases" => FEATURE_ATTR_LEASES,
            "list_io" => FEATURE_LIST_IO,
            "load" => FEATURE_LOAD,
            "read_mostly" => FEATURE_READ_MOSTLY,
            "find" => FEATURE_FIND,
            "tuples" => FEATURE_TUPLES,
            "changes" => FEATURE_CHANGES,
            "usage" => FEATURE_USAGE,
            _ => 0,
        })
        .fold(0, |a, b| a | b)
}

/// The `Hello` this build sends: its whole version range and its default features.
pub fn hello_op(client: impl Into<String>, session: u64) -> crate::msg::Op {
    crate::msg::Op::Hello {
        client: client.into(),
        session,
        min_version: MIN_PROTOCOL_VERSION,
        max_version: PROTOCOL_VERSION,
        features: default_features(),
        auth: None,
    }
}

/// What two sides agreed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Agreed {
    pub version: u32,
    pub features: u64,
}

/// The answer to a peer that speaks `peer_min..=peer_max` with `peer_features`, when this
/// side speaks `MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION` with `own_features`. `Err` is
/// the refusal, naming both ranges ("client speaks protocol 3..=4, this server 5..=5").
pub fn negotiate(peer_min: u32, peer_max: u32, peer_features: u64, own_features: u64) -> Result<Agreed, String> {
    let version = peer_max.min(PROTOCOL_VERSION);
    if peer_min > peer_max || version < peer_min.max(MIN_PROTOCOL_VERSION) {
        return Err(format!(
            "client speaks protocol {peer_min}..={peer_max}, this server {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION}"
        ));
    }
    Ok(Agreed { version, features: peer_features & own_features & KNOWN_FEATURES })
}

/// Check a server's answer against what this side offered: the version must be in our
/// range and the features among those we offered.
pub fn check_answer(version: u32, features: u64, offered: u64) -> Result<Agreed, String> {
    if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
        return Err(format!(
            "server chose protocol {version}, this client speaks {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION}"
        ));
    }
    if features & !offered != 0 {
        return Err(format!("server chose features {features:#x}, this client offered {offered:#x}"));
    }
    Ok(Agreed { version, features })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_peer_is_spoken_to_in_our_newest_version_with_the_common_features() {
        let a = negotiate(5, PROTOCOL_VERSION + 1, FEATURE_DATA_CRC | 1 << 40, KNOWN_FEATURES).unwrap();
        assert_eq!(a, Agreed { version: PROTOCOL_VERSION, features: FEATURE_DATA_CRC });
        let a = negotiate(1, PROTOCOL_VERSION + 1, 1 << 40, KNOWN_FEATURES).unwrap();
        assert_eq!(a.features, 0, "unknown bits are dropped");
    }

    #[test]
    fn a_too_old_or_too_new_peer_is_refused_naming_both_ranges() {
        let e = negotiate(3, 4, 0, KNOWN_FEATURES).unwrap_err();
        assert_eq!(e, format!("client speaks protocol 3..=4, this server {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION}"));
        assert!(negotiate(PROTOCOL_VERSION + 1, PROTOCOL_VERSION + 3, 0, KNOWN_FEATURES).is_err());
        assert!(negotiate(6, 5, 0, KNOWN_FEATURES).is_err(), "an empty range");
    }

    #[test]
    fn an_answer_outside_what_was_offered_is_refused() {
        assert!(check_answer(PROTOCOL_VERSION, FEATURE_DATA_CRC, KNOWN_FEATURES).is_ok());
        assert!(check_answer(PROTOCOL_VERSION + 1, 0, KNOWN_FEATURES).is_err());
        assert!(check_answer(PROTOCOL_VERSION, FEATURE_DATA_CRC, 0).is_err());
    }
}
