//! Permission checks, as a local POSIX file system makes them.
//!
//! The server holding an inode checks every request against the credentials the request
//! carries (AUTH_SYS-style trust, see docs/architecture.md). These functions are pure: they
//! take the inode's owner, group and mode and the caller, so that a table of cases tests
//! them and every handler shares one definition of "allowed".

use shoal_proto::msg::{Cred, FileKind};
use shoal_proto::Errno;

pub const R_OK: u32 = 4;
pub const W_OK: u32 = 2;
pub const X_OK: u32 = 1;

pub const S_ISUID: u32 = 0o4000;
pub const S_ISGID: u32 = 0o2000;
pub const S_ISVTX: u32 = 0o1000;

/// What a check needs to know about an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    pub perm: u32,
    pub kind: FileKind,
}

impl Owner {
    fn is_dir(&self) -> bool {
        self.kind == FileKind::Dir
    }
}

pub fn is_root(cred: &Cred) -> bool {
    cred.uid == 0
}

/// May `cred` access `o` for all of `mask` (R_OK|W_OK|X_OK)? Owner bits apply to the owner,
/// group bits to members of the group, other bits to everyone else (only one class applies,
/// as in POSIX). Root may read and write anything, and execute a file with at least one x bit.
pub fn allowed(cred: &Cred, o: &Owner, mask: u32) -> bool {
    let mask = mask & 7;
    if is_root(cred) {
        return mask & X_OK == 0 || o.is_dir() || o.perm & 0o111 != 0;
    }
    let bits = if cred.uid == o.uid {
        (o.perm >> 6) & 7
    } else if cred.in_group(o.gid) {
        (o.perm >> 3) & 7
    } else {
        o.perm & 7
    };
    bits & mask == mask
}

/// [`allowed`] as an EACCES error.
pub fn check(cred: &Cred, o: &Owner, mask: u32) -> Result<(), Errno> {
    if allowed(cred, o, mask) {
        Ok(())
    } else {
        Err(Errno::EACCES)
    }
}

pub fn is_owner_or_root(cred: &Cred, o: &Owner) -> bool {
    is_root(cred) || cred.uid == o.uid
}

/// In a directory with the sticky bit, only the owner of an entry's inode, the owner of
/// the directory or root may remove or rename the entry (EPERM otherwise, as Linux).
pub fn sticky_allows(cred: &Cred, dir: &Owner, file_uid: u32) -> bool {
    dir.perm & S_ISVTX == 0 || is_root(cred) || cred.uid == file_uid || cred.uid == dir.uid
}

/// Does the sticky rule need the entry's owner at all? (If not, a remote inode's attributes
/// need not be fetched.)
pub fn sticky_needs_owner(cred: &Cred, dir: &Owner) -> bool {
    dir.perm & S_ISVTX != 0 && !is_root(cred) && cred.uid != dir.uid
}

/// Linux's `protected_hardlinks` rule (fs/namei.c, `may_linkat`), which every Linux
/// distribution turns on: a user may give a new name to an inode they own, or to a *safe*
/// source: a regular file, not set-user-id, not set-group-id and group-executable, that
/// they may both read and write. Root (CAP_FOWNER) may link anything. Otherwise EPERM:
/// without it, a user could pin another user's private file under a name in a
/// world-writable directory (where its owner cannot remove it), or keep a set-user-id
/// program that its owner later fixes.
pub fn may_hardlink(cred: &Cred, o: &Owner) -> Result<(), Errno> {
    if is_owner_or_root(cred, o) {
        return Ok(());
    }
    let safe = o.kind == FileKind::File
        && o.perm & S_ISUID == 0
        && o.perm & (S_ISGID | 0o010) != (S_ISGID | 0o010)
        && allowed(cred, o, R_OK | W_OK);
    if safe {
        Ok(())
    } else {
        Err(Errno::EPERM)
    }
}

/// chmod: only the owner or root (EPERM). Returns the mode to store: a non-root caller who
/// is not in the file's group cannot set the set-group-id bit on a non-directory (it is
/// cleared silently, as Linux does).
pub fn chmod(cred: &Cred, o: &Owner, new_perm: u32) -> Result<u32, Errno> {
    if !is_owner_or_root(cred, o) {
        return Err(Errno::EPERM);
    }
    let mut p = new_perm & 0o7777;
    if !is_root(cred) && !o.is_dir() && !cred.in_group(o.gid) {
        p &= !S_ISGID;
    }
    Ok(p)
}

