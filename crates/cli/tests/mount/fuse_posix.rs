//! POSIX semantics through a real FUSE mount of a real cluster: every call the mount
//! offers, its error cases, and what happens when a server goes away.

use shoal_testkit::mount::{code, cstr, errno, sh, sh_as, skip_without_fuse, Mount, NOBODY};
use shoal_testkit::{pattern, Cluster};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Duration;

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode()
}

#[test]
fn files_directories_symlinks_and_hard_links() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(3);
    let m = Mount::new(&c, &[]);
    fs::create_dir(m.p("d")).unwrap();
    fs::create_dir_all(m.p("d/e/f")).unwrap();
    fs::write(m.p("d/a.txt"), b"hello world\n").unwrap();
    assert_eq!(fs::read(m.p("d/a.txt")).unwrap(), b"hello world\n");
    let md = fs::metadata(m.p("d/a.txt")).unwrap();
    assert!(md.is_file());
    assert_eq!(md.len(), 12);
    assert_eq!(md.nlink(), 1);
    assert_eq!(md.uid(), unsafe { libc::geteuid() });

    // Directory listing, with the right types.
    let mut names: Vec<(String, bool)> = fs::read_dir(m.p("d"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().into_string().unwrap(), e.file_type().unwrap().is_dir())
        })
        .collect();
    names.sort();
    assert_eq!(names, vec![("a.txt".to_string(), false), ("e".to_string(), true)]);
    assert_eq!(fs::metadata(m.p("d")).unwrap().nlink(), 3, "a directory with one subdirectory has 3 links");

    // Symlinks, relative and absolute, and following them.
    std::os::unix::fs::symlink("a.txt", m.p("d/rel")).unwrap();
    std::os::unix::fs::symlink(m.p("d/e"), m.p("abs")).unwrap();
    assert_eq!(fs::read_link(m.p("d/rel")).unwrap(), Path::new("a.txt"));
    assert_eq!(fs::read(m.p("d/rel")).unwrap(), b"hello world\n");
    assert!(fs::symlink_metadata(m.p("d/rel")).unwrap().file_type().is_symlink());
    assert!(m.p("abs/f").is_dir());

    // Hard links share data and count links.
    fs::hard_link(m.p("d/a.txt"), m.p("d/e/b.txt")).unwrap();
    assert_eq!(fs::metadata(m.p("d/a.txt")).unwrap().nlink(), 2);
    assert_eq!(fs::metadata(m.p("d/a.txt")).unwrap().ino(), fs::metadata(m.p("d/e/b.txt")).unwrap().ino());
    OpenOptions::new().append(true).open(m.p("d/e/b.txt")).unwrap().write_all(b"more\n").unwrap();
    assert_eq!(fs::read(m.p("d/a.txt")).unwrap(), b"hello world\nmore\n");
    fs::remove_file(m.p("d/a.txt")).unwrap();
    assert_eq!(fs::metadata(m.p("d/e/b.txt")).unwrap().nlink(), 1);
    assert_eq!(fs::read(m.p("d/e/b.txt")).unwrap(), b"hello world\nmore\n");

    // The native client sees the same tree.
    let native = c.shoal(&["ls", "/d/e"]).1;
    assert!(native.contains("b.txt") && native.contains('f'), "{native}");

    // Removal.
    fs::remove_file(m.p("d/rel")).unwrap();
    fs::remove_dir(m.p("d/e/f")).unwrap();
    fs::remove_dir_all(m.p("d")).unwrap();
    assert!(!m.p("d").exists());

    // A large directory lists every entry once (several readdir pages).
    fs::create_dir(m.p("big")).unwrap();
    for i in 0..2500 {
        File::create(m.p(&format!("big/f{i:05}"))).unwrap();
    }
    let mut seen: Vec<String> =
        fs::read_dir(m.p("big")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    seen.sort();
    assert_eq!(seen.len(), 2500);
    seen.dedup();
    assert_eq!(seen.len(), 2500);
    sh(&m.path, "rm -rf big");
    assert!(!m.p("big").exists());
}

