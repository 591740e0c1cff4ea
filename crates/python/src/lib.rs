//! Shoal's native client for Python: the extension module `shoal._native`.
//!
//! The Python package `shoal` (python/shoal) builds on it: `shoal.Client` adds file objects
//! like Python's own to the blocking client here, `shoal.AsyncClient` is the asyncio client,
//! and `shoal.filesystem` is the fsspec file system for `shoal://` (docs/python.md).
//!
//! Every call exists twice, written once (see `client.rs`, `file.rs`): the blocking twin
//! releases the GIL and waits on the runtime; the asyncio twin returns an awaitable that
//! the runtime completes on the caller's event loop. One Tokio runtime per process drives
//! both, and every client made in the process.

mod changes;
mod checkpoint;
mod client;
mod du;
mod errors;
mod file;
mod find;
mod tuples;
mod types;

use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;
use std::future::Future;

/// The runtime every client of this process runs on (pyo3-async-runtimes' own, so that
/// awaitables and blocking calls share it): two worker threads, named `shoal-runtime`.
fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

/// Run `fut` to its end with the GIL released, and hand its value to Python.
fn block<'py, T>(py: Python<'py>, fut: impl Future<Output = PyResult<T>> + Send) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send,
{
    let v = py.detach(|| runtime().block_on(fut))?;
    v.into_bound_py_any(py)
}

/// An awaitable for `fut`, completed on the running asyncio loop when the runtime finishes it.
fn awaitable<'py, T>(
    py: Python<'py>,
    fut: impl Future<Output = PyResult<T>> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    pyo3_async_runtimes::tokio::future_into_py(py, fut)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(2).thread_name("shoal-runtime").enable_all();
    pyo3_async_runtimes::tokio::init(builder);
    m.add_class::<client::Client>()?;
    m.add_class::<client::AsyncClient>()?;
    m.add_class::<file::File>()?;
    m.add_class::<file::AsyncFile>()?;
    m.add_class::<types::Stat>()?;
    m.add_class::<types::DirEntry>()?;
    m.add_class::<types::StatFs>()?;
    m.add_class::<types::Layout>()?;
    m.add_class::<tuples::TupleWatch>()?;
    m.add_class::<changes::ChangeWatch>()?;
    m.add_class::<checkpoint::MicroCheckpoint>()?;
    m.add_class::<checkpoint::AsyncMicroCheckpoint>()?;
    Ok(())
}
