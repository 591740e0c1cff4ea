//! Metadata queries (`Op::Find`, docs/find.md): the predicates of `shoal find`, evaluated by
//! every server over the entries it holds, and by the client for the entries whose inode
//! lives on another server.
//!
//! One definition of "matches" serves both sides, so a query gives the same answer wherever
//! it is evaluated. The predicates follow find(1): all of them must hold (there is no `-o`);
//! sizes and ages compare rounded-up units and whole periods the way find does (`-size -1M`
//! is the empty files only, `-mtime 0` is "changed less than a day ago").

use crate::msg::{Attr, FileKind, Timestamp};
use serde::{Deserialize, Serialize};

/// Less than, exactly, or more than a number (find's `-N`, `N`, `+N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cmp {
    Less,
    Equal,
    More,
}

impl Cmp {
    fn holds(self, value: u64, n: u64) -> bool {
        match self {
            Cmp::Less => value < n,
            Cmp::Equal => value == n,
            Cmp::More => value > n,
        }
    }
}

/// find's `-size`: the size rounded up to `unit` bytes, compared with `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeTest {
    pub cmp: Cmp,
    pub n: u64,
    pub unit: u64,
}

/// Which time an [`AgeTest`] looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeField {
    Access,
    Modify,
    Change,
}

/// find's `-mtime`/`-mmin` (and a, c): whole `period`s (seconds) between the time and `now`
/// (the client's clock when the query was made, so that every server counts from the same
/// instant), compared with `n`. A time in the future is age 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgeTest {
    pub field: TimeField,
    pub cmp: Cmp,
    pub n: u64,
    pub period: u64,
    pub now: i64,
}

/// find's `-perm`: exactly these bits, all of them (`-MODE`), or any of them (`/MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PermTest {
    Exact(u32),
    All(u32),
    Any(u32),
}

/// A query: every field set must hold. `Default` matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FindQuery {
    /// Shell pattern the entry's name must match (find `-name`), case-insensitive with
    /// `ignore_case` (`-iname`).
    pub name: Option<String>,
    pub ignore_case: bool,
    pub kind: Option<FileKind>,
    pub size: Option<SizeTest>,
    pub ages: Vec<AgeTest>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub perm: Option<PermTest>,
    /// Regular files striped over exactly this many servers.
    pub stripe_count: Option<u32>,
    /// Regular files of exactly this stripe size.
    pub stripe_size: Option<u64>,
    /// Files and directories marked read-mostly (docs/loading.md).
    pub read_mostly: Option<bool>,
    /// An extended attribute the inode must have (`xattr_value`: with exactly this value).
    pub xattr: Option<String>,
    pub xattr_value: Option<Vec<u8>>,
    /// The entry names exactly this inode (find `-inum`; protocol 12).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inum: Option<crate::Ino>,
}

/// Longest name pattern a server accepts (a longer one is EINVAL).
pub const PATTERN_MAX: usize = 4096;

impl FindQuery {
    /// The name pattern, compiled; `Err` names why it is not a valid pattern.
    pub fn pattern(&self) -> Result<Option<glob::Pattern>, String> {
        match &self.name {
            None => Ok(None),
            Some(p) if p.len() > PATTERN_MAX => Err(format!("name pattern longer than {PATTERN_MAX} bytes")),
            Some(p) => glob::Pattern::new(p).map(Some).map_err(|e| format!("name pattern {p:?}: {e}")),
        }
    }

    /// Whether `name` (of kind `kind`) passes the tests that need no attributes.
    pub fn matches_name(&self, pattern: Option<&glob::Pattern>, name: &str, kind: FileKind, ino: crate::Ino) -> bool {
        if self.kind.is_some_and(|k| k != kind) || self.inum.is_some_and(|i| i != ino) {
            return false;
        }
        let opts = glob::MatchOptions {
            case_sensitive: !self.ignore_case,
            require_literal_separator: false,
            require_literal_leading_dot: false,
        };
        pattern.is_none_or(|p| p.matches_with(name, opts))
    }

