//! The admin API's indexes: lists by status, by type and status, or by creation time
//! alone, newest or oldest first, page after page (keyset over `(created_at, id)`). The
//! recent endings the throughput reads come from `task_run_finished_idx
//! (status, finished_at)` of `m20261202_000006_task_dedup_maintenance`.
//!
//! Frozen once released: this file states its DDL per dialect and never changes.
//!
//! Idempotent (each index is created only where missing), so it also runs after
//! [`ensure_schema`](crate::ensure_schema).

use sea_orm_migration::prelude::*;

use crate::sql::{self, Dialect};

/// Adds `task_run_status_created_idx (status, created_at, id)`,
/// `task_run_type_status_created_idx (task_type, status, created_at, id)`,
/// and `task_run_created_idx (created_at, id)`.
#[derive(DeriveMigrationName)]
pub struct Migration;

/// The indexes, by name, in the order they are created.
const NAMES: [&str; 3] = [
    "task_run_status_created_idx",
    "task_run_type_status_created_idx",
    "task_run_created_idx",
];

const SQLITE_UP: [&str; 3] = [
    "CREATE INDEX \"task_run_status_created_idx\" ON \"task_run\" \
     (\"status\", \"created_at\", \"id\")",
    "CREATE INDEX \"task_run_type_status_created_idx\" ON \"task_run\" \
     (\"task_type\", \"status\", \"created_at\", \"id\")",
    "CREATE INDEX \"task_run_created_idx\" ON \"task_run\" (\"created_at\", \"id\")",
];
const SQLITE_DOWN: [&str; 3] = [
    "DROP INDEX IF EXISTS \"task_run_created_idx\"",
    "DROP INDEX IF EXISTS \"task_run_type_status_created_idx\"",
    "DROP INDEX IF EXISTS \"task_run_status_created_idx\"",
];

const POSTGRES_UP: [&str; 3] = [
    "CREATE INDEX task_run_status_created_idx ON task_run (status, created_at, id)",
    "CREATE INDEX task_run_type_status_created_idx ON task_run \
     (task_type, status, created_at, id)",
    "CREATE INDEX task_run_created_idx ON task_run (created_at, id)",
];
const POSTGRES_DOWN: [&str; 3] = [
    "DROP INDEX IF EXISTS task_run_created_idx",
    "DROP INDEX IF EXISTS task_run_type_status_created_idx",
    "DROP INDEX IF EXISTS task_run_status_created_idx",
];

const MYSQL_UP: [&str; 3] = [
    "CREATE INDEX task_run_status_created_idx ON task_run (status, created_at, id)",
    "CREATE INDEX task_run_type_status_created_idx ON task_run \
     (task_type, status, created_at, id)",
    "CREATE INDEX task_run_created_idx ON task_run (created_at, id)",
];
const MYSQL_DOWN: [&str; 1] = [
    "ALTER TABLE task_run DROP INDEX task_run_created_idx, DROP INDEX task_run_type_status_created_idx, \
     DROP INDEX task_run_status_created_idx",
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let up = match Dialect::of(manager)? {
            Dialect::Sqlite => SQLITE_UP,
            Dialect::Postgres => POSTGRES_UP,
            Dialect::MySql => MYSQL_UP,
        };
        for (name, index) in NAMES.iter().zip(up) {
            sql::create_index_if_missing(manager, name, index).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let down: &[&str] = match Dialect::of(manager)? {
            Dialect::Sqlite => &SQLITE_DOWN,
            Dialect::Postgres => &POSTGRES_DOWN,
            Dialect::MySql => &MYSQL_DOWN,
        };
        sql::run(manager, down).await
    }

    /// SQLite and PostgreSQL: all three or none.
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each dialect's statement creates the index of its name.
    #[test]
    fn statements_create_the_named_indexes() {
        for up in [SQLITE_UP, POSTGRES_UP, MYSQL_UP] {
            for (name, sql) in NAMES.iter().zip(up) {
                assert!(
                    sql.replace('"', "").contains(&format!("INDEX {name} ON")),
                    "{sql}"
                );
            }
        }
    }
}
