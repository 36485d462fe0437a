//! Creates `task_active_resource_uidx`, the dedup guarantee, after resolving duplicate
//! active rows that an older read-then-insert flow may have left.
//!
//! Released in 0.1.0 and frozen: this file states its SQL as released, per dialect, and
//! must never change. A schema change is a new migration file.
//!
//! Idempotent: when the index already exists there is nothing to do (and no duplicate
//! can exist), so it also runs cleanly after [`ensure_schema`](crate::ensure_schema).

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::prelude::Uuid;
use sea_orm_migration::sea_orm::{ConnectionTrait, Statement, TransactionTrait};

use crate::sql::{self, Dialect};

/// Cancels duplicate active rows, then creates the partial unique index (PostgreSQL,
/// SQLite) or the generated marker column and its unique index (MySQL/MariaDB).
#[derive(DeriveMigrationName)]
pub struct Migration;

pub(crate) const ACTIVE_RESOURCE_UIDX: &str = "task_active_resource_uidx";

/// PostgreSQL and SQLite: a partial unique index. The predicate's values are literals:
/// PostgreSQL infers it as the arbiter of `ON CONFLICT ... WHERE` only from a predicate
/// it can prove at plan time, and SQLite wants it written exactly as the index has it.
const PARTIAL_UNIQUE_INDEX: &str = "CREATE UNIQUE INDEX \"task_active_resource_uidx\" \
    ON \"task_run\" (\"user_id\", \"task_type\", \"resource_key\") \
    WHERE status IN ('queued', 'running')";

/// MySQL/MariaDB have no partial indexes: `active_marker` is 1 while the row is active
/// and NULL otherwise, and a unique index admits any number of NULLs. STORED so the index
/// reads it like any other column; no NULL/NOT NULL clause, which MariaDB rejects there.
const MYSQL_MARKER_COLUMN: &str = "ALTER TABLE task_run ADD COLUMN active_marker tinyint \
    GENERATED ALWAYS AS (CASE WHEN status IN ('queued', 'running') THEN 1 END) STORED";

const MYSQL_UNIQUE_INDEX: &str = "CREATE UNIQUE INDEX task_active_resource_uidx \
    ON task_run (user_id, task_type, resource_key, active_marker)";

/// Every active row of a key that has more than one, oldest first per key.
const DUPLICATES: &str = "SELECT t.id, t.user_id, t.task_type, t.resource_key FROM task_run t \
    JOIN (SELECT user_id, task_type, resource_key FROM task_run \
          WHERE status IN ('queued', 'running') \
          GROUP BY user_id, task_type, resource_key HAVING COUNT(*) > 1) d \
      ON t.user_id = d.user_id AND t.task_type = d.task_type \
     AND t.resource_key = d.resource_key \
    WHERE t.status IN ('queued', 'running') \
    ORDER BY t.user_id, t.task_type, t.resource_key, t.created_at, t.id";

const CANCEL_POSTGRES: &str = "UPDATE task_run SET status = 'cancelled', error = $1, \
    finished_at = $2, updated_at = $3 WHERE id = $4 AND status IN ('queued', 'running')";

const CANCEL_OTHERS: &str = "UPDATE task_run SET status = 'cancelled', error = ?, \
    finished_at = ?, updated_at = ? WHERE id = ? AND status IN ('queued', 'running')";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let dialect = Dialect::of(manager)?;
        if manager.has_index("task_run", ACTIVE_RESOURCE_UIDX).await? {
            return Ok(());
        }
        cancel_duplicate_active(manager).await?;
        match dialect {
            Dialect::Sqlite | Dialect::Postgres => sql::run(manager, &[PARTIAL_UNIQUE_INDEX]).await,
            Dialect::MySql => {
                if !manager.has_column("task_run", "active_marker").await? {
                    sql::run(manager, &[MYSQL_MARKER_COLUMN]).await?;
                }
                sql::run(manager, &[MYSQL_UNIQUE_INDEX]).await
            }
        }
    }

    /// Drops the index (and the marker column). Tasks cancelled as duplicates stay
    /// cancelled: reviving them would bring the duplicate work back.
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let dialect = Dialect::of(manager)?;
        if manager.has_index("task_run", ACTIVE_RESOURCE_UIDX).await? {
            let drop = match dialect {
                Dialect::MySql => "DROP INDEX task_active_resource_uidx ON task_run",
                Dialect::Sqlite | Dialect::Postgres => "DROP INDEX task_active_resource_uidx",
            };
            sql::run(manager, &[drop]).await?;
        }
        if dialect == Dialect::MySql && manager.has_column("task_run", "active_marker").await? {
            sql::run(manager, &["ALTER TABLE task_run DROP COLUMN active_marker"]).await?;
        }
        Ok(())
    }
}

/// Marks every active row but the oldest of its key `cancelled`, with `error` naming the
/// task that superseded it and `finished_at` set. Nothing is deleted. Returns how many
/// rows it cancelled; 0 when there were no duplicates.
pub(crate) async fn cancel_duplicate_active(manager: &SchemaManager<'_>) -> Result<u64, DbErr> {
    let dialect = Dialect::of(manager)?;
    let db = manager.get_connection();
    let rows = db
        .query_all_raw(Statement::from_string(dialect.backend(), DUPLICATES))
        .await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let cancel = match dialect {
        Dialect::Postgres => CANCEL_POSTGRES,
        Dialect::Sqlite | Dialect::MySql => CANCEL_OTHERS,
    };
    let now = now_micros();
    let txn = db.begin().await?;
    let mut cancelled = 0;
    let mut keeper: Option<((String, String, String), Uuid)> = None;
    for row in rows {
        let id: Uuid = row.try_get("", "id")?;
        let key = (
            row.try_get::<String>("", "user_id")?,
            row.try_get::<String>("", "task_type")?,
            row.try_get::<String>("", "resource_key")?,
        );
        match &keeper {
            Some((kept_key, kept_id)) if *kept_key == key => {
                let error = format!(
                    "cancelled by task-dedup: duplicate active task for this key, \
                     superseded by task {kept_id}"
                );
                let values = vec![error.into(), now.into(), now.into(), id.into()];
                cancelled += sql::execute(&txn, cancel, values).await?;
            }
            _ => keeper = Some((key, id)),
        }
    }
    txn.commit().await?;
    Ok(cancelled)
}

/// The current time at the precision every dialect stores (microseconds).
fn now_micros() -> chrono::DateTime<chrono::Utc> {
    use chrono::SubsecRound;
    chrono::Utc::now().trunc_subsecs(6)
}
