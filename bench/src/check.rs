//! Correctness after a run, read from the table with SQL.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Statement};

/// What the table holds.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct TableCheck {
    /// Keys with more than one active row.
    pub duplicates_active: i64,
    /// Active rows.
    pub active_jobs: i64,
    /// All rows.
    pub rows: i64,
}

pub async fn check(db: &DatabaseConnection) -> Result<TableCheck, DbErr> {
    let active = task_dedup_entity::active_status_sql();
    Ok(TableCheck {
        duplicates_active: count(
            db,
            &format!(
                "SELECT COUNT(*) AS n FROM (SELECT user_id FROM task_run WHERE {active} \
                 GROUP BY user_id, task_type, resource_key HAVING COUNT(*) > 1) d"
            ),
        )
        .await?,
        active_jobs: count(
            db,
            &format!("SELECT COUNT(*) AS n FROM task_run WHERE {active}"),
        )
        .await?,
        rows: count(db, "SELECT COUNT(*) AS n FROM task_run").await?,
    })
}

async fn count(db: &DatabaseConnection, sql: &str) -> Result<i64, DbErr> {
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await?
        .ok_or_else(|| DbErr::Custom(format!("no row from {sql}")))?;
    row.try_get("", "n")
}
