//! `NetLab`: hosts with their own addresses for one test, made of Linux network namespaces.
//!
//! Layout (all names carry the test process's pid and a per-process counter, so concurrent
//! tests never share one, and leftovers of dead test processes can be found and removed):
//!
//! ```text
//!   root namespace (the test: clients)        namespace shoal-lab-<pid>-<c>-<i>
//!   bridge sl<pid>-b<c>  10.A.B.254/24  ──── veth sl<pid>-<c>-<i>  ──  eth0  10.A.B.<i+1>/24
//!   bridge sl<pid>-i<c>  (no address: the island of isolated hosts)
//! ```
//!
//! **Isolation moves the bridge side of a host's veth from the main bridge to the island
//! bridge.** Hosts isolated together still reach each other (a minority group stays a
//! group, as a real partition does), but neither the test's clients (on the main bridge's
//! address) nor the other hosts reach them, in either direction. Frames are dropped
//! silently, as a pulled cable or a dead switch port drops them: no RST, no ICMP, so
//! callers see timeouts, the failure mode a partition really has. We do not use
//! `tc netem loss 100%` because it needs the `sch_netem` module (not loaded everywhere) and
//! would cut isolated hosts off from each other too; nor `ip link set down`, for the same
//! second reason. `heal` moves every port back. Bridges run without STP, so a moved port
//! forwards at once.
//!
//! Everything is removed on drop, also when the test panics; a lab that cannot be made
//! (not root, no `ip`) is reported by [`NetLab::new`] so that the test can skip or, under
//! `CI=true`, fail.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// Labs made by this process so far (the `<c>` in every name).
static COUNTER: AtomicU32 = AtomicU32::new(0);
/// Address choice and the reaping of leftovers run one lab at a time within a process, and
/// across processes under [`MachineLock`] (test runners that start each test in a process of
/// its own would otherwise let two labs pick one subnet before either made it).
static CREATE: Mutex<()> = Mutex::new(());

/// An exclusive lock (flock) on one file of the machine, released on drop.
struct MachineLock(std::fs::File);

impl MachineLock {
    fn take() -> Result<MachineLock, String> {
        use std::os::unix::io::AsRawFd;
        let path = std::env::temp_dir().join("shoal-test-netlab.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        // SAFETY: flock(2) on a descriptor this function owns; blocks until it is ours.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(format!("cannot lock {}: {}", path.display(), std::io::Error::last_os_error()));
        }
        Ok(MachineLock(file))
    }
}

impl Drop for MachineLock {
    fn drop(&mut self) {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock(2) on the descriptor this lock owns.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Prefix of namespace names; interface names start with `sl<pid in hex>-`.
const NS_PREFIX: &str = "shoal-lab-";

/// One test's hosts: `n` network namespaces on a private /24 behind a bridge.
pub struct NetLab {
    id: u32,
    subnet: [u8; 3],
    namespaces: Vec<String>,
    host_veths: Vec<String>,
    bridge: String,
    island: String,
    isolated: Mutex<Vec<usize>>,
}

/// Run `ip` with `args`; the error names the command and what `ip` said.
fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `ip {}`: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!("`ip {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Remove the namespaces and interfaces left by test processes that died without
/// dropping their lab (killed by a timeout, say). Only names of dead pids are touched.
fn reap_leftovers() {
    if let Ok(list) = ip(&["netns", "list"]) {
        for ns in list.lines().filter_map(|l| l.split_whitespace().next()) {
            let Some(rest) = ns.strip_prefix(NS_PREFIX) else { continue };
            let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|p| !pid_alive(p)) {
                let _ = ip(&["netns", "delete", ns]);
            }
        }
    }
    if let Ok(list) = ip(&["-o", "link", "show"]) {
        for line in list.lines() {
            // "12: sl1a2b-b0: <...>" or "13: sl1a2b-0-1@if2: <...>"
            let Some(name) = line.split(": ").nth(1).map(|n| n.split('@').next().unwrap_or(n)) else { continue };
            let Some(rest) = name.strip_prefix("sl") else { continue };
            let Some((hex, tail)) = rest.split_once('-') else { continue };
            if !ours(tail) {
                continue;
            }
            if let Ok(pid) = u32::from_str_radix(hex, 16) {
                if !pid_alive(pid) {
                    let _ = ip(&["link", "delete", name]);
                }
            }
        }
    }
}

/// Does `tail` (what follows `sl<pid>-`) have the shape of one of our interface names:
/// `b<c>`, `i<c>` (bridges) or `<c>-<i>` (veths)? Only such names are reaped, so that an
/// unrelated interface that happens to start with `sl` and hex digits is never touched.
fn ours(tail: &str) -> bool {
    let hex = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit());
    if let Some(c) = tail.strip_prefix('b').or_else(|| tail.strip_prefix('i')) {
        if hex(c) {
            return true;
        }
    }
    matches!(tail.split_once('-'), Some((c, i)) if hex(c) && !i.is_empty() && i.chars().all(|d| d.is_ascii_digit()))
}

/// Is any address or route of this machine inside `10.a.b.0/24`?
fn subnet_in_use(a: u8, b: u8) -> bool {
    let prefix = format!("10.{a}.{b}.");
    let addrs = ip(&["-o", "-4", "addr", "show"]).unwrap_or_default();
    let routes = ip(&["-4", "route", "show", "table", "all"]).unwrap_or_default();
    addrs.contains(&prefix) || routes.contains(&prefix)
}

impl NetLab {
    /// A lab of `n` hosts (1 to 200), or why it cannot be made here.
    pub fn new(n: usize) -> Result<NetLab, String> {
        assert!((1..=200).contains(&n), "a lab has 1 to 200 hosts");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("network namespaces need root (the test runs as an ordinary user)".into());
        }
        ip(&["-V"]).map_err(|e| format!("iproute2 is needed: {e}"))?;
        let _guard = CREATE.lock().unwrap_or_else(|e| e.into_inner());
        let _machine = MachineLock::take()?;
        reap_leftovers();
        let pid = std::process::id();
        let id = COUNTER.fetch_add(1, Ordering::SeqCst);
        // 10.A.B.0/24: A from the pid (concurrent test processes have nearby pids, so
        // they differ), B from the counter; a subnet already on this machine (another
        // test's lab, a real network) is skipped.
        let a = 64 + (pid % 160) as u8;
        let mut b = (id % 256) as u8;
        let mut tries = 0;
        while subnet_in_use(a, b) {
            b = b.wrapping_add(1);
            tries += 1;
            if tries == 256 {
                return Err(format!("every 10.{a}.x.0/24 is in use on this machine"));
            }
        }
        let mut lab = NetLab {
            id,
            subnet: [10, a, b],
            namespaces: Vec::new(),
            host_veths: Vec::new(),
            bridge: format!("sl{pid:x}-b{id:x}"),
            island: format!("sl{pid:x}-i{id:x}"),
            isolated: Mutex::new(Vec::new()),
        };
        // From here on, a failure drops `lab`, which removes whatever was made.
        lab.build(n, pid)?;
        Ok(lab)
    }

