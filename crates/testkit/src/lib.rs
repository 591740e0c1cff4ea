//! The one harness of Shoal's integration tests (docs/testing.md): real clusters of `shoald`
//! processes on 127.0.0.1 (or inside a network lab, [`netns`]), each in its own folder under
//! a temporary directory and killed (SIGKILL) when the test ends; FUSE mounts ([`mount`]);
//! the fault injector ([`faults`]) and the history checker ([`history`]); ports that no two
//! tests share, also when every test runs in a process of its own (cargo-nextest).
//!
//! It drives the programs cargo built for the tests ([`bin`]): the test binaries live in
//! `crates/cli/tests/<group>/`, whose package owns `shoal` and `shoald`, so cargo builds
//! both before it runs them.

pub mod faults;
pub mod history;
pub mod inproc;
pub mod mount;
pub mod netns;
mod wait;

pub use wait::{wait_for, wait_until};

use shoal_client::{Client, ClientOptions};
use shoal_placement::ClusterMap;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub map: ClusterMap,
    children: Vec<Option<Child>>,
    /// Extra `shoald` arguments (every server, every start).
    server_args: Vec<String>,
    /// With [`Cluster::start_in_lab`]: server `i` runs inside this network namespace.
    namespaces: Option<Vec<String>>,
}

/// A binary of the workspace (`shoal`, `shoald`) as cargo built it for the running tests:
/// the test binary is `<target>/<profile>/deps/<test>-<hash>` and the programs are in
/// `<target>/<profile>`. `SHOAL_TEST_BIN_DIR` names another folder (installed binaries, say).
pub fn bin(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("SHOAL_TEST_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("<target>/<profile>/deps/<test>");
    let path = profile_dir.join(name);
    assert!(path.exists(), "{} was not built (run the tests of the `shoal` package)", path.display());
    path
}

/// The `shoal` command line program built for the tests.
pub fn shoal_bin() -> PathBuf {
    bin("shoal")
}

/// The `shoald` server program built for the tests.
pub fn shoald_bin() -> PathBuf {
    bin("shoald")
}

/// Claim `port` for this process against every other test process of the machine: a lock
/// (flock) on a file named after the port, held until this process exits. Test runners
/// that start each test in a process of its own (cargo-nextest) then never hand one port
/// to two clusters, which a per-process set alone could not ensure.
fn claim_across_processes(port: u16) -> bool {
    use std::os::unix::io::AsRawFd;
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("shoal-test-ports");
    let _ = std::fs::create_dir_all(&dir);
    let Ok(file) =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(port.to_string()))
    else {
        return false;
    };
    // SAFETY: flock(2) on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return false;
    }
    HELD.lock().unwrap_or_else(|e| e.into_inner()).push(file);
    true
}

/// Ports for the servers of a test cluster, free now, and below the kernel's ephemeral range
/// (32768–60999 by default). A port the kernel hands out for `bind(0)` is ephemeral: between
/// this pick and the server's own bind, any outgoing connection of the machine (the other
/// tests' clients make thousands) may take it, and the server fails to start with "Address
/// already in use" (seen in CI). The pick starts at a place of its own per process and call,
/// and holds what it found until all `n` are found (no port twice). A port is handed out
/// once per process: the tests of one binary run in parallel, and a cluster's servers bind
/// their ports only after the pick let them go, so a second pick could otherwise hand the
/// same port to another cluster (its server then fails to bind, and its readiness check
/// reaches the other cluster's server). Across processes, a port is claimed by a lock file
/// ([`claim_across_processes`]).
pub fn free_ports(n: usize) -> Vec<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static CALLS: AtomicU32 = AtomicU32::new(0);
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let mut at =
        (std::process::id().wrapping_mul(7919) ^ nanos ^ CALLS.fetch_add(1, Ordering::Relaxed).wrapping_mul(977))
            % SPAN;
    let mut held = Vec::with_capacity(n);
    for _ in 0..SPAN {
        if held.len() == n {
            break;
        }
        let port = (FIRST + at) as u16;
        if !handed_out.contains(&port) {
            if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                if claim_across_processes(port) {
                    held.push(l);
                }
            }
        }
        at = (at + 1 + n as u32) % SPAN;
    }
    assert_eq!(held.len(), n, "no {n} free ports between {FIRST} and {}", FIRST + SPAN);
    let ports: Vec<u16> = held.iter().map(|l| l.local_addr().unwrap().port()).collect();
    handed_out.extend(&ports);
    ports
}

