//! The change log from Python (docs/changes.md, docs/python.md): `ChangeWatch`, a stream of
//! events under a directory, read with `next`/`next_async` or iterated (`for`, `async for`).
//! An event is a dict: server, seq, event, path, to_path, ino, type, xattr, uid, at.

use crate::errors::{value, OrRaise};
use crate::{awaitable, block};
use pyo3::prelude::*;
use shoal_client::{Change, ChangeStart, ChangeWatchOptions, FileKind};
use std::sync::Arc;

/// The options of `Client.watch` (`events`: names as `shoal watch --events`).
pub(crate) fn options_of(
    events: &str,
    pattern: Option<String>,
    recursive: bool,
    consumer: Option<String>,
    oldest: bool,
) -> PyResult<ChangeWatchOptions> {
    let kinds = shoal_client::parse_kinds(events).map_err(value)?;
    let start = match (consumer, oldest) {
        (Some(_), true) => return Err(value("a consumer starts where it stopped: not with oldest=True")),
        (Some(c), false) => ChangeStart::Consumer(c),
        (None, true) => ChangeStart::Oldest,
        (None, false) => ChangeStart::Now,
    };
    Ok(ChangeWatchOptions { kinds, recursive, pattern, start })
}

/// An event handed to Python, as a dict.
pub(crate) struct ChangeOut(pub Change);

impl<'py> IntoPyObject<'py> for ChangeOut {
    type Target = pyo3::types::PyDict;
    type Output = Bound<'py, pyo3::types::PyDict>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        let c = self.0;
        let d = pyo3::types::PyDict::new(py);
        d.set_item("server", c.server.0)?;
        d.set_item("seq", c.seq)?;
        d.set_item("event", c.kind.name())?;
        d.set_item("path", c.path)?;
        d.set_item("to_path", c.to_path)?;
        d.set_item("ino", c.ino.0)?;
        let kind = match c.file_kind {
            FileKind::File => "f",
            FileKind::Dir => "d",
            FileKind::Symlink => "l",
        };
        d.set_item("type", kind)?;
        d.set_item("xattr", c.xattr)?;
        d.set_item("uid", c.uid)?;
        d.set_item("at", c.at.secs as f64 + c.at.nsecs as f64 / 1e9)?;
        Ok(d)
    }
}

/// A running watch of the change log under a directory: `next(timeout)` (blocking) or
/// `next_async(timeout)` (awaitable) give the next event as a dict, or None when none came
/// in time; iterating it (`for e in w`, `async for e in w`) waits for each event. With a
/// consumer name, `ack()` keeps on the servers that every event handed out is handled.
#[pyclass(module = "shoal")]
pub struct ChangeWatch {
    inner: Arc<tokio::sync::Mutex<shoal_client::ChangeWatch>>,
}

impl ChangeWatch {
    pub(crate) fn new(w: shoal_client::ChangeWatch) -> ChangeWatch {
        ChangeWatch { inner: Arc::new(tokio::sync::Mutex::new(w)) }
    }
}

#[pymethods]
impl ChangeWatch {
    /// The next event, waiting up to `timeout` seconds (None: until there is one).
    #[pyo3(signature = (timeout = None))]
    fn next<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let (w, wait) = (self.inner.clone(), crate::tuples::wait_of(timeout)?);
        block(py, async move { Ok(w.lock().await.next(wait).await.or_raise()?.map(ChangeOut)) })
    }

    /// As `next`, awaitable.
    #[pyo3(signature = (timeout = None))]
    fn next_async<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let (w, wait) = (self.inner.clone(), crate::tuples::wait_of(timeout)?);
        awaitable(py, async move { Ok(w.lock().await.next(wait).await.or_raise()?.map(ChangeOut)) })
    }

    /// Keep, on every server, that every event handed out so far is handled (a watch with
    /// a consumer name only): a watch started again with that name goes on after them.
    fn ack<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let w = self.inner.clone();
        block(py, async move { w.lock().await.ack().await.or_raise() })
    }

    /// As `ack`, awaitable.
    fn ack_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let w = self.inner.clone();
        awaitable(py, async move { w.lock().await.ack().await.or_raise() })
    }

    /// Events the servers dropped before this watch read them.
    #[getter]
    fn lost(&self) -> PyResult<u64> {
        Ok(self.inner.try_lock().map_err(|_| value("the watch is waiting in another call"))?.lost())
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.next(py, None)
    }

    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __anext__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.next_async(py, None)
    }
}
