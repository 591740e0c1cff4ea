//! Operations that span servers: one mechanism (intent → remote steps → finish) for the
//! live path and crash recovery alike (`engine`), and the failpoints that crash tests use
//! to stop a server at any of its steps (`failpoints`).

pub mod engine;
pub mod failpoints;
pub mod move_lock;

pub use engine::{drive, Ctx};
