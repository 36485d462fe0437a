//! Enqueueing, on every dialect: `find_or_enqueue` under races, churn and transactions,
//! `find_or_enqueue_many`, the dedup policies, typed tasks and the errors a caller gets.
//!
//! One test binary of the modules below. Beside them, `guard.rs` and `one_round_trip.rs`
//! are test binaries of their own (`[[test]]` in Cargo.toml): each watches state the
//! library keeps per process, which the tests here would move.

mod bulk;
mod errors;
mod find_or_enqueue;
mod policies;
mod typed;
