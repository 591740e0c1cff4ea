//! Paging through a directory whose entries may be split over servers (docs/protocol.md,
//! "Listing order"): the walk from one position to a page of entries, independent of how
//! a page is fetched (so that it is tested here against a model of splitting partitions).
//!
//! Entries are listed by *listing key* (`shoal_placement::listing_key(name_hash(name))`),
//! then by name. A server answers a page of ONE partition, the one holding the start
//! position, and names it (`part`): `more: false` ends that partition, and the listing goes
//! on at the first key after it (`key_after`), wherever that partition now lives. A split
//! only cuts a partition's key range in two (its upper half moves), so a partition's first
//! key never changes and positions only go up: every entry present for the whole listing
//! is met exactly once, however the directory splits meanwhile.

use crate::error::{Error, Result};
use shoal_placement::{key_after, listing_key, name_hash};
use shoal_proto::msg::{DirEntry, PartRef};
use shoal_proto::Errno;
use std::future::Future;

/// Where a page starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// Strictly after this name's position (listing key, then name). The name need not
    /// exist any more.
    After(String),
    /// At the first entry whose listing key is at least this.
    From(u64),
}

impl Start {
    /// The listing key of the position.
    pub(crate) fn key(&self) -> u64 {
        match self {
            Start::After(name) => listing_key(name_hash(name)),
            Start::From(k) => *k,
        }
    }
}

/// One server's answer to one `ReadDir`.
pub(crate) struct Page {
    pub(crate) entries: Vec<DirEntry>,
    /// More entries follow in the same partition.
    pub(crate) more: bool,
    /// The partition the page came from; `None` from a server without split directories:
    /// then `more: false` is the end of the whole directory.
    pub(crate) part: Option<PartRef>,
}

