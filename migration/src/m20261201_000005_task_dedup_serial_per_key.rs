//! One run per key: `concurrent` (the per-task opt-out) and `task_running_resource_uidx`,
//! a unique index over the running tasks of a key that did not opt out, so that the
//! database never lets two of them run at once, whatever their scopes or windows.
//!
//! Frozen once released: this file states its DDL per dialect and never changes.
//!
//! Tasks that predate the column get `concurrent = false`: they run one at a time per
//! key from now on. A table that already holds several running tasks of one key (the
//! claims of older releases allowed it) is upgraded without stopping any of them: the
//! oldest keeps the key's run, the others are marked `concurrent` so that the index can
//! be built, and the rule holds from the next claim on. Idempotent, so it also runs after
//! [`ensure_schema`](crate::ensure_schema).

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::SqlErr;

use crate::sql::{self, Dialect};

/// Adds `concurrent` and the unique index `task_running_resource_uidx` over
/// `(user_id, task_type, resource_key)` for running tasks that are not `concurrent`.
#[derive(DeriveMigrationName)]
pub struct Migration;

pub(crate) const RUNNING_RESOURCE_UIDX: &str = "task_running_resource_uidx";

const SQLITE_CONCURRENT: &str = "ALTER TABLE \"task_run\" ADD COLUMN \"concurrent\" boolean \
    NOT NULL DEFAULT false";
const SQLITE_UNIQUE_INDEX: [&str; 1] = [
    "CREATE UNIQUE INDEX \"task_running_resource_uidx\" ON \"task_run\" \
     (\"user_id\", \"task_type\", \"resource_key\") \
     WHERE (status = 'running' AND NOT concurrent)",
];
const SQLITE_DOWN: [&str; 2] = [
    "DROP INDEX IF EXISTS \"task_running_resource_uidx\"",
    "ALTER TABLE \"task_run\" DROP COLUMN \"concurrent\"",
];

const POSTGRES_CONCURRENT: &str = "ALTER TABLE task_run ADD COLUMN IF NOT EXISTS concurrent \
    boolean NOT NULL DEFAULT false";
/// Writers wait while the running tasks are looked at and the index is built (building
/// it takes a SHARE lock anyway): no claim can add a second running task of a key in
/// between.
const POSTGRES_LOCK: &str = "LOCK TABLE task_run IN SHARE ROW EXCLUSIVE MODE";
const POSTGRES_UNIQUE_INDEX: [&str; 1] = [
    "CREATE UNIQUE INDEX task_running_resource_uidx ON task_run \
     (user_id, task_type, resource_key) \
     WHERE (status = 'running' AND NOT concurrent)",
];
const POSTGRES_DOWN: [&str; 2] = [
    "DROP INDEX IF EXISTS task_running_resource_uidx",
    "ALTER TABLE task_run DROP COLUMN IF EXISTS concurrent",
];

const MYSQL_CONCURRENT: &str =
    "ALTER TABLE task_run ADD COLUMN concurrent boolean NOT NULL DEFAULT false";
/// No partial indexes: `running_slot` is 1 while the row runs and did not opt out, NULL
/// otherwise, and a unique index admits any number of NULLs. One statement, as for
/// `occupied`.
const MYSQL_UNIQUE_INDEX: [&str; 1] = [
    "ALTER TABLE task_run ADD COLUMN running_slot tinyint GENERATED ALWAYS AS \
     (CASE WHEN (status = 'running' AND NOT concurrent) THEN 1 END) STORED, \
     ADD UNIQUE INDEX task_running_resource_uidx \
     (user_id, task_type, resource_key, running_slot)",
];
/// The same, for a table that kept `running_slot` while it lost the index.
const MYSQL_UNIQUE_INDEX_KEPT_COLUMN: [&str; 1] = [
    "ALTER TABLE task_run ADD UNIQUE INDEX task_running_resource_uidx \
     (user_id, task_type, resource_key, running_slot)",
];
const MYSQL_DOWN: [&str; 1] = [
    "ALTER TABLE task_run DROP INDEX task_running_resource_uidx, \
     DROP COLUMN running_slot, DROP COLUMN concurrent",
];

/// Marks `concurrent` every running task of a key that has an older one running (both
/// not `concurrent`): the oldest task of each key keeps the key's run, and the index can
/// be built over what is running. One statement: the oldest of a key is never marked,
/// so each other row keeps a witness whatever order the rows are updated in.
const EXEMPT_RUNNING_DUPLICATES: &str = "UPDATE task_run SET concurrent = true \
    WHERE status = 'running' AND NOT concurrent AND EXISTS (SELECT 1 FROM task_run o \
    WHERE o.user_id = task_run.user_id AND o.task_type = task_run.task_type \
    AND o.resource_key = task_run.resource_key AND o.status = 'running' \
    AND NOT o.concurrent AND o.id < task_run.id)";
