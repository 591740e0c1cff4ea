//! A coop group: the mounts of one job that read read-mostly trees together, in one order
//! known to all of them (the job's node list), and each object's tree over them.
//!
//! Every object (an inode's attributes, a directory's listing, a piece of a file) has a
//! **designated reader**, the root of its tree: the only member that asks the servers for
//! it. The others ask their parent in that tree, which asks its own, up to the root; the
//! answer comes back down the same way. The root is chosen by the object's hash, so the
//! reading is spread over the members; the tree has [`FANOUT`] children per member, so a
//! member answers at most that many others for any object, and an answer reaches `n`
//! members in about log_FANOUT(n) hops (Spindle's overlay network is a binomial tree;
//! a k-ary one bounds the work per member instead of the number of hops).

use std::net::SocketAddr;

/// Children per member in an object's tree.
pub const FANOUT: usize = 4;

/// The members, in the order every one of them was given, and which one this is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    members: Vec<SocketAddr>,
    me: usize,
    id: u64,
}

impl Group {
    /// The group of `members` (each member's address for the others, in the job's order),
    /// as seen by the member listening on `me`. Refused: no members, a member twice, `me`
    /// not among them.
    pub fn new(members: Vec<SocketAddr>, me: SocketAddr) -> Result<Group, String> {
        if members.is_empty() {
            return Err("a coop group needs at least one member".into());
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = members.iter().find(|m| !seen.insert(**m)) {
            return Err(format!("coop member {dup} is listed twice"));
        }
        let Some(rank) = members.iter().position(|m| *m == me) else {
            return Err(format!("this mount's coop address {me} is not one of the group's members"));
        };
        // The group's identity: two jobs' groups never take each other's members for their own.
        let text: Vec<String> = members.iter().map(|m| m.to_string()).collect();
        let id = xxhash_rust::xxh3::xxh3_64(text.join(",").as_bytes());
        Ok(Group { members, me: rank, id })
    }

    /// This member's rank (its position in the list).
    pub fn me(&self) -> usize {
        self.me
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The address of member `rank`.
    pub fn addr(&self, rank: usize) -> SocketAddr {
        self.members[rank]
    }

    /// The group's identity (a hash of its member list), the same at every member.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The designated reader of the object hashed to `h`: the root of its tree.
    pub fn root(&self, h: u64) -> usize {
        (h % self.members.len() as u64) as usize
    }

    /// This member's parent in the tree of the object hashed to `h`; `None` at its root.
    pub fn parent(&self, h: u64) -> Option<usize> {
        let n = self.members.len();
        let root = self.root(h);
        // Positions relative to the root: the root is 0, its children 1..=FANOUT, theirs next.
        let rel = (self.me + n - root) % n;
        (rel != 0).then(|| ((rel - 1) / FANOUT + root) % n)
    }

    /// [`Group::parent`] in the tree over the members `live` says are up (this member is
    /// always counted): the tree of an object once members failed. Members that agree on
    /// who is up agree on the tree; the others still reach a live root, through more hops or
    /// the servers.
    pub fn parent_among(&self, h: u64, live: impl Fn(usize) -> bool) -> Option<usize> {
        let up: Vec<usize> = (0..self.members.len()).filter(|r| *r == self.me || live(*r)).collect();
        let n = up.len();
        let root = (h % n as u64) as usize;
        let me = up.iter().position(|r| *r == self.me).expect("this member is counted");
        let rel = (me + n - root) % n;
        (rel != 0).then(|| up[((rel - 1) / FANOUT + root) % n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: u16) -> Vec<SocketAddr> {
        (0..n).map(|i| SocketAddr::from(([127, 0, 0, 1], 7000 + i))).collect()
    }

    #[test]
    fn every_member_reaches_the_root_within_log_fanout_hops_and_no_one_has_more_than_fanout_children() {
        for n in [1u16, 2, 3, 5, 16, 100] {
            let all = members(n);
            let groups: Vec<Group> = all.iter().map(|m| Group::new(all.clone(), *m).unwrap()).collect();
            for h in [0u64, 7, 12345, u64::MAX] {
                let root = groups[0].root(h);
                for g in &groups {
                    assert_eq!(g.root(h), root, "every member agrees on the root");
                    // Walk up: reaches the root, within the tree's depth.
                    let (mut at, mut hops) = (g.me(), 0);
                    while let Some(p) = groups[at].parent(h) {
                        at = p;
                        hops += 1;
                        assert!(hops <= 1 + (n as f64).log(FANOUT as f64).ceil() as usize, "n={n}: {hops} hops");
                    }
                    assert_eq!(at, root);
                }
                let direct = |p: usize| groups.iter().filter(|g| g.parent(h) == Some(p)).count();
                for p in 0..n as usize {
                    assert!(direct(p) <= FANOUT, "n={n}: member {p} has {} children", direct(p));
                }
                assert_eq!(groups[root].parent(h), None);
            }
        }
    }

    #[test]
    fn with_members_down_the_live_ones_agree_on_a_tree_over_the_live_ones() {
        let all = members(16);
        let groups: Vec<Group> = all.iter().map(|m| Group::new(all.clone(), *m).unwrap()).collect();
        let down = [0usize, 5, 6, 11];
        let live = |r: usize| !down.contains(&r);
        for h in 0..64u64 {
            let mut roots = std::collections::HashSet::new();
            for g in groups.iter().filter(|g| live(g.me())) {
                let (mut at, mut hops) = (g.me(), 0);
                while let Some(p) = groups[at].parent_among(h, live) {
                    assert!(live(p), "a member that is down is never asked");
                    at = p;
                    hops += 1;
                    assert!(hops <= 3, "12 live members: {hops} hops");
                }
                roots.insert(at);
            }
            assert_eq!(roots.len(), 1, "one designated reader among the live members");
        }
        // Nobody down: the same tree as without failures.
        for g in &groups {
            assert_eq!(g.parent_among(7, |_| true), g.parent(7));
        }
    }

    #[test]
    fn bad_groups_are_refused_with_the_reason() {
        let all = members(3);
        assert!(Group::new(vec![], all[0]).unwrap_err().contains("at least one"));
        assert!(Group::new(vec![all[0], all[0]], all[0]).unwrap_err().contains("twice"));
        assert!(Group::new(all[..2].to_vec(), all[2]).unwrap_err().contains("not one of"));
        // Another member list, another identity.
        assert_ne!(Group::new(all.clone(), all[0]).unwrap().id(), Group::new(all[..2].to_vec(), all[0]).unwrap().id());
        assert_eq!(Group::new(all.clone(), all[0]).unwrap().id(), Group::new(all.clone(), all[1]).unwrap().id());
    }
}