/// Gather a page of at most `limit` (≥ 1) entries from `start`, asking `fetch(start, n)`
/// for one server page of at most `n` entries at a time and crossing partition ends.
/// Returns the entries and whether more may follow; never an empty page with `true`
/// (an empty partition is skipped, not handed to the caller).
pub(crate) async fn walk<F, Fut>(start: Start, limit: u32, mut fetch: F) -> Result<(Vec<DirEntry>, bool)>
where
    F: FnMut(Start, u32) -> Fut,
    Fut: Future<Output = Result<Page>>,
{
    let limit = limit.max(1) as usize;
    let mut out: Vec<DirEntry> = Vec::new();
    let mut start = start;
    loop {
        let position = start.key();
        let page = fetch(start, (limit - out.len()) as u32).await?;
        let last = page.entries.last().map(|e| e.name.clone());
        out.extend(page.entries);
        if page.more {
            // The partition goes on: after the last name given (a server page of a
            // partition that goes on is never empty).
            let Some(last) = last else {
                return Err(Error::new(Errno::EPROTO, "an empty directory page said more entries follow"));
            };
            if out.len() >= limit {
                return Ok((out, true));
            }
            start = Start::After(last);
            continue;
        }
        // The end of the partition holding `position`: on to the next one.
        let next = match page.part {
            None => None,
            Some(p) => key_after(p.index, p.depth),
        };
        match next {
            None => return Ok((out, false)),
            // Positions only go up; a partition not holding the position would loop.
            Some(k) if k <= position => {
                let p = page.part.unwrap_or(PartRef { index: 0, depth: 0 });
                return Err(Error::new(
                    Errno::EPROTO,
                    format!("a directory page of partition {} at depth {} does not hold its start", p.index, p.depth),
                ));
            }
            Some(_) if out.len() >= limit => return Ok((out, true)),
            Some(k) => start = Start::From(k),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_placement::{key_range, Bitmap};
    use shoal_proto::msg::FileKind;
    use shoal_proto::Ino;
    use std::cell::RefCell;
    use std::collections::{BTreeMap, BTreeSet, HashMap};

    /// A model of a split directory as its servers see it: the names by listing position
    /// and the partitions that exist now. `fetch` answers as a server holding the start
    /// position would, then lets `between` change the directory (split, add, remove).
    struct Model {
        names: BTreeMap<(u64, String), Ino>,
        bitmap: Bitmap,
        requests: u32,
    }

    impl Model {
        fn new(n: usize) -> Model {
            let mut m = Model { names: BTreeMap::new(), bitmap: Bitmap::new(), requests: 0 };
            for i in 0..n {
                m.add(&format!("f{i}"));
            }
            m
        }

        fn add(&mut self, name: &str) {
            self.names.insert((listing_key(name_hash(name)), name.to_string()), Ino(1000 + self.names.len() as u64));
        }

        fn remove(&mut self, name: &str) {
            self.names.remove(&(listing_key(name_hash(name)), name.to_string()));
        }

        fn page(&mut self, start: &Start, n: u32) -> Page {
            self.requests += 1;
            let key = start.key();
            let index = self.bitmap.partition_of(key.reverse_bits());
            let depth = self.bitmap.depth_of(index);
            let (_, hi) = key_range(index, depth);
            let from = match start {
                Start::After(name) => std::ops::Bound::Excluded((key, name.clone())),
                Start::From(k) => std::ops::Bound::Included((*k, String::new())),
            };
            let mut it = self
                .names
                .range((from, std::ops::Bound::Unbounded))
                .take_while(|((k, _), _)| *k <= hi)
                .map(|((_, name), ino)| DirEntry { name: name.clone(), ino: *ino, kind: FileKind::File });
            let entries: Vec<DirEntry> = it.by_ref().take(n as usize).collect();
            let more = it.next().is_some();
            Page { entries, more, part: Some(PartRef { index, depth }) }
        }

        /// Split every partition once (the directory doubles its partitions).
        fn split_all(&mut self) {
            let parts: Vec<u32> = self.bitmap.partitions().collect();
            for p in parts {
                if self.bitmap.depth_of(p) < 6 {
                    self.bitmap.split(p).unwrap();
                }
            }
        }
    }

    fn list_all(model: &RefCell<Model>, limit: u32, between: impl Fn(&mut Model, u32)) -> Vec<String> {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        for round in 0..100_000u32 {
            let start = after.clone().map_or(Start::From(0), Start::After);
            let (page, more) = rt
                .block_on(walk(start, limit, |s, n| {
                    let mut m = model.borrow_mut();
                    let p = m.page(&s, n);
                    between(&mut m, round);
                    async move { Ok(p) }
                }))
                .unwrap();
            assert!(page.len() <= limit as usize);
            assert!(!(page.is_empty() && more), "an empty page with more");
            after = page.last().map(|e| e.name.clone()).or(after);
            all.extend(page.into_iter().map(|e| e.name));
            if !more {
                return all;
            }
        }
        panic!("the listing did not end");
    }

    fn exactly_once(listed: &[String], expect: impl IntoIterator<Item = String>) {
        let mut seen = HashMap::new();
        for n in listed {
            *seen.entry(n.clone()).or_insert(0) += 1;
        }
        assert!(seen.values().all(|&c| c == 1), "a name listed twice");
        for n in expect {
            assert_eq!(seen.get(&n), Some(&1), "{n} not listed");
        }
    }

    #[test]
    fn an_unsplit_directory_lists_in_listing_order() {
        let model = RefCell::new(Model::new(250));
        let listed = list_all(&model, 64, |_, _| {});
        exactly_once(&listed, (0..250).map(|i| format!("f{i}")));
        let keys: Vec<(u64, &String)> = listed.iter().map(|n| (listing_key(name_hash(n)), n)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "listing order");
    }

    #[test]
    fn a_split_directory_is_walked_partition_by_partition_without_empty_pages() {
        let model = RefCell::new(Model::new(300));
        for _ in 0..3 {
            model.borrow_mut().split_all();
        }
        // Empty partitions are skipped, not handed out: a few names only, 8 partitions.
        let sparse = RefCell::new(Model::new(3));
        for _ in 0..3 {
            sparse.borrow_mut().split_all();
        }
        let listed = list_all(&sparse, 1, |_, _| {});
        exactly_once(&listed, (0..3).map(|i| format!("f{i}")));
        let listed = list_all(&model, 1000, |_, _| {});
        exactly_once(&listed, (0..300).map(|i| format!("f{i}")));
        assert_eq!(model.borrow().requests, 8, "one request per partition when a page can hold it all");
    }

    #[test]
    fn every_name_is_listed_once_while_partitions_split() {
        for limit in [1, 7, 50, 1000] {
            let model = RefCell::new(Model::new(400));
            let listed = list_all(&model, limit, |m, round| {
                if round % 3 == 1 {
                    m.split_all();
                }
            });
            exactly_once(&listed, (0..400).map(|i| format!("f{i}")));
        }
    }

    #[test]
    fn names_added_and_removed_meanwhile_never_show_twice() {
        let model = RefCell::new(Model::new(200));
        let listed = list_all(&model, 9, |m, round| {
            m.add(&format!("new{round}"));
            m.remove(&format!("f{}", round * 2 + 1));
            if round % 5 == 0 {
                m.split_all();
            }
        });
        // Names present throughout: the even ones up to the listing's end.
        let stayed: BTreeSet<String> = (0..200).filter(|i| i % 2 == 0).map(|i| format!("f{i}")).collect();
        exactly_once(&listed, stayed);
    }

    #[test]
    fn the_caller_s_after_name_may_be_gone() {
        let model = RefCell::new(Model::new(100));
        model.borrow_mut().split_all();
        let listed = list_all(&model, 10, |m, round| {
            // Remove the name the caller will continue after.
            if round < 10 {
                let keys: Vec<String> = m.names.keys().map(|(_, n)| n.clone()).collect();
                if let Some(n) = keys.get((round as usize + 1) * 10 - 1) {
                    m.remove(&n.clone());
                }
            }
        });
        let mut uniq = listed.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), listed.len(), "no name twice");
        assert!(listed.len() >= 90, "{} names listed", listed.len());
    }

    #[test]
    fn a_server_page_not_holding_its_start_is_an_error_not_a_loop() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let e = rt
            .block_on(walk(Start::From(u64::MAX), 5, |_, _| async {
                Ok(Page { entries: Vec::new(), more: false, part: Some(PartRef { index: 0, depth: 1 }) })
            }))
            .unwrap_err();
        assert_eq!(e.errno, Errno::EPROTO);
        let e = rt
            .block_on(walk(Start::From(0), 5, |_, _| async {
                Ok(Page { entries: Vec::new(), more: true, part: None })
            }))
            .unwrap_err();
        assert_eq!(e.errno, Errno::EPROTO);
    }

    #[test]
    fn a_server_without_partitions_ends_the_listing_with_its_last_page() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (page, more) = rt
            .block_on(walk(Start::From(0), 5, |_, _| async {
                Ok(Page { entries: Vec::new(), more: false, part: None })
            }))
            .unwrap();
        assert!(page.is_empty() && !more);
    }
}
