//! [`TaskLifecycle`]: the lifecycle that moves tasks out of the active set, with leases.
//!
//! Every transition is a compare-and-set on `status` (and on `lease_owner` where a
//! lease applies) in one statement, or on MySQL/MariaDB in one short transaction. A
//! transition that does not apply changes nothing and says why; one that already took
//! effect for the same caller returns the stored outcome, so a call repeated after a lost
//! connection is safe.
//!
//! The trait and its delegations are here; each concern in a file of its own: the claim
//! ([`claim`], and which statement it runs, [`claim_mode`]; a limited type's, [`limited`]), the transitions of one task
//! ([`transition`]), the reaper ([`reap`]), a worker's batch of endings ([`endings`]).
//! Pause and retention are maintenance's ([`crate::maintenance`]): the trait only offers
//! them on the same handles.

mod claim;
mod claim_mode;
pub(crate) mod endings;
mod limited;
mod reap;
mod transition;

/// The Worker's claim: [`TaskLifecycle::claim_many`] and when a rate's window opens.
#[cfg(feature = "worker")]
pub(crate) use claim::claim_many;

use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use crate::maintenance::pause::{self, PausedType};
use crate::maintenance::retention::{self as pruner, PruneReport, Retention};
use crate::values::backoff::{Retry, RetryPolicy};
use crate::values::connection::DedupConnection;
use crate::values::error::DedupError;
use task_dedup_entity::task_run;

/// How many times a claim is run again after losing a race to another claim (for a key's
/// run, or for a run slot), before it returns what it has. Each loss means another claim
/// won.
const MAX_CLAIM_RACES: u32 = 5;

/// What [`TaskLifecycle::reap_expired`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReapReport {
    /// Running tasks whose lease expired, returned to `queued` for another attempt.
    pub requeued: u64,
    /// Running tasks whose lease expired on their last allowed attempt (or that could not
    /// be requeued), now `failed`.
    pub failed: u64,
}

/// The worker side: claim queued tasks under a lease, keep the lease alive, finish or
/// retry tasks, reap the leases of crashed workers and prune old history.
///
/// Lease and due times come from the database's clock, so workers on several machines
/// agree. Implemented for the same handles as [`TaskDedup`](crate::TaskDedup); sealed
/// likewise.
///
/// A lost connection (on a pool) is retried within the handle's retry budget, and a
/// deadlock outside the caller's transaction is run again, as for `find_or_enqueue`;
/// every transition is idempotent for its caller, so a repeat after an attempt that took
/// effect returns what it stored.
#[async_trait]
pub trait TaskLifecycle: crate::values::connection::sealed::Sealed {
    /// Atomically moves the next due `queued` task (of `task_types`, or of any type when
    /// empty) to `running`, owned by `worker_id` until now + `lease`: the highest
    /// priority first, then the oldest `run_at`, then the oldest task; a task whose
    /// `run_at` is in the future is not due. Increments `attempts` and sets `started_at`.
    /// Each queued task goes to exactly one worker. `None` when nothing is due.
    ///
    /// One run per key: a task is not due while another task of its key is `running`
    /// (whatever their scopes; [`NewTask::concurrent`](crate::NewTask::concurrent) tasks
    /// aside), and tasks behind it are claimed past it. The database's
    /// `task_running_resource_uidx` guarantees it; a claim that loses a key to a
    /// concurrent claim is run again (up to 5 times, then it returns nothing), never an
    /// error. On a pool the first claim is optimistic (it leaves the refusal of a second
    /// run to the index) and one the index refused is run again looking for running
    /// tasks of its keys, as claims then do for a second (README "One run per key").
    ///
    /// A claim lost with its connection is not retried by the library: it may have taken
    /// effect, and its task then comes back when the lease expires and the reaper
    /// requeues it.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] for an empty or over-long worker id or task type,
    /// or a lease of zero or over [`MAX_LEASE`](crate::MAX_LEASE);
    /// [`DedupError::Database`].
    async fn claim(
        &self,
        worker_id: &str,
        task_types: &[&str],
        lease: Duration,
    ) -> Result<Option<task_run::Model>, DedupError>;

