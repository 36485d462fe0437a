//! Retention: how long finished tasks are kept ([`Retention`]), and the pruner that
//! deletes the rest in bounded batches ([`prune`], behind
//! [`TaskLifecycle::prune`](crate::TaskLifecycle::prune)). A [`Worker`](crate::Worker) runs it
//! by default.

use std::time::Duration;

use crate::connect::retry::Retrying;
use crate::executor::Executor;
use crate::values::connection::DedupConnection;
use crate::values::error::DedupError;
use crate::values::validate::{self, InvalidArgument};
use task_dedup_entity::TaskStatus;

/// The longest age [`Retention`] takes: about 100 years (older cut-offs fall outside
/// what PostgreSQL's timestamps hold).
const MAX_AGE: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The most rows one batch deletes.
pub const MAX_PRUNE_BATCH: usize = 100_000;

/// How long finished tasks are kept before they are pruned, per status, and how the
/// pruner works: in batches of at most `batch_size` rows, one statement each (so that no
/// statement holds its locks for long), every `every` in a [`Worker`](crate::Worker).
///
/// The default keeps `succeeded` and `cancelled` tasks 24 hours and `failed` tasks 7
/// days (River's defaults), deleting 1,000 rows a batch, every minute. `None` keeps a
/// status forever; [`Retention::off`] keeps everything.
///
/// A period-scoped task ([`Scope::Period`](crate::Scope::Period)) is kept until its
/// window is over, however long ago it finished: it holds the window's key until then,
/// and pruning it would let a second task into the window.
///
/// ```
/// use std::time::Duration;
/// use task_dedup::Retention;
///
/// let retention = Retention::default()
///     .failed(Some(Duration::from_secs(30 * 86_400)))
///     .cancelled(None)
///     .batch_size(500);
/// assert!(retention.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    /// How long `succeeded` tasks are kept after they finished; `None`: forever.
    pub succeeded: Option<Duration>,
    /// How long `failed` tasks are kept after they finished; `None`: forever.
    pub failed: Option<Duration>,
    /// How long `cancelled` tasks are kept after they finished; `None`: forever.
    pub cancelled: Option<Duration>,
    /// The most rows one statement deletes: 1 to [`MAX_PRUNE_BATCH`].
    pub batch_size: usize,
    /// How often a [`Worker`](crate::Worker) prunes (give or take a fifth).
    pub every: Duration,
}

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            succeeded: Some(Duration::from_secs(24 * 60 * 60)),
            failed: Some(Duration::from_secs(7 * 24 * 60 * 60)),
            cancelled: Some(Duration::from_secs(24 * 60 * 60)),
            batch_size: 1_000,
            every: Duration::from_secs(60),
        }
    }
}

impl Retention {
    /// Keeps every finished task: a worker with it prunes nothing.
    pub fn off() -> Retention {
        Retention {
            succeeded: None,
            failed: None,
            cancelled: None,
            ..Retention::default()
        }
    }

    /// Keeps finished tasks of every status for `age`.
    pub fn all(age: Duration) -> Retention {
        Retention {
            succeeded: Some(age),
            failed: Some(age),
            cancelled: Some(age),
            ..Retention::default()
        }
    }

    /// How long `succeeded` tasks are kept; `None`: forever.
    pub fn succeeded(mut self, age: Option<Duration>) -> Retention {
        self.succeeded = age;
        self
    }

    /// How long `failed` tasks are kept; `None`: forever.
    pub fn failed(mut self, age: Option<Duration>) -> Retention {
        self.failed = age;
        self
    }

    /// How long `cancelled` tasks are kept; `None`: forever.
    pub fn cancelled(mut self, age: Option<Duration>) -> Retention {
        self.cancelled = age;
        self
    }

    /// The most rows one statement deletes.
    pub fn batch_size(mut self, rows: usize) -> Retention {
        self.batch_size = rows;
        self
    }

    /// How often a worker prunes.
    pub fn every(mut self, every: Duration) -> Retention {
        self.every = every;
        self
    }

    /// Whether it keeps everything (no status has an age).
    pub fn is_off(&self) -> bool {
        self.statuses().next().is_none()
    }

