//! The interception library (`crates/preload`, docs/preload.md) in real programs on a
//! real mount: what they write with the library preloaded is what the mount shows and the
//! other way round; tar, cp, git and Python round trips; fork, exec, dup, dup2,
//! F_DUPFD and threads on served descriptors; and proof that the calls were served
//! in-process: the library's own counts (`SHOAL_PRELOAD_STATS`) say native, and the mount
//! saw none of the reads, writes, creates and removals (its request log, one line per
//! FUSE request).

use shoal_testkit::mount::{skip_without_fuse, Mount};
use shoal_testkit::{pattern, Cluster};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Programs run with the library preloaded on mount `m`, counting into a stats file.
struct Preloaded<'a> {
    m: &'a Mount,
    stats: PathBuf,
}

impl<'a> Preloaded<'a> {
    fn new(m: &'a Mount) -> Preloaded<'a> {
        Preloaded { m, stats: m.dir.path().join("preload-stats") }
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("LD_PRELOAD", shoal_testkit::mount::preload_library())
            .env("SHOAL_PRELOAD_MOUNTS", &self.m.path)
            .env("SHOAL_PRELOAD_STATS", &self.stats)
            .current_dir(&self.m.path);
        c
    }

    /// `sh -c script` preloaded (the shell and everything it starts), in the mount;
    /// asserts success and returns stdout.
    fn sh(&self, script: &str) -> String {
        let out = self.command("sh").arg("-c").arg(script).output().expect("run sh");
        ok(script, out)
    }

    /// `python3 -c code` preloaded, in the mount.
    fn python(&self, code: &str) -> String {
        let out = self.command("python3").arg("-c").arg(code).output().expect("run python3");
        ok("python3", out)
    }

    /// Calls served natively since the last call, by family, summed over the processes.
    fn take_native(&self) -> BTreeMap<String, u64> {
        let text = fs::read_to_string(&self.stats).unwrap_or_default();
        let _ = fs::remove_file(&self.stats);
        let mut all = BTreeMap::new();
        for line in text.lines() {
            let native = line.split(" native ").nth(1).unwrap_or("").split(" kernel").next().unwrap_or("");
            for kv in native.split_whitespace() {
                if let Some((k, v)) = kv.split_once('=') {
                    *all.entry(k.to_string()).or_insert(0) += v.parse::<u64>().unwrap();
                }
            }
        }
        all
    }
}

fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "`{what}` failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run `cmd` without the library (through the kernel and the mount); asserts success.
fn plain(cwd: &Path, cmd: &[&str]) -> String {
    let out = Command::new(cmd[0]).args(&cmd[1..]).current_dir(cwd).output().unwrap();
    ok(&cmd.join(" "), out)
}

/// FUSE requests of kind `op` (" WRITE fh ", " CREATE ", ...) the mount has logged.
fn fuse_requests(m: &Mount, op: &str) -> usize {
    m.log_text().lines().filter(|l| l.contains(op)).count()
}

/// Whether `f` holds within 2 s (the mount's view of another client's change lags by up
/// to its entry_timeout, 1 s).
fn eventually(f: impl Fn() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(2) {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    f()
}

/// A small tree with nested directories, files of odd sizes, a symlink and a hard link.
fn make_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::write(root.join("a/one"), b"one\n").unwrap();
    fs::write(root.join("a/b/odd.bin"), pattern(3, 0, 100_003)).unwrap();
    fs::write(root.join("a/b/c/big.bin"), pattern(4, 0, 3 << 20)).unwrap();
    fs::write(root.join("zero"), b"").unwrap();
    std::os::unix::fs::symlink("a/one", root.join("link")).unwrap();
    fs::hard_link(root.join("a/one"), root.join("a/b/hard")).unwrap();
}

#[test]
fn programs_under_the_library_round_trip_through_the_mount_without_fuse() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(3);
    let m = Mount::with_log(&c, &[], "info,fuser::request=debug");
    let p = Preloaded::new(&m);