    /// [`claim`](Self::claim) for up to `max` tasks in one statement (one short
    /// transaction on MySQL), in claim order, at most one per key. Empty when nothing is
    /// due. A worker that
    /// has several free slots fills them with one round trip instead of one each.
    ///
    /// # Errors
    /// As [`claim`](Self::claim), and [`DedupError::InvalidArgument`] for a `max` of 0 or
    /// over [`MAX_CLAIM`](crate::MAX_CLAIM).
    async fn claim_many(
        &self,
        worker_id: &str,
        task_types: &[&str],
        lease: Duration,
        max: usize,
    ) -> Result<Vec<task_run::Model>, DedupError>;

    /// Extends the lease of a task `worker_id` is running to now + `lease`.
    ///
    /// # Errors
    /// [`DedupError::NotFound`]; [`DedupError::InvalidTransition`] when the task is not
    /// running (it finished, was cancelled, or the reaper requeued it);
    /// [`DedupError::LeaseNotHeld`] when another worker holds it now; as
    /// [`claim`](Self::claim) for the arguments.
    async fn heartbeat(
        &self,
        id: Uuid,
        worker_id: &str,
        lease: Duration,
    ) -> Result<task_run::Model, DedupError>;

    /// `running` → `succeeded` with `result`, releasing the key (unless its scope is a
    /// period window). Repeated by the same worker, returns the stored outcome.
    ///
    /// # Errors
    /// As [`heartbeat`](Self::heartbeat); [`DedupError::InvalidArgument`] when `result`
    /// has a NUL character in a string or key.
    async fn complete(
        &self,
        id: Uuid,
        worker_id: &str,
        result: Option<serde_json::Value>,
    ) -> Result<task_run::Model, DedupError>;

    /// Ends a failed attempt. [`Retry::Never`]: `running` → `failed` with `error`,
    /// releasing the key. [`Retry::After`]: `running` → `queued` with `error` and `run_at`
    /// that far in the future (by the database's clock), in one statement, so the key
    /// stays held throughout and no duplicate can slip in. Use
    /// [`RetryPolicy::after_attempt`] with the task's `attempts` for exponential backoff
    /// with an attempt limit.
    ///
    /// A [`Scope::Queued`](crate::Scope::Queued) task may have a follow-up queued behind
    /// it; then it is not retried but fails for good, its error saying so: the follow-up
    /// does the work. Repeated by the same worker, returns the stored outcome.
    ///
    /// # Errors
    /// As [`heartbeat`](Self::heartbeat); [`DedupError::InvalidArgument`] when `error`
    /// has a NUL byte or more than
    /// [`ERROR_MAX_CHARS`](crate::task_run::ERROR_MAX_CHARS) characters, or the delay
    /// does not fit in microseconds.
    async fn fail(
        &self,
        id: Uuid,
        worker_id: &str,
        error: &str,
        retry: Retry,
    ) -> Result<task_run::Model, DedupError>;

    /// `queued` or `running` → `cancelled` with `reason` in `error`, releasing the key.
    /// Needs no lease: cancelling is the application's decision, not a worker's.
    /// Cancelling a cancelled task returns it as stored.
    ///
    /// # Errors
    /// [`DedupError::NotFound`]; [`DedupError::InvalidTransition`] when the task already
    /// finished otherwise; [`DedupError::InvalidArgument`] for a `reason` as `fail`
    /// rejects.
    async fn cancel(&self, id: Uuid, reason: &str) -> Result<task_run::Model, DedupError>;

