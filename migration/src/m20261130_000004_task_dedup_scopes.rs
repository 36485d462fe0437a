//! Dedup scopes: which states of a task hold its key (`scope`), and period windows
//! (`dedup_window_end`). The unique index `task_active_resource_uidx` is rebuilt to read
//! them.
//!
//! Frozen once released: this file states its DDL per dialect and never changes.
//!
//! Tasks that predate the columns get scope `active` and window 0: they hold their keys
//! exactly as before. The key is never unguarded: PostgreSQL builds the new index before
//! it drops the old one and renames it, in one transaction; SQLite swaps them in one
//! transaction; MySQL/MariaDB in one `ALTER TABLE`. Idempotent, so it also runs after
//! [`ensure_schema`](crate::ensure_schema).

use sea_orm_migration::prelude::*;

use crate::m20261130_000002_task_dedup_active_resource_uidx::cancel_duplicate_active;
use crate::sql::{self, Dialect};

/// Adds `scope` and `dedup_window_end` and makes the unique index
/// `(user_id, task_type, resource_key, dedup_window_end)` over the rows that hold their
/// key: `active` tasks while queued or running, `queued` tasks while queued, `period`
/// tasks always.
#[derive(DeriveMigrationName)]
pub struct Migration;

const SQLITE_SCOPE: &str = "ALTER TABLE \"task_run\" ADD COLUMN \"scope\" varchar(16) \
    NOT NULL DEFAULT 'active'";
const SQLITE_WINDOW: &str = "ALTER TABLE \"task_run\" ADD COLUMN \"dedup_window_end\" \
    bigint NOT NULL DEFAULT 0";
const SQLITE_UNIQUE_INDEX: [&str; 2] = [
    "DROP INDEX \"task_active_resource_uidx\"",
    "CREATE UNIQUE INDEX \"task_active_resource_uidx\" ON \"task_run\" \
     (\"user_id\", \"task_type\", \"resource_key\", \"dedup_window_end\") \
     WHERE ((scope = 'active' AND status IN ('queued', 'running')) \
     OR (scope = 'queued' AND status = 'queued') OR scope = 'period')",
];
const SQLITE_DOWN: [&str; 4] = [
    "DROP INDEX \"task_active_resource_uidx\"",
    "CREATE UNIQUE INDEX \"task_active_resource_uidx\" \
     ON \"task_run\" (\"user_id\", \"task_type\", \"resource_key\") \
     WHERE status IN ('queued', 'running')",
    "ALTER TABLE \"task_run\" DROP COLUMN \"dedup_window_end\"",
    "ALTER TABLE \"task_run\" DROP COLUMN \"scope\"",
];

const POSTGRES_SCOPE: &str = "ALTER TABLE task_run ADD COLUMN IF NOT EXISTS scope \
    varchar(16) NOT NULL DEFAULT 'active'";
const POSTGRES_WINDOW: &str = "ALTER TABLE task_run ADD COLUMN IF NOT EXISTS \
    dedup_window_end bigint NOT NULL DEFAULT 0";
const POSTGRES_UNIQUE_INDEX: [&str; 3] = [
    "CREATE UNIQUE INDEX task_run_occupied_uidx ON task_run \
     (user_id, task_type, resource_key, dedup_window_end) \
     WHERE ((scope = 'active' AND status IN ('queued', 'running')) \
     OR (scope = 'queued' AND status = 'queued') OR scope = 'period')",
    "DROP INDEX task_active_resource_uidx",
    "ALTER INDEX task_run_occupied_uidx RENAME TO task_active_resource_uidx",
];
const POSTGRES_DOWN: [&str; 5] = [
    "CREATE UNIQUE INDEX task_run_active_uidx ON task_run (user_id, task_type, resource_key) \
     WHERE status IN ('queued', 'running')",
    "DROP INDEX task_active_resource_uidx",
    "ALTER INDEX task_run_active_uidx RENAME TO task_active_resource_uidx",
    "ALTER TABLE task_run DROP COLUMN dedup_window_end",
    "ALTER TABLE task_run DROP COLUMN scope",
];

const MYSQL_SCOPE: &str =
    "ALTER TABLE task_run ADD COLUMN scope varchar(16) NOT NULL DEFAULT 'active'";
const MYSQL_WINDOW: &str =
    "ALTER TABLE task_run ADD COLUMN dedup_window_end bigint NOT NULL DEFAULT 0";