impl Cluster {
    /// Start `n` servers with the default settings.
    pub fn start(n: u32) -> Cluster {
        Cluster::start_with(n, |_| {})
    }

    /// Start `n` servers after letting `tweak` change the map (defaults, policy…).
    pub fn start_with(n: u32, tweak: impl FnOnce(&mut ClusterMap)) -> Cluster {
        Cluster::start_full(n, tweak, &[])
    }

    /// Start `n` servers, each with the extra `shoald` arguments `args`.
    pub fn start_with_server_args(n: u32, args: &[&str]) -> Cluster {
        Cluster::start_full(n, |_| {}, args)
    }

    /// Start `n` servers after `prepare` has filled the cluster's directory (data
    /// directories `s0`, `s1`, … from a fixture, say).
    pub fn start_prepared(n: u32, prepare: impl FnOnce(&Path)) -> Cluster {
        Cluster::start_inner(n, |_| {}, &[], prepare)
    }

    /// Start `n` servers after letting `tweak` change the map, each with the extra `shoald`
    /// arguments `args` (kept for restarts).
    pub fn start_full(n: u32, tweak: impl FnOnce(&mut ClusterMap), args: &[&str]) -> Cluster {
        Cluster::start_inner(n, tweak, args, |_| {})
    }

    /// Start one server per host of `lab`, server `i` inside host `i`'s namespace and
    /// listening on `lab.addr(i)` (RPC port 7400, HTTP 7480: every host has its own ports),
    /// after letting `tweak` change the map. The test's clients stay in the root namespace
    /// and reach the servers through the lab's bridge. Declare the lab before the cluster,
    /// so that the servers are killed before their namespaces go.
    pub fn start_in_lab(lab: &netns::NetLab, tweak: impl FnOnce(&mut ClusterMap)) -> Cluster {
        let hosts: Vec<String> = (0..lab.len()).map(|i| lab.namespace(i).to_string()).collect();
        let addrs: Vec<(String, String)> =
            (0..lab.len()).map(|i| (format!("{}:7400", lab.addr(i)), format!("{}:7480", lab.addr(i)))).collect();
        let c = Cluster::start_placed(lab.len() as u32, Some(addrs), Some(hosts), tweak, &[], |_| {});
        for id in 0..lab.len() as u32 {
            // `ip netns exec` must have exec'd shoald in place: kill9, stop and signal act
            // on the child's pid.
            let exe = std::fs::read_link(format!("/proc/{}/exe", c.pid(id))).unwrap_or_default();
            assert!(
                exe.file_name().is_some_and(|f| f.to_string_lossy().starts_with("shoald")),
                "server {id}'s pid runs {} rather than shoald",
                exe.display()
            );
        }
        c
    }

    fn start_inner(n: u32, tweak: impl FnOnce(&mut ClusterMap), args: &[&str], prepare: impl FnOnce(&Path)) -> Cluster {
        Cluster::start_placed(n, None, None, tweak, args, prepare)
    }

    /// Start `n` servers at `addrs` (RPC, HTTP) or on free ports of 127.0.0.1, each in
    /// namespace `namespaces[i]` if given.
    fn start_placed(
        n: u32,
        addrs: Option<Vec<(String, String)>>,
        namespaces: Option<Vec<String>>,
        tweak: impl FnOnce(&mut ClusterMap),
        args: &[&str],
        prepare: impl FnOnce(&Path),
    ) -> Cluster {
        let dir = tempfile::Builder::new().prefix("shoal-test-").tempdir().unwrap();
        prepare(dir.path());
        let mut map = ClusterMap::local(n, 0, dir.path());
        let addrs = addrs.unwrap_or_else(|| {
            let ports = free_ports(2 * n as usize);
            (0..n as usize)
                .map(|i| (format!("127.0.0.1:{}", ports[i]), format!("127.0.0.1:{}", ports[n as usize + i])))
                .collect()
        });
        for (s, (addr, http)) in map.servers.iter_mut().zip(addrs) {
            s.addr = addr;
            s.http = Some(http);
        }
        tweak(&mut map);
        let config = dir.path().join("cluster.toml");
        std::fs::write(&config, map.to_toml()).unwrap();
        let loaded = ClusterMap::load(&config).unwrap();
        shoal_auth::make_keys(&loaded.security.cluster_key, &loaded.security.host_key).unwrap();
        if loaded.security.tls {
            shoal_rpc::tls_certs::make_certs(&loaded, false).unwrap();
        }
        let server_args = args.iter().map(|a| a.to_string()).collect();
        let mut c = Cluster { dir, config, map, children: Vec::new(), server_args, namespaces };
        for id in 0..n {
            let child = c.spawn(id);
            c.children.push(Some(child));
        }
        for id in 0..n {
            c.wait_ready(id);
        }
        c
    }

