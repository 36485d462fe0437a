#![allow(clippy::missing_errors_doc)]
#![allow(clippy::unnecessary_struct_initialization)]
#![allow(clippy::unused_async)]
//! Reports, rendered by the `Report` worker in the background: at most one per user
//! and month in flight, however many requests ask (task-dedup as the queue).
use loco_rs::prelude::*;
use sea_orm::TransactionTrait;
use serde::{Deserialize, Serialize};
use task_dedup_loco::TaskDedupQueue;

use crate::workers::report::{Worker, WorkerArgs};

#[derive(Debug, Serialize, Deserialize)]
pub struct Enqueued {
    pub job_id: String,
    /// `None` through Loco's `perform_later` (it returns the id only).
    pub created: Option<bool>,
}

/// Loco's own call: a request that repeats one in flight gets the same job id.
#[debug_handler]
pub async fn create(
    State(ctx): State<AppContext>,
    Json(args): Json<WorkerArgs>,
) -> Result<Response> {
    let job_id = Worker::perform_later(&ctx, args).await?;
    format::json(Enqueued {
        job_id,
        created: None,
    })
}

#[derive(Debug, Deserialize)]
pub struct AuditedParams {
    #[serde(flatten)]
    pub args: WorkerArgs,
    /// Make the request's own write fail after the enqueue: the transaction rolls back,
    /// the job with it.
    #[serde(default)]
    pub fail_after_enqueue: bool,
}

/// The job enqueued in the request's transaction, which commits only if the rest of the
/// request succeeds; the answer says whether it created the job.
#[debug_handler]
pub async fn create_in_transaction(
    State(ctx): State<AppContext>,
    Json(params): Json<AuditedParams>,
) -> Result<Response> {
    let queue = ctx
        .shared_store
        .get::<TaskDedupQueue>()
        .ok_or_else(|| Error::string("the task-dedup queue is not installed"))?;
    let txn = ctx.db.begin().await?;
    let outcome = queue
        .enqueue::<Worker, _, _>(&txn, &params.args)
        .await
        .map_err(Error::wrap)?;
    if params.fail_after_enqueue {
        txn.rollback().await?;
        return Err(Error::BadRequest(
            "the request failed; nothing was enqueued".into(),
        ));
    }
    txn.commit().await?;
    format::json(Enqueued {
        job_id: outcome.task().id.to_string(),
        created: Some(outcome.is_created()),
    })
}

pub fn routes() -> Routes {
    Routes::new()
        .prefix("api/reports/")
        .add("/", post(create))
        .add("/in_transaction", post(create_in_transaction))
}
