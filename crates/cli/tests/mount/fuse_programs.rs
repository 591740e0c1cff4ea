//! Real programs on a Shoal mount: cp -a and tar round trips compared byte for byte and by
//! metadata, git, make with cc, SQLite written by two processes at once, rsync -a.

use shoal_testkit::mount::{sh, skip_without_fuse, Mount, NOBODY};
use shoal_testkit::{pattern, Cluster};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

fn set_mtime(p: &Path, secs: i64, nsecs: i64) {
    let c = shoal_testkit::mount::cstr(p);
    let t = [libc::timespec { tv_sec: secs, tv_nsec: nsecs }, libc::timespec { tv_sec: secs, tv_nsec: nsecs }];
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), t.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) },
        0,
        "{p:?}"
    );
}

/// A source tree with what archivers must keep: nested directories, empty and large and
/// odd-sized files, relative/absolute/dangling symlinks, hard links across directories,
/// unusual modes, another owner, and old timestamps with nanoseconds.
fn make_tree(root: &Path) {
    fs::create_dir_all(root.join("src/deep/er/still")).unwrap();
    fs::create_dir_all(root.join("docs")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::write(root.join("empty-file"), b"").unwrap();
    fs::write(root.join("src/main.c"), b"int main(void) { return 0; }\n").unwrap();
    fs::write(root.join("src/deep/odd.bin"), pattern(5, 0, 4095)).unwrap();
    fs::write(root.join("src/deep/er/still/big.bin"), pattern(6, 0, 3 << 20)).unwrap();
    fs::write(root.join("docs/readme.txt"), b"read me\n").unwrap();
    fs::write(root.join("docs/private"), b"mine\n").unwrap();
    fs::set_permissions(root.join("docs/private"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(root.join("script.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(root.join("script.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(root.join("readonly"), b"ro").unwrap();
    fs::set_permissions(root.join("readonly"), fs::Permissions::from_mode(0o444)).unwrap();
    fs::write(root.join("nobodys"), b"n").unwrap();
    std::os::unix::fs::chown(root.join("nobodys"), Some(NOBODY), Some(NOBODY)).unwrap();
    fs::hard_link(root.join("docs/readme.txt"), root.join("src/readme-link.txt")).unwrap();
    fs::hard_link(root.join("docs/readme.txt"), root.join("third-name")).unwrap();
    std::os::unix::fs::symlink("../docs/readme.txt", root.join("src/rel-link")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", root.join("abs-link")).unwrap();
    std::os::unix::fs::symlink("does/not/exist", root.join("dangling")).unwrap();
    std::os::unix::fs::symlink("src/deep", root.join("dir-link")).unwrap();
    fs::set_permissions(root.join("empty"), fs::Permissions::from_mode(0o700)).unwrap();
    // Old times, bottom-up so that directories keep theirs.
    let mut all: Vec<PathBuf> = walk(root).into_keys().map(|k| root.join(k)).collect();
    all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for (i, p) in all.iter().enumerate() {
        set_mtime(p, 1_500_000_000 + i as i64 * 1000, 123_456_789);
    }
}

#[derive(Debug, PartialEq)]
struct Entry {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: (i64, i64),
    content: Option<Vec<u8>>,
    target: Option<PathBuf>,
}

/// Every path under `root` (relative) with what we compare, plus hard-link groups.
fn walk(root: &Path) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let ft = md.file_type();
            let kind = if ft.is_dir() {
                stack.push(p.clone());
                "dir"
            } else if ft.is_symlink() {
                "symlink"
            } else {
                "file"
            };
            out.insert(
                rel,
                Entry {
                    kind,
                    mode: md.mode() & 0o7777,
                    uid: md.uid(),
                    gid: md.gid(),
                    size: if ft.is_dir() { 0 } else { md.len() },
                    mtime: (md.mtime(), md.mtime_nsec()),
                    content: ft.is_file().then(|| fs::read(&p).unwrap()),
                    target: ft.is_symlink().then(|| fs::read_link(&p).unwrap()),
                },
            );
        }
    }
    out
}

/// Groups of paths that are the same inode (hard links), as sorted lists.
fn link_groups(root: &Path) -> Vec<Vec<String>> {
    let mut by_ino: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for rel in walk(root).keys() {
        let md = fs::symlink_metadata(root.join(rel)).unwrap();
        if md.is_file() && md.nlink() > 1 {
            by_ino.entry(md.ino()).or_default().push(rel.clone());
        }
    }
    let mut groups: Vec<Vec<String>> = by_ino
        .into_values()
        .map(|mut g| {
            g.sort();
            g
        })
        .collect();
    groups.sort();
    groups
}

/// Compare two trees; `nanos`: whether mtimes must match to the nanosecond (else the second).
fn assert_same_tree(a: &Path, b: &Path, nanos: bool, what: &str) {
    let (ta, tb) = (walk(a), walk(b));
    assert_eq!(ta.keys().collect::<Vec<_>>(), tb.keys().collect::<Vec<_>>(), "{what}: the same names");
    for (k, ea) in &ta {
        let eb = &tb[k];
        let (mut ea_t, mut eb_t) = (ea.mtime, eb.mtime);
        if !nanos {
            ea_t.1 = 0;
            eb_t.1 = 0;
        }
        assert_eq!(ea.kind, eb.kind, "{what}: {k} kind");
        if ea.kind != "symlink" {
            assert_eq!(ea.mode, eb.mode, "{what}: {k} mode");
        }
        assert_eq!((ea.uid, ea.gid), (eb.uid, eb.gid), "{what}: {k} owner");
        assert_eq!(ea.size, eb.size, "{what}: {k} size");
        assert!(ea.content == eb.content, "{what}: {k} contents differ");
        assert_eq!(ea.target, eb.target, "{what}: {k} symlink target");
        assert_eq!(ea_t, eb_t, "{what}: {k} mtime");
    }
    assert_eq!(link_groups(a), link_groups(b), "{what}: hard links");
}

fn local_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("shoal-prog-").tempdir().unwrap()
}

#[test]
fn cp_a_and_tar_round_trips_keep_everything() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(3);
    let m = Mount::new(&c, &[]);
    let local = local_dir();
    let src = local.path().join("src");
    fs::create_dir(&src).unwrap();
    make_tree(&src);
    assert_eq!(link_groups(&src).len(), 1);

    // cp -a there and back.
    sh(local.path(), &format!("cp -a src '{}'", m.p("cp").display()));
    assert_same_tree(&src, &m.p("cp"), true, "cp -a onto the mount");
    sh(local.path(), &format!("cp -a '{}' back-cp", m.p("cp").display()));
    assert_same_tree(&src, &local.path().join("back-cp"), true, "cp -a back");

    // tar there and back (through pipes, as people do).
    fs::create_dir(m.p("tar")).unwrap();
    sh(local.path(), &format!("tar -C src -cf - . | tar -C '{}' -xpf -", m.p("tar").display()));
    assert_same_tree(&src, &m.p("tar"), false, "tar onto the mount");
    sh(
        local.path(),
        &format!(
            "tar -C '{}' -cf archive.tar . && mkdir back-tar && tar -C back-tar -xpf archive.tar",
            m.p("tar").display()
        ),
    );
    assert_same_tree(&src, &local.path().join("back-tar"), false, "tar back");
    // A tar archive written to and read from the mount itself.
    sh(local.path(), &format!("tar -C src -czf '{}' .", m.p("t.tgz").display()));
    sh(local.path(), &format!("mkdir from-tgz && tar -C from-tgz -xzpf '{}'", m.p("t.tgz").display()));
    assert_same_tree(&src, &local.path().join("from-tgz"), false, "tar.gz stored on the mount");
    // diff agrees.
    sh(local.path(), &format!("diff -r --no-dereference src '{}'", m.p("cp").display()));
}

#[test]
fn rsync_onto_the_mount_and_back() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(3);
    let m = Mount::new(&c, &[]);
    let local = local_dir();
    let src = local.path().join("src");
    fs::create_dir(&src).unwrap();
    make_tree(&src);
    sh(local.path(), &format!("rsync -aH src/ '{}/'", m.p("r").display()));
    assert_same_tree(&src, &m.p("r"), false, "rsync -aH onto the mount");
    // A second run finds nothing to do (sizes and times kept).
    let again = sh(local.path(), &format!("rsync -aHi src/ '{}/'", m.p("r").display()));
    assert_eq!(again.trim(), "", "second rsync transfers nothing");
    // Changes go across, deletions too.
    fs::write(src.join("docs/new.txt"), b"new").unwrap();
    fs::remove_file(src.join("empty-file")).unwrap();
    sh(local.path(), &format!("rsync -aH --delete src/ '{}/'", m.p("r").display()));
    assert!(m.p("r/docs/new.txt").exists() && !m.p("r/empty-file").exists());
    sh(local.path(), &format!("rsync -aH '{}/' back/", m.p("r").display()));
    assert_same_tree(&src, &local.path().join("back"), false, "rsync -aH back");
}