/// No partial indexes: `occupied` is 1 while the row holds its key and NULL otherwise,
/// and a unique index admits any number of NULLs. One statement, so the table always has
/// one of the two indexes.
const MYSQL_UNIQUE_INDEX: [&str; 1] = [
    "ALTER TABLE task_run ADD COLUMN occupied tinyint GENERATED ALWAYS AS \
     (CASE WHEN ((scope = 'active' AND status IN ('queued', 'running')) \
     OR (scope = 'queued' AND status = 'queued') OR scope = 'period') THEN 1 END) STORED, \
     DROP INDEX task_active_resource_uidx, \
     ADD UNIQUE INDEX task_active_resource_uidx \
     (user_id, task_type, resource_key, dedup_window_end, occupied), \
     DROP COLUMN active_marker",
];
/// The same, for a table that kept `occupied` while it lost its unique index.
const MYSQL_UNIQUE_INDEX_KEPT_COLUMN: [&str; 1] = [
    "ALTER TABLE task_run DROP INDEX task_active_resource_uidx, \
     ADD UNIQUE INDEX task_active_resource_uidx \
     (user_id, task_type, resource_key, dedup_window_end, occupied), \
     DROP COLUMN active_marker",
];
const MYSQL_DOWN: [&str; 1] = [
    "ALTER TABLE task_run ADD COLUMN active_marker tinyint GENERATED ALWAYS AS \
     (CASE WHEN status IN ('queued', 'running') THEN 1 END) STORED AFTER finished_at, \
     DROP INDEX task_active_resource_uidx, \
     ADD UNIQUE INDEX task_active_resource_uidx \
     (user_id, task_type, resource_key, active_marker), \
     DROP COLUMN occupied, DROP COLUMN dedup_window_end, DROP COLUMN scope",
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let dialect = Dialect::of(manager)?;
        let (scope, window, unique_index): (&str, &str, &[&str]) = match dialect {
            Dialect::Sqlite => (SQLITE_SCOPE, SQLITE_WINDOW, &SQLITE_UNIQUE_INDEX),
            Dialect::Postgres => (POSTGRES_SCOPE, POSTGRES_WINDOW, &POSTGRES_UNIQUE_INDEX),
            Dialect::MySql => (MYSQL_SCOPE, MYSQL_WINDOW, &MYSQL_UNIQUE_INDEX),
        };
        if !manager.has_column("task_run", "scope").await? {
            sql::run(manager, &[scope]).await?;
        }
        if !manager.has_column("task_run", "dedup_window_end").await? {
            sql::run(manager, &[window]).await?;
        }
        let columns = sql::index_columns(manager, dialect, "task_active_resource_uidx").await?;
        if !columns.iter().any(|c| c == "dedup_window_end") {
            let kept_column =
                dialect == Dialect::MySql && manager.has_column("task_run", "occupied").await?;
            let unique_index = if kept_column {
                &MYSQL_UNIQUE_INDEX_KEPT_COLUMN
            } else {
                unique_index
            };
            sql::run(manager, unique_index).await?;
        }
        Ok(())
    }

    /// The old index admits one queued-or-running task per key, whatever its scope or
    /// window: where several hold a key now (a queued task behind a running one, period
    /// tasks of several windows), the oldest stays and the others are cancelled, as the
    /// unique-index migration does. Nothing is deleted.
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let down: &[&str] = match Dialect::of(manager)? {
            Dialect::Sqlite => &SQLITE_DOWN,
            Dialect::Postgres => &POSTGRES_DOWN,
            Dialect::MySql => &MYSQL_DOWN,
        };
        cancel_duplicate_active(manager).await?;
        sql::run(manager, down).await
    }

    /// SQLite and PostgreSQL: the indexes are swapped in one transaction.
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frozen predicate is the one the library's statements splice in. Should the
    /// library's change, this fails: the library must then keep matching the index (a
    /// new migration), not the other way round.
    #[test]
    fn index_predicate_is_the_librarys() {
        let predicate = task_dedup_entity::OCCUPIES_KEY_SQL;
        assert!(SQLITE_UNIQUE_INDEX[1].ends_with(&format!("WHERE {predicate}")));
        assert!(POSTGRES_UNIQUE_INDEX[0].ends_with(&format!("WHERE {predicate}")));
        assert!(MYSQL_UNIQUE_INDEX[0].contains(&format!("(CASE WHEN {predicate} THEN 1 END)")));
    }
}