/// MySQL/MariaDB cannot read the table an UPDATE writes in a subquery (error 1093),
/// except through a derived table, which they materialize first.
const MYSQL_EXEMPT_RUNNING_DUPLICATES: &str = "UPDATE task_run SET concurrent = true \
    WHERE id IN (SELECT id FROM (SELECT t.id FROM task_run t \
    WHERE t.status = 'running' AND NOT t.concurrent AND EXISTS (SELECT 1 FROM task_run o \
    WHERE o.user_id = t.user_id AND o.task_type = t.task_type \
    AND o.resource_key = t.resource_key AND o.status = 'running' \
    AND NOT o.concurrent AND o.id < t.id)) AS duplicates)";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let dialect = Dialect::of(manager)?;
        let concurrent = match dialect {
            Dialect::Sqlite => SQLITE_CONCURRENT,
            Dialect::Postgres => POSTGRES_CONCURRENT,
            Dialect::MySql => MYSQL_CONCURRENT,
        };
        if !manager.has_column("task_run", "concurrent").await? {
            sql::run(manager, &[concurrent]).await?;
        }
        if manager.has_index("task_run", RUNNING_RESOURCE_UIDX).await? {
            return Ok(());
        }
        match dialect {
            Dialect::Sqlite => {
                // The UPDATE takes the write lock, held until the index is built.
                exempt_running_duplicates(manager).await?;
                sql::run(manager, &SQLITE_UNIQUE_INDEX).await
            }
            Dialect::Postgres => {
                sql::run(manager, &[POSTGRES_LOCK]).await?;
                exempt_running_duplicates(manager).await?;
                sql::run(manager, &POSTGRES_UNIQUE_INDEX).await
            }
            Dialect::MySql => {
                let index: &[&str] = if manager.has_column("task_run", "running_slot").await? {
                    &MYSQL_UNIQUE_INDEX_KEPT_COLUMN
                } else {
                    &MYSQL_UNIQUE_INDEX
                };
                // A claim of an older release may add a second running task of a key
                // between the marking and the `ALTER TABLE` (DDL commits at once there):
                // mark again.
                let mut attempts = 0;
                loop {
                    exempt_running_duplicates(manager).await?;
                    match sql::run(manager, index).await {
                        Err(err)
                            if attempts < 3
                                && matches!(
                                    err.sql_err(),
                                    Some(SqlErr::UniqueConstraintViolation(_))
                                ) =>
                        {
                            attempts += 1;
                        }
                        outcome => return outcome,
                    }
                }
            }
        }
    }

    /// Drops the index and the column: tasks of a key may run side by side again.
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let down: &[&str] = match Dialect::of(manager)? {
            Dialect::Sqlite => &SQLITE_DOWN,
            Dialect::Postgres => &POSTGRES_DOWN,
            Dialect::MySql => &MYSQL_DOWN,
        };
        sql::run(manager, down).await
    }

    /// SQLite and PostgreSQL: the marking and the index in one transaction.
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }
}

/// Marks `concurrent` every running task of a key but the oldest (by id), so that
/// `task_running_resource_uidx` can be built; they all keep running. Returns how many.
pub(crate) async fn exempt_running_duplicates(manager: &SchemaManager<'_>) -> Result<u64, DbErr> {
    let sql = match Dialect::of(manager)? {
        Dialect::MySql => MYSQL_EXEMPT_RUNNING_DUPLICATES,
        Dialect::Sqlite | Dialect::Postgres => EXEMPT_RUNNING_DUPLICATES,
    };
    sql::execute(manager.get_connection(), sql, Vec::new()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frozen predicate is the one the library's claims probe with (see the same
    /// test of the scopes migration).
    #[test]
    fn index_predicate_is_the_librarys() {
        let predicate = task_dedup_entity::RUNS_SERIALLY_SQL;
        assert!(SQLITE_UNIQUE_INDEX[0].ends_with(&format!("WHERE {predicate}")));
        assert!(POSTGRES_UNIQUE_INDEX[0].ends_with(&format!("WHERE {predicate}")));
        assert!(MYSQL_UNIQUE_INDEX[0].contains(&format!("(CASE WHEN {predicate} THEN 1 END)")));
        assert_eq!(
            RUNNING_RESOURCE_UIDX,
            task_dedup_entity::task_run::RUNNING_RESOURCE_UIDX
        );
    }
}
