//! A [`Worker`](crate::Worker)'s batch of task endings ([`end_many`]): one statement per
//! batch and shape, with the guards and explanations of the one-at-a-time transitions.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::transition::{Guard, explain};
use crate::connect::retry::Retrying;
/// A worker's batch of endings of one shape, as [`end_many`] takes it.
pub(crate) use crate::executor::EndMany;
use crate::executor::Executor;
use crate::values::connection::DedupConnection;
use crate::values::error::{DedupError, Transition};
use crate::values::validate;
use task_dedup_entity::TaskStatus;

/// How a batch of endings went ([`end_many`]).
#[cfg_attr(not(feature = "worker"), allow(dead_code))]
pub(crate) enum EndedMany {
    /// Per task, in the batch's order: recorded (by this call, or by an attempt of it
    /// lost with its connection), or the refusal that says why not
    /// ([`DedupError::LeaseNotHeld`], [`DedupError::InvalidTransition`],
    /// [`DedupError::NotFound`]).
    Each(Vec<Result<(), DedupError>>),
    /// A retry ran into a key a queued follow-up took, and the statement changed
    /// nothing: record these endings one at a time ([`TaskLifecycle::fail`] decides each).
    HeldKey,
}

/// Records a [`Worker`](crate::Worker)'s batch of endings of one shape in one statement
/// (MySQL/MariaDB: one short transaction): each the compare-and-set on status and lease
/// owner that [`TaskLifecycle::complete`] and [`TaskLifecycle::fail`] run one at a time, with
/// the same retries (a lost connection within the handle's budget, a deadlock) and the
/// same idempotence (a batch run again after a lost attempt that took effect finds its
/// rows ended by this worker and reports them recorded). The rows it did not change are
/// read, only to say why.
///
/// # Errors
/// [`DedupError::InvalidArgument`] for an invalid worker id, result or error text,
/// before any SQL; the batch's database error when it could not run within the retries
/// (none of its endings is known to be recorded: their leases run out and the reaper
/// takes the tasks back).
#[cfg_attr(not(feature = "worker"), allow(dead_code))]
pub(crate) async fn end_many<C: DedupConnection>(
    db: &C,
    worker_id: &str,
    batch: EndMany<'_>,
) -> Result<EndedMany, DedupError> {
    validate::worker_id(worker_id)?;
    let (transition, operation, outcome, done): (_, _, _, &'static [TaskStatus]) = match batch {
        EndMany::Complete(rows) => {
            for (_, result) in rows {
                validate::json("result", *result)?;
            }
            (
                Transition::Complete,
                "complete",
                "completed",
                &[TaskStatus::Succeeded],
            )
        }
        EndMany::Fail(rows) => {
            for (_, error) in rows {
                validate::error_text("error", error)?;
            }
            (Transition::Fail, "fail", "failed", &[TaskStatus::Failed])
        }
        EndMany::Retry(rows) => {
            for (_, error, _) in rows {
                validate::error_text("error", error)?;
            }
            (Transition::Fail, "fail", "retried", &[TaskStatus::Queued])
        }
    };
    let guard = Guard::LeaseHolder { worker_id, done };
    let mut exec = Executor::on(db)?;
    let mut retrying = Retrying::new(db, None, operation);
    let ended = loop {
        let attempt = async {
            match exec.end_many(worker_id, batch).await {
                Ok(ids) => Ok(Some(ids)),
                Err(failure) if failure.is_held_key() => Ok(None),
                Err(failure) => Err(failure.into()),
            }
        };
        // Boxed, as in `retried`.
        if let Some(outcome) = retrying.run(Box::pin(attempt)).await {
            break outcome?;
        }
    };
    let Some(ended) = ended else {
        return Ok(EndedMany::HeldKey);
    };
    let ended: HashSet<Uuid> = ended.into_iter().collect();
    let ids = batch.ids();
    let missing: Vec<Uuid> = ids
        .iter()
        .filter(|id| !ended.contains(id))
        .copied()
        .collect();
    let mut found = HashMap::new();
    if !missing.is_empty() {
        let mut retrying = Retrying::new(db, None, operation);
        let read = loop {
            let attempt = async { Ok(exec.by_ids(&missing).await?) };
            if let Some(outcome) = retrying.run(Box::pin(attempt)).await {
                break outcome?;
            }
        };
        found.extend(read.into_iter().map(|task| (task.id, task)));
    }
    let each: Vec<Result<(), DedupError>> = ids
        .iter()
        .map(|id| {
            if ended.contains(id) {
                tracing::debug!(task_id = %id, %transition, outcome, "task transitioned");
                return Ok(());
            }
            match found.remove(id) {
                Some(task) => explain(task, transition, guard).map(drop),
                None => Err(DedupError::NotFound { id: *id }),
            }
        })
        .collect();
    let recorded = each.iter().filter(|each| each.is_ok()).count();
    for _ in 0..recorded {
        crate::metrics::finished(outcome);
    }
    // Each recorded ending freed its key's run: a follow-up waiting for it is due now,
    // and so is a retry due at once.
    if recorded > 0
        && let Err(err) = crate::executor::notify::run_ended(&mut exec).await
    {
        // The endings are recorded; a worker that missed the wake-up claims the
        // follow-ups at its next poll.
        tracing::warn!(error = %err.err, "could not wake workers for tasks due now");
    }
    Ok(EndedMany::Each(each))
}
