//! The schema, on every dialect: the migrations, the unique index they create and the
//! schema each step leaves (pinned in `snapshots/`), the compat patch, online migrations
//! (`online.rs`) and an upgrade under load, measured (`online_load.rs`, ignored by
//! default: `bench/online_upgrade.sh` runs it).
//!
//! One test binary of the modules below.

mod migrations;
mod online;
mod online_load;
