//! The task lifecycle under the `Worker` runtime, on every dialect: `TaskLifecycle`'s
//! primitives (claim, heartbeat, the transitions, the reaper), one run per key, a
//! worker's batched endings, the claims' plans, pause, retention and the limits per type.
//!
//! One test binary of the modules below. Beside them, `claim_backoff.rs` is a test binary
//! of its own (`[[test]]` in Cargo.toml): the claims' turn counter it follows is the
//! process's, which the tests here would move.

mod claim_plans;
mod endings;
mod limits;
mod pause;
mod primitives;
mod retention;
mod serial;
