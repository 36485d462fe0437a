//! The one retry driver: every operation runs its attempts through [`Retrying`], which
//! runs one again when the database aborted it to break a deadlock (outside the caller's
//! transaction) or its connection was lost (on a pool, within a time budget), and tells
//! the operation when an earlier attempt may have committed unseen (an ambiguous
//! commit), so that it looks for what that attempt wrote before writing again.

use std::time::Duration;

use sea_orm::{DbErr, RuntimeErr};
use tokio::time::Instant;

use crate::executor::Pool;
use crate::values::connection::{DedupConnection, Target};
use crate::values::error::DedupError;

/// How many attempts an operation gets before it gives up on the database aborting it
/// to break deadlocks ([`DedupError::Contention`] for an enqueue, else
/// [`DedupError::TransactionAborted`]); also how many inserts `find_or_enqueue` tries
/// when the task holding the key keeps letting go of it before it can be read.
pub const MAX_ENQUEUE_ATTEMPTS: u32 = 16;

/// The attempts of one call: run each through [`Retrying::run`] until it gives an
/// outcome.
///
/// - A deadlock or serialization failure ([`DedupError::TransactionAborted`]) outside
///   the caller's transaction: run again after a random pause of up to 2^n ms (64 ms at
///   most), [`MAX_ENQUEUE_ATTEMPTS`] attempts in all. Inside the caller's transaction
///   the whole transaction is gone: only the caller can run it again.
/// - A lost connection on a pool: run again until `budget` has passed since the first
///   loss. Before each retry the pool's idle connections are checked and the dead ones
///   closed, so that neither this call nor the next ones are handed a string of
///   connections the server already dropped; then a pause with jitter, growing from
///   10 ms to 500 ms. A retry is cut off where the budget ends (while a server is down,
///   the pool keeps trying to connect for its whole acquire timeout). In a transaction
///   nothing is retried: the transaction went with its connection.
pub(crate) struct Retrying<'c> {
    pool: Option<Pool<'c>>,
    in_transaction: bool,
    budget: Duration,
    operation: &'static str,
    deadline: Option<Instant>,
    lost: u32,
    aborted: u32,
}

impl<'c> Retrying<'c> {
    /// The attempts of `operation` on `db`, with `budget` after a lost connection (the
    /// handle's own when `None`).
    pub(crate) fn new<C: DedupConnection + ?Sized>(
        db: &'c C,
        budget: Option<Duration>,
        operation: &'static str,
    ) -> Retrying<'c> {
        let budget = budget.unwrap_or_else(|| db.retry_budget());
        let (pool, in_transaction) = match db.target() {
            Target::Pool(db) => (Pool::of(db).filter(|_| !budget.is_zero()), false),
            Target::Transaction(_) => (None, true),
        };
        Retrying {
            pool,
            in_transaction,
            budget,
            operation,
            deadline: None,
            lost: 0,
            aborted: 0,
        }
    }

    /// Whether an attempt of this call was lost with its connection: it may have
    /// committed.
    pub(crate) fn after_lost_attempt(&self) -> bool {
        self.lost > 0
    }

    /// Runs one attempt. `Some(outcome)` is the call's outcome; `None`: run another.
    pub(crate) async fn run<T>(
        &mut self,
        attempt: impl Future<Output = Result<T, DedupError>>,
    ) -> Option<Result<T, DedupError>> {
        let outcome = match self.deadline {
            None => attempt.await,
            Some(deadline) => match tokio::time::timeout_at(deadline, attempt).await {
                Ok(outcome) => outcome,
                Err(_) => return Some(Err(self.give_up(None))),
            },
        };
        match outcome {
            Err(DedupError::ConnectionLost(err)) if self.pool.is_some() => {
                self.after_loss(err).await
            }
            Err(err @ DedupError::TransactionAborted(_)) if !self.in_transaction => {
                self.after_abort(err).await
            }
            outcome => {
                if outcome.is_ok() && self.lost > 0 {
                    let (operation, retries) = (self.operation, self.lost);
                    tracing::info!(operation, retries, "succeeded after a lost connection");
                }
                Some(outcome)
            }
        }
    }

    async fn after_abort<T>(&mut self, err: DedupError) -> Option<Result<T, DedupError>> {
        self.aborted += 1;
        let (operation, attempt) = (self.operation, self.aborted);
        if attempt >= MAX_ENQUEUE_ATTEMPTS {
            tracing::warn!(
                operation,
                attempts = attempt,
                "gave up: the database kept aborting it"
            );
            return Some(Err(err));
        }
        tracing::debug!(operation, attempt, error = %err, "aborted by a deadlock; running it again");
        tokio::time::sleep(deadlock_pause(attempt)).await;
        None
    }

    async fn after_loss<T>(&mut self, err: DbErr) -> Option<Result<T, DedupError>> {
        self.lost += 1;
        crate::metrics::connection_retry(self.operation);
        let budget = self.budget;
        let deadline = *self.deadline.get_or_insert_with(|| Instant::now() + budget);
        let (operation, lost) = (self.operation, self.lost);
        tracing::warn!(operation, lost, error = %err, "connection lost; retrying on a fresh connection");
        let pool = self.pool?;
        // Boxed: rare, and its pings' state would otherwise sit in every call's future.
        let recover = Box::pin(async move {
            // A pool opened on several hosts: the primary may have moved.
            #[cfg(feature = "postgres")]
            let moved = match pool {
                Pool::Postgres(pool) => super::formation::repoint(pool).await,
                #[allow(unreachable_patterns)]
                _ => false,
            };
            #[cfg(not(feature = "postgres"))]
            let moved = false;
            pool.close_dead_connections(moved).await;
            tokio::time::sleep(reconnect_pause(lost)).await;
        });
        match tokio::time::timeout_at(deadline, recover).await {
            Ok(()) => None,
            Err(_) => Some(Err(self.give_up(Some(err)))),
        }
    }

    fn give_up(&self, last: Option<DbErr>) -> DedupError {
        let (operation, budget) = (self.operation, self.budget);
        tracing::warn!(operation, ?budget, "gave up: connection lost");
        DedupError::ConnectionLost(last.unwrap_or_else(|| {
            DbErr::Conn(RuntimeErr::Internal(format!(
                "no answer within the retry budget ({budget:?}) after a lost connection"
            )))
        }))
    }
}

/// A random pause after deadlock number `attempt`, up to 2^attempt ms (at most 64 ms),
/// so that callers a deadlock aborted together do not collide again.
fn deadlock_pause(attempt: u32) -> Duration {
    let ceiling_micros = (1u64 << attempt.min(6)) * 1_000;
    Duration::from_micros(rand::random_range(0..ceiling_micros))
}

/// A random pause before retry number `lost`: up to 10 ms, doubling to 500 ms.
fn reconnect_pause(lost: u32) -> Duration {
    let ceiling_ms = (10u64 << lost.saturating_sub(1).min(6)).min(500);
    Duration::from_micros(rand::random_range(ceiling_ms * 500..=ceiling_ms * 1_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_and_stay_bounded() {
        for lost in 1..40 {
            let pause = reconnect_pause(lost);
            assert!(pause <= Duration::from_millis(500), "{lost}: {pause:?}");
            assert!(pause >= Duration::from_millis(5), "{lost}: {pause:?}");
        }
        assert!(reconnect_pause(1) <= Duration::from_millis(10));
        for attempt in 1..40 {
            assert!(deadlock_pause(attempt) < Duration::from_millis(64));
        }
    }
}