#[test]
fn error_numbers() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let m = Mount::new(&c, &[]);
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/f"), b"x").unwrap();

    assert_eq!(code(fs::create_dir(m.p("d"))), libc::EEXIST);
    assert_eq!(code(OpenOptions::new().write(true).create_new(true).open(m.p("d/f"))), libc::EEXIST);
    assert_eq!(code(fs::remove_dir(m.p("d"))), libc::ENOTEMPTY);
    assert_eq!(code(OpenOptions::new().write(true).open(m.p("d"))), libc::EISDIR);
    assert_eq!(code(fs::remove_file(m.p("d"))), libc::EISDIR);
    assert_eq!(code(fs::remove_dir(m.p("d/f"))), libc::ENOTDIR);
    assert_eq!(code(fs::metadata(m.p("d/f/x"))), libc::ENOTDIR);
    assert_eq!(code(fs::metadata(m.p("nope"))), libc::ENOENT);
    assert_eq!(code(fs::read(m.p("nope/x"))), libc::ENOENT);
    let long = "n".repeat(256);
    assert_eq!(code(File::create(m.p(&long))), libc::ENAMETOOLONG);
    assert_eq!(code(fs::create_dir(m.p(&long))), libc::ENAMETOOLONG);
    File::create(m.p(&"n".repeat(255))).unwrap();
    // Renaming a directory into itself, and a directory over a file.
    fs::create_dir(m.p("d/sub")).unwrap();
    assert_eq!(code(fs::rename(m.p("d"), m.p("d/sub/x"))), libc::EINVAL);
    assert_eq!(code(fs::rename(m.p("d/sub"), m.p("d/f"))), libc::ENOTDIR);
    assert_eq!(code(fs::rename(m.p("d/f"), m.p("d/sub"))), libc::EISDIR);
    // Across file systems.
    assert_eq!(code(fs::rename(m.p("d/f"), m.dir.path().join("outside"))), libc::EXDEV);
    // Too many symlinks.
    std::os::unix::fs::symlink("loop2", m.p("loop1")).unwrap();
    std::os::unix::fs::symlink("loop1", m.p("loop2")).unwrap();
    assert_eq!(code(fs::read(m.p("loop1"))), libc::ELOOP);

    // Another user: EACCES on a private file and in a directory it may not write.
    fs::write(m.p("private"), b"secret").unwrap();
    fs::set_permissions(m.p("private"), fs::Permissions::from_mode(0o600)).unwrap();
    let out = sh_as(NOBODY, &m.path, "cat private");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"), "{out:?}");
    let out = sh_as(NOBODY, &m.path, "touch d/new");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"), "{out:?}");
    let out = sh_as(NOBODY, &m.path, "chmod 777 d/f");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Operation not permitted"), "{out:?}");
    // Search permission: a private directory hides its contents even right after root used them.
    fs::create_dir(m.p("closed")).unwrap();
    fs::write(m.p("closed/inside"), b"x").unwrap();
    fs::set_permissions(m.p("closed/inside"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::set_permissions(m.p("closed"), fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(fs::read(m.p("closed/inside")).unwrap(), b"x");
    let out = sh_as(NOBODY, &m.path, "cat closed/inside");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"), "{out:?}");
    // A world-writable sticky directory: nobody's own file is nobody's to remove, root's is not.
    fs::create_dir(m.p("tmp")).unwrap();
    fs::set_permissions(m.p("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::write(m.p("tmp/roots"), b"r").unwrap();
    let out = sh_as(NOBODY, &m.path, "echo n > tmp/mine && rm tmp/mine && rm -f tmp/roots");
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Operation not permitted"),
        "{out:?}"
    );
    assert!(m.p("tmp/roots").exists() && !m.p("tmp/mine").exists());
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> i32 {
    let (a, b) = (cstr(from), cstr(to));
    let r = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags) };
    if r == 0 {
        0
    } else {
        errno()
    }
}

#[test]
fn rename_everywhere() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(4);
    let m = Mount::new(&c, &[]);
    // Many directories: some pairs are certainly owned by different servers.
    for i in 0..8 {
        fs::create_dir(m.p(&format!("d{i}"))).unwrap();
    }
    for i in 0..8 {
        let (a, b) = (format!("d{i}"), format!("d{}", (i + 1) % 8));
        fs::write(m.p(&format!("{a}/f")), format!("file {i}")).unwrap();
        fs::rename(m.p(&format!("{a}/f")), m.p(&format!("{a}/g"))).unwrap();
        fs::rename(m.p(&format!("{a}/g")), m.p(&format!("{b}/moved{i}"))).unwrap();
        assert!(!m.p(&format!("{a}/g")).exists());
    }
    for i in 0..8 {
        assert_eq!(fs::read_to_string(m.p(&format!("d{}/moved{i}", (i + 1) % 8))).unwrap(), format!("file {i}"));
    }
    // Replacing an existing file.
    fs::write(m.p("d0/old"), b"old contents").unwrap();
    fs::write(m.p("d3/new"), b"new").unwrap();
    fs::rename(m.p("d3/new"), m.p("d0/old")).unwrap();
    assert_eq!(fs::read(m.p("d0/old")).unwrap(), b"new");
    // Directories move with their contents; an empty directory can be replaced.
    fs::create_dir(m.p("d1/sub")).unwrap();
    fs::write(m.p("d1/sub/x"), b"x").unwrap();
    fs::create_dir(m.p("d2/empty")).unwrap();
    fs::rename(m.p("d1/sub"), m.p("d2/empty")).unwrap();
    assert_eq!(fs::read(m.p("d2/empty/x")).unwrap(), b"x");
    assert_eq!(fs::metadata(m.p("d1")).unwrap().nlink(), 2);
    assert_eq!(fs::metadata(m.p("d2")).unwrap().nlink(), 3);
    // RENAME_NOREPLACE and RENAME_EXCHANGE.
    fs::write(m.p("d4/a"), b"A").unwrap();
    fs::write(m.p("d5/b"), b"B").unwrap();
    assert_eq!(renameat2(&m.p("d4/a"), &m.p("d5/b"), libc::RENAME_NOREPLACE), libc::EEXIST);
    assert_eq!(renameat2(&m.p("d4/a"), &m.p("d5/c"), libc::RENAME_NOREPLACE), 0);
    assert_eq!(renameat2(&m.p("d5/c"), &m.p("d5/b"), libc::RENAME_EXCHANGE), 0);
    assert_eq!(fs::read(m.p("d5/b")).unwrap(), b"A");
    assert_eq!(fs::read(m.p("d5/c")).unwrap(), b"B");
    fs::create_dir(m.p("d5/dir")).unwrap();
    assert_eq!(renameat2(&m.p("d5/dir"), &m.p("d5/c"), libc::RENAME_EXCHANGE), 0);
    assert!(m.p("d5/c").is_dir() && m.p("d5/dir").is_file());
    assert_eq!(renameat2(&m.p("d5/dir"), &m.p("d5/nothing"), libc::RENAME_EXCHANGE), libc::ENOENT);
    // Across directories: done, or EXDEV when their servers differ (a documented limit).
    fs::write(m.p("d6/e"), b"E").unwrap();
    for i in 0..8 {
        let r = renameat2(&m.p("d6/e"), &m.p(&format!("d{i}/moved{}", (i + 7) % 8)), libc::RENAME_EXCHANGE);
        assert!(r == 0 || r == libc::EXDEV, "errno {r}");
        if r == 0 {
            assert_eq!(fs::read(m.p(&format!("d{i}/moved{}", (i + 7) % 8))).unwrap(), b"E");
            break;
        }
    }
}

#[test]
fn ownership_permissions_and_times() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let m = Mount::new(&c, &[]);
    fs::write(m.p("f"), b"data").unwrap();
    fs::set_permissions(m.p("f"), fs::Permissions::from_mode(0o4751)).unwrap();
    assert_eq!(mode(&m.p("f")) & 0o7777, 0o4751);
    std::os::unix::fs::chown(m.p("f"), Some(NOBODY), Some(NOBODY)).unwrap();
    let md = fs::metadata(m.p("f")).unwrap();
    assert_eq!((md.uid(), md.gid()), (NOBODY, NOBODY));
    assert_eq!(md.mode() & 0o7000, 0, "chown clears set-user-id");
    // The new owner may chmod; others may not; the owner may read its 0400 file.
    fs::set_permissions(m.p("f"), fs::Permissions::from_mode(0o600)).unwrap();
    let out = sh_as(NOBODY, &m.path, "chmod 400 f && cat f");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"data");
    assert_eq!(mode(&m.p("f")) & 0o777, 0o400);

    // utimensat: explicit times (with nanoseconds), UTIME_NOW and UTIME_OMIT.
    let f = cstr(&m.p("f"));
    let times = [
        libc::timespec { tv_sec: 1_000_000_000, tv_nsec: 123_456_789 },
        libc::timespec { tv_sec: 1_100_000_000, tv_nsec: 987_654_321 },
    ];
    assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, f.as_ptr(), times.as_ptr(), 0) }, 0);
    let md = fs::metadata(m.p("f")).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 123_456_789));
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_100_000_000, 987_654_321));
    let omit_now = [
        libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
        libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
    ];
    assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, f.as_ptr(), omit_now.as_ptr(), 0) }, 0);
    let md = fs::metadata(m.p("f")).unwrap();
    assert_eq!(md.atime(), 1_000_000_000, "atime omitted");
    assert!(md.mtime() > 1_600_000_000, "mtime now");
    // A time before 1970.
    let old = [libc::timespec { tv_sec: -86_400, tv_nsec: 0 }, libc::timespec { tv_sec: -1, tv_nsec: 5 }];
    assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, f.as_ptr(), old.as_ptr(), 0) }, 0);
    assert_eq!(fs::metadata(m.p("f")).unwrap().mtime(), -1);
    // Others may not set explicit times.
    let out = sh_as(NOBODY + 1, &m.path, "touch -d 2001-01-01 f");
    assert!(!out.status.success(), "{out:?}");

    // Set-group-ID directories pass their group on.
    fs::create_dir(m.p("g")).unwrap();
    std::os::unix::fs::chown(m.p("g"), None, Some(NOBODY)).unwrap();
    fs::set_permissions(m.p("g"), fs::Permissions::from_mode(0o2775)).unwrap();
    fs::write(m.p("g/x"), b"").unwrap();
    fs::create_dir(m.p("g/sub")).unwrap();
    assert_eq!(fs::metadata(m.p("g/x")).unwrap().gid(), NOBODY);
    assert_eq!(mode(&m.p("g/sub")) & 0o2000, 0o2000);

    // The umask of the creating process applies, once.
    let out = sh(&m.path, "umask 027; mkdir um; touch um/f; stat -c %a um um/f");
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["750", "640"]);
}

