//! Pure functions on Shoal path names: scheme stripping, splitting, lexical normalisation.
//!
//! A Shoal path is absolute from the root of the file system: `/a/b`. The forms
//! `shoal://a/b` and `shoal:///a/b` mean the same, and a path without a leading `/` is
//! also taken from the root. `""` and `"/"` are the root. Empty components (`//`) are
//! ignored. The client resolves `.` and `..` while walking (so `..` after a followed
//! symlink goes to the parent of the link's target, as POSIX says); [`normalize`] is the
//! lexical version used where only a name is needed (`mkdir_all`, messages).

use shoal_proto::msg::{NAME_MAX, PATH_MAX};
use shoal_proto::Errno;

/// The URL-like prefix accepted in front of paths.
pub const SCHEME: &str = "shoal://";

/// Remove a leading `shoal://` (so `shoal://a/b` → `a/b`, `shoal:///a/b` → `/a/b`).
pub fn strip_scheme(path: &str) -> &str {
    path.strip_prefix(SCHEME).unwrap_or(path)
}

/// The components of `path` in order, without empty ones; `.` and `..` are kept.
/// Fails with ENAMETOOLONG for a path longer than PATH_MAX or a component longer than
/// NAME_MAX, and EINVAL for a NUL byte.
pub fn components(path: &str) -> Result<Vec<&str>, Errno> {
    let p = strip_scheme(path);
    if p.len() > PATH_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if p.contains('\0') {
        return Err(Errno::EINVAL);
    }
    let comps: Vec<&str> = p.split('/').filter(|c| !c.is_empty()).collect();
    if comps.iter().any(|c| c.len() > NAME_MAX) {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(comps)
}

/// Whether `path` names a directory explicitly by ending in `/` (and is not the root).
pub fn has_trailing_slash(path: &str) -> bool {
    let p = strip_scheme(path);
    p.ends_with('/') && p.split('/').any(|c| !c.is_empty())
}

/// Split `path` into the components of its parent and its last component. The last
/// component is `None` for the root. It may be `.` or `..`, which callers that create or
/// remove names refuse.
pub fn split_last(path: &str) -> Result<(Vec<&str>, Option<&str>), Errno> {
    let mut comps = components(path)?;
    let last = comps.pop();
    Ok((comps, last))
}

/// Lexically normalised absolute form: `shoal://a//b/./c/../d/` → `/a/b/d`. `..` at the
/// root stays at the root. (Lexical: `..` after a symlink goes to the link's directory,
/// not to the parent of its target.)
pub fn normalize(path: &str) -> Result<String, Errno> {
    let mut out: Vec<&str> = Vec::new();
    for c in components(path)? {
        match c {
            "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    Ok(format!("/{}", out.join("/")))
}

/// Parent of a normalised path (`/a/b` → `/a`, `/a` → `/`); `None` for the root.
pub fn parent(normalized: &str) -> Option<&str> {
    if normalized == "/" || normalized.is_empty() {
        return None;
    }
    let t = normalized.trim_end_matches('/');
    match t.rfind('/') {
        Some(0) => Some("/"),
        Some(i) => Some(&t[..i]),
        None => Some("/"),
    }
}

/// `dir` joined with `name` (`/` + `x` → `/x`, `/a` + `x` → `/a/x`).
pub fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_forms_are_the_same_path() {
        for p in ["/a/b", "shoal://a/b", "shoal:///a/b", "a/b", "//a//b/", "shoal://a/./b"] {
            assert_eq!(normalize(p).unwrap(), "/a/b", "{p}");
        }
        for p in ["", "/", "shoal://", "shoal:///", ".", "/..", "/a/.."] {
            assert_eq!(normalize(p).unwrap(), "/", "{p}");
        }
        assert_eq!(normalize("/a/b/../../../c/./d/..").unwrap(), "/c");
    }

    #[test]
    fn components_keep_dots_and_check_lengths() {
        assert_eq!(components("/a//./b/../c").unwrap(), vec!["a", ".", "b", "..", "c"]);
        assert_eq!(components("/").unwrap(), Vec::<&str>::new());
        let long = "x".repeat(NAME_MAX + 1);
        assert_eq!(components(&format!("/a/{long}")), Err(Errno::ENAMETOOLONG));
        assert!(components(&format!("/a/{}", "x".repeat(NAME_MAX))).is_ok());
        let deep = "/ab".repeat(PATH_MAX / 3 + 1);
        assert_eq!(components(&deep), Err(Errno::ENAMETOOLONG));
        assert_eq!(components("/a\0b"), Err(Errno::EINVAL));
    }

    #[test]
    fn split_last_and_parents() {
        assert_eq!(split_last("/a/b/c").unwrap(), (vec!["a", "b"], Some("c")));
        assert_eq!(split_last("shoal://c/").unwrap(), (vec![], Some("c")));
        assert_eq!(split_last("/").unwrap(), (vec![], None));
        assert_eq!(split_last("/a/..").unwrap(), (vec!["a"], Some("..")));
        assert_eq!(parent("/a/b"), Some("/a"));
        assert_eq!(parent("/a"), Some("/"));
        assert_eq!(parent("/"), None);
        assert_eq!(join("/", "x"), "/x");
        assert_eq!(join("/a", "x"), "/a/x");
        assert!(has_trailing_slash("/a/"));
        assert!(!has_trailing_slash("/a"));
        assert!(!has_trailing_slash("/"));
        assert!(!has_trailing_slash("shoal://"));
    }
}
