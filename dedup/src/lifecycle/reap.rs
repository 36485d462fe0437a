//! [`reap_expired`](super::TaskLifecycle::reap_expired): tasks whose lease ran out (their
//! worker crashed or lost its connection) requeued after the policy's backoff, or failed
//! after their last attempt.

use uuid::Uuid;

use super::ReapReport;
use super::transition::not_retried;
use crate::connect::retry::Retrying;
use crate::dialect::Failure;
use crate::executor::Executor;
use crate::values::backoff::{Retry, RetryPolicy};
use crate::values::connection::DedupConnection;
use crate::values::error::DedupError;
use crate::values::validate;

/// Reaps every expired lease (the trait method).
pub(super) async fn reap_expired<C: DedupConnection>(
    db: &C,
    policy: &RetryPolicy,
) -> Result<ReapReport, DedupError> {
    policy.validate()?;
    let mut exec = Executor::on(db)?;
    let mut report = ReapReport::default();
    let last_attempt = format!(
        "lease expired on the last allowed attempt (max_attempts = {})",
        policy.max_attempts
    );
    for (id, attempts) in exec.expired().await? {
        // A deadlock with a claim or an ending (InnoDB, around the unique indexes'
        // entries this moves) is run again: each step rechecks the expiry.
        let mut retrying = Retrying::new(db, None, "reap");
        let reaped = loop {
            let attempt = reap_one(&mut exec, id, attempts, policy, &last_attempt);
            // Boxed, as in `retried`.
            if let Some(outcome) = retrying.run(Box::pin(attempt)).await {
                break outcome?;
            }
        };
        match reaped {
            Some(true) => report.requeued += 1,
            Some(false) => report.failed += 1,
            None => {}
        }
    }
    crate::metrics::reaped(report.requeued, report.failed);
    if report != ReapReport::default() {
        // Requeued tasks are due, and the keys' runs are free for their follow-ups.
        crate::executor::notify::run_ended(&mut exec).await?;
    }
    if report != ReapReport::default() {
        tracing::info!(
            requeued = report.requeued,
            failed = report.failed,
            "expired leases reaped"
        );
    }
    Ok(report)
}

/// Reaps expired task `id` (claimed for attempt number `attempts`): requeued after the
/// policy's backoff, or failed after its last attempt or when a follow-up holds its key.
/// `Some(true)` requeued, `Some(false)` failed, `None` when its lease was renewed or it
/// ended meanwhile.
async fn reap_one(
    exec: &mut Executor<'_>,
    id: Uuid,
    attempts: i32,
    policy: &RetryPolicy,
    last_attempt: &str,
) -> Result<Option<bool>, DedupError> {
    let requeue_refused = match policy.after_attempt(attempts) {
        Retry::Never => false,
        Retry::After(delay) => {
            let delay_micros = validate::micros("retry", delay)?;
            match requeue(exec, id, delay_micros).await {
                Ok(true) => return Ok(Some(true)),
                Ok(false) => return Ok(None),
                Err(failure) if failure.is_held_key() => true,
                Err(failure) => return Err(failure.into()),
            }
        }
    };
    let error = if requeue_refused {
        not_retried("lease expired")
    } else {
        last_attempt.to_owned()
    };
    Ok(exec.reap_fail(id, &error).await?.then_some(false))
}

/// Requeues expired task `id` after `delay_micros`, in a savepoint or short transaction
/// (a unique violation must not abort a caller's transaction on PostgreSQL). Whether it
/// applied.
async fn requeue(exec: &mut Executor<'_>, id: Uuid, delay_micros: i64) -> Result<bool, Failure> {
    let mut txn = exec.begin(false).await?;
    let outcome = txn.reap_requeue(id, delay_micros).await;
    txn.finish(outcome).await
}
