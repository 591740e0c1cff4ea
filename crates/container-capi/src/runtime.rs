//! The runtime the handles share, how a C call waits for the container's futures, and
//! where a container's name points (Shoal or POSIX).
//!
//! **One runtime per process** (two worker threads, started by the first call that needs
//! it, never shut down): the container library shares each physical file among all the
//! handles of a process (`store::Opened`), so a file opened through one handle may be used
//! through another. With a runtime per handle, closing the first handle would stop the
//! connection tasks the second one's file still uses. Clients of Shoal are shared the same
//! way, one per configuration file.

use crate::error::{fail, fail_with};
use container::Target;
use parking_lot::Mutex;
use shoal_client::{Client, ClientOptions};
use std::cell::Cell;
use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{LazyLock, OnceLock};
use tokio::runtime::Runtime;

static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

/// The process's runtime; `None` (EAGAIN set) if it cannot be started.
fn runtime() -> Option<&'static Runtime> {
    let rt = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shoal-container")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    });
    match rt {
        Ok(rt) => Some(rt),
        Err(e) => {
            fail(libc::EAGAIN, format_args!("cannot start libshoal_container's runtime: {e}"));
            None
        }
    }
}

thread_local! {
    /// Whether this thread is inside `block`: the only place communication callbacks may
    /// be called from (`comm.rs` checks it).
    static IN_CALL: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is running a call of the C API (inside `block`).
pub(crate) fn in_call() -> bool {
    IN_CALL.with(Cell::get)
}

/// Marks the thread as inside `block` until dropped (also when a panic unwinds).
struct InCall(bool);

impl InCall {
    fn enter() -> InCall {
        InCall(IN_CALL.with(|c| c.replace(true)))
    }
}

impl Drop for InCall {
    fn drop(&mut self) {
        IN_CALL.with(|c| c.set(self.0));
    }
}

/// Run `fut` to its end **on the calling thread**; `None` (errno and message set) if it
/// failed.
///
/// `Runtime::block_on` polls the future on the thread that calls it, not on a worker: the
/// container's collective operations, and so the application's blocking communication
/// callbacks (an `MPI_Gatherv`, say), run on the application's own thread, as MPI wants
/// (MPI_THREAD_SINGLE or FUNNELED suffice), while the two worker threads keep driving the
/// connections. A callback blocking inside the future therefore stalls nothing but this
/// call. Called from a runtime thread (a callback calling back into the library), waiting
/// could deadlock: EDEADLK instead.
pub(crate) fn block<T>(fut: impl Future<Output = container::Result<T>>) -> Option<T> {
    if tokio::runtime::Handle::try_current().is_ok() {
        fail(
            libc::EDEADLK,
            "a blocking call of libshoal_container from inside one of its calls (a communication callback?)",
        );
        return None;
    }
    let rt = runtime()?;
    let _inside = InCall::enter();
    match rt.block_on(fut) {
        Ok(v) => Some(v),
        Err(e) => {
            fail_with(&e);
            None
        }
    }
}

/// Shoal clients of this process, one per configuration file.
static CLIENTS: LazyLock<Mutex<HashMap<PathBuf, Client>>> = LazyLock::new(Default::default);

/// The client of the cluster described by `config`.
fn client(config: PathBuf) -> Option<Client> {
    let rt = runtime()?;
    let mut clients = CLIENTS.lock();
    if let Some(c) = clients.get(&config) {
        return Some(c.clone());
    }
    // Connection tasks are spawned on the runtime the client is made in.
    let made = {
        let _inside = rt.enter();
        Client::from_config(&config, ClientOptions::default())
    };
    match made {
        Ok(c) => {
            clients.insert(config, c.clone());
            Some(c)
        }
        Err(e) => {
            fail(e.errno.0, format_args!("{}: {e}", config.display()));
            None
        }
    }
}

/// Where the container `name` lives, and its path there: `shoal://dir/c` is the Shoal path
/// `/dir/c`; any other name is on Shoal when a configuration file is given, else a host
/// path (POSIX). A `shoal://` name without `config` takes `$SHOAL_CONFIG`. `None` (errno
/// set) if no cluster can be reached.
pub(crate) fn target(name: &str, config: Option<&str>) -> Option<(Target, String)> {
    let shoal = name.strip_prefix("shoal://").map(|rest| format!("/{}", rest.trim_start_matches('/')));
    let (path, config) = match (shoal, config) {
        (None, None) => return Some((Target::Posix, name.to_string())),
        (Some(path), Some(c)) => (path, PathBuf::from(c)),
        (None, Some(c)) => {
            (if name.starts_with('/') { name.to_string() } else { format!("/{name}") }, PathBuf::from(c))
        }
        (Some(path), None) => match std::env::var_os("SHOAL_CONFIG") {
            Some(c) => (path, PathBuf::from(c)),
            None => {
                fail(libc::EINVAL, format_args!("{name}: no configuration file given and $SHOAL_CONFIG is not set"));
                return None;
            }
        },
    };
    if path == "/" {
        fail(libc::EINVAL, format_args!("{name}: a container needs a file name, not the root"));
        return None;
    }
    Some((Target::Shoal(client(config)?), path))
}