#[test]
fn sizes_truncate_fallocate_append_and_sync() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(3);
    let m = Mount::new(&c, &[]);
    // Stripe the test directory over all servers in small stripes.
    c.shoal(&["mkdir", "/s"]);
    let (code_, _, err) = c.shoal(&["setstripe", "-c", "-1", "-S", "64K", "/s"]);
    assert_eq!(code_, 0, "{err}");
    let layout = xattr_get(&m.p("s"), "shoal.layout").unwrap();
    assert!(layout.contains("stripe_size=65536"), "{layout}");

    let mut f = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(m.p("s/f")).unwrap();
    let data = pattern(1, 0, 1 << 20);
    f.write_all(&data).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 1 << 20, "fstat sees writes not yet published");
    assert_eq!(fs::metadata(m.p("s/f")).unwrap().len(), 1 << 20, "stat too");
    let layout = xattr_get(&m.p("s/f"), "shoal.layout").unwrap();
    assert!(layout.starts_with("stripe_size=65536 stripe_count=3 servers="), "{layout}");
    // ftruncate down and up (up reads zeros), fdatasync, fsync.
    f.set_len(100_000).unwrap();
    f.set_len(300_000).unwrap();
    f.sync_data().unwrap();
    f.sync_all().unwrap();
    let mut back = Vec::new();
    File::open(m.p("s/f")).unwrap().read_to_end(&mut back).unwrap();
    assert_eq!(back.len(), 300_000);
    assert_eq!(&back[..100_000], &data[..100_000]);
    assert!(back[100_000..].iter().all(|&b| b == 0));
    // truncate by name while open.
    fs::OpenOptions::new().write(true).open(m.p("s/f")).unwrap().set_len(10).unwrap();
    std::process::Command::new("truncate").args(["-s", "5"]).arg(m.p("s/f")).status().unwrap();
    assert_eq!(f.metadata().unwrap().len(), 5);
    drop(f);

    // fallocate: plain mode extends, KEEP_SIZE does not, PUNCH_HOLE zeros.
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(m.p("s/g")).unwrap();
    f.write_all_at(&[7u8; 200_000], 0).unwrap();
    let fd = f.as_raw_fd();
    assert_eq!(unsafe { libc::fallocate(fd, 0, 0, 500_000) }, 0);
    assert_eq!(f.metadata().unwrap().len(), 500_000);
    assert_eq!(unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 0, 900_000) }, 0);
    assert_eq!(f.metadata().unwrap().len(), 500_000);
    assert_eq!(unsafe { libc::fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 1000, 70_000) }, 0);
    let mut buf = vec![0u8; 200_000];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf[..1000].iter().all(|&b| b == 7) && buf[1000..71_000].iter().all(|&b| b == 0));
    assert!(buf[71_000..].iter().all(|&b| b == 7));
    assert_eq!(unsafe { libc::fallocate(fd, libc::FALLOC_FL_COLLAPSE_RANGE, 0, 65536) }, -1);
    assert_eq!(errno(), libc::EOPNOTSUPP);
    assert_eq!(unsafe { libc::posix_fallocate(fd, 0, 600_000) }, 0);
    assert_eq!(f.metadata().unwrap().len(), 600_000);
    drop(f);

    // O_APPEND from two descriptors, O_TRUNC, O_EXCL.
    let mut a = OpenOptions::new().append(true).create(true).open(m.p("log")).unwrap();
    let mut b = OpenOptions::new().append(true).open(m.p("log")).unwrap();
    a.write_all(b"one\n").unwrap();
    b.write_all(b"two\n").unwrap();
    a.write_all(b"three\n").unwrap();
    drop((a, b));
    assert_eq!(fs::read(m.p("log")).unwrap(), b"one\ntwo\nthree\n");
    OpenOptions::new().write(true).truncate(true).open(m.p("log")).unwrap().write_all(b"x").unwrap();
    assert_eq!(fs::read(m.p("log")).unwrap(), b"x");
    assert_eq!(code(OpenOptions::new().write(true).create_new(true).open(m.p("log"))), libc::EEXIST);
    // A new file with no permissions opens for writing (O_CREAT), and ftruncate works on it.
    let f = OpenOptions::new().read(true).write(true).create_new(true).mode(0o000).open(m.p("locked")).unwrap();
    f.write_all_at(b"abc", 0).unwrap();
    f.set_len(2).unwrap();
    drop(f);
    assert_eq!(fs::metadata(m.p("locked")).unwrap().len(), 2);
}

