//! Migrations of [task-dedup](https://docs.rs/task-dedup): the `task_run` table and
//! `task_active_resource_uidx`, the unique index that makes deduplication atomic.
//!
//! - [`migrations()`] returns them to splice into your application's own migrator, next
//!   to your migrations. They are recorded wherever your migrator records its own
//!   (`seaql_migrations` by default). Their names carry a `task_dedup` prefix, so they
//!   never collide with yours.
//! - [`Migrator`] runs them on their own (the `task-dedup-migrate` command uses it) and
//!   records them in a ledger of its own, [`MIGRATION_TABLE`], so it never trips over an
//!   application migrator's records in the same database, nor they over its.
//! - [`ensure_schema`] brings a `task_run` table that predates these migrations up to
//!   the guarantee, or refuses, before changing anything, what it cannot fix.
//!
//! Released migration files are frozen: each states its DDL as released, per dialect,
//! and never changes. Schema changes come as new files.
//!
//! How each dialect enforces "at most one task holds a key": PostgreSQL and SQLite use a
//! partial unique index over `(user_id, task_type, resource_key, dedup_window_end)` whose
//! predicate is "the row holds its key" (`queued` or `running` for scope `active`,
//! `queued` for scope `queued`, always for scope `period`). MySQL/MariaDB have no
//! partial indexes: a (virtual) generated column `occupied` is 1 while the row holds its
//! key and NULL otherwise, and the unique index covers the key, the window and that
//! column (a unique index admits any number of NULLs). Key columns are `VARBINARY` there
//! so that keys compare byte for byte, as on the other two dialects (or, in a table the
//! compat patch brought up, `utf8mb4` `VARCHAR` in a binary NO PAD collation, which
//! compares the same way).
//!
//! One run per key the same way: `task_running_resource_uidx` over
//! `(user_id, task_type, resource_key)` for rows that are `running` and not `concurrent`
//! (PostgreSQL, SQLite: its predicate; MySQL/MariaDB: the generated `running_slot`).
//!
//! | migration | what |
//! |---|---|
//! | `m20261130_000001_task_dedup_create_task_run` | the table, its lookup and claim indexes (0.1.0) |
//! | `m20261130_000002_task_dedup_active_resource_uidx` | the unique index, after resolving old duplicates (0.1.0) |
//! | `m20261130_000003_task_dedup_scheduling` | `run_at`, `priority`, the claim index for their order |
//! | `m20261130_000004_task_dedup_scopes` | `scope`, `dedup_window_end`, the unique index rebuilt to read them |
//! | `m20261201_000005_task_dedup_serial_per_key` | `concurrent`, the unique index over running tasks per key (one run per key) |
//! | `m20261202_000006_task_dedup_maintenance` | `task_run_finished_idx` (the pruner's batches), the table `task_dedup_paused` (paused task types) |
//! | `m20261202_000007_task_dedup_admin` | the admin API's list indexes (by status, by type and status, by creation time) and the index of finished times |
//! | `m20261203_000008_task_dedup_key_prefix` | `task_run_key_prefix_idx`: the keys in byte order, for lists by key prefix |
//! | `m20261203_000009_task_dedup_pooler_function` | PostgreSQL: the function `task_dedup_insert_or_find_v1`, which `PoolerMode::NoPreparedStatements` calls (plans kept per server session); nothing elsewhere |
//! | `m20261204_000010_task_dedup_snoozes` | `snoozes`, how many times a handler snoozed the task (bounds a handler that snoozes for ever) |
//! | `m20261205_000011_task_dedup_limits` | the table `task_dedup_limits` (flow control per task type: running tasks anywhere, per user, starts per window) |
//! | `m20261206_000012_task_dedup_virtual_markers` | MySQL/MariaDB: `occupied` and `running_slot` made VIRTUAL (added instantly by an online upgrade; an existing STORED pair is converted by one table copy); nothing elsewhere |
//! | `m20261207_000013_task_dedup_lean_indexes` | PostgreSQL: `task_run`'s indexes partial to the rows each serves (the queue, the running tasks, the history), 12 index entries per task's life instead of 28, `fillfactor` 70; nothing elsewhere |
//!
//! [`online`] builds the same schema without stopping a live table's writes:
//! `CREATE INDEX CONCURRENTLY` on PostgreSQL, InnoDB online DDL on MySQL/MariaDB
//! ([`online::up_online`], [`online::prepare_online`], [`online::ensure_schema_online`]).
//!
//! # Features
//! - `sqlite`, `postgres`, `mysql` (all default): the dialects, forwarded to
//!   sea-orm-migration's `sqlx-*` features. A dialect built without its feature is a
//!   `DbErr::BackendNotSupported` at run time.
//! - No runtime or TLS backend: your application's sea-orm dependency picks them. The
//!   `task-dedup-migrate` command, which runs these migrations standalone, is the crate
//!   of that name. Splice [`migrations()`] with only the dialects you use:
//!   `task-dedup-migration = { version = "0.1", default-features = false, features = ["postgres"] }`.
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
mod entity_first;
mod m20261130_000001_task_dedup_create_task_run;
mod m20261130_000002_task_dedup_active_resource_uidx;
mod m20261130_000003_task_dedup_scheduling;
mod m20261130_000004_task_dedup_scopes;
mod m20261201_000005_task_dedup_serial_per_key;
mod m20261202_000006_task_dedup_maintenance;
mod m20261202_000007_task_dedup_admin;
mod m20261203_000008_task_dedup_key_prefix;
mod m20261203_000009_task_dedup_pooler_function;
mod m20261204_000010_task_dedup_snoozes;
mod m20261205_000011_task_dedup_limits;
mod m20261206_000012_task_dedup_virtual_markers;
mod m20261207_000013_task_dedup_lean_indexes;
pub mod online;
mod sql;

pub use compat::{ColumnProblem, CompatReport, SchemaError, ensure_schema};
pub use entity_first::apply_with_task_run;

/// The ledger table of the standalone [`Migrator`].
pub const MIGRATION_TABLE: &str = "task_dedup_migrations";

/// task-dedup's migrations, in order, to splice into an application's own migrator.
pub fn migrations() -> Vec<Box<dyn MigrationTrait>> {
    vec![
        Box::new(m20261130_000001_task_dedup_create_task_run::Migration),
        Box::new(m20261130_000002_task_dedup_active_resource_uidx::Migration),
        Box::new(m20261130_000003_task_dedup_scheduling::Migration),
        Box::new(m20261130_000004_task_dedup_scopes::Migration),
        Box::new(m20261201_000005_task_dedup_serial_per_key::Migration),
        Box::new(m20261202_000006_task_dedup_maintenance::Migration),
        Box::new(m20261202_000007_task_dedup_admin::Migration),
        Box::new(m20261203_000008_task_dedup_key_prefix::Migration),
        Box::new(m20261203_000009_task_dedup_pooler_function::Migration),
        Box::new(m20261204_000010_task_dedup_snoozes::Migration),
        Box::new(m20261205_000011_task_dedup_limits::Migration),
        Box::new(m20261206_000012_task_dedup_virtual_markers::Migration),
        Box::new(m20261207_000013_task_dedup_lean_indexes::Migration),
    ]
}

/// The standalone migrator: task-dedup's migrations and nothing else, recorded in
/// [`MIGRATION_TABLE`] rather than in `seaql_migrations`.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        migrations()
    }

    fn migration_table_name() -> DynIden {
        MIGRATION_TABLE.into_iden()
    }
}
