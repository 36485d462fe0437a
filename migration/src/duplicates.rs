//! Resolution of duplicate active rows left by the old read-then-insert flow.
//!
//! Runs before `task_active_resource_uidx` is created (the index could not be built over
//! them). Per key, the oldest active task stays; every other active task of that key is
//! marked `cancelled`, with `error` naming the task that superseded it and `finished_at`
//! set. Nothing is deleted, so the history stays complete.

use sea_orm_migration::sea_orm::{
    ConnectionTrait, DbErr, Statement, TransactionSession, TransactionTrait, prelude::Uuid,
};
use sea_orm_migration::sea_query::{Expr, ExprTrait, Query};
use task_dedup_entity::task_run::{self, Column, Entity};
use task_dedup_entity::{TaskStatus, active_status_sql};

/// Marks every active row but the oldest of its key `cancelled`. Returns how many rows it
/// cancelled; 0 when there were no duplicates, so running it again is a no-op.
pub(crate) async fn cancel_duplicate_active<C>(db: &C) -> Result<u64, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    let backend = db.get_database_backend();
    let active = active_status_sql();
    let rows = db
        .query_all_raw(Statement::from_string(
            backend,
            format!(
                "SELECT t.id, t.user_id, t.task_type, t.resource_key FROM task_run t \
                 JOIN (SELECT user_id, task_type, resource_key FROM task_run WHERE {active} \
                       GROUP BY user_id, task_type, resource_key HAVING COUNT(*) > 1) d \
                   ON t.user_id = d.user_id AND t.task_type = d.task_type \
                  AND t.resource_key = d.resource_key \
                 WHERE t.{active} \
                 ORDER BY t.user_id, t.task_type, t.resource_key, t.created_at, t.id"
            ),
        ))
        .await?;
    if rows.is_empty() {
        return Ok(0);
    }

    let now = task_run::now();
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
                let update = Query::update()
                    .table(Entity)
                    .value(Column::Status, TaskStatus::Cancelled.as_str())
                    .value(Column::Error, error)
                    .value(Column::FinishedAt, now)
                    .value(Column::UpdatedAt, now)
                    .and_where(Expr::col(Column::Id).eq(id))
                    .and_where(Expr::cust(active))
                    .to_owned();
                let result = txn.execute(&update).await?;
                cancelled += result.rows_affected();
            }
            _ => keeper = Some((key, id)),
        }
    }
    txn.commit().await?;
    Ok(cancelled)
}
