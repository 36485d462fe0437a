//! The single-task actions that are the admin's own: retry and delete. Each is one
//! compare-and-set statement; a refusal is explained from the row read afterwards.

use uuid::Uuid;

use crate::connect::retry::MAX_ENQUEUE_ATTEMPTS;
use crate::executor::{Change, Executor, args};
use crate::values::error::{DedupError, Transition};
use task_dedup_entity::task_run;

/// failed or cancelled → queued, in a savepoint (PostgreSQL: a unique violation must not
/// abort the caller's transaction) or a short transaction of its own. When the unique
/// index refuses it, the task holding the key is read and returned in
/// [`DedupError::KeyHeld`]; if that task let go of the key before it could be read, the
/// retry is tried again (at most [`MAX_ENQUEUE_ATTEMPTS`] times).
pub(super) async fn retry(
    exec: &mut Executor<'_>,
    id: Uuid,
) -> Result<task_run::Model, DedupError> {
    let mut task = None;
    for _ in 0..MAX_ENQUEUE_ATTEMPTS {
        let mut txn = exec.begin(false).await?;
        let outcome = txn.transition(id, Change::Requeue).await;
        let held = matches!(&outcome, Err(failure) if failure.is_held_key());
        match txn.finish(outcome).await {
            Ok(Some(retried)) => {
                tracing::debug!(task_id = %id, "task retried by an operator");
                return Ok(retried);
            }
            Ok(None) => return Err(refusal(exec, id, Transition::Retry).await),
            Err(_) if held => {}
            Err(failure) => return Err(failure.into()),
        }
        let Some(stored) = exec.by_id(id).await? else {
            return Err(DedupError::NotFound { id });
        };
        if let Some(holder) = exec
            .find_occupant(args::key_of(&stored), stored.dedup_window_end, true)
            .await?
            && holder.id != id
        {
            return Err(DedupError::KeyHeld {
                id,
                holder: Box::new(holder),
            });
        }
        task = Some(stored);
    }
    // Holders kept letting go of the key between the refusal and the read.
    let key = task.map_or_else(
        || crate::values::key::TaskKey::from_trusted_parts("", "", ""),
        |t| {
            crate::values::key::TaskKey::from_trusted_parts(
                &t.user_id,
                &t.task_type,
                &t.resource_key,
            )
        },
    );
    Err(DedupError::Contention {
        key,
        attempts: MAX_ENQUEUE_ATTEMPTS,
    })
}

/// Deletes a finished task.
pub(super) async fn delete(exec: &mut Executor<'_>, id: Uuid) -> Result<(), DedupError> {
    if exec.delete(id).await? {
        tracing::debug!(task_id = %id, "task deleted by an operator");
        return Ok(());
    }
    Err(refusal(exec, id, Transition::Delete).await)
}

/// Why `transition` of task `id` did not apply, from the row as read now.
async fn refusal(exec: &mut Executor<'_>, id: Uuid, transition: Transition) -> DedupError {
    match exec.by_id(id).await {
        Ok(Some(task)) => DedupError::InvalidTransition {
            id,
            transition,
            status: task.status,
        },
        Ok(None) => DedupError::NotFound { id },
        Err(failure) => failure.into(),
    }
}