/// chown/chgrp: only root may give a file away; the owner may change the group to one it
/// belongs to (EPERM otherwise). A no-change `uid` is allowed for the owner.
pub fn chown(cred: &Cred, o: &Owner, uid: Option<u32>, gid: Option<u32>) -> Result<(), Errno> {
    if is_root(cred) {
        return Ok(());
    }
    if let Some(u) = uid {
        if u != o.uid || cred.uid != o.uid {
            return Err(Errno::EPERM);
        }
    }
    if let Some(g) = gid {
        if cred.uid != o.uid || (g != o.gid && !cred.in_group(g)) {
            return Err(Errno::EPERM);
        }
    }
    Ok(())
}

/// The mode after a chown of a non-directory: set-user-id is cleared, set-group-id too when
/// the group may execute (Linux's rule, applied to root as well).
pub fn mode_after_chown(perm: u32, kind: FileKind) -> u32 {
    if kind == FileKind::Dir {
        return perm;
    }
    let mut p = perm & !S_ISUID;
    if p & 0o010 != 0 {
        p &= !S_ISGID;
    }
    p
}

/// The mode after `cred` changes a regular file's contents or size. A caller without
/// CAP_FSETID (in Shoal's model: not root) clears set-user-id, set-group-id too when the group
/// may execute or the caller is not in the file's group (Linux's `setattr_should_drop_suidgid`),
/// so that a program cannot keep its privileges after someone else rewrote it.
pub fn mode_after_write(cred: &Cred, perm: u32, gid: u32) -> u32 {
    if is_root(cred) {
        return perm;
    }
    let mut p = perm & !S_ISUID;
    if p & 0o010 != 0 || !cred.in_group(gid) {
        p &= !S_ISGID;
    }
    p
}

/// utimens: explicit times need ownership (EPERM); "now" needs ownership or write
/// permission (EACCES).
pub fn set_times(cred: &Cred, o: &Owner, explicit: bool) -> Result<(), Errno> {
    if is_owner_or_root(cred, o) {
        return Ok(());
    }
    if explicit {
        return Err(Errno::EPERM);
    }
    check(cred, o, W_OK)
}

/// Extended attribute namespaces Shoal stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrNs {
    User,
    Trusted,
    Security,
}

/// The namespace of an attribute name; others (`system.*` — POSIX ACLs —, no prefix) are
/// not supported (ENOTSUP, which `cp -a` and `tar` tolerate).
pub fn xattr_ns(name: &str) -> Result<XattrNs, Errno> {
    let ns = if let Some(rest) = name.strip_prefix("user.") {
        (XattrNs::User, rest)
    } else if let Some(rest) = name.strip_prefix("trusted.") {
        (XattrNs::Trusted, rest)
    } else if let Some(rest) = name.strip_prefix("security.") {
        (XattrNs::Security, rest)
    } else {
        return Err(Errno::ENOTSUP);
    };
    if ns.1.is_empty() {
        return Err(Errno::EINVAL);
    }
    Ok(ns.0)
}

/// May `cred` read (`write == false`) or set/remove (`write == true`) attribute `name` of `o`?
/// `user.*`: regular files and directories only (EPERM elsewhere), read needs R, write W.
/// `trusted.*`: root only (a non-root read sees nothing: ENODATA; a write is EPERM).
/// `security.*`: anyone reads, root writes.
pub fn xattr_access(cred: &Cred, o: &Owner, name: &str, write: bool) -> Result<(), Errno> {
    match xattr_ns(name)? {
        XattrNs::User => {
            if !matches!(o.kind, FileKind::File | FileKind::Dir) {
                return Err(Errno::EPERM);
            }
            check(cred, o, if write { W_OK } else { R_OK })
        }
        XattrNs::Trusted => {
            if is_root(cred) {
                Ok(())
            } else if write {
                Err(Errno::EPERM)
            } else {
                Err(Errno::ENODATA)
            }
        }
        XattrNs::Security => {
            if write && !is_root(cred) {
                Err(Errno::EPERM)
            } else {
                Ok(())
            }
        }
    }
}