    /// Whether `a` passes the tests on attributes (not the name, not the extended
    /// attribute: see [`FindQuery::matches_name`] and [`FindQuery::xattr_holds`]).
    pub fn matches_attr(&self, a: &Attr) -> bool {
        if self.kind.is_some_and(|k| k != a.kind) {
            return false;
        }
        if let Some(s) = self.size {
            let units = a.size.div_ceil(s.unit.max(1));
            if !s.cmp.holds(units, s.n) {
                return false;
            }
        }
        for t in &self.ages {
            let time = match t.field {
                TimeField::Access => a.atime,
                TimeField::Modify => a.mtime,
                TimeField::Change => a.ctime,
            };
            if !t.cmp.holds(age(time, t.now) / t.period.max(1), t.n) {
                return false;
            }
        }
        if self.uid.is_some_and(|u| u != a.uid) || self.gid.is_some_and(|g| g != a.gid) {
            return false;
        }
        let mode = a.perm & 0o7777;
        let perm_ok = match self.perm {
            None => true,
            Some(PermTest::Exact(m)) => mode == m & 0o7777,
            Some(PermTest::All(m)) => mode & m == m,
            Some(PermTest::Any(m)) => m == 0 || mode & m != 0,
        };
        if !perm_ok || self.read_mostly.is_some_and(|r| r != a.read_mostly) {
            return false;
        }
        if self.stripe_count.is_some() || self.stripe_size.is_some() {
            let Some(l) = a.layout.as_ref().filter(|_| a.kind == FileKind::File) else { return false };
            if self.stripe_count.is_some_and(|c| c as usize != l.servers.len())
                || self.stripe_size.is_some_and(|s| s != l.stripe_size)
            {
                return false;
            }
        }
        true
    }

    /// Whether the extended attribute test holds for the value found (`None`: the inode
    /// has no attribute of that name). True when the query has no such test.
    pub fn xattr_holds(&self, found: Option<&[u8]>) -> bool {
        match (&self.xattr, found) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(_), Some(v)) => self.xattr_value.as_deref().is_none_or(|want| want == v),
        }
    }
}

/// find's numbers: "+N" (more), "-N" (less) or "N" (exactly).
pub fn parse_number(s: &str) -> Result<(Cmp, u64), String> {
    let (cmp, digits) = match (s.strip_prefix('+'), s.strip_prefix('-')) {
        (Some(d), _) => (Cmp::More, d),
        (_, Some(d)) => (Cmp::Less, d),
        _ => (Cmp::Equal, s),
    };
    let n = digits.parse().map_err(|_| format!("{s:?} is not a number (N, +N or -N)"))?;
    Ok((cmp, n))
}

impl SizeTest {
    /// find's `-size`: "[+-]N[cwkMGT]" (no unit: 512-byte blocks).
    pub fn parse(s: &str) -> Result<SizeTest, String> {
        let unit_of = |c: char| match c {
            'c' => Some(1),
            'w' => Some(2),
            'k' | 'K' => Some(1 << 10),
            'M' => Some(1 << 20),
            'G' => Some(1 << 30),
            'T' => Some(1u64 << 40),
            _ => None,
        };
        let (unit, digits) = match s.chars().last().and_then(unit_of) {
            Some(u) => (u, &s[..s.len() - 1]),
            None => (512, s),
        };
        let (cmp, n) = parse_number(digits)?;
        Ok(SizeTest { cmp, n, unit })
    }
}

impl AgeTest {
    /// find's `-mtime` (`period` 86,400) or `-mmin` (60) and their kin: "[+-]N" periods
    /// before `now`.
    pub fn parse(s: &str, field: TimeField, period: u64, now: i64) -> Result<AgeTest, String> {
        let (cmp, n) = parse_number(s)?;
        Ok(AgeTest { field, cmp, n, period, now })
    }
}

