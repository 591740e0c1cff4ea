//! `Client.du` and `AsyncClient.du` (docs/du.md, docs/python.md): the report as a dict,
//! `{"dirs": [...], "unreadable": [...]}`.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use shoal_client::DuReport;

/// A `DuReport` handed to Python: `dirs`, one dict per directory (`path`, `ino`, `depth`,
/// `files`, `dirs`, `bytes`, `inodes`), each before its parent, the path asked about last;
/// `unreadable`, the sorted inode numbers of the directories the caller may not read.
pub(crate) struct DuOut(pub DuReport);

impl<'py> IntoPyObject<'py> for DuOut {
    type Target = PyDict;
    type Output = Bound<'py, PyDict>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        let dirs = PyList::empty(py);
        for u in &self.0.dirs {
            let d = PyDict::new(py);
            d.set_item("path", &u.path)?;
            d.set_item("ino", u.ino.0)?;
            d.set_item("depth", u.depth)?;
            d.set_item("files", u.files)?;
            d.set_item("dirs", u.dirs)?;
            d.set_item("bytes", u.bytes)?;
            d.set_item("inodes", u.inodes())?;
            dirs.append(d)?;
        }
        let out = PyDict::new(py);
        out.set_item("dirs", dirs)?;
        out.set_item("unreadable", self.0.unreadable.iter().map(|i| i.0).collect::<Vec<_>>())?;
        Ok(out)
    }
}
