//! Micro-checkpointing from Python (docs/checkpoint.md, docs/python.md): `MicroCheckpoint`
//! (blocking; from `Client.micro_checkpoint` or its constructor) and `AsyncMicroCheckpoint`
//! (awaitables; from `AsyncClient.micro_checkpoint`), the same calls written once in
//! `checkpoint_calls!`, over `shoal_client::MicroCheckpoint`.

use crate::errors::{value, OrRaise};
use crate::file::bytes_of;
use crate::types::Data;
use crate::{awaitable, block, runtime};
use pyo3::prelude::*;

/// What every task of a job gives to open its checkpoints.
#[derive(Clone)]
pub(crate) struct Job {
    ck: shoal_client::MicroCheckpoint,
    name: String,
    dir: String,
    parts: u32,
}

impl Job {
    /// Check the arguments (a `ValueError` for a bad one, before any request).
    fn check(name: &str, parts: u32) -> PyResult<()> {
        if name.is_empty() {
            return Err(value("a checkpoint needs a name"));
        }
        if parts == 0 {
            return Err(value("a checkpoint needs at least one part"));
        }
        Ok(())
    }

    /// Open the checkpoints of job `name` in `dir` (made if missing).
    pub(crate) async fn open(client: shoal_client::Client, name: String, dir: String, parts: u32) -> PyResult<Job> {
        let ck = shoal_client::MicroCheckpoint::open(&client, &name, &dir, parts).await.or_raise()?;
        Ok(Job { ck, name, dir, parts })
    }

    /// Open, checking the arguments first; for `Client.micro_checkpoint` and its twin.
    pub(crate) fn opening(
        client: shoal_client::Client,
        name: String,
        dir: String,
        parts: u32,
    ) -> PyResult<impl std::future::Future<Output = PyResult<Job>> + Send + 'static> {
        Job::check(&name, parts)?;
        Ok(Job::open(client, name, dir, parts))
    }

    fn part(&self, part: u32) -> PyResult<()> {
        if part >= self.parts {
            return Err(value(format!(
                "part {part} of a checkpoint of {} parts (0 to {})",
                self.parts,
                self.parts - 1
            )));
        }
        Ok(())
    }
}

/// The calls of a job's checkpoints, for the blocking class and the asyncio class alike:
/// `$run` is `block` or `awaitable`.
macro_rules! checkpoint_calls {
    ($class:ident, $run:path, { $($extra:tt)* }) => {
        #[pymethods]
        impl $class {
            $($extra)*

            /// The job's name.
            #[getter]
            fn name(&self) -> String {
                self.job.name.clone()
            }

            /// The directory holding the parts (`DIR/N.PART`).
            #[getter]
            fn dir(&self) -> String {
                self.job.dir.clone()
            }

            /// How many parts each checkpoint has.
            #[getter]
            fn parts(&self) -> u32 {
                self.job.parts
            }

            /// The path of part `part` of checkpoint `n`.
            fn part_path(&self, n: u64, part: u32) -> String {
                self.job.ck.part_path(n, part)
            }

            /// Save part `part` (0 to parts - 1) of checkpoint `n`: `data` (any bytes-like
            /// object) is written to its file and made durable, then recorded; the part
            /// that completes `n` commits it. Saving a part again replaces it.
            fn save<'py>(
                &self,
                py: Python<'py>,
                n: u64,
                part: u32,
                data: &Bound<'py, PyAny>,
            ) -> PyResult<Bound<'py, PyAny>> {
                self.job.part(part)?;
                let data = bytes_of(data)?;
                let ck = self.job.ck.clone();
                $run(py, async move { ck.save(n, part, &data).await.or_raise() })
            }

            /// Whether checkpoint `n` is committed (every part saved), waiting up to
            /// `timeout` seconds for it (None: until it is; 0: look once).
            #[pyo3(signature = (n, timeout = Some(0.0)))]
            fn is_committed<'py>(&self, py: Python<'py>, n: u64, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
                let wait = crate::tuples::wait_of(timeout)?;
                let ck = self.job.ck.clone();
                $run(py, async move { ck.is_committed(n, wait).await.or_raise() })
            }

            /// The newest committed checkpoint (where a restart starts from), or None.
            fn latest<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                let ck = self.job.ck.clone();
                $run(py, async move { ck.latest().await.or_raise() })
            }

            /// Part `part` of checkpoint `n` as saved, as `bytes` (`FileNotFoundError` if
            /// it was never saved).
            fn load<'py>(&self, py: Python<'py>, n: u64, part: u32) -> PyResult<Bound<'py, PyAny>> {
                let ck = self.job.ck.clone();
                $run(py, async move { ck.load(n, part).await.or_raise().map(|d| Data(d.into())) })
            }

            fn __repr__(&self) -> String {
                format!(
                    "<shoal.{} {:?} in {:?}, {} parts>",
                    stringify!($class),
                    self.job.name,
                    self.job.dir,
                    self.job.parts
                )
            }
        }
    };
}

/// One job's micro-checkpoints (docs/checkpoint.md), blocking: every task saves its part
/// of checkpoint N when it is ready, and N is committed when its last part arrives.
#[pyclass(frozen, module = "shoal._native")]
pub struct MicroCheckpoint {
    pub(crate) job: Job,
}

/// As `MicroCheckpoint`, every call returning an awaitable (`AsyncClient.micro_checkpoint`).
#[pyclass(frozen, module = "shoal._native")]
pub struct AsyncMicroCheckpoint {
    pub(crate) job: Job,
}

checkpoint_calls!(MicroCheckpoint, block, {
    /// Open the checkpoints of job `name` (any text), of `parts` parts each, kept in the
    /// directory `dir` (made if missing), through `client` (a `Client` or
    /// `AsyncClient`). Every task of the job opens it with the same arguments.
    #[new]
    fn new(py: Python<'_>, client: &Bound<'_, PyAny>, name: String, dir: String, parts: u32) -> PyResult<Self> {
        let c = crate::client::native_of(client)?;
        let open = Job::opening(c, name, dir, parts)?;
        let job = py.detach(|| runtime().block_on(open))?;
        Ok(MicroCheckpoint { job })
    }
});
checkpoint_calls!(AsyncMicroCheckpoint, awaitable, {});
