//! Open files: `File` (blocking; `shoal.Client.open` wraps it in Python's own file objects)
//! and `AsyncFile` (asyncio). Positional calls only: the position of a file object is kept
//! by the Python layer, so one handle serves many readers at different offsets.

use crate::errors::{value, OrRaise};
use crate::types::{Data, Stat};
use crate::{awaitable, block};
use bytes::Bytes;
use parking_lot::Mutex;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyMemoryView;
use std::sync::Arc;

/// The open handle shared by a `File` or `AsyncFile` and its calls in flight.
#[derive(Clone)]
pub(crate) struct Handle {
    file: Arc<Mutex<Option<shoal_client::File>>>,
    path: String,
}

impl Handle {
    pub(crate) fn new(file: shoal_client::File, path: String) -> Handle {
        Handle { file: Arc::new(Mutex::new(Some(file))), path }
    }

    /// The client's handle; `ValueError` once closed (as Python's own files).
    fn get(&self) -> PyResult<shoal_client::File> {
        self.file.lock().clone().ok_or_else(|| value(format!("I/O operation on closed file {}", self.path)))
    }

    /// Close: waits for writes in flight and makes written data durable (`File::close`).
    /// Closing twice is allowed and does nothing.
    async fn close(self) -> PyResult<()> {
        let f = self.file.lock().take();
        match f {
            Some(f) => f.close().await.or_raise(),
            None => Ok(()),
        }
    }
}

/// The bytes of `obj`'s buffer whatever its item type (a numpy array of float64 is 8 bytes
/// an item): a memoryview of it cast to unsigned bytes, as `io` does for `readinto`.
fn byte_buffer(obj: &Bound<'_, PyAny>) -> PyResult<PyBuffer<u8>> {
    if let Ok(buf) = PyBuffer::<u8>::get(obj) {
        return Ok(buf);
    }
    let bytes = PyMemoryView::from(obj)?.call_method1("cast", ("B",))?;
    PyBuffer::<u8>::get(&bytes)
}

/// A writable, C-contiguous byte buffer of Python's (bytearray, memoryview, numpy array).
pub(crate) fn writable_buffer(obj: &Bound<'_, PyAny>) -> PyResult<PyBuffer<u8>> {
    let buf = byte_buffer(obj)?;
    if buf.readonly() {
        return Err(value("readinto needs a writable buffer (a bytearray, memoryview or numpy array)"));
    }
    if !buf.is_c_contiguous() {
        return Err(value("readinto needs a contiguous buffer"));
    }
    Ok(buf)
}

/// Copy `data` to the start of `buf` (at most its length); returns the bytes copied.
pub(crate) fn fill(buf: &PyBuffer<u8>, data: &[u8]) -> usize {
    let n = data.len().min(buf.len_bytes());
    // SAFETY: `buf` is a writable, C-contiguous export of at least `n` bytes (checked in
    // `writable_buffer`), kept alive by the `PyBuffer` until it is dropped.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.buf_ptr() as *mut u8, n) };
    n
}

/// The bytes of any object with the buffer protocol (bytes, bytearray, memoryview, numpy),
/// copied: a write may be sent after the call returns (write-behind).
pub(crate) fn bytes_of(obj: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    let buf = byte_buffer(obj)?;
    Ok(Bytes::from(buf.to_vec(obj.py())?))
}