#[test]
fn sparse_files_beyond_four_gib() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(3);
    let m = Mount::new(&c, &[]);
    c.shoal(&["mkdir", "/big"]);
    assert_eq!(c.shoal(&["setstripe", "-c", "-1", "-S", "1M", "/big"]).0, 0);
    let five_gib: u64 = 5 << 30;
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(m.p("big/sparse")).unwrap();
    f.write_all_at(b"start", 0).unwrap();
    f.write_all_at(b"past four gib", (4 << 30) + 12345).unwrap();
    f.write_all_at(b"end", five_gib).unwrap();
    drop(f);
    let md = fs::metadata(m.p("big/sparse")).unwrap();
    assert_eq!(md.len(), five_gib + 3);
    let mut f = File::open(m.p("big/sparse")).unwrap();
    let mut buf = [1u8; 13];
    f.read_exact_at(&mut buf, (4 << 30) + 12345).unwrap();
    assert_eq!(&buf, b"past four gib");
    f.read_exact_at(&mut buf[..3], five_gib).unwrap();
    assert_eq!(&buf[..3], b"end");
    let mut hole = vec![1u8; 1 << 20];
    f.read_exact_at(&mut hole, 3 << 30).unwrap();
    assert!(hole.iter().all(|&b| b == 0), "a hole reads as zeros");
    f.seek(SeekFrom::End(-3)).unwrap();
    let mut tail = String::new();
    f.read_to_string(&mut tail).unwrap();
    assert_eq!(tail, "end");
    // The native client agrees.
    let (_, out, _) = c.shoal(&["stat", "/big/sparse"]);
    assert!(out.contains(&(five_gib + 3).to_string()), "{out}");
}

