//! The reindex worker, on a pool of its own: its claims never queue behind the
//! application's requests, and its LISTEN (PostgreSQL) takes none of their connections.

use std::time::Duration;

use sea_orm::{
    ActiveModelTrait, ActiveValue, ConnectOptions, DatabaseConnection, EntityTrait,
    TransactionTrait,
};
use task_dedup::{CancellationToken, DedupError, HandlerError, Worker, task_run};

use crate::entity::post;
use crate::service::REINDEX;

/// A worker reindexing posts on its own pool of `connections` connections to `url`.
///
/// # Errors
/// When the pool cannot be opened or a setting is invalid.
pub async fn reindexer(url: &str, connections: u32) -> Result<Worker, DedupError> {
    let mut options = ConnectOptions::new(url);
    options.max_connections(connections).sqlx_logging(false);
    let db = task_dedup::connect_with(options).await?;
    let handler_db = db.clone();
    Worker::builder(db)
        .task_types([REINDEX])
        .concurrency(4)
        .poll_interval(Duration::from_millis(20), Duration::from_millis(200))
        .handler(move |task: task_run::Model, _cancel: CancellationToken| {
            let db = handler_db.clone();
            async move { reindex(&db, &task).await.map(|()| None) }
        })
        .build()
}

/// "Indexes" the post the task names: records the revision it saw.
async fn reindex(db: &DatabaseConnection, task: &task_run::Model) -> Result<(), HandlerError> {
    let id: i32 = task
        .resource_key
        .strip_prefix("post/")
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| HandlerError::fail(format!("not a post: {}", task.resource_key)))?;
    let txn = db.begin().await.map_err(HandlerError::retry)?;
    let Some(found) = post::Entity::find_by_id(id)
        .one(&txn)
        .await
        .map_err(HandlerError::retry)?
    else {
        return Err(HandlerError::fail(format!("post {id} is gone")));
    };
    let revision = found.revision;
    let mut found: post::ActiveModel = found.into();
    found.indexed_revision = ActiveValue::Set(revision);
    found.update(&txn).await.map_err(HandlerError::retry)?;
    txn.commit().await.map_err(HandlerError::retry)
}
