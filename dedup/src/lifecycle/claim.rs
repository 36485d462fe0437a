//! [`claim_many`](super::TaskWorker::claim_many): take due tasks under a lease, run again
//! when it lost a key's one run to another claim; which of the dialect's two claims runs
//! is [`claim_mode`]'s choice.

use std::time::Duration;

use super::claim_mode;
use crate::connect::retry::Retrying;
use crate::dialect::Claim;
use crate::executor::Executor;
use crate::values::connection::DedupConnection;
use crate::values::error::DedupError;
use crate::values::validate;
use task_dedup_entity::task_run;

const MAX_CLAIM_RACES: u32 = 5;

/// Claims up to `max` due tasks of `task_types` for `worker_id` (the trait method).
pub(super) async fn claim_many<C: DedupConnection>(
    db: &C,
    worker_id: &str,
    task_types: &[&str],
    lease: Duration,
    max: usize,
) -> Result<Vec<task_run::Model>, DedupError> {
    validate::worker_id(worker_id)?;
    validate::task_types(task_types)?;
    let lease_micros = validate::lease_micros(lease)?;
    let max = validate::claim_max(max)?;
    let mut exec = Executor::on(db)?;
    // A claim lost with its connection is not run again (it may have taken effect:
    // its tasks come back through the reaper); an aborted one took nothing.
    let mut retrying = Retrying::new(db, Some(Duration::ZERO), "claim");
    let mut races = 0;
    let mut how = claim_mode::choose(&mut exec).await;
    let claimed = loop {
        // `None`: the claim lost the race for a key's one run to another claim
        // (`task_running_resource_uidx`), or an optimistic one picked a task whose
        // key runs, and took nothing.
        let attempt = async {
            // A rerun after a lost race on another connection could pass over the
            // tasks the failed claim picked: see `Executor::hold`.
            exec.hold().await?;
            match exec
                .claim(how, worker_id, task_types, lease_micros, max)
                .await
            {
                Err(failure) if failure.is_running_key() => Ok(None),
                outcome => Ok(Some(outcome?)),
            }
        };
        // Boxed, as in `retried`.
        match retrying.run(Box::pin(attempt)).await {
            Some(Ok(Some(claimed))) => break claimed,
            // Follow-ups wait behind running keys: probe, now and for a while.
            Some(Ok(None)) if how == Claim::Optimistic => {
                claim_mode::met_running_key(&exec);
                how = Claim::Probing;
            }
            // Run again: it now sees the winner's task running and passes over its
            // key, filling the batch from other keys.
            Some(Ok(None)) if races < MAX_CLAIM_RACES => {
                races += 1;
                tracing::debug!(
                    worker_id,
                    races,
                    "claim lost a key's run to another claim; claiming again"
                );
            }
            // Others keep winning: nothing for now, which a worker treats as an empty
            // queue until its next wake-up or poll.
            Some(Ok(None)) => break Vec::new(),
            Some(Err(err)) => return Err(err),
            None => {}
        }
    };
    for task in &claimed {
        tracing::debug!(task_id = %task.id, worker_id, attempts = task.attempts, "task claimed");
        let waited = task
            .started_at
            .and_then(|started| (started - task.run_at).to_std().ok());
        crate::metrics::claimed(waited.unwrap_or_default());
    }
    Ok(claimed)
}
