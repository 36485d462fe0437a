//! [`TaskWorker`]: the lifecycle that moves tasks out of the active set, with leases.
//!
//! Every transition is a compare-and-set on `status` (and on `lease_owner` where a
//! lease applies) in one statement, or on MySQL/MariaDB in one short transaction. A
//! transition that does not apply changes nothing and says why; one that already took
//! effect for the same caller returns the stored outcome, so a call repeated after a lost
//! connection is safe.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use crate::TaskStatus;
use crate::connect::retry::Retrying;
use crate::dialect::{Claim, Failure};
/// A worker's batch of endings of one shape, as [`end_many`] takes it.
pub(crate) use crate::executor::EndMany;
use crate::executor::{Change, Executor};
use crate::maintenance::pause::PausedType;
use crate::maintenance::retention::{PruneReport, Retention};
use crate::task_run;
use crate::values::backoff::{Retry, RetryPolicy};
use crate::values::connection::DedupConnection;
use crate::values::error::{DedupError, Transition};
use crate::values::validate;

/// What [`TaskWorker::reap_expired`] did.
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
pub trait TaskWorker: crate::values::connection::sealed::Sealed {
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

/// How many times a claim is run again after losing the race for a key's run to another
/// claim, before it returns empty-handed. Each loss means another claim won.
const MAX_CLAIM_RACES: u32 = 5;

/// Who may perform a transition, and what its effect looks like once it took effect.
#[derive(Clone, Copy)]
enum Guard<'a> {
    /// The task is running under this worker's lease; afterwards it is in one of the
    /// `done` states with this worker recorded as `lease_owner`.
    LeaseHolder {
        worker_id: &'a str,
        done: &'static [TaskStatus],
    },
    /// The task is queued or running; afterwards it is `cancelled`.
    Active,
}