    /// The statuses it prunes, with their ages.
    fn statuses(&self) -> impl Iterator<Item = (TaskStatus, Duration)> + use<> {
        [
            (TaskStatus::Succeeded, self.succeeded),
            (TaskStatus::Failed, self.failed),
            (TaskStatus::Cancelled, self.cancelled),
        ]
        .into_iter()
        .filter_map(|(status, age)| Some((status, age?)))
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] naming the setting: an age over 100 years
    /// (`succeeded`, `failed`, `cancelled`), a `batch_size` of 0 or over
    /// [`MAX_PRUNE_BATCH`], an `every` of zero.
    pub fn validate(&self) -> Result<(), DedupError> {
        for (name, age) in [
            ("succeeded", self.succeeded),
            ("failed", self.failed),
            ("cancelled", self.cancelled),
        ] {
            if age.is_some_and(|age| age > MAX_AGE) {
                return Err(
                    InvalidArgument::out_of_range(name, "an age of at most 100 years").into(),
                );
            }
        }
        if self.batch_size == 0 || self.batch_size > MAX_PRUNE_BATCH {
            return Err(InvalidArgument::out_of_range(
                "batch_size",
                "1 to 100,000 (MAX_PRUNE_BATCH)",
            )
            .into());
        }
        if self.every.is_zero() {
            return Err(InvalidArgument::out_of_range("every", "more than zero").into());
        }
        Ok(())
    }
}

/// What one [`prune`](crate::TaskLifecycle::prune) deleted, per status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PruneReport {
    /// `succeeded` tasks deleted.
    pub succeeded: u64,
    /// `failed` tasks deleted.
    pub failed: u64,
    /// `cancelled` tasks deleted.
    pub cancelled: u64,
}

impl PruneReport {
    /// Tasks deleted, of every status.
    pub fn total(&self) -> u64 {
        self.succeeded + self.failed + self.cancelled
    }

    fn add(&mut self, status: TaskStatus, rows: u64) {
        match status {
            TaskStatus::Succeeded => self.succeeded += rows,
            TaskStatus::Failed => self.failed += rows,
            TaskStatus::Cancelled => self.cancelled += rows,
            _ => {}
        }
    }
}

/// Deletes, per status that `retention` gives an age, the tasks that finished longer
/// ago than that age (period tasks only once their window is over), oldest first, in
/// batches until a batch comes back short. Each batch is one statement: a pruner
/// stopped between batches (or killed) leaves every row either deleted or whole.
pub(crate) async fn prune<C: DedupConnection + ?Sized>(
    db: &C,
    retention: &Retention,
) -> Result<PruneReport, DedupError> {
    retention.validate()?;
    let batch = retention.batch_size as i64;
    let mut exec = Executor::on(db)?;
    let mut report = PruneReport::default();
    for (status, age) in retention.statuses() {
        let age_micros = validate::micros(status.as_str(), age)?;
        loop {
            // A deadlock (InnoDB: a batch against a claim or an ending) is run again.
            let mut retrying = Retrying::new(db, None, "prune");
            let deleted = loop {
                let attempt = async {
                    Ok::<_, DedupError>(exec.prune(status.as_str(), age_micros, batch).await?)
                };
                // Boxed, as in the lifecycle's `retried`.
                if let Some(outcome) = retrying.run(Box::pin(attempt)).await {
                    break outcome?;
                }
            };
            report.add(status, deleted);
            crate::metrics::pruned(status.as_str(), deleted);
            if deleted < batch as u64 {
                break;
            }
        }
    }
    if report.total() > 0 {
        tracing::info!(
            succeeded = report.succeeded,
            failed = report.failed,
            cancelled = report.cancelled,
            "finished tasks pruned"
        );
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_rivers_cleaner() {
        let retention = Retention::default();
        assert_eq!(retention.succeeded, Some(Duration::from_secs(86_400)));
        assert_eq!(retention.cancelled, Some(Duration::from_secs(86_400)));
        assert_eq!(retention.failed, Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(retention.batch_size, 1_000);
        assert!(retention.validate().is_ok());
        assert!(!retention.is_off());
        assert!(Retention::off().is_off());
        assert!(
            Retention::default()
                .succeeded(None)
                .failed(None)
                .cancelled(None)
                .is_off()
        );
    }

    #[test]
    fn invalid_settings_are_named() {
        let name = |retention: Retention| match retention.validate() {
            Err(DedupError::InvalidArgument { name, .. }) => name,
            other => panic!("{other:?}"),
        };
        assert_eq!(name(Retention::default().batch_size(0)), "batch_size");
        assert_eq!(
            name(Retention::default().batch_size(MAX_PRUNE_BATCH + 1)),
            "batch_size"
        );
        assert_eq!(name(Retention::default().every(Duration::ZERO)), "every");
        assert_eq!(name(Retention::all(Duration::MAX)), "succeeded");
        assert_eq!(
            name(Retention::off().failed(Some(MAX_AGE + Duration::from_secs(1)))),
            "failed"
        );
        assert!(Retention::all(Duration::ZERO).validate().is_ok());
    }
}
