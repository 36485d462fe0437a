//! [`Job`]: what a typed handler receives: the decoded payload, the task, its
//! cancellation, and a [`Lease`] it can extend.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sea_orm::DatabaseConnection;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::lifecycle::TaskLifecycle;
use crate::values::connection::WithRetryBudget;
use crate::values::error::DedupError;
use crate::values::validate::{self, InvalidArgument};
use task_dedup_entity::task_run;

/// One run of a typed task, handed to its
/// [`TaskHandler`](super::TaskHandler): the payload decoded (`args`), the task as
/// claimed, its cancellation and its lease.
#[derive(Debug)]
#[non_exhaustive]
pub struct Job<T> {
    /// The task's payload, decoded into its type.
    pub args: T,
    task: task_run::Model,
    cancel: CancellationToken,
    lease: Lease,
}

impl<T> Job<T> {
    pub(super) fn new(
        args: T,
        task: task_run::Model,
        cancel: CancellationToken,
        lease: Lease,
    ) -> Job<T> {
        Job {
            args,
            task,
            cancel,
            lease,
        }
    }

    /// The task's id.
    pub fn id(&self) -> Uuid {
        self.task.id
    }

    /// The task's user (empty for a key of no user).
    pub fn user_id(&self) -> &str {
        &self.task.user_id
    }

    /// The task's resource key.
    pub fn resource_key(&self) -> &str {
        &self.task.resource_key
    }

    /// Which attempt this is: 1 for the first run.
    pub fn attempt(&self) -> i32 {
        self.task.attempts
    }

    /// The task as claimed (`status` running). Its `payload` was moved into
    /// [`args`](Self::args) and is `None` here.
    pub fn task(&self) -> &task_run::Model {
        &self.task
    }

    /// Fires when the task was taken away (cancelled, or its lease lost), or the
    /// worker's shutdown grace ran out: stop soon. See [`Handler`](super::Handler).
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// The task's lease, to extend for long work.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }
}

/// The lease of a running task, renewed by the worker's heartbeat. A handler that
/// knows its work will outlast a few missed heartbeats (a long upload, a call that
/// blocks the heartbeat's connection) extends it.
#[derive(Clone)]
pub struct Lease {
    db: DatabaseConnection,
    retry_budget: Duration,
    worker_id: Arc<str>,
    id: Uuid,
    heartbeat_every: Duration,
    micros: Arc<AtomicU64>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("task_id", &self.id)
            .field("worker_id", &self.worker_id)
            .field("lease", &self.current())
            .finish_non_exhaustive()
    }
}

impl Lease {
    pub(super) fn new(
        db: DatabaseConnection,
        retry_budget: Duration,
        worker_id: Arc<str>,
        id: Uuid,
        lease: Duration,
        heartbeat_every: Duration,
    ) -> Lease {
        Lease {
            db,
            retry_budget,
            worker_id,
            id,
            heartbeat_every,
            micros: Arc::new(AtomicU64::new(micros(lease))),
        }
    }

    pub(super) fn task_id(&self) -> Uuid {
        self.id
    }

    pub(super) fn heartbeat_every(&self) -> Duration {
        self.heartbeat_every
    }

    /// The lease each heartbeat renews now.
    pub fn current(&self) -> Duration {
        Duration::from_micros(self.micros.load(Ordering::Relaxed))
    }

    /// Renews the lease now for `lease`, and makes every later heartbeat of this run
    /// renew it for as long.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] for a lease of zero, over
    /// [`MAX_LEASE`](crate::MAX_LEASE) or not longer than the heartbeat interval, before
    /// any SQL runs; [`DedupError::LeaseNotHeld`] or
    /// [`DedupError::InvalidTransition`] when the task was taken away (stop: its
    /// cancellation fires at the next heartbeat); database errors after the retry
    /// budget.
    pub async fn extend(&self, lease: Duration) -> Result<(), DedupError> {
        validate::lease_micros(lease)?;
        if lease <= self.heartbeat_every {
            return Err(InvalidArgument::out_of_range(
                "lease",
                "longer than the worker's heartbeat interval",
            )
            .into());
        }
        WithRetryBudget::new(&self.db, self.retry_budget)
            .heartbeat(self.id, &self.worker_id, lease)
            .await?;
        self.micros.store(micros(lease), Ordering::Relaxed);
        Ok(())
    }
}

fn micros(lease: Duration) -> u64 {
    u64::try_from(lease.as_micros()).unwrap_or(u64::MAX)
}
