//! Failpoints on the steps of operations that span servers (the `fail` crate, compiled in
//! always).
//!
//! `shoald --failpoints SPEC` (or the `FAILPOINTS` environment variable) configures them at
//! start-up: `SPEC` is `name=action[;name=action…]` with the `fail` crate's actions
//! (`panic`, `sleep(ms)`, `pause`, `print`, `off`, `N%`, `N*`, …) plus one of ours,
//! **`return(crash)`** (or plain `return`): the process kills itself with SIGKILL at that
//! point, exactly as `kill -9` would — no destructor, no log flush beyond what the kernel
//! already holds. Crash tests (crates/cli/tests/faults/step_crashes.rs) use it to stop a server
//! at every step of every operation and check what recovery makes of it.
//!
//! Names are `<operation>.<step>.<before|after>` (see [`point`]): `before` runs with the
//! intent durable and the step not sent, `after` with the step applied on the peer and
//! not yet acted on here. The finishing batch is step `finish`. The engine places them
//! (`engine::remote`, `engine::finish`), so an operation built on it — a directory split
//! included (`split.in`, `split.register`, `split.finish`) — has them without code of its
//! own. One sits on a receiving side: `split_in.commit.after`, on the server taking a new
//! partition, once it is stored and before the coordinator hears of it.
//!
//! With no failpoint configured a point costs one relaxed atomic load.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set once any failpoint is configured; until then [`point`] does nothing else.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Configure failpoints from `spec` (`name=action;…`). An error names the bad entry.
pub fn configure(spec: &str) -> Result<(), String> {
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, actions) = entry.split_once('=').ok_or_else(|| format!("failpoint {entry:?} is not name=action"))?;
        fail::cfg(name.trim(), actions.trim()).map_err(|e| format!("failpoint {entry:?}: {e}"))?;
        ENABLED.store(true, Ordering::Relaxed);
    }
    Ok(())
}

/// Where a failpoint sits relative to its step.
#[derive(Clone, Copy, Debug)]
pub enum At {
    Before,
    After,
}

/// Evaluate failpoint `<op>.<step>.<before|after>`.
pub fn point(op: &str, step: &str, at: At) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let name = format!("{op}.{step}.{}", if matches!(at, At::Before) { "before" } else { "after" });
    fail::eval(&name, |arg| {
        if arg.as_deref().unwrap_or("crash") == "crash" {
            crash(&name)
        }
    });
}

/// Die as `kill -9` would.
fn crash(name: &str) -> ! {
    eprintln!("failpoint {name}: crashing (SIGKILL)");
    // SAFETY: kill(2) and getpid(2) have no memory-safety preconditions.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    // SIGKILL cannot be caught; this is not reached.
    std::process::abort()
}
