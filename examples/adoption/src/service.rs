//! The application's services: SeaORM code returning `DbErr`, which enqueues its
//! background work in the same transaction as the write the work is about.

use sea_orm::{
    ActiveModelTrait, ActiveValue, DatabaseConnection, DatabaseTransaction, DbErr, EntityTrait,
    QuerySelect, SqliteTransactionMode, TransactionOptions, TransactionTrait,
};
use task_dedup::{DedupConnection, Enqueued, NewTask, Scope, TaskDedup, TaskKey};

use crate::entity::post;

/// The task type of a post's reindex.
pub const REINDEX: &str = "reindex-post";

/// The reindex of post `id`: a key without a user (the blog's own work), re-done on
/// change.
pub fn reindex(id: i32) -> Result<NewTask, DbErr> {
    let key = TaskKey::without_user(REINDEX, format!("post/{id}"))?;
    Ok(NewTask::new(key).scope(Scope::Queued))
}

/// Asks for post `id` to be reindexed, on a pool or in the caller's transaction.
pub async fn request_reindex<C: DedupConnection>(db: &C, id: i32) -> Result<Enqueued, DbErr> {
    Ok(db.find_or_enqueue(reindex(id)?).await?)
}

/// A write transaction. On SQLite it takes the write lock up front (`BEGIN IMMEDIATE`):
/// a deferred transaction that reads and then writes fails with SQLITE_BUSY when another
/// writer got in between. Other databases ignore the mode.
async fn begin_write(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
    db.begin_with_options(TransactionOptions {
        sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
        ..TransactionOptions::default()
    })
    .await
}

/// Creates a post and asks for its reindex, in one transaction.
pub async fn create_post(db: &DatabaseConnection, title: &str) -> Result<post::Model, DbErr> {
    let txn = begin_write(db).await?;
    let post = post::ActiveModel {
        id: ActiveValue::NotSet,
        title: ActiveValue::Set(title.to_owned()),
        revision: ActiveValue::Set(1),
        indexed_revision: ActiveValue::Set(0),
    }
    .insert(&txn)
    .await?;
    request_reindex(&txn, post.id).await?;
    txn.commit().await?;
    Ok(post)
}

/// Edits post `id` (a new revision) and asks for its reindex, in one transaction.
/// Returns what the request did: created a reindex, or joined the one queued.
pub async fn edit_post(db: &DatabaseConnection, id: i32, title: &str) -> Result<Enqueued, DbErr> {
    let txn = begin_write(db).await?;
    // FOR UPDATE: concurrent edits take turns, none loses another's revision (SQLite
    // drops the clause; its IMMEDIATE transaction already serializes writers).
    let post = post::Entity::find_by_id(id)
        .lock_exclusive()
        .one(&txn)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound(format!("post {id}")))?;
    let revision = post.revision + 1;
    let mut post: post::ActiveModel = post.into();
    post.title = ActiveValue::Set(title.to_owned());
    post.revision = ActiveValue::Set(revision);
    post.update(&txn).await?;
    let outcome = request_reindex(&txn, id).await?;
    txn.commit().await?;
    Ok(outcome)
}
