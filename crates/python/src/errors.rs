//! Client errors as Python exceptions: `OSError(errno, message)`, which Python turns into
//! the matching subclass (`FileNotFoundError` for ENOENT, `PermissionError` for EACCES, …).

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::PyErr;

/// A client error as the `OSError` subclass of its errno, with the client's message
/// (what was done, to which path, and why).
pub(crate) fn os_error(e: shoal_client::Error) -> PyErr {
    PyOSError::new_err((e.errno.0, e.to_string()))
}

/// An `OSError` for `errno` with `message` (checks made here, before any request).
pub(crate) fn errno(errno: i32, message: impl Into<String>) -> PyErr {
    PyOSError::new_err((errno, message.into()))
}

/// A `ValueError` (a bad argument: an unknown mode string, say).
pub(crate) fn value(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}

/// Results of the client as Python results.
pub(crate) trait OrRaise<T> {
    fn or_raise(self) -> pyo3::PyResult<T>;
}

impl<T> OrRaise<T> for shoal_client::Result<T> {
    fn or_raise(self) -> pyo3::PyResult<T> {
        self.map_err(os_error)
    }
}
