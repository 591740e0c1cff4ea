//! Messages on the process's stderr, written with the C library's `write` (one call per
//! line, so lines of several threads do not mix).

fn emit(msg: &str) {
    let line = format!("shoal-preload[{}]: {msg}\n", std::process::id());
    // SAFETY: writes a valid buffer to descriptor 2; a failure is ignored (nowhere to say it).
    unsafe {
        crate::real::write(2, line.as_ptr().cast(), line.len());
    }
}

/// A message shown only with `SHOAL_PRELOAD_DEBUG=1`: why a call went to the kernel,
/// what a server answered.
pub fn say(msg: &str) {
    if crate::settings::get().debug {
        emit(msg);
    }
}

/// A message always shown: a setting that cannot be used, a cluster that cannot be reached.
pub fn warn(msg: &str) {
    emit(msg);
}
