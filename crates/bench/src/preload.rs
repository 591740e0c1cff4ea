//! Where the workspace's libraries are: the interception library for the `preload` target
//! (`crates/preload`, docs/preload.md: its workers run with `LD_PRELOAD` of it), and the
//! loader's audit library for `bench load` (`crates/audit`).

use anyhow::{bail, Result};
use std::path::PathBuf;

/// `$SHOAL_PRELOAD_LIB`, else `libshoal_preload.so` beside this program (see
/// [`built_library`]).
pub fn library() -> Result<PathBuf> {
    built_library("libshoal_preload.so", "SHOAL_PRELOAD_LIB")
}

/// Library `file` of this workspace: `$env` if set, else beside this program, in its
/// `deps/` (where cargo leaves a library it builds as a dependency of `shoal`) or in
/// `../lib`: the most recently built of those that exist.
pub fn built_library(file: &str, env: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("{env}={} is not a file", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let candidates = [dir.join(file), dir.join("deps").join(file), dir.join("../lib").join(file)];
    let newest = candidates
        .iter()
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok().map(|t| (t, p.clone())))
        .max();
    match newest {
        Some((_, p)) => Ok(p),
        None => bail!(
            "{file} is neither beside {} nor in its deps/ or ../lib (build it with cargo build --release --workspace, or set {env})",
            exe.display()
        ),
    }
}
