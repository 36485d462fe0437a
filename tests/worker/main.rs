//! The `Worker` runtime, on every dialect: a thousand tasks through workers in one
//! process and in several, retries, shutdown, cancellation, panics and wake-ups
//! (`runtime.rs`); the handler's controls (snooze, timeouts, a cancel from outside);
//! periodic tasks without a leader; rate-limited work started as each window opens
//! (`rate.rs`).
//!
//! One test binary of the modules below. Beside them, `metrics.rs` is a test binary of
//! its own (`[[test]]` in Cargo.toml): the metrics recorder is the process's.

mod handler_controls;
mod periodic;
mod rate;
mod runtime;
