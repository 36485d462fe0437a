//! `migrate`: runs task-dedup's migrations.
//!
//! `cargo run -p task-dedup-migration -- up` (also `down`, `status`, `fresh`, `refresh`,
//! `reset`). Reads `DATABASE_URL`; without it, uses the SQLite file `task_dedup.db` in the
//! current directory, creating it if needed.

use sea_orm_migration::sea_orm::Database;
use task_dedup_migration::{Migrator, cli};

/// The embedded database used when `DATABASE_URL` is not set.
const DEFAULT_URL: &str = "sqlite://task_dedup.db?mode=rwc";

#[tokio::main]
async fn main() {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
    cli::run_cli_with_custom_connection(Migrator, async || Database::connect(url).await).await;
}
