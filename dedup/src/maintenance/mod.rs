//! Keeping the queue in shape without a leader: retention (pruning finished tasks in
//! bounded batches), pausing a task type (a row every claim reads), and the schedules of
//! periodic tasks (a pure function of the schedule, so every process computes the same
//! ticks).

pub(crate) mod limits;
pub(crate) mod pause;
pub(crate) mod retention;
#[cfg(feature = "worker")]
pub(crate) mod schedule;