impl PermTest {
    /// find's `-perm`: octal "MODE" (exactly), "-MODE" (all of them), "/MODE" (any).
    pub fn parse(s: &str) -> Result<PermTest, String> {
        let octal = |m: &str| {
            u32::from_str_radix(m, 8)
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| format!("{s:?} is not an octal mode such as 644, -600 or /111"))
        };
        match (s.strip_prefix('-'), s.strip_prefix('/')) {
            (Some(m), _) => octal(m).map(PermTest::All),
            (_, Some(m)) => octal(m).map(PermTest::Any),
            _ => octal(s).map(PermTest::Exact),
        }
    }
}

/// find's `-type`: "f", "d" or "l" (or "file", "directory", "symlink").
pub fn parse_kind(s: &str) -> Result<FileKind, String> {
    match s {
        "f" | "file" => Ok(FileKind::File),
        "d" | "directory" => Ok(FileKind::Dir),
        "l" | "symlink" => Ok(FileKind::Symlink),
        _ => Err(format!("{s:?}: f (file), d (directory) or l (symbolic link)")),
    }
}

/// Seconds from `t` to `now` (0 for a time in the future).
fn age(t: Timestamp, now: i64) -> u64 {
    now.saturating_sub(t.secs).max(0) as u64
}

/// An entry that matched, as a server found it: its directory, its name, and its
/// attributes when the inode is held by that server and passed every test (`None`: the
/// inode is elsewhere; the client fetches its attributes and finishes the tests).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoundEntry {
    pub dir: crate::Ino,
    pub name: String,
    pub ino: crate::Ino,
    pub kind: FileKind,
    pub attr: Option<Attr>,
}

/// A directory entry naming a directory (every one the caller may see, matching or not):
/// what the client builds paths from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoundDir {
    pub dir: crate::Ino,
    pub name: String,
    pub ino: crate::Ino,
}