    // Written under the library, read through the mount; and the other way round. The
    // mount sees no WRITE, READ or CREATE of the library's: the data went from the process
    // to the servers and back.
    let kinds = [" WRITE fh ", " READ fh ", " CREATE "];
    let before = kinds.map(|op| fuse_requests(&m, op));
    p.sh("dd if=/dev/zero of=zeros bs=1M count=8 status=none && printf 'hello\\n' > hello");
    let written = kinds.map(|op| fuse_requests(&m, op));
    fs::write(m.p("from-mount"), pattern(9, 0, 300_000)).unwrap();
    let mid = kinds.map(|op| fuse_requests(&m, op));
    let sum = p.sh("cksum from-mount zeros");
    let after = kinds.map(|op| fuse_requests(&m, op));
    assert_eq!(written, before, "the kernel saw WRITE, READ, CREATE requests for files written under the library");
    assert_eq!(after[1], mid[1], "the kernel sent READ requests for files read under the library");
    let native = p.take_native();
    assert!(native.get("write").copied().unwrap_or(0) >= 8, "{native:?}");
    assert!(native.get("read").copied().unwrap_or(0) >= 2, "{native:?}");
    assert!(native.get("open").copied().unwrap_or(0) >= 4, "{native:?}");
    assert_eq!(fs::read(m.p("zeros")).unwrap(), vec![0u8; 8 << 20]);
    assert_eq!(fs::read_to_string(m.p("hello")).unwrap(), "hello\n");
    assert_eq!(sum, plain(&m.path, &["cksum", "from-mount", "zeros"]));

    // tar and cp: a tree packed into the mount, unpacked in it, copied, compared.
    let src = m.dir.path().join("src");
    make_tree(&src);
    let s = src.display();
    p.sh(&format!(
        "tar cf t.tar -C {s} . && mkdir x && tar xf t.tar -C x && cp -r {s} cp && cp -a x cpa && tar cf - -C x . | (mkdir y && tar xf - -C y)"
    ));
    for d in ["x", "cp", "cpa", "y"] {
        plain(&m.path, &["diff", "-r", &src.display().to_string(), d]);
    }
    let native = p.take_native();
    for op in ["open", "read", "write", "mkdir", "link", "dir"] {
        assert!(native.get(op).copied().unwrap_or(0) > 0, "tar/cp served no {op}: {native:?}");
    }

    // git in the mount.
    p.sh("mkdir repo && cd repo && git init -q . && git config user.email t@e && git config user.name t \
         && printf 'one\\n' > f && git add f && git commit -qm one \
         && printf 'two\\n' >> f && mkdir d && printf 'x\\n' > d/x && git add -A && git commit -qm two \
         && git mv f g && git commit -qm three");
    let log = p.sh("cd repo && git log --format=%s && git status --porcelain && git fsck --no-progress 2>&1");
    assert_eq!(log.trim(), "three\ntwo\none", "{log}");
    assert_eq!(fs::read_to_string(m.p("repo/g")).unwrap(), "one\ntwo\n");
    let log = plain(&m.p("repo"), &["git", "log", "--format=%s"]);
    assert_eq!(log.trim(), "three\ntwo\none");
    assert!(p.take_native().get("open").copied().unwrap_or(0) > 20);

