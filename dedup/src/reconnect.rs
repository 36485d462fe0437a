//! Surviving a lost connection: the idempotent calls (`find_or_enqueue`, `find_active`,
//! the worker transitions) run again on a fresh connection when the one they used was
//! lost, within a time budget, on a pool only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sea_orm::{DatabaseConnection, DbErr, RuntimeErr};
use tokio::time::Instant;

use crate::connection::{self, DedupConnection};
use crate::error::DedupError;

/// How long a call keeps retrying after its connection was lost, unless changed with
/// [`set_default_retry_budget`] or per call
/// ([`NewTask::retry_budget`](crate::NewTask::retry_budget)).
pub const DEFAULT_RETRY_BUDGET: Duration = Duration::from_secs(5);

static DEFAULT_BUDGET_MICROS: AtomicU64 = AtomicU64::new(5_000_000);

/// Sets the retry budget of every call that does not set its own, process-wide (a
/// start-up setting, like a pool's size). `Duration::ZERO` turns the retries off.
pub fn set_default_retry_budget(budget: Duration) {
    let micros = u64::try_from(budget.as_micros()).unwrap_or(u64::MAX);
    DEFAULT_BUDGET_MICROS.store(micros, Ordering::Relaxed);
}

/// The retry budget of calls that do not set their own.
pub fn default_retry_budget() -> Duration {
    Duration::from_micros(DEFAULT_BUDGET_MICROS.load(Ordering::Relaxed))
}

/// The retries of one call: run each attempt through [`Retrying::run`] until it gives an
/// outcome. On a pool, an attempt that fails with a lost connection is run again, until
/// `budget` has passed since the first loss; the caller can ask whether a lost attempt
/// came before ([`Retrying::after_lost_attempt`]): that one may have taken effect.
///
/// Before each retry the pool's idle connections are checked and the dead ones closed,
/// so that neither this call nor the next ones are handed a string of connections the
/// server already dropped; then a pause with jitter, growing from 10 ms to 500 ms. A
/// retry is cut off where the budget ends (while a server is down, the pool keeps trying
/// to connect for its whole acquire timeout). In a transaction nothing is retried: the
/// transaction went with its connection.
pub(crate) struct Retrying<'a> {
    pool: Option<&'a DatabaseConnection>,
    budget: Duration,
    operation: &'static str,
    deadline: Option<Instant>,
    lost: u32,
}

impl<'a> Retrying<'a> {
    pub(crate) fn new<C: DedupConnection + ?Sized>(
        db: &'a C,
        budget: Duration,
        operation: &'static str,
    ) -> Retrying<'a> {
        Retrying {
            pool: db.pool().filter(|_| !budget.is_zero()),
            budget,
            operation,
            deadline: None,
            lost: 0,
        }
    }

    /// Whether an attempt of this call was lost with its connection.
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
        let err = match outcome {
            Err(DedupError::ConnectionLost(err)) if self.pool.is_some() => err,
            outcome => {
                if outcome.is_ok() && self.lost > 0 {
                    let (operation, retries) = (self.operation, self.lost);
                    tracing::info!(operation, retries, "succeeded after a lost connection");
                }
                return Some(outcome);
            }
        };
        self.lost += 1;
        crate::metrics::connection_retry(self.operation);
        let budget = self.budget;
        let deadline = *self.deadline.get_or_insert_with(|| Instant::now() + budget);
        let (operation, lost) = (self.operation, self.lost);
        tracing::warn!(operation, lost, error = %err, "connection lost; retrying on a fresh connection");
        let pool = self.pool?;
        let recover = async {
            connection::close_dead_connections(pool).await;
            tokio::time::sleep(pause(lost)).await;
        };
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

/// A random pause before retry number `lost`: up to 10 ms, doubling to 500 ms.
fn pause(lost: u32) -> Duration {
    let ceiling_ms = (10u64 << lost.saturating_sub(1).min(6)).min(500);
    Duration::from_micros(rand::random_range(ceiling_ms * 500..=ceiling_ms * 1_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_and_stay_bounded() {
        for lost in 1..40 {
            let pause = pause(lost);
            assert!(pause <= Duration::from_millis(500), "{lost}: {pause:?}");
            assert!(pause >= Duration::from_millis(5), "{lost}: {pause:?}");
        }
        assert!(pause(1) <= Duration::from_millis(10));
    }

    #[test]
    fn the_default_budget_can_be_changed_and_turned_off() {
        assert_eq!(default_retry_budget(), DEFAULT_RETRY_BUDGET);
        set_default_retry_budget(Duration::ZERO);
        assert_eq!(default_retry_budget(), Duration::ZERO);
        set_default_retry_budget(DEFAULT_RETRY_BUDGET);
    }
}