#[test]
fn git_init_add_commit_status() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(3);
    let m = Mount::new(&c, &[]);
    let git =
        "git -c user.name=Shoal -c user.email=shoal@example.org -c init.defaultBranch=main -c core.fsmonitor=false";
    sh(&m.path, &format!("{git} init -q repo"));
    let repo = m.p("repo");
    make_tree(&repo.join("tree"));
    fs::write(repo.join("README"), b"hello\n").unwrap();
    sh(&repo, &format!("{git} add -A && {git} commit -qm first"));
    assert_eq!(sh(&repo, &format!("{git} status --porcelain")), "");
    fs::write(repo.join("README"), b"hello again\n").unwrap();
    assert_eq!(sh(&repo, &format!("{git} status --porcelain")).trim(), "M README");
    sh(&repo, &format!("{git} commit -qam second && {git} mv README README.md && {git} commit -qm third"));
    assert_eq!(sh(&repo, &format!("{git} log --oneline")).lines().count(), 3);
    sh(&repo, &format!("{git} gc -q && {git} fsck --strict"));
    assert_eq!(sh(&repo, &format!("{git} status --porcelain")), "");
    // Clone from the mount to local disk and back onto the mount.
    let local = local_dir();
    sh(local.path(), &format!("{git} clone -q '{}' c1", repo.display()));
    sh(&m.path, &format!("{git} clone -q '{}' c2", local.path().join("c1").display()));
    assert_eq!(fs::read(m.p("c2/README.md")).unwrap(), b"hello again\n");
    assert_eq!(sh(&m.p("c2"), &format!("{git} status --porcelain")), "");
}