    fn build(&mut self, n: usize, pid: u32) -> Result<(), String> {
        let bridge = self.bridge.clone();
        let island = self.island.clone();
        ip(&["link", "add", &bridge, "type", "bridge", "stp_state", "0"])?;
        ip(&["link", "add", &island, "type", "bridge", "stp_state", "0"])?;
        ip(&["addr", "add", &format!("{}/24", self.gateway()), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        ip(&["link", "set", &island, "up"])?;
        for i in 0..n {
            let ns = format!("{NS_PREFIX}{pid}-{}-{i}", self.id);
            ip(&["netns", "add", &ns])?;
            self.namespaces.push(ns.clone());
            let veth = format!("sl{pid:x}-{:x}-{i}", self.id);
            assert!(veth.len() <= 15, "interface name {veth} is too long");
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            self.host_veths.push(veth.clone());
            ip(&["link", "set", &veth, "master", &bridge])?;
            ip(&["link", "set", &veth, "up"])?;
            let addr = format!("{}/24", self.addr(i));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        }
        Ok(())
    }

    /// A lab of `n` hosts, or `None` when it cannot be made here: then the reason is
    /// printed, and under `CI=true` the test fails instead (CI runs as root with `ip`, so
    /// a lab that cannot be made there is a broken machine, not a reason to pass).
    pub fn or_skip(n: usize) -> Option<NetLab> {
        match NetLab::new(n) {
            Ok(lab) => Some(lab),
            Err(why) => {
                if std::env::var("CI").as_deref() == Ok("true") {
                    panic!("network lab unavailable under CI=true: {why}");
                }
                eprintln!("skipped: network lab unavailable: {why}");
                None
            }
        }
    }

    /// Number of hosts.
    pub fn len(&self) -> usize {
        self.namespaces.len()
    }

    /// Whether the lab has no host (never, once made: a lab has 1 to 200).
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
    }

    /// Address of host `i` (`10.A.B.<i+1>`).
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, i as u8 + 1)
    }

    /// The root namespace's address on the lab's bridge (where the test's clients come from).
    pub fn gateway(&self) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, 254)
    }

    /// Name of host `i`'s namespace.
    pub fn namespace(&self, i: usize) -> &str {
        &self.namespaces[i]
    }

    /// `program` to be run inside host `i` (`ip netns exec NS program`). `ip netns exec`
    /// execs the program in place (it forks only in batch mode), so the child's pid is
    /// the program's own: signals sent to it reach the program.
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.namespaces[i]]).arg(program);
        c
    }

    /// Cut hosts `hosts` off from the test's clients and from every other host (they still
    /// reach each other). Adds to hosts already isolated.
    pub fn isolate(&self, hosts: &[usize]) {
        let mut isolated = self.isolated.lock().unwrap_or_else(|e| e.into_inner());
        for &i in hosts {
            ip(&["link", "set", &self.host_veths[i], "master", &self.island])
                .unwrap_or_else(|e| panic!("isolate host {i}: {e}"));
            if !isolated.contains(&i) {
                isolated.push(i);
            }
        }
    }

    /// Reconnect every isolated host.
    pub fn heal(&self) {
        let mut isolated = self.isolated.lock().unwrap_or_else(|e| e.into_inner());
        for i in isolated.drain(..) {
            ip(&["link", "set", &self.host_veths[i], "master", &self.bridge])
                .unwrap_or_else(|e| panic!("heal host {i}: {e}"));
        }
    }

    /// The interfaces this lab made in the root namespace (bridges, host ends of veths).
    pub fn interfaces(&self) -> Vec<String> {
        let mut v = vec![self.bridge.clone(), self.island.clone()];
        v.extend(self.host_veths.iter().cloned());
        v
    }

    /// Hosts isolated now.
    pub fn isolated(&self) -> Vec<usize> {
        self.isolated.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth and with it the pair; the host
        // ends are deleted first anyway, so nothing depends on the namespace going away
        // (a process still inside keeps a namespace alive after its name is removed).
        for v in &self.host_veths {
            let _ = ip(&["link", "delete", v]);
        }
        for ns in &self.namespaces {
            let _ = ip(&["netns", "delete", ns]);
        }
        let _ = ip(&["link", "delete", &self.bridge]);
        let _ = ip(&["link", "delete", &self.island]);
    }
}