    /// Hands a task `worker_id` is running back to the queue: `running` → `queued`, lease
    /// cleared, the attempt not counted (`attempts` back to what it was before the
    /// claim), due at once. For a worker shutting down before its handler finished: the
    /// task does not wait for its lease to expire. The key stays held throughout. A
    /// [`Scope::Queued`](crate::Scope::Queued) task with a follow-up queued behind it is
    /// cancelled instead (the follow-up does the work). Repeated by the same worker,
    /// returns the stored outcome.
    ///
    /// # Errors
    /// As [`heartbeat`](Self::heartbeat).
    async fn release(&self, id: Uuid, worker_id: &str) -> Result<task_run::Model, DedupError>;

    /// A handler's "run me again in `delay`" for a task `worker_id` is running: `running`
    /// → `queued`, due `delay` from now by the database's clock, lease cleared, the
    /// attempt not counted (`attempts` back to what it was before the claim) and
    /// `snoozes` counted. The key stays held throughout, so no duplicate can be enqueued
    /// while it waits. A [`Scope::Queued`](crate::Scope::Queued) task with a follow-up
    /// queued behind it is cancelled instead, as [`release`](Self::release) does. The
    /// bound on snoozes is the caller's (the [`Worker`](crate::Worker)'s
    /// [`max_snoozes`](crate::WorkerBuilder::max_snoozes) reads `snoozes` off the
    /// claimed row). Repeated by the same worker, returns the stored outcome.
    ///
    /// # Errors
    /// As [`heartbeat`](Self::heartbeat); [`DedupError::InvalidArgument`] for a `delay`
    /// over 100 years.
    async fn snooze(
        &self,
        id: Uuid,
        worker_id: &str,
        delay: Duration,
    ) -> Result<task_run::Model, DedupError>;

    /// Returns `running` tasks whose lease expired to `queued` (lease cleared) after the
    /// backoff `policy` gives for their attempts, or marks them `failed` once `attempts`
    /// reached `policy.max_attempts`. A heartbeat that extended the lease first wins: the
    /// task stays with its worker. Safe to run from every worker at once: each task is
    /// reaped by exactly one of them. At most 100 tasks per call.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] for an invalid policy; [`DedupError::Database`].
    async fn reap_expired(&self, policy: &RetryPolicy) -> Result<ReapReport, DedupError>;

    /// Deletes finished tasks (`succeeded`, `failed`, `cancelled`) whose `finished_at`
    /// is older than `older_than`, except period-scoped tasks whose window is not over
    /// (they still hold it). Never touches an active task. Returns how many rows it
    /// deleted. The same as [`prune`](Self::prune) with
    /// [`Retention::all(older_than)`](crate::Retention::all): in batches of 1,000.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] when `older_than` is over 100 years;
    /// [`DedupError::Database`].
    async fn prune_finished(&self, older_than: Duration) -> Result<u64, DedupError>;

    /// Deletes the finished tasks `retention` no longer keeps: per status with an age,
    /// those that finished longer ago than it, oldest first, in batches of
    /// `retention.batch_size` rows (one statement each) until a batch comes back short.
    /// A period-scoped task is kept until its window is over, however long ago it
    /// finished. Never touches an active task. A [`Worker`](crate::Worker) runs it every
    /// `retention.every` ([`WorkerBuilder::retention`](crate::WorkerBuilder::retention)).
    ///
    /// Safe from every worker at once: on PostgreSQL each batch skips the rows another
    /// pruner has locked; elsewhere pruners wait for each other's short batches. Each row
    /// is deleted once, and a pruner stopped or killed between or inside batches leaves
    /// every row deleted or whole.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] for invalid settings ([`Retention::validate`](crate::Retention::validate)),
    /// before any SQL; [`DedupError::Database`].
    async fn prune(&self, retention: &Retention) -> Result<PruneReport, DedupError>;

    /// Pauses `task_type`: no worker claims its tasks until it is
    /// [`resume`](Self::resume)d. Stored in the database (`task_dedup_paused`), so every
    /// worker of every process honours it from its next claim on (within one poll or
    /// wake-up); tasks already running go on. Enqueueing is not affected: its tasks
    /// queue up. Returns whether the type was not paused before.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] (`task_type`) for an empty or over-long name or
    /// one with a NUL byte; [`DedupError::Database`].
    async fn pause(&self, task_type: &str) -> Result<bool, DedupError>;

