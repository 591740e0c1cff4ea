//! Per-job formations (`shoal job`): the launcher's view of the job, the shared directory
//! the ranks coordinate through, and the parallel stage-in and stage-out.

pub mod formation;
pub mod launcher;
pub mod stage;
