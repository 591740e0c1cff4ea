//! The tuple space from Python (docs/tuples.md, docs/python.md): Python values to tuples and
//! templates and back, and `TupleWatch`.
//!
//! Values: `int` (64-bit), `str`, `bytes`. In templates, `None` matches any value and the
//! types `int`, `str`, `bytes` any value of that type. A tuple comes back as a Python tuple.

use crate::errors::{value, OrRaise};
use crate::{awaitable, block};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyType};
use shoal_client::{Field, Template, Tuple, TupleEvent, TupleEventKind, Value, ValueKind};
use std::sync::Arc;
use std::time::Duration;

/// One Python value as a tuple value.
fn value_of(v: &Bound<'_, PyAny>) -> PyResult<Value> {
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(Value::Str(s.to_str()?.to_string()));
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(Value::Bytes(b.as_bytes().to_vec()));
    }
    match v.extract::<i64>() {
        Ok(n) => Ok(Value::Int(n)),
        Err(_) => Err(value(format!("a tuple value is an int (64-bit), a str or bytes, not {v}"))),
    }
}

/// A sequence of Python values as a tuple (checked).
pub(crate) fn tuple_of(fields: &Bound<'_, PyAny>) -> PyResult<Tuple> {
    let t = Tuple(fields.try_iter()?.map(|v| value_of(&v?)).collect::<PyResult<_>>()?);
    t.check().map_err(value)?;
    Ok(t)
}

/// A sequence of Python values, `None` and types as a template (checked).
pub(crate) fn template_of(fields: &Bound<'_, PyAny>) -> PyResult<Template> {
    let py = fields.py();
    let field = |v: Bound<'_, PyAny>| -> PyResult<Field> {
        if v.is_none() {
            return Ok(Field::Any);
        }
        if let Ok(t) = v.cast::<PyType>() {
            return if t.is(py.get_type::<pyo3::types::PyInt>()) {
                Ok(Field::AnyOf(ValueKind::Int))
            } else if t.is(py.get_type::<PyString>()) {
                Ok(Field::AnyOf(ValueKind::Str))
            } else if t.is(py.get_type::<PyBytes>()) {
                Ok(Field::AnyOf(ValueKind::Bytes))
            } else {
                Err(value(format!("a template's type is int, str or bytes, not {t}")))
            };
        }
        value_of(&v).map(Field::Is)
    };
    let t = Template(fields.try_iter()?.map(|v| field(v?)).collect::<PyResult<_>>()?);
    t.check().map_err(value)?;
    Ok(t)
}

/// A timeout in seconds as a wait: `None` forever, 0 look once.
pub(crate) fn wait_of(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    timeout.map(|s| Duration::try_from_secs_f64(s).map_err(|_| value(format!("timeout {s}: not seconds")))).transpose()
}

/// Event kinds from the `written` and `taken` flags.
pub(crate) fn kinds_of(written: bool, taken: bool) -> PyResult<u8> {
    let k =
        (if written { shoal_client::WATCH_WRITTEN } else { 0 }) | (if taken { shoal_client::WATCH_TAKEN } else { 0 });
    if k == 0 {
        return Err(value("a watch needs written or taken"));
    }
    Ok(k)
}

/// A tuple handed to Python: a Python tuple of int, str and bytes.
pub(crate) struct TupleOut(pub Tuple);

impl<'py> IntoPyObject<'py> for TupleOut {
    type Target = pyo3::types::PyTuple;
    type Output = Bound<'py, pyo3::types::PyTuple>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        let items: Vec<Bound<'py, PyAny>> = (self.0)
            .0
            .into_iter()
            .map(|v| match v {
                Value::Int(n) => {
                    let Ok(int) = n.into_pyobject(py); // infallible
                    int.into_any()
                }
                Value::Str(s) => PyString::new(py, &s).into_any(),
                Value::Bytes(b) => PyBytes::new(py, &b).into_any(),
            })
            .collect();
        pyo3::types::PyTuple::new(py, items)
    }
}

/// An event handed to Python: `(seq, "written" | "taken", tuple, uid, at)`, `at` in seconds
/// since the epoch.
pub(crate) struct EventOut(pub TupleEvent);

impl<'py> IntoPyObject<'py> for EventOut {
    type Target = pyo3::types::PyTuple;
    type Output = Bound<'py, pyo3::types::PyTuple>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        let e = self.0;
        let kind = match e.kind {
            TupleEventKind::Written => "written",
            TupleEventKind::Taken => "taken",
        };
        let at = e.at.secs as f64 + e.at.nsecs as f64 / 1e9;
        (e.seq, kind, TupleOut(e.tuple), e.uid, at).into_pyobject(py)
    }
}

/// A running watch of the tuple space: `next(timeout)` (blocking) or `next_async(timeout)`
/// (awaitable) give the next event, or None when none came in time; `cursor` is where a
/// new watch (`after=cursor`) goes on with nothing missed or repeated.
#[pyclass(module = "shoal")]
pub struct TupleWatch {
    inner: Arc<tokio::sync::Mutex<shoal_client::TupleWatch>>,
}

impl TupleWatch {
    pub(crate) fn new(w: shoal_client::TupleWatch) -> TupleWatch {
        TupleWatch { inner: Arc::new(tokio::sync::Mutex::new(w)) }
    }
}

#[pymethods]
impl TupleWatch {
    /// The next matching event, waiting up to `timeout` seconds (None: until there is one).
    #[pyo3(signature = (timeout = None))]
    fn next<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let (w, wait) = (self.inner.clone(), wait_of(timeout)?);
        block(py, async move { Ok(w.lock().await.next(wait).await.or_raise()?.map(EventOut)) })
    }

    /// As `next`, awaitable.
    #[pyo3(signature = (timeout = None))]
    fn next_async<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let (w, wait) = (self.inner.clone(), wait_of(timeout)?);
        awaitable(py, async move { Ok(w.lock().await.next(wait).await.or_raise()?.map(EventOut)) })
    }

    /// Every event up to this one was handed out or did not match.
    #[getter]
    fn cursor(&self) -> PyResult<u64> {
        Ok(self.inner.try_lock().map_err(|_| value("the watch is waiting in another call"))?.cursor())
    }

    /// Events the server dropped before this watch read them.
    #[getter]
    fn lost(&self) -> PyResult<u64> {
        Ok(self.inner.try_lock().map_err(|_| value("the watch is waiting in another call"))?.lost())
    }
}