/// One page of a server's answer to `Op::Find`: `next` is where the following page starts
/// (`None`: the server has looked at every entry it holds).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindPage {
    pub found: Vec<FoundEntry>,
    pub dirs: Vec<FoundDir>,
    /// Entries this page looked at (matching or not).
    pub scanned: u64,
    pub next: Option<Vec<u8>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Ino;

    fn file(size: u64, mtime: i64, perm: u32) -> Attr {
        Attr {
            ino: Ino(9),
            kind: FileKind::File,
            perm,
            uid: 1000,
            gid: 100,
            size,
            nlink: 1,
            atime: Timestamp { secs: mtime, nsecs: 0 },
            mtime: Timestamp { secs: mtime, nsecs: 0 },
            ctime: Timestamp { secs: mtime, nsecs: 0 },
            blocks_bytes: 0,
            layout: None,
            dir_default: None,
            parent: None,
            read_mostly: false,
        }
    }

    #[test]
    fn sizes_round_up_to_the_unit_as_find_does() {
        let mib = 1 << 20;
        let q = |cmp, n| FindQuery { size: Some(SizeTest { cmp, n, unit: mib }), ..Default::default() };
        assert!(q(Cmp::Less, 1).matches_attr(&file(0, 0, 0o644)), "-size -1M: empty only");
        assert!(!q(Cmp::Less, 1).matches_attr(&file(1, 0, 0o644)));
        assert!(q(Cmp::Equal, 1).matches_attr(&file(1, 0, 0o644)), "1 byte is 1 MiB rounded up");
        assert!(q(Cmp::More, 1).matches_attr(&file(mib + 1, 0, 0o644)));
        assert!(!q(Cmp::More, 1).matches_attr(&file(mib, 0, 0o644)));
    }

    #[test]
    fn ages_count_whole_periods_from_the_query_s_now() {
        let now = 1_000_000;
        let q = |cmp, n| FindQuery {
            ages: vec![AgeTest { field: TimeField::Modify, cmp, n, period: 86_400, now }],
            ..Default::default()
        };
        assert!(q(Cmp::Equal, 0).matches_attr(&file(0, now - 86_399, 0o644)), "-mtime 0: under a day");
        assert!(q(Cmp::More, 0).matches_attr(&file(0, now - 86_400, 0o644)));
        assert!(q(Cmp::Less, 1).matches_attr(&file(0, now + 50, 0o644)), "the future is age 0");
    }

    #[test]
    fn names_kinds_owners_and_permission_bits() {
        let q = FindQuery { name: Some("*.H5".into()), ignore_case: true, ..Default::default() };
        let p = q.pattern().unwrap();
        assert!(q.matches_name(p.as_ref(), "out.h5", FileKind::File, Ino(9)));
        assert!(q.matches_name(p.as_ref(), ".hidden.h5", FileKind::File, Ino(9)), "find's * matches a leading dot");
        assert!(!q.matches_name(p.as_ref(), "out.h5.bak", FileKind::File, Ino(9)));
        let q = FindQuery { kind: Some(FileKind::Dir), ..Default::default() };
        assert!(!q.matches_name(None, "x", FileKind::File, Ino(9)));
        let perm = |t| FindQuery { perm: Some(t), ..Default::default() };
        assert!(perm(PermTest::Exact(0o644)).matches_attr(&file(0, 0, 0o644)));
        assert!(!perm(PermTest::Exact(0o600)).matches_attr(&file(0, 0, 0o644)));
        assert!(perm(PermTest::All(0o600)).matches_attr(&file(0, 0, 0o644)));
        assert!(!perm(PermTest::All(0o002)).matches_attr(&file(0, 0, 0o644)));
        assert!(perm(PermTest::Any(0o111)).matches_attr(&file(0, 0, 0o744)));
        assert!(!perm(PermTest::Any(0o111)).matches_attr(&file(0, 0, 0o644)));
        let owner = FindQuery { uid: Some(1000), gid: Some(7), ..Default::default() };
        assert!(!owner.matches_attr(&file(0, 0, 0o644)));
        assert!(FindQuery { name: Some("[".into()), ..Default::default() }.pattern().is_err());
    }

    #[test]
    fn find_s_notation_is_read_as_find_reads_it() {
        assert_eq!(SizeTest::parse("+1M").unwrap(), SizeTest { cmp: Cmp::More, n: 1, unit: 1 << 20 });
        assert_eq!(SizeTest::parse("-10k").unwrap(), SizeTest { cmp: Cmp::Less, n: 10, unit: 1024 });
        assert_eq!(SizeTest::parse("7").unwrap(), SizeTest { cmp: Cmp::Equal, n: 7, unit: 512 });
        assert_eq!(SizeTest::parse("100c").unwrap().unit, 1);
        assert!(SizeTest::parse("big").is_err());
        assert!(SizeTest::parse("").is_err());
        assert_eq!(parse_number("+3").unwrap(), (Cmp::More, 3));
        assert!(parse_number("3d").is_err());
        let t = AgeTest::parse("-7", TimeField::Access, 86_400, 5).unwrap();
        assert_eq!((t.cmp, t.n, t.now), (Cmp::Less, 7, 5));
        assert_eq!(PermTest::parse("644").unwrap(), PermTest::Exact(0o644));
        assert_eq!(PermTest::parse("-600").unwrap(), PermTest::All(0o600));
        assert_eq!(PermTest::parse("/111").unwrap(), PermTest::Any(0o111));
        assert!(PermTest::parse("999").is_err());
        assert!(PermTest::parse("17777").is_err());
        assert_eq!(parse_kind("d").unwrap(), FileKind::Dir);
        assert!(parse_kind("q").is_err());
    }

    #[test]
    fn extended_attribute_tests() {
        let q = FindQuery { xattr: Some("user.tag".into()), xattr_value: Some(b"hot".to_vec()), ..Default::default() };
        assert!(q.xattr_holds(Some(b"hot")));
        assert!(!q.xattr_holds(Some(b"cold")));
        assert!(!q.xattr_holds(None));
        assert!(FindQuery::default().xattr_holds(None));
    }
}
