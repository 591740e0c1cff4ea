//! `Client.find` and `AsyncClient.find` (docs/find.md, docs/python.md): the keyword
//! arguments, in find(1)'s notation, made into a query.

use crate::errors::value;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use shoal_client::{parse_kind, AgeTest, PermTest, SizeTest, TimeField};
use shoal_client::{FindOptions, FindQuery};

/// The keyword arguments `find` takes (an unknown one is a TypeError).
const KEYWORDS: &[&str] = &[
    "name",
    "iname",
    "type",
    "size",
    "mtime",
    "mmin",
    "atime",
    "amin",
    "ctime",
    "cmin",
    "uid",
    "gid",
    "perm",
    "stripe_count",
    "stripe_size",
    "xattr",
    "xattr_value",
    "read_mostly",
    "mindepth",
    "maxdepth",
];

/// The query and options of `find(path, **tests)`.
pub(crate) fn query_of(tests: Option<&Bound<'_, PyDict>>) -> PyResult<(FindQuery, FindOptions)> {
    let mut q = FindQuery::default();
    let mut opts = FindOptions::default();
    let Some(tests) = tests else { return Ok((q, opts)) };
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let bad = |key: &str, e: String| value(format!("find: {key}={e}"));
    for (k, v) in tests.iter() {
        let key: String = k.extract()?;
        if v.is_none() {
            continue;
        }
        let text = || v.extract::<String>().map_err(|_| bad(&key, "must be a string in find's notation".into()));
        match key.as_str() {
            "name" | "iname" => {
                if q.name.is_some() {
                    return Err(value("find: name and iname exclude one another"));
                }
                q.name = Some(text()?);
                q.ignore_case = key == "iname";
            }
            "type" => q.kind = Some(parse_kind(&text()?).map_err(|e| bad(&key, e))?),
            "size" => q.size = Some(SizeTest::parse(&text()?).map_err(|e| bad(&key, e))?),
            "mtime" | "mmin" | "atime" | "amin" | "ctime" | "cmin" => {
                let field = match &key[..1] {
                    "m" => TimeField::Modify,
                    "a" => TimeField::Access,
                    _ => TimeField::Change,
                };
                let period = if key.ends_with("min") { 60 } else { 86_400 };
                q.ages.push(AgeTest::parse(&text()?, field, period, now).map_err(|e| bad(&key, e))?);
            }
            "uid" => q.uid = Some(v.extract()?),
            "gid" => q.gid = Some(v.extract()?),
            "perm" => {
                q.perm = Some(match v.extract::<u32>() {
                    Ok(m) if m <= 0o7777 => PermTest::Exact(m),
                    Ok(m) => return Err(bad(&key, format!("{m:o} is not a mode (at most 0o7777)"))),
                    Err(_) => PermTest::parse(&text()?).map_err(|e| bad(&key, e))?,
                })
            }
            "stripe_count" => q.stripe_count = Some(v.extract()?),
            "stripe_size" => q.stripe_size = Some(v.extract()?),
            "xattr" => q.xattr = Some(text()?),
            "xattr_value" => {
                q.xattr_value = Some(match v.cast::<PyBytes>() {
                    Ok(b) => b.as_bytes().to_vec(),
                    Err(_) => text()?.into_bytes(),
                })
            }
            "read_mostly" => q.read_mostly = Some(v.extract()?),
            "mindepth" => opts.min_depth = v.extract()?,
            "maxdepth" => opts.max_depth = Some(v.extract()?),
            other => {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "find() got an unexpected keyword argument {other:?} (it takes {})",
                    KEYWORDS.join(", ")
                )))
            }
        }
    }
    if q.xattr_value.is_some() && q.xattr.is_none() {
        return Err(value("find: xattr_value needs xattr (the attribute's name)"));
    }
    q.pattern().map_err(|e| value(format!("find: {e}")))?;
    Ok((q, opts))
}