/// The calls of an open file, for the blocking class and the asyncio class alike: `$run`
/// is `block` or `awaitable`.
macro_rules! file_calls {
    ($class:ident, $run:path, { $($extra:tt)* }) => {
        #[pymethods]
        impl $class {
            $($extra)*

            /// The path the file was opened by.
            #[getter]
            fn path(&self) -> String {
                self.h.path.clone()
            }

            /// Whether `close` was called.
            #[getter]
            fn closed(&self) -> bool {
                self.h.file.lock().is_none()
            }

            /// The file's size as this handle knows it (its own writes included), without
            /// a request; `fstat` asks the server.
            fn size(&self) -> PyResult<u64> {
                Ok(self.h.get()?.attr().size)
            }

            /// Up to `size` bytes at `offset` (fewer at the end of the file) as `bytes`.
            fn pread<'py>(&self, py: Python<'py>, size: usize, offset: u64) -> PyResult<Bound<'py, PyAny>> {
                let f = self.h.get()?;
                $run(py, async move { f.read_at(offset, size).await.or_raise().map(Data) })
            }

            /// Read into `buffer` (bytearray, memoryview, numpy array…) from `offset`,
            /// with no copy in between; returns the number of bytes read (fewer than the
            /// buffer's length at the end of the file).
            fn preadinto<'py>(&self, py: Python<'py>, buffer: &Bound<'py, PyAny>, offset: u64) -> PyResult<Bound<'py, PyAny>> {
                let f = self.h.get()?;
                let buf = writable_buffer(buffer)?;
                let len = buf.len_bytes();
                $run(py, async move {
                    let data = f.read_at(offset, len).await.or_raise()?;
                    let n = fill(&buf, &data);
                    Python::attach(|_| drop(buf));
                    Ok(n)
                })
            }

            /// Write `data` (any bytes-like object) at `offset`; returns its length.
            /// Writes may return before the servers stored them; `fsync` and `close`
            /// report a failure.
            fn pwrite<'py>(&self, py: Python<'py>, data: &Bound<'py, PyAny>, offset: u64) -> PyResult<Bound<'py, PyAny>> {
                let f = self.h.get()?;
                let data = bytes_of(data)?;
                $run(py, async move { f.write_bytes_at(offset, data).await.or_raise() })
            }

            /// List I/O: the bytes of each `(offset, length)` piece, in one request per
            /// server (small holes between pieces are read and dropped: data sieving).
            /// A piece reaching past the end of the file is short.
            fn read_list<'py>(&self, py: Python<'py>, pieces: Vec<(u64, usize)>) -> PyResult<Bound<'py, PyAny>> {
                let f = self.h.get()?;
                $run(py, async move {
                    let got = f.read_list(&pieces).await.or_raise()?;
                    Ok(got.into_iter().map(Data).collect::<Vec<_>>())
                })
            }

            /// List I/O: write each `(offset, data)` piece, in one request per server;
            /// where pieces overlap, the later one's bytes stay. Returns the bytes written.
            fn write_list<'py>(&self, py: Python<'py>, pieces: Vec<(u64, Bound<'py, PyAny>)>) -> PyResult<Bound<'py, PyAny>> {
                let f = self.h.get()?;
                let pieces = pieces.iter().map(|(off, d)| Ok((*off, bytes_of(d)?))).collect::<PyResult<Vec<_>>>()?;
                let total: usize = pieces.iter().map(|p| p.1.len()).sum();
                $run(py, async move { f.write_list(&pieces).await.or_raise().map(|()| total) })
            }

            /// Append `data` at the end of the file as the servers know it, atomically;
            /// returns the offset it landed at.
            fn append<'py>(&self, py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
                let f = self.h.get()?;
                let data = bytes_of(data)?;
                $run(py, async move { f.append_bytes(data).await.or_raise() })
            }

            /// The attributes, fresh from the inode's server (after this handle's writes).
            fn fstat<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                let f = self.h.get()?;
                $run(py, async move { f.stat().await.or_raise().map(Stat::from) })
            }

            /// Cut or extend the file to `size` bytes.
            fn truncate<'py>(&self, py: Python<'py>, size: u64) -> PyResult<Bound<'py, PyAny>> {
                let f = self.h.get()?;
                $run(py, async move { f.set_len(size).await.or_raise() })
            }

            /// Wait for the writes in flight and publish the size they reached (others see
            /// it); reports a failure of an earlier write.
            fn flush<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                let f = self.h.get()?;
                $run(py, async move { f.flush().await.or_raise() })
            }

            /// Make the data and size durable on the servers.
            fn fsync<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                let f = self.h.get()?;
                $run(py, async move { f.fsync().await.or_raise() })
            }

            /// Close: wait for writes in flight, and if this handle wrote, make the data
            /// durable (as `fsync`). Closing a closed file does nothing.
            fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                let h = self.h.clone();
                $run(py, h.close())
            }

            fn __repr__(&self) -> String {
                let state = if self.h.file.lock().is_none() { " (closed)" } else { "" };
                format!("<shoal.{} {:?}{state}>", stringify!($class), self.h.path)
            }
        }
    };
}

/// An open file of the blocking client: positional reads and writes. `shoal.Client.open`
/// gives the familiar file object over it.
#[pyclass(frozen, module = "shoal._native")]
pub struct File {
    pub(crate) h: Handle,
}

/// An open file of the asyncio client: every call returns an awaitable; `async with`
/// closes it.
#[pyclass(frozen, module = "shoal._native")]
pub struct AsyncFile {
    pub(crate) h: Handle,
}

// `with` closes the file.
file_calls!(File, block, {
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&self, py: Python<'_>, _t: Py<PyAny>, _v: Py<PyAny>, _tb: Py<PyAny>) -> PyResult<bool> {
        let h = self.h.clone();
        block(py, h.close())?;
        Ok(false)
    }
});
// `async with` closes the file.
file_calls!(AsyncFile, awaitable, {
    fn __aenter__<'py>(slf: Py<Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, async move { Ok(slf) })
    }

    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        _t: Py<PyAny>,
        _v: Py<PyAny>,
        _tb: Py<PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let h = self.h.clone();
        awaitable(py, async move { h.close().await.map(|()| false) })
    }
});