    // Python: open, listdir, stat, rename, shutil.
    let out = p.python(
        r#"
import os, shutil
os.makedirs("py/sub")
with open("py/a.txt", "w") as f:
    f.write("alpha\n" * 1000)
with open("py/a.txt", "a") as f:
    f.write("end\n")
os.rename("py/a.txt", "py/b.txt")
shutil.copy2("py/b.txt", "py/sub/c.txt")
shutil.copytree("py", "py2")
shutil.rmtree("py/sub")
st = os.stat("py2/sub/c.txt")
print(sorted(os.listdir("py")), sorted(os.listdir("py2")), st.st_size, open("py2/b.txt").read().count("alpha"))
"#,
    );
    assert_eq!(out.trim(), "['b.txt'] ['b.txt', 'sub'] 6004 1000");
    assert_eq!(fs::read_to_string(m.p("py2/sub/c.txt")).unwrap().len(), 6004);
    // The mount is another client of the cluster: it sees the removal within its
    // entry_timeout (1 s).
    assert!(eventually(|| !m.p("py/sub").exists()), "py/sub still shows through the mount");
    let native = p.take_native();
    for op in ["open", "write", "stat", "rename", "mkdir", "unlink", "dir"] {
        assert!(native.get(op).copied().unwrap_or(0) > 0, "Python served no {op}: {native:?}");
    }
}

#[test]
fn fork_exec_dup_and_threads_share_descriptors_as_the_kernel_does() {
    if skip_without_fuse() {
        return;
    }
    let c = Cluster::start(3);
    let m = Mount::new(&c, &[]);
    let p = Preloaded::new(&m);
    let out = p.python(
        r#"
import os, fcntl, subprocess, threading
fd = os.open("shared", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"A" * 100)
# fork: the child writes on at the shared offset, the parent after it.
pid = os.fork()
if pid == 0:
    os.write(fd, b"B" * 100)
    os._exit(0)
os.waitpid(pid, 0)
os.write(fd, b"C" * 100)
assert os.lseek(fd, 0, os.SEEK_CUR) == 300, os.lseek(fd, 0, os.SEEK_CUR)
# A forked child reads on at the parent's offset.
os.lseek(fd, 100, os.SEEK_SET)
pid = os.fork()
if pid == 0:
    os._exit(0 if os.read(fd, 100) == b"B" * 100 else 1)
_, st = os.waitpid(pid, 0)
assert st == 0, "child read the wrong bytes"
assert os.lseek(fd, 0, os.SEEK_CUR) == 200
os.lseek(fd, 300, os.SEEK_SET)
# exec: a program started with the descriptor writes through it, at the shared offset.
subprocess.run(["bash", "-c", "printf EXEC >&%d" % fd], pass_fds=[fd], check=True)
os.write(fd, b"D")
# dup, dup2, F_DUPFD share the offset.
d1 = os.dup(fd)
os.write(d1, b"E")
d2 = os.dup2(fd, 50)
os.write(d2, b"F")
d3 = fcntl.fcntl(fd, fcntl.F_DUPFD, 60)
assert d3 >= 60
os.write(d3, b"G")
os.close(d1); os.close(d2); os.close(d3)
os.write(fd, b"H")
assert os.lseek(fd, 0, os.SEEK_CUR) == 309
os.close(fd)
# Threads writing disjoint ranges of one descriptor at once.
fd = os.open("threads", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
def work(i):
    for k in range(16):
        os.pwrite(fd, bytes([65 + i]) * 4096, (i * 16 + k) * 4096)
ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
os.close(fd)
print("ok")
"#,
    );
    assert_eq!(out.trim(), "ok");
    let shared = fs::read(m.p("shared")).unwrap();
    let expect = [&b"A".repeat(100)[..], &b"B".repeat(100), &b"C".repeat(100), b"EXEC", b"DEFGH"].concat();
    assert_eq!(String::from_utf8_lossy(&shared), String::from_utf8_lossy(&expect));
    let threads = fs::read(m.p("threads")).unwrap();
    assert_eq!(threads.len(), 8 * 16 * 4096);
    for (i, chunk) in threads.chunks(16 * 4096).enumerate() {
        assert!(chunk.iter().all(|b| *b == 65 + i as u8), "thread {i}'s range is wrong");
    }
    let native = p.take_native();
    assert!(native.get("write").copied().unwrap_or(0) >= 8 * 16, "{native:?}");
}
