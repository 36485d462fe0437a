//! The guide: how to use task-dedup, chapter by chapter. Documentation only: these
//! modules hold no code.
//!
//! 1. [Getting started](getting_started): install, the schema, the first enqueue, in
//!    your transaction, in bulk.
//! 2. [Scopes and policies](scopes_and_policies): which states hold a key, one run per
//!    key, the latest request wins, `run_at` and priority, retries.
//! 3. [Typed tasks and the Worker](typed_tasks_and_worker): a task type as a Rust type,
//!    the `Worker` runtime, the primitives under it.
//! 4. [Periodic tasks and maintenance](periodic_and_maintenance): schedules without a
//!    leader, retention, pausing a task type.
//! 5. [Flow control](flow_control): limits per task type across every worker (running
//!    at once, per user, starts per window) and fair claims between users.
//! 6. [Operating: command, dashboard, poolers](operating): the admin API, the
//!    `task-dedup` command, the dashboard, pools and poolers.
//! 7. [Upgrading](upgrading): the migrations standalone and online (a big, live table
//!    keeps its writes), older and hand-made tables.
//! 8. [Failure model](failure_model): what each database enforces, and what a lost
//!    connection, a deadlock or a crash does to each operation.
//!
//! Every Rust example in these chapters is compiled and run by `cargo test --workspace`
//! (the workspace's root package includes the chapters for that).

#[doc = include_str!("getting_started.md")]
pub mod getting_started {}

#[doc = include_str!("scopes_and_policies.md")]
pub mod scopes_and_policies {}

#[doc = include_str!("typed_tasks_and_worker.md")]
pub mod typed_tasks_and_worker {}

#[doc = include_str!("periodic_and_maintenance.md")]
pub mod periodic_and_maintenance {}

#[doc = include_str!("flow_control.md")]
pub mod flow_control {}

#[doc = include_str!("operating.md")]
pub mod operating {}

#[doc = include_str!("upgrading.md")]
pub mod upgrading {}

#[doc = include_str!("failure_model.md")]
pub mod failure_model {}
