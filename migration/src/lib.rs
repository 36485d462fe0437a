//! Migrations of [task-dedup](https://docs.rs/task-dedup): the `task_run` table and
//! `task_active_resource_uidx`, the unique index that makes deduplication atomic.
//!
//! - [`Migrator`] runs them on their own (the `migrate` binary uses it).
//! - [`migrations()`] returns them to splice into your application's own `Migrator`,
//!   next to your migrations. Their names carry a `task_dedup` prefix, so they never
//!   collide with yours in `seaql_migrations`.
//!   Use one migrator per database: once your `Migrator` has recorded its migrations
//!   in `seaql_migrations`, keep using it there. The standalone [`Migrator`] (and the
//!   `migrate` binary) would find migrations it has no file for and refuse to run.
//! - [`ensure_schema`] brings a `task_run` table that predates these migrations up to
//!   the guarantee; it is idempotent and safe at every start-up.
//!
//! How each dialect enforces "at most one active task per key":
//! PostgreSQL and SQLite use a partial unique index
//! `(user_id, task_type, resource_key) WHERE status IN ('queued', 'running')`.
//! MySQL/MariaDB have no partial indexes: a stored generated column `active_marker` is 1
//! while the row is active and NULL otherwise, and the unique index covers the key plus
//! that column (a unique index admits any number of NULLs). Key columns are `VARBINARY`
//! there so that keys compare byte for byte, as on the other two dialects.
//!
//! ```
//! use sea_orm_migration::prelude::*;
//!
//! /// Your application's migrator, with task-dedup's migrations spliced in.
//! pub struct Migrator;
//!
//! #[async_trait::async_trait]
//! impl MigratorTrait for Migrator {
//!     fn migrations() -> Vec<Box<dyn MigrationTrait>> {
//!         let mut migrations = task_dedup_migration::migrations();
//!         // migrations.push(Box::new(m20270101_000001_your_table::Migration));
//!         migrations
//!     }
//! }
//! ```

pub use sea_orm_migration::prelude::*;

mod compat;
mod ddl;
mod duplicates;
mod m20261130_000001_task_dedup_create_task_run;
mod m20261130_000002_task_dedup_active_resource_uidx;

pub use compat::{CompatReport, ensure_schema};
pub use ddl::{ACTIVE_MARKER, ACTIVE_RESOURCE_UIDX, CLAIM_IDX, LOOKUP_IDX};

/// task-dedup's migrations, in order, to splice into an application's own `Migrator`.
pub fn migrations() -> Vec<Box<dyn MigrationTrait>> {
    vec![
        Box::new(m20261130_000001_task_dedup_create_task_run::Migration),
        Box::new(m20261130_000002_task_dedup_active_resource_uidx::Migration),
    ]
}

/// The standalone migrator: task-dedup's migrations and nothing else.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        migrations()
    }
}
