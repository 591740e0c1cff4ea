//! The replicated document, the one command that changes it, and the rule that decides
//! whether a change applies (the same on every member, so that all apply the same log to
//! the same result).

use serde::{Deserialize, Serialize};
use shoal_placement::ClusterMap;
use std::path::Path;

/// The cluster map as the group holds it: its TOML text and the version (`[cluster]
/// version`, the epoch every request names) that text declares.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapDoc {
    pub version: u64,
    pub toml: String,
}

impl MapDoc {
    /// A document from map text; refused unless the text is a valid map.
    pub fn new(toml: String) -> Result<MapDoc, String> {
        let map = parse(&toml)?;
        Ok(MapDoc { version: map.version(), toml })
    }

    /// The map this document holds, key paths left as written (relative ones stay relative,
    /// so that a map edited and proposed again keeps them so).
    pub fn map(&self) -> Result<ClusterMap, String> {
        parse(&self.toml)
    }
}

fn parse(toml: &str) -> Result<ClusterMap, String> {
    let map: ClusterMap = toml::from_str(toml).map_err(|e| e.message().trim_end().to_string())?;
    map.validate()?;
    Ok(map)
}

/// A change to the document, as a log entry carries it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Command {
    /// Compare-and-set: replace the map by `toml` if the current version is
    /// `expect_version` and `toml` is a valid map of version `expect_version + 1`.
    Replace { expect_version: u64, toml: String },
}

/// What applying one log entry did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApplyResult {
    /// The map now has this version.
    Applied { version: u64 },
    /// Not applied: the map's version is `current`, not the one the change expected.
    Conflict { current: u64 },
    /// Not applied: the text is not a valid map of the next version.
    Invalid { message: String },
    /// The entry was Raft's own (a blank entry of a new leader, a membership change).
    NotACommand,
}

/// The compare-and-set rule of [`Command::Replace`]: the new document, or why not.
pub fn replace(current: &MapDoc, expect_version: u64, toml: &str) -> Result<MapDoc, ApplyResult> {
    if current.version != expect_version {
        return Err(ApplyResult::Conflict { current: current.version });
    }
    check_next(expect_version, toml).map_err(|message| ApplyResult::Invalid { message })
}

/// `toml` as the document that may follow version `expect_version`, or why it may not.
pub fn check_next(expect_version: u64, toml: &str) -> Result<MapDoc, String> {
    let doc = MapDoc::new(toml.to_string())?;
    if doc.version != expect_version + 1 {
        return Err(format!(
            "the new map has version {}, the next after {expect_version} is {}",
            doc.version,
            expect_version + 1
        ));
    }
    Ok(doc)
}

/// The map of `doc` with key paths resolved against `base`, as servers and clients use it.
pub fn resolve(doc: &MapDoc, base: &Path) -> Result<ClusterMap, String> {
    ClusterMap::from_toml(&doc.toml, base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(version: u64) -> MapDoc {
        let mut m = ClusterMap::local(3, 7000, Path::new("/tmp"));
        m.cluster.version = version;
        MapDoc::new(m.to_toml()).unwrap()
    }

    #[test]
    fn replace_is_a_compare_and_set_on_the_version() {
        let cur = doc(4);
        assert_eq!(replace(&cur, 4, &doc(5).toml).unwrap(), doc(5));
        assert_eq!(replace(&cur, 3, &doc(4).toml).unwrap_err(), ApplyResult::Conflict { current: 4 });
        match replace(&cur, 4, &doc(7).toml).unwrap_err() {
            ApplyResult::Invalid { message } => assert!(message.contains("version 7"), "{message}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(replace(&cur, 4, "not a map").unwrap_err(), ApplyResult::Invalid { .. }));
    }
}