#[async_trait]
impl<C: DedupConnection> TaskWorker for C {
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
        validate::worker_id(worker_id)?;
        validate::task_types(task_types)?;
        let lease_micros = validate::lease_micros(lease)?;
        let max = validate::claim_max(max)?;
        let mut exec = Executor::new(self.target())?;
        // A claim lost with its connection is not run again (it may have taken effect:
        // its tasks come back through the reaper); an aborted one took nothing.
        let mut retrying = Retrying::new(self, Some(Duration::ZERO), "claim");
        let mut races = 0;
        let mut how = crate::claim_mode::choose(&mut exec).await;
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
                    crate::claim_mode::met_running_key(&exec);
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

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %id, worker_id = %worker_id))]
    async fn heartbeat(
        &self,
        id: Uuid,
        worker_id: &str,
        lease: Duration,
    ) -> Result<task_run::Model, DedupError> {
        validate::worker_id(worker_id)?;
        let lease_micros = validate::lease_micros(lease)?;
        let guard = Guard::LeaseHolder {
            worker_id,
            done: &[TaskStatus::Running],
        };
        let change = Change::Heartbeat {
            lease_micros,
            worker_id,
        };
        retried(self, id, Op::Plain(Transition::Heartbeat, guard, change)).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %id, worker_id = %worker_id))]
    async fn complete(
        &self,
        id: Uuid,
        worker_id: &str,
        result: Option<serde_json::Value>,
    ) -> Result<task_run::Model, DedupError> {
        validate::worker_id(worker_id)?;
        validate::json("result", result.as_ref())?;
        let guard = Guard::LeaseHolder {
            worker_id,
            done: &[TaskStatus::Succeeded],
        };
        let change = Change::Complete {
            result: result.as_ref(),
            worker_id,
        };
        let task = retried(self, id, Op::Plain(Transition::Complete, guard, change)).await?;
        crate::metrics::finished("completed");
        crate::executor::notify::run_ended(&mut Executor::new(self.target())?).await?;
        Ok(task)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %id, worker_id = %worker_id, ?retry))]
    async fn fail(
        &self,
        id: Uuid,
        worker_id: &str,
        error: &str,
        retry: Retry,
    ) -> Result<task_run::Model, DedupError> {
        validate::worker_id(worker_id)?;
        validate::error_text("error", error)?;
        let delay_micros = match retry {
            Retry::Never => None,
            Retry::After(delay) => Some(validate::micros("retry", delay)?),
        };
        let op = Op::Fail {
            worker_id,
            error,
            delay_micros,
        };
        let task = retried(self, id, op).await?;
        if task.status == TaskStatus::Queued {
            crate::metrics::finished("retried");
        } else {
            crate::metrics::finished("failed");
        }
        // A retry due at once is due; either way the key's run is free.
        crate::executor::notify::run_ended(&mut Executor::new(self.target())?).await?;
        Ok(task)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %id))]
    async fn cancel(&self, id: Uuid, reason: &str) -> Result<task_run::Model, DedupError> {
        validate::error_text("reason", reason)?;
        let change = Change::Cancel { reason };
        let task = retried(
            self,
            id,
            Op::Plain(Transition::Cancel, Guard::Active, change),
        )
        .await?;
        crate::metrics::finished("cancelled");
        if task.started_at.is_some() {
            // It may have been running: its key's run is free.
            crate::executor::notify::run_ended(&mut Executor::new(self.target())?).await?;
        }
        Ok(task)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %id, worker_id = %worker_id))]
    async fn release(&self, id: Uuid, worker_id: &str) -> Result<task_run::Model, DedupError> {
        validate::worker_id(worker_id)?;
        let task = retried(self, id, Op::Release { worker_id }).await?;
        if task.status == TaskStatus::Queued {
            crate::metrics::finished("released");
            crate::executor::notify::task_due(&mut Executor::new(self.target())?).await?;
        } else {
            crate::metrics::finished("cancelled");
        }
        Ok(task)
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn reap_expired(&self, policy: &RetryPolicy) -> Result<ReapReport, DedupError> {
        policy.validate()?;
        let mut exec = Executor::new(self.target())?;
        let mut report = ReapReport::default();
        let last_attempt = format!(
            "lease expired on the last allowed attempt (max_attempts = {})",
            policy.max_attempts
        );
        for (id, attempts) in exec.expired().await? {
            // A deadlock with a claim or an ending (InnoDB, around the unique indexes'
            // entries this moves) is run again: each step rechecks the expiry.
            let mut retrying = Retrying::new(self, None, "reap");
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
        Ok(crate::maintenance::retention::prune(self, &retention)
            .await?
            .total())
    }

    #[tracing::instrument(level = "debug", name = "prune", skip_all)]
    async fn prune(&self, retention: &Retention) -> Result<PruneReport, DedupError> {
        crate::maintenance::retention::prune(self, retention).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_type = %task_type))]
    async fn pause(&self, task_type: &str) -> Result<bool, DedupError> {
        crate::maintenance::pause::set(self, task_type, crate::maintenance::pause::Action::Pause)
            .await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_type = %task_type))]
    async fn resume(&self, task_type: &str) -> Result<bool, DedupError> {
        crate::maintenance::pause::set(self, task_type, crate::maintenance::pause::Action::Resume)
            .await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn paused(&self) -> Result<Vec<PausedType>, DedupError> {
        crate::maintenance::pause::list(self).await
    }
}

/// One of the lifecycle's operations on a task, as its attempts run it.
#[derive(Clone, Copy)]
enum Op<'a> {
    /// A compare-and-set transition.
    Plain(Transition, Guard<'a>, Change<'a>),
    /// `fail`, with a retry after `delay_micros` or for good.
    Fail {
        worker_id: &'a str,
        error: &'a str,
        delay_micros: Option<i64>,
    },
    /// `release`.
    Release { worker_id: &'a str },
}