    /// Resumes a paused `task_type`: its tasks are claimed again, and workers that wait
    /// for notifications are woken. Returns whether it was paused.
    ///
    /// # Errors
    /// As [`pause`](Self::pause).
    async fn resume(&self, task_type: &str) -> Result<bool, DedupError>;

    /// The paused task types, by name, with when each was paused.
    ///
    /// # Errors
    /// [`DedupError::Database`].
    async fn paused(&self) -> Result<Vec<PausedType>, DedupError>;
}

#[async_trait]
impl<C: DedupConnection> TaskLifecycle for C {
    #[tracing::instrument(level = "debug", skip_all, fields(worker_id = %worker_id, ?task_types))]
    async fn claim(
        &self,
        worker_id: &str,
        task_types: &[&str],
        lease: Duration,
    ) -> Result<Option<task_run::Model>, DedupError> {
        Ok(self
            .claim_many(worker_id, task_types, lease, 1)
            .await?
            .pop())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(worker_id = %worker_id, ?task_types, max))]
    async fn claim_many(
        &self,
        worker_id: &str,
        task_types: &[&str],
        lease: Duration,
        max: usize,
    ) -> Result<Vec<task_run::Model>, DedupError> {
        Ok(claim::claim_many(self, worker_id, task_types, lease, max)
            .await?
            .tasks)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %id, worker_id = %worker_id))]
    async fn heartbeat(
        &self,
        id: Uuid,
        worker_id: &str,
        lease: Duration,
    ) -> Result<task_run::Model, DedupError> {
        transition::heartbeat(self, id, worker_id, lease).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %id, worker_id = %worker_id))]
    async fn complete(
        &self,
        id: Uuid,
        worker_id: &str,
        result: Option<serde_json::Value>,
    ) -> Result<task_run::Model, DedupError> {
        transition::complete(self, id, worker_id, result).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %id, worker_id = %worker_id, ?retry))]
    async fn fail(
        &self,
        id: Uuid,
        worker_id: &str,
        error: &str,
        retry: Retry,
    ) -> Result<task_run::Model, DedupError> {
        transition::fail(self, id, worker_id, error, retry).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %id))]
    async fn cancel(&self, id: Uuid, reason: &str) -> Result<task_run::Model, DedupError> {
        transition::cancel(self, id, reason).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %id, worker_id = %worker_id))]
    async fn release(&self, id: Uuid, worker_id: &str) -> Result<task_run::Model, DedupError> {
        transition::release(self, id, worker_id).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %id, worker_id = %worker_id))]
    async fn snooze(
        &self,
        id: Uuid,
        worker_id: &str,
        delay: Duration,
    ) -> Result<task_run::Model, DedupError> {
        transition::snooze(self, id, worker_id, delay).await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn reap_expired(&self, policy: &RetryPolicy) -> Result<ReapReport, DedupError> {
        reap::reap_expired(self, policy).await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn prune_finished(&self, older_than: Duration) -> Result<u64, DedupError> {
        let retention = Retention::all(older_than);
        if retention.validate().is_err() {
            return Err(crate::values::validate::InvalidArgument::out_of_range(
                "older_than",
                "an age of at most 100 years",
            )
            .into());
        }
        Ok(pruner::prune(self, &retention).await?.total())
    }

    #[tracing::instrument(level = "debug", name = "prune", skip_all)]
    async fn prune(&self, retention: &Retention) -> Result<PruneReport, DedupError> {
        pruner::prune(self, retention).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_type = %task_type))]
    async fn pause(&self, task_type: &str) -> Result<bool, DedupError> {
        pause::set(self, task_type, pause::Action::Pause).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_type = %task_type))]
    async fn resume(&self, task_type: &str) -> Result<bool, DedupError> {
        pause::set(self, task_type, pause::Action::Resume).await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn paused(&self) -> Result<Vec<PausedType>, DedupError> {
        pause::list(self).await
    }
}