#[test]
fn statfs_and_df() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let m = Mount::new(&c, &[]);
    let p = cstr(&m.path);
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(p.as_ptr(), &mut s) }, 0);
    assert!(s.f_blocks > 0 && s.f_bfree > 0 && s.f_bfree <= s.f_blocks, "{} {}", s.f_blocks, s.f_bfree);
    assert_eq!(s.f_namemax, 255);
    let df = sh(&m.path, "df -P .");
    assert!(df.contains(&m.path.to_string_lossy().to_string()), "{df}");
    let types = sh(&m.path, "stat -f -c %T .");
    assert!(types.contains("fuse"), "{types}");
}

fn xattr_get(p: &Path, name: &str) -> Result<String, i32> {
    let (pc, nc) = (cstr(p), std::ffi::CString::new(name).unwrap());
    let mut buf = vec![0u8; 4096];
    let n = unsafe { libc::getxattr(pc.as_ptr(), nc.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(errno());
    }
    buf.truncate(n as usize);
    Ok(String::from_utf8(buf).unwrap())
}

fn xattr_set(p: &Path, name: &str, value: &[u8], flags: i32) -> i32 {
    let (pc, nc) = (cstr(p), std::ffi::CString::new(name).unwrap());
    let r = unsafe { libc::setxattr(pc.as_ptr(), nc.as_ptr(), value.as_ptr().cast(), value.len(), flags) };
    if r == 0 {
        0
    } else {
        errno()
    }
}

fn xattr_list(p: &Path) -> Vec<String> {
    let pc = cstr(p);
    let n = unsafe { libc::listxattr(pc.as_ptr(), std::ptr::null_mut(), 0) };
    assert!(n >= 0);
    let mut buf = vec![0u8; n as usize];
    let n = unsafe { libc::listxattr(pc.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    buf.truncate(n as usize);
    buf.split(|&b| b == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8(s.to_vec()).unwrap()).collect()
}

#[test]
fn extended_attributes() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let m = Mount::new(&c, &[]);
    let f = m.p("f");
    fs::write(&f, b"x").unwrap();
    assert_eq!(xattr_set(&f, "user.color", b"blue", 0), 0);
    assert_eq!(xattr_set(&f, "user.size", &[0u8, 1, 2, 255], 0), 0);
    assert_eq!(xattr_get(&f, "user.color").unwrap(), "blue");
    let mut names = xattr_list(&f);
    names.sort();
    assert_eq!(names, ["user.color", "user.size"]);
    assert_eq!(xattr_set(&f, "user.color", b"red", libc::XATTR_CREATE), libc::EEXIST);
    assert_eq!(xattr_set(&f, "user.none", b"v", libc::XATTR_REPLACE), libc::ENODATA);
    assert_eq!(xattr_set(&f, "user.color", b"red", libc::XATTR_REPLACE), 0);
    assert_eq!(xattr_get(&f, "user.color").unwrap(), "red");
    assert_eq!(xattr_get(&f, "user.missing"), Err(libc::ENODATA));
    // Asking with a buffer too small.
    let (pc, nc) = (cstr(&f), std::ffi::CString::new("user.color").unwrap());
    let mut small = [0u8; 1];
    assert_eq!(unsafe { libc::getxattr(pc.as_ptr(), nc.as_ptr(), small.as_mut_ptr().cast(), 1) }, -1);
    assert_eq!(errno(), libc::ERANGE);
    let rm = std::ffi::CString::new("user.color").unwrap();
    assert_eq!(unsafe { libc::removexattr(pc.as_ptr(), rm.as_ptr()) }, 0);
    assert_eq!(xattr_list(&f), ["user.size"]);
    // The read-only layout attribute, on files and directories.
    let l = xattr_get(&f, "shoal.layout").unwrap();
    assert!(l.starts_with("stripe_size=") && l.contains(" stripe_count=1 servers="), "{l}");
    assert!(xattr_get(&m.path, "shoal.layout").unwrap().contains("stripe_count="));
    assert_eq!(xattr_set(&f, "shoal.layout", b"stripe_count=2", 0), libc::EPERM);
    // Another user may not set attributes on root's file.
    let out =
        sh_as(NOBODY, &m.path, "/usr/bin/python3 -c \"import os; os.setxattr('f', 'user.x', b'1')\" 2>&1 || true");
    assert!(String::from_utf8_lossy(&out.stdout).contains("Permission denied"), "{out:?}");
}

/// A small C program that takes a POSIX lock (fcntl) or flock on a file and reports.
const LOCKER_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>
/* locker fcntl|flock FILE: try a non-blocking exclusive lock, print "locked" or "busy". */
int main(int argc, char **argv) {
    int fd = open(argv[2], O_RDWR);
    if (fd < 0) { perror("open"); return 2; }
    int r;
    if (strcmp(argv[1], "fcntl") == 0) {
        struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 10 };
        r = fcntl(fd, F_SETLK, &fl);
        if (r != 0) {
            struct flock q = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 10 };
            fcntl(fd, F_GETLK, &q);
            printf("busy pid=%d\n", (int)q.l_pid);
            return 0;
        }
    } else {
        r = flock(fd, LOCK_EX | LOCK_NB);
        if (r != 0) { printf("busy\n"); return 0; }
    }
    printf("locked\n");
    return 0;
}
"#;