impl Op<'_> {
    fn name(self) -> &'static str {
        match self {
            Op::Plain(Transition::Heartbeat, ..) => "heartbeat",
            Op::Plain(Transition::Complete, ..) => "complete",
            Op::Plain(Transition::Cancel, ..) => "cancel",
            Op::Plain(Transition::Fail, ..) | Op::Fail { .. } => "fail",
            Op::Plain(Transition::Release, ..) | Op::Release { .. } => "release",
            // The admin's own (`crate::admin`), never run as a lifecycle operation.
            Op::Plain(Transition::Retry, ..) => "retry",
            Op::Plain(Transition::Delete, ..) => "delete",
        }
    }

    /// One attempt.
    async fn attempt(
        self,
        exec: &mut Executor<'_>,
        id: Uuid,
    ) -> Result<task_run::Model, DedupError> {
        match self {
            Op::Plain(transition, guard, change) => {
                apply(exec, transition, id, guard, change).await
            }
            Op::Fail {
                worker_id,
                error,
                delay_micros,
            } => fail_once(exec, id, worker_id, error, delay_micros).await,
            Op::Release { worker_id } => release_once(exec, id, worker_id).await,
        }
    }
}

/// Runs `op` on task `id` until it gives an outcome, through the one retry driver:
/// again on a fresh connection after a lost one, and again after a deadlock the database
/// broke by aborting it (outside a caller's transaction). The transitions are idempotent
/// for their caller, so a repeat after an attempt that took effect returns what it
/// stored.
async fn retried<C: DedupConnection>(
    db: &C,
    id: Uuid,
    op: Op<'_>,
) -> Result<task_run::Model, DedupError> {
    let mut exec = Executor::new(db.target())?;
    let mut retrying = Retrying::new(db, None, op.name());
    loop {
        // Boxed: moved into the retry driver, and a transition's state is large.
        if let Some(outcome) = retrying.run(Box::pin(op.attempt(&mut exec, id))).await {
            return outcome;
        }
    }
}

/// How a change run in a savepoint ended.
enum Savepoint {
    /// Committed: the row as it is now, or `None` when its guard did not match.
    Applied(Option<Box<task_run::Model>>),
    /// Rolled back: the task would have taken a key another task holds (a follow-up
    /// queued behind a `Scope::Queued` task).
    KeyHeld,
}

/// Runs `change` of task `id` in a savepoint or short transaction: on PostgreSQL a
/// unique violation would otherwise abort the caller's transaction.
async fn in_savepoint(
    exec: &mut Executor<'_>,
    id: Uuid,
    change: Change<'_>,
) -> Result<Savepoint, DedupError> {
    let mut txn = exec.begin(false).await?;
    let outcome = txn.transition(id, change).await;
    let held = matches!(&outcome, Err(failure) if failure.is_held_key());
    match txn.finish(outcome).await {
        Ok(task) => Ok(Savepoint::Applied(task.map(Box::new))),
        Err(_) if held => Ok(Savepoint::KeyHeld),
        Err(failure) => Err(failure.into()),
    }
}

/// One attempt of `fail`: the final failure, or the retry (`delay_micros`) in a
/// savepoint; when a follow-up of the key is queued, the final failure instead.
async fn fail_once(
    exec: &mut Executor<'_>,
    id: Uuid,
    worker_id: &str,
    error: &str,
    delay_micros: Option<i64>,
) -> Result<task_run::Model, DedupError> {
    let guard = Guard::LeaseHolder {
        worker_id,
        done: FAILED_OR_RETRIED,
    };
    let Some(delay_micros) = delay_micros else {
        let change = Change::Fail { error, worker_id };
        return apply(exec, Transition::Fail, id, guard, change).await;
    };
    let retry = Change::Retry {
        error,
        delay_micros,
        worker_id,
    };
    match in_savepoint(exec, id, retry).await? {
        Savepoint::Applied(Some(task)) => Ok(*task),
        Savepoint::Applied(None) => not_applied(exec, Transition::Fail, id, guard).await,
        Savepoint::KeyHeld => {
            tracing::info!(task_id = %id, "not retried: a follow-up of this key is queued");
            let error = not_retried(error);
            let change = Change::Fail {
                error: &error,
                worker_id,
            };
            apply(exec, Transition::Fail, id, guard, change).await
        }
    }
}

