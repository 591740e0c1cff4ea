//! Files' metadata as tuples (docs/tuples.md, "Files as tuples"): PXFS keeps the metadata of
//! storage objects in its meta-space, matched by the same templates as any tuple. Shoal
//! answers a template on files from the servers' metadata, through a query (`find.rs`):
//! every file under a directory is the tuple
//!
//! `("file", path, type, size, uid, gid, mode, mtime)`
//!
//! with `type` `"f"`, `"d"` or `"l"`, `mode` the permission bits and `mtime` in seconds
//! since the epoch. The template's exact fields become the query's tests (the servers look
//! only for those), and every answer is checked against the whole template.

use crate::client::Client;
use crate::error::{Error, Result};
use crate::find::FindOptions;
use shoal_proto::find::{Cmp, FindQuery, PermTest, SizeTest};
use shoal_proto::msg::{Attr, FileKind};
use shoal_proto::tuple::{Field, Template, Tuple, Value};
use shoal_proto::Errno;

/// The first field of a file's tuple.
pub const FILE_TUPLE: &str = "file";
/// Fields of a file's tuple.
pub const FILE_FIELDS: usize = 8;

/// The tuple of the file at `path` with attributes `a`.
pub fn file_tuple(path: &str, a: &Attr) -> Tuple {
    let kind = match a.kind {
        FileKind::File => "f",
        FileKind::Dir => "d",
        FileKind::Symlink => "l",
    };
    Tuple(vec![
        Value::Str(FILE_TUPLE.into()),
        Value::Str(path.into()),
        Value::Str(kind.into()),
        Value::Int(a.size as i64),
        Value::Int(a.uid as i64),
        Value::Int(a.gid as i64),
        Value::Int(a.perm as i64),
        Value::Int(a.mtime.secs),
    ])
}

impl Client {
    /// The tuples of the files at or under directory `root` that match `template` (see the
    /// module documentation), by path. A template naming a path exactly looks at that file
    /// only (it need not be under `root`).
    pub async fn file_tuples(&self, root: &str, template: &Template) -> Result<Vec<Tuple>> {
        let shape = format!("(\"{FILE_TUPLE}\", path, type, size, uid, gid, mode, mtime)");
        if template.0.len() != FILE_FIELDS || template.0[0] != Field::Is(Value::Str(FILE_TUPLE.into())) {
            return Err(Error::new(Errno::EINVAL, format!("a template on files has the shape {shape}")));
        }
        if let Field::Is(Value::Str(path)) = &template.0[1] {
            let a = match self.lstat(path).await {
                Ok(a) => a,
                Err(e) if e.errno == Errno::ENOENT => return Ok(Vec::new()),
                Err(e) => return Err(e),
            };
            return Ok(Some(file_tuple(path, &a)).filter(|t| template.matches(t)).into_iter().collect());
        }
        let query = query_of(template).map_err(|e| Error::new(Errno::EINVAL, format!("{e}: {shape}")))?;
        let (found, _) = self.find(root, &query, FindOptions::default()).await?;
        Ok(found.iter().map(|f| file_tuple(&f.path, &f.attr)).filter(|t| template.matches(t)).collect())
    }
}

/// The query's tests from the template's exact fields (a field of the wrong type matches
/// nothing: an error, since no file could match it).
fn query_of(t: &Template) -> std::result::Result<FindQuery, String> {
    let mut q = FindQuery::default();
    let int = |i: usize, name: &str| match &t.0[i] {
        Field::Is(Value::Int(n)) if *n >= 0 => Ok(Some(*n as u64)),
        Field::Is(v) => Err(format!("{name} must be a number, not {v:?}")),
        _ => Ok(None),
    };
    match &t.0[2] {
        Field::Is(Value::Str(k)) => q.kind = Some(shoal_proto::find::parse_kind(k)?),
        Field::Is(v) => return Err(format!("type must be \"f\", \"d\" or \"l\", not {v:?}")),
        _ => {}
    }
    q.size = int(3, "size")?.map(|n| SizeTest { cmp: Cmp::Equal, n, unit: 1 });
    q.uid = int(4, "uid")?.map(|n| n as u32);
    q.gid = int(5, "gid")?.map(|n| n as u32);
    q.perm = int(6, "mode")?.map(|n| PermTest::Exact(n as u32));
    int(7, "mtime")?;
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(fields: &[&str]) -> Template {
        Template(fields.iter().map(|f| Field::parse(f)).collect())
    }

    #[test]
    fn exact_fields_become_tests() {
        let q = query_of(&template(&["file", "?", "f", "?", "1000", "?", "420", "?"])).unwrap();
        assert_eq!(q.kind, Some(FileKind::File));
        assert_eq!(q.uid, Some(1000));
        assert_eq!(q.perm, Some(PermTest::Exact(0o644)));
        assert_eq!(q.size, None);
        assert!(query_of(&template(&["file", "?", "x", "?", "?", "?", "?", "?"])).is_err());
        assert!(query_of(&template(&["file", "?", "?", "s:big", "?", "?", "?", "?"])).is_err());
    }
}