#[test]
fn advisory_locks_between_processes() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let m = Mount::new(&c, &[]);
    let work = m.dir.path();
    fs::write(work.join("locker.c"), LOCKER_C).unwrap();
    sh(work, "cc -O0 -o locker locker.c");
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(m.p("lockfile")).unwrap();
    let run = |kind: &str| sh(work, &format!("./locker {kind} '{}'", m.p("lockfile").display()));
    assert_eq!(run("fcntl").trim(), "locked");
    // Hold a POSIX write lock on bytes 5..15 here: another process sees it (and our pid).
    let fl =
        libc::flock { l_type: libc::F_WRLCK as i16, l_whence: libc::SEEK_SET as i16, l_start: 5, l_len: 10, l_pid: 0 };
    assert_eq!(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &fl) }, 0);
    assert_eq!(run("fcntl").trim(), format!("busy pid={}", std::process::id()));
    let un = libc::flock { l_type: libc::F_UNLCK as i16, ..fl };
    assert_eq!(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &un) }, 0);
    assert_eq!(run("fcntl").trim(), "locked");
    // flock.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
    assert_eq!(run("flock").trim(), "busy");
    let out = sh(work, &format!("flock -n -E 9 '{}' true; echo $?", m.p("lockfile").display()));
    assert_eq!(out.trim(), "9");
    drop(f);
    assert_eq!(run("flock").trim(), "locked");
}

#[test]
fn mmap_reads_and_writes() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let m = Mount::new(&c, &[]);
    let len = 3 * 65536 + 123;
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(m.p("mapped")).unwrap();
    f.set_len(len as u64).unwrap();
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let s = std::slice::from_raw_parts_mut(p as *mut u8, len);
        for (i, b) in s.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        assert_eq!(libc::msync(p, len, libc::MS_SYNC), 0);
        assert_eq!(libc::munmap(p, len), 0);
    }
    drop(f);
    let back = fs::read(m.p("mapped")).unwrap();
    assert_eq!(back.len(), len);
    assert!(back.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    // Data written with write(2) reads back through a private mapping.
    fs::write(m.p("plain"), pattern(3, 0, 100_000)).unwrap();
    let f = File::open(m.p("plain")).unwrap();
    unsafe {
        let p = libc::mmap(std::ptr::null_mut(), 100_000, libc::PROT_READ, libc::MAP_PRIVATE, f.as_raw_fd(), 0);
        assert_ne!(p, libc::MAP_FAILED);
        let s = std::slice::from_raw_parts(p as *const u8, 100_000);
        assert_eq!(s, &pattern(3, 0, 100_000)[..]);
        libc::munmap(p, 100_000);
    }
    // Another client sees what the mapping wrote.
    let (code_, out, _) = c.shoal(&["stat", "/mapped"]);
    assert_eq!(code_, 0);
    assert!(out.contains(&len.to_string()), "{out}");
}