#[test]
fn make_builds_a_c_program() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(2);
    let m = Mount::new(&c, &[]);
    let p = m.p("proj");
    fs::create_dir(&p).unwrap();
    fs::write(p.join("util.h"), "#define GREETING \"hello from shoal\"\nint twice(int);\n").unwrap();
    fs::write(p.join("util.c"), "#include \"util.h\"\nint twice(int x) { return 2 * x; }\n").unwrap();
    fs::write(
        p.join("main.c"),
        "#include <stdio.h>\n#include \"util.h\"\nint main(void) { printf(\"%s %d\\n\", GREETING, twice(21)); return 0; }\n",
    )
    .unwrap();
    fs::write(
        p.join("Makefile"),
        "hello: main.o util.o\n\tcc -o $@ main.o util.o\n%.o: %.c util.h\n\tcc -O1 -c -o $@ $<\nclean:\n\trm -f hello *.o\n",
    )
    .unwrap();
    sh(&p, "make -s");
    assert_eq!(sh(&p, "./hello"), "hello from shoal 42\n");
    assert!(sh(&p, "make").contains("up to date"), "nothing to rebuild");
    // A newer header rebuilds everything.
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::write(p.join("util.h"), "#define GREETING \"rebuilt\"\nint twice(int);\n").unwrap();
    let out = sh(&p, "make");
    assert!(out.contains("main.o") && out.contains("util.o"), "{out}");
    assert_eq!(sh(&p, "./hello"), "rebuilt 42\n");
    sh(&p, "make -s clean && make -s -j4 && ./hello >/dev/null");
}

#[test]
fn sqlite_written_by_two_processes() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(3);
    let m = Mount::new(&c, &[]);
    for mode in ["delete", "wal"] {
        let db = m.p(&format!("{mode}.db"));
        sh(
            &m.path,
            &format!(
                "sqlite3 '{}' 'PRAGMA journal_mode={mode}; CREATE TABLE t(id INTEGER PRIMARY KEY, who TEXT, v BLOB);'",
                db.display()
            ),
        );
        let script = |who: &str| {
            let mut s = String::from(".timeout 20000\n");
            for i in 0..150 {
                s.push_str(&format!(
                    "BEGIN IMMEDIATE; INSERT INTO t(who, v) VALUES('{who}', randomblob({})); COMMIT;\n",
                    100 + i * 37
                ));
            }
            s
        };
        let mut kids = Vec::new();
        for who in ["a", "b"] {
            let path = m.dir.path().join(format!("{mode}-{who}.sql"));
            fs::write(&path, script(who)).unwrap();
            kids.push(
                Command::new("sh")
                    .arg("-c")
                    .arg(format!("sqlite3 '{}' < '{}'", db.display(), path.display()))
                    .spawn()
                    .unwrap(),
            );
        }
        for mut k in kids {
            assert!(k.wait().unwrap().success(), "{mode}: a writer failed");
        }
        let q = |sql: &str| sh(&m.path, &format!("sqlite3 '{}' \"{sql}\"", db.display())).trim().to_string();
        assert_eq!(q("PRAGMA integrity_check;"), "ok", "{mode}");
        assert_eq!(q("SELECT count(*) FROM t;"), "300", "{mode}");
        assert_eq!(q("SELECT count(*) FROM t WHERE who='a';"), "150", "{mode}");
        assert_eq!(q("PRAGMA journal_mode;"), mode);
    }
}
