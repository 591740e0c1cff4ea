//! Where the interception library is, for the `preload` target (`crates/preload`,
//! docs/preload.md): its workers run with `LD_PRELOAD` of it.

use anyhow::{bail, Result};
use std::path::PathBuf;

/// `$SHOAL_PRELOAD_LIB`, else `libshoal_preload.so` beside this program, in its `deps/`
/// (where cargo leaves the library when it builds it as a dependency of `shoal`) or in
/// `../lib`: the most recently built of those that exist.
pub fn library() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("SHOAL_PRELOAD_LIB").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("SHOAL_PRELOAD_LIB={} is not a file", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    let candidates =
        [dir.join("libshoal_preload.so"), dir.join("deps/libshoal_preload.so"), dir.join("../lib/libshoal_preload.so")];
    let newest = candidates
        .iter()
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok().map(|t| (t, p.clone())))
        .max();
    match newest {
        Some((_, p)) => Ok(p),
        None => bail!(
            "libshoal_preload.so is neither beside {} nor in its deps/ or ../lib (build it with cargo build --release --workspace, or set SHOAL_PRELOAD_LIB)",
            exe.display()
        ),
    }
}
