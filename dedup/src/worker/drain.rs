//! Running a worker's due tasks inline, one after another, for an application's tests
//! ([`crate::testing::drain`]).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Worker;
use super::handler::HandlerError;
use super::job::Lease;
use super::record::{snooze_refused, timed_out, truncated};
use super::route::RunContext;
use crate::lifecycle::TaskLifecycle;
use crate::values::backoff::Retry;
use crate::values::connection::WithRetryBudget;
use crate::values::error::DedupError;
use task_dedup_entity::task_run;

/// What [`drain`](crate::testing::drain) did: each task it ran, as recorded afterwards,
/// in the order it ran them.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Drained {
    /// Tasks whose handler succeeded (now `succeeded`).
    pub completed: Vec<task_run::Model>,
    /// Tasks whose attempt failed and that went back to the queue (now `queued`, due
    /// after the backoff).
    pub retried: Vec<task_run::Model>,
    /// Tasks that failed for good (now `failed`).
    pub failed: Vec<task_run::Model>,
    /// Tasks whose handler snoozed them (now `queued`, due after the snooze; a zero
    /// snooze is run again in the same drain).
    pub snoozed: Vec<task_run::Model>,
}

impl Drained {
    /// How many tasks ran.
    pub fn len(&self) -> usize {
        self.completed.len() + self.retried.len() + self.failed.len() + self.snoozed.len()
    }

    /// Whether no task was due.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Claims the due tasks of `worker`'s types one at a time and runs each with its
/// handler in the caller's task, recording its end, until none is due.
pub(crate) async fn drain(worker: &Worker) -> Result<Drained, DedupError> {
    let config = &worker.config;
    let db = WithRetryBudget::new(&worker.db, config.retry_budget);
    let worker_id: Arc<str> = Arc::from(config.id.as_str());
    let types: Vec<&str> = config.task_types.iter().map(String::as_str).collect();
    let mut drained = Drained::default();
    loop {
        let Some(task) = db
            .claim_many(&config.id, &types, config.lease, 1)
            .await?
            .into_iter()
            .next()
        else {
            return Ok(drained);
        };
        let (id, attempts, snoozes) = (task.id, task.attempts, task.snoozes);
        let (lease, heartbeat_every, retry) = match worker.routes.typed.get(&task.task_type) {
            Some(typed) => (typed.lease, typed.heartbeat_every, typed.retry),
            None => (config.lease, config.heartbeat_every, config.retry),
        };
        let context = RunContext {
            cancel: CancellationToken::new(),
            lease: Lease::new(
                worker.db.clone(),
                config.retry_budget,
                worker_id.clone(),
                id,
                lease,
                heartbeat_every,
            ),
        };
        let timeout = config
            .timeouts
            .get(&task.task_type)
            .copied()
            .or(config.timeout);
        let returned = match worker.routes.get(&task.task_type).cloned() {
            // Inline, a timed-out handler is dropped at once (no cancel grace).
            Some(route) => match timeout {
                Some(timeout) => tokio::time::timeout(timeout, route.run(task, context))
                    .await
                    .unwrap_or_else(|_| Err(HandlerError::Retry(timed_out(timeout)))),
                None => route.run(task, context).await,
            },
            None => Err(HandlerError::fail("no handler for this task type")),
        };
        match returned {
            Ok(result) => drained
                .completed
                .push(db.complete(id, &config.id, result).await?),
            Err(HandlerError::Fail(message)) => drained.failed.push(
                db.fail(id, &config.id, &truncated(message), Retry::Never)
                    .await?,
            ),
            Err(HandlerError::Snooze(delay)) => {
                match snooze_refused(config.max_snoozes, snoozes, delay) {
                    Some(message) => drained
                        .failed
                        .push(db.fail(id, &config.id, &message, Retry::Never).await?),
                    None => drained
                        .snoozed
                        .push(db.snooze(id, &config.id, delay).await?),
                }
            }
            Err(HandlerError::Retry(message)) => {
                let task = db
                    .fail(
                        id,
                        &config.id,
                        &truncated(message),
                        retry.after_attempt(attempts),
                    )
                    .await?;
                if task.status == task_run::TaskStatus::Failed {
                    drained.failed.push(task);
                } else {
                    drained.retried.push(task);
                }
            }
        }
    }
}
