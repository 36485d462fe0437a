//! The admin surface, on every dialect: `TaskAdmin` (`task_admin.rs`), the query plans of
//! its lists on a big table (`plans.rs`), the dashboard over HTTP (`dashboard.rs`) and the
//! `http_api` example with the dashboard mounted (`http_api.rs`).
//!
//! One test binary of the modules below. Beside them, `browser.rs` is a test binary of
//! its own (`[[test]]` in Cargo.toml): the dashboard in headless Chromium.

mod dashboard;
mod http_api;
mod plans;
mod task_admin;
