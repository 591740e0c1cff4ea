//! Dropping a file's privileges when it is written or truncated, on a real mount: the mount
//! negotiates FUSE_HANDLE_KILLPRIV_V2, so the kernel leaves clearing set-user/group-ID bits
//! and `security.capability` to Shoal (docs/mount.md, "Set-ID bits and capabilities").

use shoal_testkit::mount::{cstr, errno, sh, sh_as, skip_without_fuse, Mount, NOBODY};
use shoal_testkit::Cluster;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().mode() & 0o7777
}

fn set_mode(p: &Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
    assert_eq!(mode(p), m);
}

/// Run `script` as nobody in `cwd`, asserting success.
fn as_nobody(cwd: &Path, script: &str) {
    let out = sh_as(NOBODY, cwd, script);
    assert!(out.status.success(), "`{script}` as nobody failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// A valid `security.capability` value (revision 2, CAP_NET_BIND_SERVICE permitted): the
/// kernel checks the format before passing it on.
fn caps_value() -> Vec<u8> {
    let words: [u32; 5] = [0x0200_0000, 1 << 10, 0, 0, 0];
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn has_caps(p: &Path) -> bool {
    let (pc, nc) = (cstr(p), std::ffi::CString::new("security.capability").unwrap());
    let mut buf = [0u8; 64];
    let n = unsafe { libc::getxattr(pc.as_ptr(), nc.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        assert_eq!(errno(), libc::ENODATA, "getxattr security.capability");
        return false;
    }
    true
}

fn set_caps(p: &Path) {
    let (pc, nc) = (cstr(p), std::ffi::CString::new("security.capability").unwrap());
    let v = caps_value();
    let r = unsafe { libc::setxattr(pc.as_ptr(), nc.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
    assert_eq!(r, 0, "setxattr security.capability: errno {}", errno());
    assert!(has_caps(p));
}

#[test]
fn unprivileged_writes_and_truncates_clear_set_id_bits_and_root_keeps_them() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let m = Mount::new(&c, &[]);
    fs::create_dir(m.p("d")).unwrap();
    set_mode(&m.p("d"), 0o777);
    let f = m.p("d/f");
    // Owned by root, writable by everyone.
    fs::write(&f, b"0123456789").unwrap();
    let d = m.p("d");

    // write(2) by another user.
    set_mode(&f, 0o6777);
    as_nobody(&d, "printf x | dd of=f conv=notrunc status=none");
    assert_eq!(mode(&f), 0o777, "a write by nobody clears set-user-ID and set-group-ID");

    // truncate(2) by name.
    set_mode(&f, 0o6777);
    as_nobody(&d, "truncate -s 5 f");
    assert_eq!(mode(&f), 0o777, "truncate by nobody clears the set-ID bits");
    assert_eq!(fs::metadata(&f).unwrap().len(), 5);

    // ftruncate(2) on a descriptor.
    set_mode(&f, 0o6777);
    as_nobody(&d, "/usr/bin/python3 -c \"import os; os.ftruncate(os.open('f', os.O_WRONLY), 3)\"");
    assert_eq!(mode(&f), 0o777, "ftruncate by nobody clears the set-ID bits");

    // open(2) with O_TRUNC.
    set_mode(&f, 0o6777);
    as_nobody(&d, ": > f");
    assert_eq!(mode(&f), 0o777, "an O_TRUNC open by nobody clears the set-ID bits");
    assert_eq!(fs::metadata(&f).unwrap().len(), 0);

    // Set-group-ID without group execute: kept for a writer in the file's group, cleared
    // for one who is not (Linux's rule for a caller without CAP_FSETID).
    std::os::unix::fs::chown(&f, None, Some(NOBODY)).unwrap();
    set_mode(&f, 0o2666);
    as_nobody(&d, "printf x | dd of=f conv=notrunc status=none");
    assert_eq!(mode(&f), 0o2666, "set-group-ID without group execute stays for a group member");
    std::os::unix::fs::chown(&f, None, Some(0)).unwrap();
    set_mode(&f, 0o2666);
    as_nobody(&d, "printf x | dd of=f conv=notrunc status=none");
    assert_eq!(mode(&f), 0o666, "and is cleared for a writer outside the group");

    // Root (CAP_FSETID) keeps them, writing or truncating.
    set_mode(&f, 0o6777);
    sh(&d, "printf x | dd of=f conv=notrunc status=none && truncate -s 1 f");
    assert_eq!(mode(&f), 0o6777, "root's write and truncate keep the set-ID bits");
    assert_eq!(fs::read(&f).unwrap(), b"x");
}

#[test]
fn writes_and_truncates_drop_file_capabilities_also_ones_set_by_another_client() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let a = Mount::new(&c, &["attr_timeout=1"]);
    let b = Mount::new(&c, &[]);
    fs::write(a.p("f"), b"data").unwrap();
    let file = OpenOptions::new().write(true).open(a.p("f")).unwrap();

    set_caps(&a.p("f"));
    file.write_at(b"x", 0).unwrap();
    assert!(!has_caps(&a.p("f")), "root's write drops the capabilities");

    set_caps(&a.p("f"));
    file.set_len(2).unwrap();
    assert!(!has_caps(&a.p("f")), "ftruncate drops the capabilities");

    set_caps(&a.p("f"));
    sh(&a.path, "truncate -s 1 f");
    assert!(!has_caps(&a.p("f")), "truncate drops the capabilities");

    // Set through another mount while this one trusts what it knows: the next write after
    // that knowledge expired (attr_timeout) drops them, though this mount's kernel no
    // longer asks before each write.
    file.write_at(b"y", 0).unwrap();
    set_caps(&b.p("f"));
    std::thread::sleep(Duration::from_millis(1500));
    file.write_at(b"z", 0).unwrap();
    assert!(!has_caps(&b.p("f")), "a write drops capabilities set by another client");
    assert_eq!(fs::read(b.p("f")).unwrap(), b"z");
}