#[test]
fn unlinked_open_files_and_special_files() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let m = Mount::new(&c, &[]);
    fs::create_dir(m.p("d")).unwrap();
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(m.p("d/tmp")).unwrap();
    f.write_all_at(b"before", 0).unwrap();
    fs::remove_file(m.p("d/tmp")).unwrap();
    assert!(!m.p("d/tmp").exists());
    assert_eq!(fs::read_dir(m.p("d")).unwrap().count(), 0, "nothing listed");
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    f.write_all_at(b" and after", 6).unwrap();
    let mut buf = [0u8; 16];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"before and after");
    // Replaced by a rename while open: the old contents stay readable.
    fs::write(m.p("d/target"), b"old").unwrap();
    let old = File::open(m.p("d/target")).unwrap();
    fs::write(m.p("d/src"), b"new").unwrap();
    fs::rename(m.p("d/src"), m.p("d/target")).unwrap();
    let mut s = String::new();
    (&old).read_to_string(&mut s).unwrap();
    assert_eq!(s, "old");
    drop((f, old));
    // Only the real name is listed (the native client lists the directory): no hidden names.
    std::thread::sleep(Duration::from_millis(300));
    let (_, listing, _) = c.shoal(&["ls", "-a", "/d"]);
    assert_eq!(listing.split_whitespace().filter(|n| !n.starts_with('.')).collect::<Vec<_>>(), ["target"], "{listing}");
    assert!(!listing.contains(".shoal-unlinked"), "{listing}");

    // FIFOs work between processes; sockets can be bound; device nodes record rdev.
    sh(&m.path, "mkfifo -m 640 d/fifo && (echo through the pipe > d/fifo &) && cat d/fifo > out.txt");
    assert_eq!(fs::read_to_string(m.p("out.txt")).unwrap(), "through the pipe\n");
    let md = fs::symlink_metadata(m.p("d/fifo")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&md.file_type()));
    assert_eq!(md.mode() & 0o777, 0o640);
    let sock = std::os::unix::net::UnixListener::bind(m.p("d/sock")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_socket(&fs::symlink_metadata(m.p("d/sock")).unwrap().file_type()));
    drop(sock);
    sh(&m.path, "mknod d/null c 1 3");
    let md = fs::symlink_metadata(m.p("d/null")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(&md.file_type()));
    assert_eq!(md.rdev(), libc::makedev(1, 3));
    let kinds = sh(&m.p("d"), "ls -l | cut -c1 | sort | tr -d '\\n'");
    assert_eq!(kinds, "-cpst", "regular, char device, pipe, socket, plus the total line");
}

#[test]
fn close_to_open_between_two_mounts() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(3);
    let a = Mount::new(&c, &[]);
    let b = Mount::new(&c, &[]);
    c.shoal(&["mkdir", "/wide"]);
    assert_eq!(c.shoal(&["setstripe", "-c", "-1", "-S", "64K", "/wide"]).0, 0);
    for round in 0..3u64 {
        let data = pattern(round, 0, 200_000 + round as usize * 70_000);
        fs::write(a.p("wide/f"), &data).unwrap();
        // After close on A, an open on B sees all of it.
        assert_eq!(fs::read(b.p("wide/f")).unwrap(), data, "round {round}");
    }
    fs::write(b.p("from-b"), b"b").unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(fs::read(a.p("from-b")).unwrap(), b"b");
    fs::remove_file(a.p("from-b")).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert!(!b.p("from-b").exists(), "removal seen after the entry timeout");
}