/// One attempt of `release`, in a savepoint like `fail`'s retry: a follow-up queued
/// behind a `Scope::Queued` task makes the release a cancellation.
async fn release_once(
    exec: &mut Executor<'_>,
    id: Uuid,
    worker_id: &str,
) -> Result<task_run::Model, DedupError> {
    let guard = Guard::LeaseHolder {
        worker_id,
        done: &[TaskStatus::Queued, TaskStatus::Cancelled],
    };
    match in_savepoint(exec, id, Change::Release { worker_id }).await? {
        Savepoint::Applied(Some(task)) => Ok(*task),
        Savepoint::Applied(None) => not_applied(exec, Transition::Release, id, guard).await,
        Savepoint::KeyHeld => {
            let reason = "released by its worker; not requeued: another task of this key is \
                          queued and will do the work";
            apply(
                exec,
                Transition::Release,
                id,
                guard,
                Change::Cancel { reason },
            )
            .await
        }
    }
}

/// Where `fail` leaves a task, whichever way it went.
const FAILED_OR_RETRIED: &[TaskStatus] = &[TaskStatus::Failed, TaskStatus::Queued];

/// The error of a task that failed for good because a follow-up of its key is queued.
fn not_retried(error: &str) -> String {
    format!("{error} (not retried: another task of this key is queued and will do the work)")
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

/// Applies `change` to task `id` if `guard` holds; otherwise reads the row to say why
/// not, or, when the transition already took effect for this caller (a call repeated
/// after a lost connection), returns the row as stored. The read only explains a
/// refusal; the decision was the UPDATE's.
async fn apply(
    exec: &mut Executor<'_>,
    transition: Transition,
    id: Uuid,
    guard: Guard<'_>,
    change: Change<'_>,
) -> Result<task_run::Model, DedupError> {
    if let Some(task) = exec.transition(id, change).await? {
        tracing::debug!(task_id = %id, %transition, status = %task.status, "task transitioned");
        return Ok(task);
    }
    not_applied(exec, transition, id, guard).await
}

/// How a batch of endings went ([`end_many`]).
#[cfg_attr(not(feature = "worker"), allow(dead_code))]
pub(crate) enum EndedMany {
    /// Per task, in the batch's order: recorded (by this call, or by an attempt of it
    /// lost with its connection), or the refusal that says why not
    /// ([`DedupError::LeaseNotHeld`], [`DedupError::InvalidTransition`],
    /// [`DedupError::NotFound`]).
    Each(Vec<Result<(), DedupError>>),
    /// A retry ran into a key a queued follow-up took, and the statement changed
    /// nothing: record these endings one at a time ([`TaskWorker::fail`] decides each).
    HeldKey,
}

/// Records a [`Worker`](crate::Worker)'s batch of endings of one shape in one statement
/// (MySQL/MariaDB: one short transaction): each the compare-and-set on status and lease
/// owner that [`TaskWorker::complete`] and [`TaskWorker::fail`] run one at a time, with
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
    let mut exec = Executor::new(db.target())?;
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

/// Why a transition of task `id` did not apply, read from the row: or its stored row
/// when it had already taken effect for this caller.
async fn not_applied(
    exec: &mut Executor<'_>,
    transition: Transition,
    id: Uuid,
    guard: Guard<'_>,
) -> Result<task_run::Model, DedupError> {
    let Some(task) = exec.by_id(id).await? else {
        return Err(DedupError::NotFound { id });
    };
    explain(task, transition, guard)
}

/// Why a transition of `task` did not apply, from the row as read: or the row, when it
/// had already taken effect for this caller.
fn explain(
    task: task_run::Model,
    transition: Transition,
    guard: Guard<'_>,
) -> Result<task_run::Model, DedupError> {
    let id = task.id;
    match guard {
        Guard::LeaseHolder { worker_id, done }
            if done.contains(&task.status) && task.lease_owner.as_deref() == Some(worker_id) =>
        {
            tracing::debug!(task_id = %id, %transition, "already done by this worker");
            Ok(task)
        }
        Guard::Active if task.status == TaskStatus::Cancelled => Ok(task),
        Guard::LeaseHolder { worker_id, .. } if task.status == TaskStatus::Running => {
            Err(DedupError::LeaseNotHeld {
                id,
                transition,
                worker_id: worker_id.to_owned(),
                holder: task.lease_owner,
            })
        }
        _ => Err(DedupError::InvalidTransition {
            id,
            transition,
            status: task.status,
        }),
    }
}
