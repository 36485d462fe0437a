//! Writing rows directly, bypassing the library, to seed states the library would never
//! produce (duplicates, legacy tables, expired leases).

use chrono::{DateTime, Duration, Utc};
use sea_orm::{ActiveValue::Set, ConnectionTrait, DbErr, EntityTrait};
use task_dedup::{TaskStatus, task_run};
use uuid::Uuid;

/// Inserts a task row with only the key, status and timestamps set, so it also works on
/// a legacy table that lacks the newer columns. Returns its id.
pub async fn insert<C: ConnectionTrait>(
    db: &C,
    (user_id, task_type, resource_key): (&str, &str, &str),
    status: TaskStatus,
    created_at: DateTime<Utc>,
) -> Result<Uuid, DbErr> {
    let id = Uuid::now_v7();
    let row = task_run::ActiveModel {
        id: Set(id),
        user_id: Set(user_id.to_owned()),
        task_type: Set(task_type.to_owned()),
        resource_key: Set(resource_key.to_owned()),
        status: Set(status),
        attempts: Set(0),
        created_at: Set(created_at),
        updated_at: Set(created_at),
        ..Default::default()
    };
    task_run::Entity::insert(row)
        .exec_without_returning(db)
        .await?;
    Ok(id)
}

/// A fixed instant plus `seconds`, at microsecond precision.
pub fn at(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_780_000_000, 123_456_000).expect("valid instant")
        + Duration::seconds(seconds)
}

/// Every row of the table, oldest first.
pub async fn all<C: ConnectionTrait>(db: &C) -> Vec<task_run::Model> {
    use sea_orm::QueryOrder;
    task_run::Entity::find()
        .order_by_asc(task_run::Column::CreatedAt)
        .order_by_asc(task_run::Column::Id)
        .all(db)
        .await
        .expect("rows load")
}

/// Whether `err` is a unique-constraint violation.
pub fn is_unique_violation(err: &DbErr) -> bool {
    matches!(
        err.sql_err(),
        Some(sea_orm::SqlErr::UniqueConstraintViolation(_))
    )
}