#[test]
fn a_down_server_gives_eio_and_the_mount_recovers() {
    if skip_without_fuse() {
        return;
    }
    let mut c = Cluster::start(2);
    let m = Mount::new(&c, &["timeout=2", "attr_timeout=0", "entry_timeout=0"]);
    // A directory homed on server 1 (files sit with their directory's entries), found by
    // trying names.
    let client = c.uncached_client();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut on1 = None;
    for i in 0..64 {
        let dir = format!("d{i}");
        fs::create_dir(m.p(&dir)).unwrap();
        let a = rt.block_on(client.stat(&format!("/{dir}"))).unwrap();
        if client.home_of(a.ino).0 == 1 {
            let name = format!("{dir}/f");
            fs::write(m.p(&name), b"payload").unwrap();
            on1 = Some(name);
            break;
        }
    }
    let name = on1.expect("some directory lives on server 1");
    c.kill9(1);
    let start = std::time::Instant::now();
    let r = fs::read(m.p(&name));
    let took = start.elapsed();
    assert_eq!(code(r), libc::EIO);
    assert!(took < Duration::from_secs(15), "EIO after {took:?}");
    c.restart(1);
    let start = std::time::Instant::now();
    loop {
        match fs::read(m.p(&name)) {
            Ok(d) => {
                assert_eq!(d, b"payload");
                break;
            }
            Err(e) => assert!(start.elapsed() < Duration::from_secs(20), "not back: {e}"),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn daemon_mode_umount_and_signals() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("m");
    fs::create_dir(&mp).unwrap();
    let mps = mp.to_str().unwrap();
    // Daemon: returns once mounted; umount ends it.
    let (code_, out, err) = c.shoal(&["mount", mps, "-o", "attr_timeout=0.5"]);
    assert_eq!(code_, 0, "{out}{err}");
    assert!(shoal_testkit::mount::is_fuse_mount(&mp));
    fs::write(mp.join("x"), b"daemon").unwrap();
    assert_eq!(fs::read(mp.join("x")).unwrap(), b"daemon");
    let (code_, _, err) = c.shoal(&["umount", mps]);
    assert_eq!(code_, 0, "{err}");
    assert!(!shoal_testkit::mount::is_fuse_mount(&mp));
    // Errors: not mounted, mounting twice, bad options, missing mount point.
    assert_eq!(c.shoal(&["umount", mps]).0, 1);
    assert_eq!(c.shoal(&["mount", mps, "-o", "bogus_option"]).0, 2);
    assert_eq!(c.shoal(&["mount", "/nonexistent/mp"]).0, 1);
    let mut m = Mount::new(&c, &[]);
    let (code_, _, err) = c.shoal(&["mount", m.path.to_str().unwrap()]);
    assert_eq!(code_, 1, "{err}");
    assert!(err.contains("already"), "{err}");
    // Foreground: SIGTERM unmounts (lazily: an open file keeps the session alive until it
    // is closed) and the process exits 0.
    fs::write(m.p("x"), b"still here").unwrap();
    let busy = File::open(m.p("x")).unwrap();
    unsafe { libc::kill(m.pid() as i32, libc::SIGTERM) };
    let start = std::time::Instant::now();
    while shoal_testkit::mount::is_fuse_mount(&m.path) {
        assert!(start.elapsed() < Duration::from_secs(10), "still mounted after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut s = String::new();
    (&busy).read_to_string(&mut s).unwrap();
    assert_eq!(s, "still here", "an open file stays usable after the detach");
    drop(busy);
    let st = m.wait_exit(Duration::from_secs(20)).expect("mount process exits after SIGTERM");
    assert!(st.success(), "{st}: {}", m.log_text());
    // A cluster that is down: mounting fails with a message after the timeout, not a hang.
    let config = m.dir.path().join("down.toml");
    fs::copy(&c.config, &config).unwrap();
    drop(c);
    let start = std::time::Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shoal"))
        .args(["--timeout", "2", "--config"])
        .arg(&config)
        .args(["mount", mps])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the cluster"), "{out:?}");
    assert!(start.elapsed() < Duration::from_secs(30));
}

#[test]
fn library_mount_in_process() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let dir = tempfile::tempdir().unwrap();
    let opts = shoal_fuse::MountOptions { attr_timeout: Duration::ZERO, threads: 2, ..Default::default() };
    let m = shoal_fuse::spawn(&c.config, dir.path(), opts).unwrap();
    assert!(shoal_fuse::is_mounted(dir.path()));
    fs::write(dir.path().join("f"), b"in process").unwrap();
    assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"in process");
    // An abort through a connection number that another connection has taken since (a
    // mount gone, its number reused) leaves the live connection alone; its own aborts it.
    let live = m.connection().expect("the connection of the mount");
    let stale = shoal_fuse::Connection { number: live.number, dir_ino: live.dir_ino.map(|i| i + 1) };
    stale.abort();
    assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"in process");
    m.unmount().unwrap();
    assert!(!shoal_fuse::is_mounted(dir.path()));
    assert_eq!(c.shoal(&["cat", "/f"]).1, "in process");
    // Dropping a mount with a file still open does not hang: the connection is aborted.
    let m = shoal_fuse::spawn(&c.config, dir.path(), shoal_fuse::MountOptions::default()).unwrap();
    let open = File::open(dir.path().join("f")).unwrap();
    let start = std::time::Instant::now();
    drop(m);
    assert!(start.elapsed() < Duration::from_secs(15));
    let mut s = String::new();
    assert!((&open).read_to_string(&mut s).is_err(), "the aborted connection fails the open file");
}