    fn spawn(&self, id: u32) -> Child {
        self.spawn_env(id, &[])
    }

    /// Start a killed server again with extra `shoald` arguments for this start only
    /// (`--data-dir` of a mirror, say), and wait until it accepts.
    pub fn restart_with_args(&mut self, id: u32, args: &[&str]) {
        assert!(self.children[id as usize].is_none(), "server {id} still running");
        let extra: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let child = self.spawn_full(id, &[], &extra);
        self.children[id as usize] = Some(child);
        self.wait_ready(id);
    }

    fn spawn_env(&self, id: u32, env: &[(&str, &str)]) -> Child {
        self.spawn_full(id, env, &[])
    }

    fn spawn_full(&self, id: u32, env: &[(&str, &str)], extra: &[String]) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("s{id}.log")))
            .unwrap();
        let mut cmd = match &self.namespaces {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns[id as usize]]).arg(shoald_bin());
                c
            }
            None => Command::new(shoald_bin()),
        };
        cmd.arg("--config")
            .arg(&self.config)
            .arg("--id")
            .arg(id.to_string())
            .args(&self.server_args)
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start shoald")
    }

    /// Start server `id`, added to the map since the cluster started (`shoal server add`,
    /// which wrote it into the configuration file), at `addr`; wait until it accepts.
    pub fn start_joined(&mut self, id: u32) {
        let map = ClusterMap::load(&self.config).unwrap();
        let entry = map.server(shoal_proto::ServerId(id)).expect("the joined server is in the config file").clone();
        while self.map.servers.len() <= id as usize {
            self.map.servers.push(entry.clone());
        }
        self.map.servers[id as usize] = entry;
        while self.children.len() <= id as usize {
            self.children.push(None);
        }
        let child = self.spawn(id);
        self.children[id as usize] = Some(child);
        self.wait_ready(id);
    }

    pub fn addr(&self, id: u32) -> String {
        self.map.servers[id as usize].addr.clone()
    }

    /// Base URL of server `id`'s HTTP service (`http://127.0.0.1:PORT`).
    pub fn http_url(&self, id: u32) -> String {
        format!("http://{}", self.map.servers[id as usize].http.as_deref().expect("the test cluster has HTTP ports"))
    }

    fn wait_ready(&mut self, id: u32) {
        let start = Instant::now();
        loop {
            // With a timeout: a server in a lab host is reached through a bridge, where a
            // lost SYN would otherwise wait for the kernel's retries.
            let up = match self.addr(id).parse::<std::net::SocketAddr>() {
                Ok(a) => TcpStream::connect_timeout(&a, Duration::from_secs(1)).is_ok(),
                Err(_) => TcpStream::connect(self.addr(id)).is_ok(),
            };
            let exited = match self.children.get_mut(id as usize) {
                Some(Some(child)) => child.try_wait().ok().flatten(),
                _ => None,
            };
            if let Some(status) = exited {
                // Also when the port answered: then something else listens there.
                panic!("shoald {id} exited ({status}) during start-up:\n{}", self.log(id));
            }
            if up {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "shoald {id} not ready:\n{}", self.log(id));
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self, id: u32) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("s{id}.log"))).unwrap_or_default()
    }

    /// `kill -9` one server and reap it.
    pub fn kill9(&mut self, id: u32) {
        if let Some(mut child) = self.children[id as usize].take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Send `signal` to a running server (SIGSTOP freezes it: its sockets stay open but
    /// nothing answers; SIGCONT thaws it).
    pub fn signal(&self, id: u32, signal: i32) {
        let child = self.children[id as usize].as_ref().expect("server running");
        // SAFETY: kill(2) on the pid of a child this harness started and has not reaped.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0, "signal server {id}");
    }

    /// Stop one server cleanly (SIGTERM: it syncs its log and closes its stores) and reap it.
    pub fn stop(&mut self, id: u32) {
        if let Some(mut child) = self.children[id as usize].take() {
            // SAFETY: kill(2) on the pid of a child this harness started and has not reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let start = Instant::now();
            while matches!(child.try_wait(), Ok(None)) {
                if start.elapsed() > Duration::from_secs(30) {
                    let _ = child.kill();
                    panic!("shoald {id} did not stop within 30 s of SIGTERM:\n{}", self.log(id));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Start a killed server again (same data directory) and wait until it accepts.
    pub fn restart(&mut self, id: u32) {
        assert!(self.children[id as usize].is_none(), "server {id} still running");
        let child = self.spawn(id);
        self.children[id as usize] = Some(child);
        self.wait_ready(id);
    }

    /// Start a stopped server again with extra environment variables (`FAILPOINTS`, say),
    /// for this start only, and wait until it accepts.
    pub fn restart_with_env(&mut self, id: u32, env: &[(&str, &str)]) {
        assert!(self.children[id as usize].is_none(), "server {id} still running");
        let child = self.spawn_env(id, env);
        self.children[id as usize] = Some(child);
        self.wait_ready(id);
    }

    /// Start a stopped server with extra environment variables without waiting for it to
    /// accept (it is expected to die during start-up: a failpoint armed in its recovery).
    pub fn spawn_with_env(&mut self, id: u32, env: &[(&str, &str)]) {
        assert!(self.children[id as usize].is_none(), "server {id} still running");
        let child = self.spawn_env(id, env);
        self.children[id as usize] = Some(child);
    }

    /// Wait up to `timeout` for server `id` to exit on its own (a failpoint that kills it);
    /// reap it and say whether it did.
    pub fn wait_exit(&mut self, id: u32, timeout: Duration) -> bool {
        self.children[id as usize].is_none() || self.wait_exit_status(id, timeout).is_some()
    }

    /// Wait up to `timeout` for the running server `id` to exit on its own; reap it and
    /// return how it ended (`None`: still running).
    pub fn wait_exit_status(&mut self, id: u32, timeout: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            let child = self.children[id as usize].as_mut()?;
            if let Ok(Some(status)) = child.try_wait() {
                self.children[id as usize] = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    pub fn options(&self) -> ClientOptions {
        ClientOptions { timeout: Duration::from_secs(20), ..ClientOptions::default() }
    }

    /// A client as the current user (root in CI).
    pub fn client(&self) -> Client {
        Client::from_config(&self.config, self.options()).unwrap()
    }

    /// A client with caching off: every call goes to the servers (no directory leases either).
    pub fn uncached_client(&self) -> Client {
        let opts = ClientOptions { cache_ttl: Duration::ZERO, dir_lease: Duration::ZERO, ..self.options() };
        Client::from_config(&self.config, opts).unwrap()
    }

    /// Client requests the servers have served so far, summed (a batch counts once; the
    /// `hello` and `status` requests of this count itself included).
    pub fn client_requests(&self) -> u64 {
        let client = self.uncached_client();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(client.status_all()).into_iter().map(|(_, st)| st.unwrap().counters.client_requests).sum()
    }

    /// Requests served so far, by operation, summed over the servers (without `status` and
    /// `hello`, which counting itself sends).
    pub fn ops(&self) -> std::collections::BTreeMap<String, u64> {
        let client = self.uncached_client();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut all = std::collections::BTreeMap::new();
        for (_, st) in rt.block_on(client.status_all()) {
            for (op, n) in st.unwrap().counters.ops {
                if op != "status" && op != "hello" {
                    *all.entry(op).or_insert(0) += n;
                }
            }
        }
        all
    }

    /// Run the `shoal` CLI against this cluster: (exit code, stdout, stderr).
    pub fn shoal(&self, args: &[&str]) -> (i32, String, String) {
        shoal_cmd(Some(&self.config), args)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Lines of each server's log a failed test shows.
const LOG_TAIL_LINES: usize = 25;

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // A failed test shows the end of each server's log (CI keeps only the test's output).
        if std::thread::panicking() {
            for i in 0..self.children.len() {
                let log = self.log(i as u32);
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
                eprintln!("---- the last lines of server {i}'s log ----\n{tail}");
            }
        }
        // A failed test's server logs, kept where `SHOAL_TEST_KEEP_LOGS` says (docs/testing.md).
        if let (true, Some(to)) = (std::thread::panicking(), std::env::var_os("SHOAL_TEST_KEEP_LOGS")) {
            let to = Path::new(&to);
            let _ = std::fs::create_dir_all(to);
            for i in 0..self.children.len() {
                let _ = std::fs::copy(self.dir.path().join(format!("s{i}.log")), to.join(format!("s{i}.log")));
            }
            eprintln!("server logs kept in {}", to.display());
        }
    }
}

pub fn shoal_cmd(config: Option<&Path>, args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(shoal_bin());
    cmd.env_remove("SHOAL_CONFIG").stdin(Stdio::null());
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    let out = cmd.args(args).output().expect("run shoal");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Deterministic content: byte at file offset `off` depends only on `off` and `seed`.
pub fn pattern(seed: u64, off: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 16);
    let mut word = off / 8;
    let skip = (off % 8) as usize;
    while v.len() < len + skip {
        v.extend_from_slice(&shoal_placement::rendezvous::mix64(word ^ seed.rotate_left(17)).to_le_bytes());
        word += 1;
    }
    v.drain(..skip);
    v.truncate(len);
    v
}

/// Sum of per-op counters across servers, for one op name.
pub async fn op_count(client: &Client, op: &str) -> Vec<u64> {
    let mut v = Vec::new();
    for (_, st) in client.status_all().await {
        let st = st.unwrap();
        v.push(st.counters.ops.iter().find(|(n, _)| n == op).map(|(_, c)| *c).unwrap_or(0));
    }
    v
}

/// Client requests received by each server so far.
pub async fn client_requests(client: &Client) -> Vec<u64> {
    let mut v = Vec::new();
    for (_, st) in client.status_all().await {
        v.push(st.unwrap().counters.client_requests);
    }
    v
}

/// Per server: requests of every kind except `status` and `hello` (which measuring itself sends).
pub async fn work_requests(client: &Client) -> Vec<u64> {
    let mut v = Vec::new();
    for (_, st) in client.status_all().await {
        let st = st.unwrap();
        v.push(st.counters.ops.iter().filter(|(n, _)| n != "status" && n != "hello").map(|(_, c)| *c).sum());
    }
    v
}

impl Cluster {
    /// Process id of a running server (to stop it with SIGSTOP, say).
    pub fn pid(&self, id: u32) -> u32 {
        self.children[id as usize].as_ref().expect("server running").id()
    }

    /// Is the server process still running (not exited, not killed)?
    pub fn alive(&mut self, id: u32) -> bool {
        match self.children[id as usize].as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }
}

/// For tests that speak the protocol over raw connections: prove the host key of the
/// cluster whose map is at `config` in a raw `Hello` exchange, as root's tools do. The
/// `HelloAuth` to put in the `Hello`, and (given the server's answer) the `Authenticate`.
pub struct RawHost {
    ring: shoal_auth::KeyRing,
    nonce: Vec<u8>,
}

impl RawHost {
    pub fn new(config: &Path) -> RawHost {
        let map = ClusterMap::load(config).unwrap();
        let ring = shoal_auth::KeyRing::load(&map.security.host_key, shoal_auth::KeyKind::Host).unwrap();
        RawHost { ring, nonce: shoal_rpc::auth::nonce() }
    }

    pub fn hello(&self) -> shoal_proto::auth::HelloAuth {
        shoal_proto::auth::HelloAuth {
            role: shoal_proto::auth::Role::Host,
            nonce: self.nonce.clone(),
            epoch: self.ring.current().0,
        }
    }

    /// The `Authenticate` answering a server's `Hello` reply (which must carry a proof,
    /// checked here).
    pub fn authenticate(&self, reply: &shoal_proto::msg::Reply) -> shoal_proto::msg::Op {
        let shoal_proto::msg::Reply::Hello { server, auth: Some(proof), .. } = reply else {
            panic!("no proof in the Hello reply: {reply:?}")
        };
        let t = shoal_rpc::auth::Transcript {
            server: *server,
            role: shoal_proto::auth::Role::Host,
            connector_nonce: &self.nonce,
            server_nonce: &proof.nonce,
            epoch: proof.epoch,
        };
        let key = self.ring.get(proof.epoch).expect("the server's epoch");
        assert!(t.verify_server(key, &proof.proof), "the server proves the host key");
        shoal_proto::msg::Op::Authenticate {
            epoch: proof.epoch,
            proof: Some(t.connector_tag(key).to_vec()),
            credential: None,
        }
    }
}

/// A running identity helper (`shoal identityd`), stopped (SIGTERM, then killed) on drop.
pub struct Identityd {
    child: Child,
    pub socket: PathBuf,
}

impl Cluster {
    /// Start the identity helper of this cluster (at the map's `identity_socket`), for
    /// tests whose clients run as unprivileged users; waits until it answers.
    pub fn start_identityd(&self) -> Identityd {
        self.start_identityd_limited(None)
    }

    /// [`Cluster::start_identityd`] with at most `descriptors` open files (soft and hard
    /// limit), for floods bounded in count.
    pub fn start_identityd_limited(&self, descriptors: Option<u64>) -> Identityd {
        use std::os::unix::process::CommandExt;
        let map = ClusterMap::load(&self.config).unwrap();
        let socket = map.security.identity_socket.clone();
        let log = std::fs::File::create(self.dir.path().join("identityd.log")).unwrap();
        let mut cmd = Command::new(shoal_bin());
        cmd.env_remove("SHOAL_CONFIG")
            .arg("--config")
            .arg(&self.config)
            .arg("identityd")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if let Some(n) = descriptors {
            // SAFETY: setrlimit(2) only, between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit { rlim_cur: n, rlim_max: n };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().expect("start shoal identityd");
        let mut d = Identityd { child, socket };
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&d.socket).is_err() {
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!("shoal identityd exited ({status}): {}", self.identityd_log());
            }
            assert!(start.elapsed() < Duration::from_secs(20), "identityd not ready: {}", self.identityd_log());
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    pub fn identityd_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("identityd.log")).unwrap_or_default()
    }
}

impl Drop for Identityd {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of a child this harness started and has not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while matches!(self.child.try_wait(), Ok(None)) {
            if start.elapsed() > Duration::from_secs(5) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The running test's package folder (`crates/cli`) as cargo or cargo-nextest sets
/// `CARGO_MANIFEST_DIR` when it runs the test, not as it was when the test was built:
/// checkouts that share one target directory (CI's fresh clones) may run a test binary built
/// from another checkout, whose folder may be gone or hold other files.
pub fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../cli"))
}

/// The workspace's root folder (holding `scripts/`, `docs/`, `Cargo.toml`).
pub fn workspace_root() -> std::path::PathBuf {
    manifest_dir().join("../..")
}

/// Build the C library package `package` (the tests' own package does not depend on it)
/// in the tests' own profile and return `<target>/<profile>`, checking that each of
/// `outputs` was made there (release under `cargo test --release`, as CI runs them; dev
/// otherwise, so that a developer's `cargo test` needs no second build of everything).
///
/// Cargo and the package folder are taken from the environment cargo gives the running
/// test, for the reason given at [`manifest_dir`].
pub fn build_c_library(package: &str, outputs: &[&str]) -> std::path::PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let mut cmd = std::process::Command::new(&cargo);
    // Not the variables cargo (or cargo-nextest) sets for the running test: some build
    // scripts (ring's) declare `rerun-if-env-changed` on CARGO_MANIFEST_DIR, CARGO_PKG_NAME
    // and the like, so this build would see them changed from the workspace build's (where
    // they are unset), rerun those scripts and rebuild ring and everything above it, in
    // place, for the next workspace build to rebuild back (two minutes per test here).
    for (name, _) in std::env::vars_os() {
        let n = name.to_string_lossy();
        let set_for_the_test = n == "OUT_DIR"
            || n.starts_with("NEXTEST")
            || ["CARGO_MANIFEST_", "CARGO_PKG_", "CARGO_CRATE_", "CARGO_BIN_", "CARGO_PRIMARY_", "CARGO_TARGET_TMPDIR"]
                .iter()
                .any(|p| n.starts_with(p));
        if set_for_the_test {
            cmd.env_remove(&name);
        }
    }
    let out = cmd
        .args(["build", "-p", package])
        .args(if cfg!(debug_assertions) { &[][..] } else { &["--release"][..] })
        .current_dir(manifest_dir())
        .output()
        .unwrap_or_else(|e| {
            panic!("run {} build -p {package} in {}: {e}", cargo.to_string_lossy(), manifest_dir().display())
        });
    assert!(out.status.success(), "building {package} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    // The test binary is <target>/<profile>/deps/<test>-<hash>: the libraries are in
    // <target>/<profile>.
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe.parent().and_then(std::path::Path::parent).expect("<target>/<profile>").to_path_buf();
    for f in outputs {
        assert!(dir.join(f).exists(), "{} was not made", dir.join(f).display());
    }
    dir
}

/// Files in `/d` on every slot: single-object files spread by placement, and striped ones
/// (every fourth), of 1000 B, 70 kB and 1 MiB in turn: path and bytes of each.
pub async fn write_files(client: &Client, n: u64) -> Vec<(String, Vec<u8>)> {
    let all = shoal_proto::msg::LayoutSpec {
        stripe_size: Some(64 << 10),
        stripe_count: Some(u32::MAX),
        ..Default::default()
    };
    let mut want = Vec::new();
    client.mkdir("/d", 0o755).await.unwrap();
    for i in 0..n {
        let path = format!("/d/f{i}");
        let data = pattern(i, 0, [1000, 70_000, 1 << 20][i as usize % 3]);
        let f = client.create(&path, 0o644, (i % 4 == 0).then(|| all.clone())).await.unwrap();
        f.write_at(0, &data).await.unwrap();
        f.close().await.unwrap();
        want.push((path, data));
    }
    want
}

/// Every file of `want` reads back as written.
pub async fn check_files(client: &Client, want: &[(String, Vec<u8>)]) {
    for (path, data) in want {
        let f = client.open(path, shoal_client::OpenFlags::read_only()).await.unwrap_or_else(|e| panic!("{path}: {e}"));
        let got = f.read_at(0, data.len() + 1).await.unwrap();
        assert!(got[..] == data[..], "{path}: other bytes than written");
    }
}

/// Wait (at most 60 s) until every server answers and none holds an intent: the operations
/// that a crash interrupted have been finished or undone by recovery.
pub async fn wait_no_intents(fs: &Client) {
    for _ in 0..600 {
        let mut pending = 0;
        let mut all_up = true;
        for (_, st) in fs.status_all().await {
            match st {
                Ok(st) => pending += st.pending_intents,
                Err(_) => all_up = false,
            }
        }
        if all_up && pending == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("intents still pending 60 s after recovery started");
}

/// A `shoal` command that runs as user `uid` (primary group `gid`, supplementary `groups`),
/// for tests of what an unprivileged user may do. The binary is a copy in `dir` (made once):
/// the build folder may sit under a home only root can enter (~/.cache). The command gets
/// no `SHOAL_CONFIG` and no stdin; the caller adds `--config` and the arguments.
pub fn shoal_as_user(dir: &Path, uid: u32, gid: u32, groups: Vec<u32>) -> Command {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let copy = dir.join("shoal-as-user");
    if !copy.exists() {
        std::fs::copy(shoal_bin(), &copy).expect("copy the shoal binary");
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut cmd = Command::new(&copy);
    cmd.env_remove("SHOAL_CONFIG").stdin(Stdio::null()).current_dir("/");
    let groups: Vec<libc::gid_t> = groups;
    // SAFETY: only async-signal-safe calls between fork and exec. The groups are set here,
    // before dropping root, because `Command::uid` would clear them.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0 || libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// Whether the other side closed `c`: a read gives end of file or an error, not "would
/// block" (replies still queued, a refusal say, are read past).
pub fn closed_by_peer(c: &mut TcpStream) -> bool {
    use std::io::Read;
    c.set_nonblocking(true).unwrap();
    let mut b = [0u8; 512];
    let closed = loop {
        match c.read(&mut b) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    c.set_nonblocking(false).unwrap();
    closed
}

/// Wait up to `within` for the other side to close every connection of `conns`; the ones
/// still open then (none, if all went).
pub fn wait_closed_by_peer(mut conns: Vec<TcpStream>, within: Duration) -> Vec<TcpStream> {
    let deadline = Instant::now() + within;
    while !conns.is_empty() && Instant::now() < deadline {
        conns.retain_mut(|c| !closed_by_peer(c));
        std::thread::sleep(Duration::from_millis(200));
    }
    conns
}