/// Whether `listxattr` shows `name` to `cred` (trusted attributes are invisible to non-root).
pub fn xattr_visible(cred: &Cred, name: &str) -> bool {
    !name.starts_with("trusted.") || is_root(cred)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(uid: u32, gid: u32, groups: &[u32]) -> Cred {
        Cred { uid, gid, groups: groups.to_vec() }
    }
    fn file(uid: u32, gid: u32, perm: u32) -> Owner {
        Owner { uid, gid, perm, kind: FileKind::File }
    }
    fn dir(uid: u32, gid: u32, perm: u32) -> Owner {
        Owner { uid, gid, perm, kind: FileKind::Dir }
    }

    /// Issue 51: the native client let a user hard-link another user's 0600 file into a
    /// world-writable directory; the rule is Linux's `protected_hardlinks`.
    #[test]
    fn hard_links_follow_protected_hardlinks() {
        let alice = cred(1000, 1000, &[]);
        let bob = cred(1001, 1001, &[1000]);
        let root = Cred::root();
        let symlink = Owner { uid: 1000, gid: 1000, perm: 0o777, kind: FileKind::Symlink };
        // (who, inode, allowed)
        let cases: &[(&Cred, Owner, bool)] = &[
            (&alice, file(1000, 1000, 0o600), true),  // the owner, whatever the mode
            (&alice, file(1000, 1000, 0o4755), true), // even set-user-id
            (&bob, file(1000, 1000, 0o600), false),   // another user's private file
            (&bob, file(1000, 1000, 0o644), false),   // readable is not enough
            (&bob, file(1000, 1000, 0o666), true),    // read and write: safe
            (&bob, file(1000, 1000, 0o660), true),    // through the group
            (&bob, file(1000, 1000, 0o4666), false),  // set-user-id
            (&bob, file(1000, 1000, 0o2676), false),  // set-group-id and group-executable
            (&bob, file(1000, 1000, 0o2666), true),   // set-group-id alone (mandatory locking)
            (&bob, symlink, false),                   // not a regular file
            (&root, file(1000, 1000, 0o4700), true),  // CAP_FOWNER
        ];
        for (i, (who, o, want)) in cases.iter().enumerate() {
            assert_eq!(may_hardlink(who, o).is_ok(), *want, "case {i}: uid {} on {o:?}", who.uid);
        }
        assert_eq!(may_hardlink(&bob, &file(1000, 1000, 0o600)), Err(Errno::EPERM));
    }

    #[test]
    fn access_table() {
        let alice = cred(1000, 1000, &[]);
        let bob = cred(1001, 1001, &[1000]);
        let eve = cred(1002, 1002, &[]);
        let root = Cred::root();
        // (who, inode, mask, expected)
        let cases: &[(&Cred, Owner, u32, bool)] = &[
            (&alice, file(1000, 1000, 0o600), R_OK | W_OK, true),
            (&alice, file(1000, 1000, 0o600), X_OK, false),
            (&alice, file(1000, 1000, 0o077), R_OK, false), // owner class only, even if others may
            (&bob, file(1000, 1000, 0o640), R_OK, true),    // supplementary group
            (&bob, file(1000, 1000, 0o640), W_OK, false),
            (&eve, file(1000, 1000, 0o640), R_OK, false),
            (&eve, file(1000, 1000, 0o644), R_OK, true),
            (&eve, dir(1000, 1000, 0o755), W_OK | X_OK, false),
            (&eve, dir(1000, 1000, 0o777), W_OK | X_OK, true),
            (&root, file(1000, 1000, 0o000), R_OK | W_OK, true),
            (&root, file(1000, 1000, 0o600), X_OK, false), // no x bit at all
            (&root, file(1000, 1000, 0o001), X_OK, true),
            (&root, dir(1000, 1000, 0o000), X_OK, true),
            (&alice, file(1000, 1000, 0o000), 0, true), // existence only
        ];
        for (i, (c, o, mask, want)) in cases.iter().enumerate() {
            assert_eq!(allowed(c, o, *mask), *want, "case {i}: {c:?} {o:?} mask {mask}");
        }
    }

    #[test]
    fn sticky_table() {
        let tmp = dir(0, 0, 0o1777);
        let alice = cred(1000, 1000, &[]);
        assert!(sticky_allows(&alice, &tmp, 1000));
        assert!(!sticky_allows(&alice, &tmp, 1001));
        assert!(sticky_allows(&Cred::root(), &tmp, 1001));
        let owned = dir(1000, 1000, 0o1777);
        assert!(sticky_allows(&alice, &owned, 1001)); // owner of the directory
        assert!(sticky_allows(&alice, &dir(0, 0, 0o777), 1001)); // no sticky bit
        assert!(sticky_needs_owner(&alice, &tmp));
        assert!(!sticky_needs_owner(&alice, &owned));
    }

    #[test]
    fn chmod_chown_utimens_table() {
        let alice = cred(1000, 1000, &[50]);
        let eve = cred(1002, 1002, &[]);
        let f = file(1000, 1000, 0o644);
        assert_eq!(chmod(&alice, &f, 0o102755), Ok(0o2755));
        assert_eq!(chmod(&eve, &f, 0o777), Err(Errno::EPERM));
        // not in the file's group: setgid dropped
        assert_eq!(chmod(&alice, &file(1000, 77, 0o644), 0o2755), Ok(0o755));
        assert_eq!(chmod(&Cred::root(), &file(1000, 77, 0o644), 0o2755), Ok(0o2755));
        assert_eq!(chown(&alice, &f, Some(1002), None), Err(Errno::EPERM));
        assert_eq!(chown(&alice, &f, Some(1000), None), Ok(()));
        assert_eq!(chown(&alice, &f, None, Some(50)), Ok(()));
        assert_eq!(chown(&alice, &f, None, Some(51)), Err(Errno::EPERM));
        assert_eq!(chown(&eve, &f, None, Some(1002)), Err(Errno::EPERM));
        assert_eq!(chown(&Cred::root(), &f, Some(5), Some(6)), Ok(()));
        assert_eq!(mode_after_chown(0o6755, FileKind::File), 0o755);
        assert_eq!(mode_after_chown(0o6745, FileKind::File), 0o2745);
        assert_eq!(mode_after_chown(0o2755, FileKind::Dir), 0o2755);
        assert_eq!(set_times(&eve, &f, true), Err(Errno::EPERM));
        assert_eq!(set_times(&eve, &f, false), Err(Errno::EACCES));
        assert_eq!(set_times(&eve, &file(1000, 1000, 0o666), false), Ok(()));
        assert_eq!(set_times(&alice, &f, true), Ok(()));
    }

    #[test]
    fn xattr_table() {
        let alice = cred(1000, 1000, &[]);
        let eve = cred(1002, 1002, &[]);
        let f = file(1000, 1000, 0o644);
        let link = Owner { uid: 1000, gid: 1000, perm: 0o777, kind: FileKind::Symlink };
        assert_eq!(xattr_access(&alice, &f, "user.a", true), Ok(()));
        assert_eq!(xattr_access(&eve, &f, "user.a", true), Err(Errno::EACCES));
        assert_eq!(xattr_access(&eve, &f, "user.a", false), Ok(()));
        assert_eq!(xattr_access(&alice, &link, "user.a", true), Err(Errno::EPERM));
        assert_eq!(xattr_access(&alice, &f, "trusted.a", true), Err(Errno::EPERM));
        assert_eq!(xattr_access(&alice, &f, "trusted.a", false), Err(Errno::ENODATA));
        assert_eq!(xattr_access(&Cred::root(), &f, "trusted.a", true), Ok(()));
        assert_eq!(xattr_access(&alice, &f, "security.selinux", false), Ok(()));
        assert_eq!(xattr_access(&alice, &f, "security.selinux", true), Err(Errno::EPERM));
        assert_eq!(xattr_access(&alice, &f, "system.posix_acl_access", false), Err(Errno::ENOTSUP));
        assert_eq!(xattr_access(&alice, &f, "noprefix", false), Err(Errno::ENOTSUP));
        assert_eq!(xattr_access(&alice, &f, "user.", false), Err(Errno::EINVAL));
        assert!(!xattr_visible(&alice, "trusted.x"));
        assert!(xattr_visible(&alice, "user.x"));
    }
}
