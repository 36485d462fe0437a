//! [`TaskDedup::find_or_enqueue`]: insert first, read on conflict, never check-then-insert.

use std::hash::BuildHasher;
use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use crate::TaskStatus;
use crate::connection::DedupConnection;
use crate::dialect::is_transaction_conflict;
use crate::dialect::{Dialect, Lookup};
use crate::error::DedupError;
use crate::key::{NewTask, TaskKey};
use crate::task_run;
use crate::validate;

/// How many inserts `find_or_enqueue` tries before giving up with
/// [`DedupError::Contention`]. A retry happens only when the conflicting task finished
/// before it could be read, or (outside a transaction) when the database broke a
/// deadlock by aborting the insert.
pub const MAX_ENQUEUE_ATTEMPTS: u32 = 16;

/// What [`TaskDedup::find_or_enqueue`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enqueued {
    /// This call inserted the task.
    Created(task_run::Model),
    /// A task for the key was already active; this is it, as stored. Nothing was written.
    Existing(task_run::Model),
}

impl Enqueued {
    /// The task, created or existing.
    pub fn task(&self) -> &task_run::Model {
        match self {
            Enqueued::Created(task) | Enqueued::Existing(task) => task,
        }
    }

    /// The task, created or existing.
    pub fn into_task(self) -> task_run::Model {
        match self {
            Enqueued::Created(task) | Enqueued::Existing(task) => task,
        }
    }

    /// Whether this call created the task.
    pub fn is_created(&self) -> bool {
        matches!(self, Enqueued::Created(_))
    }
}

/// Atomic find-or-enqueue, on a pool or inside the caller's transaction.
///
/// Implemented for [`DatabaseConnection`](sea_orm::DatabaseConnection),
/// [`DatabaseTransaction`](sea_orm::DatabaseTransaction) and
/// [`DatabaseExecutor`](sea_orm::DatabaseExecutor).
#[async_trait]
pub trait TaskDedup {
    /// Enqueues `task` unless its key already has an active (`queued` or `running`) task,
    /// and says which happened.
    ///
    /// The insert comes first and the database's unique index decides; only on a
    /// conflict is the active task read and returned as [`Enqueued::Existing`]. Under any
    /// number of concurrent callers exactly one gets [`Enqueued::Created`]. The created
    /// path is one statement; the duplicate path writes nothing. Inside a transaction a
    /// hit leaves the transaction usable (no aborted statement on PostgreSQL).
    ///
    /// `created_at`/`updated_at` of a new task come from this process's clock; lease
    /// times come from the database's.
    ///
    /// # Errors
    /// - [`DedupError::InvalidArgument`] when the payload has a NUL character in a
    ///   string or key (PostgreSQL cannot store it); nothing is written.
    /// - [`DedupError::Contention`] when the conflicting task kept leaving the active set
    ///   before it could be read, [`MAX_ENQUEUE_ATTEMPTS`] times in a row.
    /// - [`DedupError::TransactionAborted`] inside a transaction the database aborted to
    ///   resolve a deadlock or serialization conflict (e.g. REPEATABLE READ on
    ///   PostgreSQL); roll back and retry the transaction.
    /// - [`DedupError::Database`] for anything else, including an unreachable database.
    ///
    /// # Example
    /// ```
    /// use task_dedup::{NewTask, TaskDedup, TaskKey};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let db = task_dedup::connect("sqlite::memory:").await?;
    /// # use task_dedup_migration::MigratorTrait;
    /// task_dedup_migration::Migrator::up(&db, None).await?;
    ///
    /// let key = TaskKey::new("user-1", "render", "document/42")?;
    /// let first = db.find_or_enqueue(NewTask::new(key.clone())).await?;
    /// let second = db.find_or_enqueue(NewTask::new(key)).await?;
    /// assert!(first.is_created());
    /// assert!(!second.is_created());
    /// assert_eq!(first.task().id, second.task().id);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    async fn find_or_enqueue(&self, task: NewTask) -> Result<Enqueued, DedupError>;

    /// The active task of `key`, if there is one.
    ///
    /// # Errors
    /// [`DedupError::Database`].
    async fn find_active(&self, key: &TaskKey) -> Result<Option<task_run::Model>, DedupError>;
}

#[async_trait]
impl<C: DedupConnection> TaskDedup for C {
    async fn find_or_enqueue(&self, task: NewTask) -> Result<Enqueued, DedupError> {
        let NewTask { key, payload } = task;
        validate::json("payload", payload.as_ref())?;
        let dialect = Dialect::of(self)?;
        let now = task_run::now();
        let mut row = task_run::Model {
            id: Uuid::now_v7(),
            user_id: key.user_id().to_owned(),
            task_type: key.task_type().to_owned(),
            resource_key: key.resource_key().to_owned(),
            status: TaskStatus::Queued,
            payload,
            result: None,
            error: None,
            attempts: 0,
            lease_owner: None,
            lease_expires_at: None,
            created_at: now,
            updated_at: now,
            started_at: None,
            finished_at: None,
        };

        for attempt in 1..=MAX_ENQUEUE_ATTEMPTS {
            let found = match dialect.insert_if_absent(self, &row).await {
                Ok(true) => {
                    tracing::debug!(task_id = %row.id, key = %key, attempt, "task created");
                    return Ok(Enqueued::Created(row));
                }
                Ok(false) => dialect.find_active(self, &key, Lookup::AfterConflict).await,
                Err(err) => Err(err),
            };
            match found {
                Ok(Some(existing)) => {
                    tracing::debug!(task_id = %existing.id, key = %key, attempt, "existing task returned");
                    return Ok(Enqueued::Existing(existing));
                }
                Ok(None) => {
                    tracing::debug!(key = %key, attempt, "conflicting task finished before it was read; retrying");
                    // A fresh id, in case what conflicted was the id itself (SQLite's
                    // DO NOTHING covers the primary key too).
                    row.id = Uuid::now_v7();
                }
                // The insert or the locking read after it (InnoDB) was the victim.
                Err(err) if is_transaction_conflict(&err) => {
                    if self.in_transaction() {
                        tracing::warn!(key = %key, error = %err, "transaction aborted by the database");
                        return Err(DedupError::TransactionAborted(err));
                    }
                    tracing::debug!(key = %key, attempt, error = %err, "aborted by a deadlock; retrying");
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(err) => return Err(err.into()),
            }
        }
        tracing::warn!(key = %key, attempts = MAX_ENQUEUE_ATTEMPTS, "gave up: contention");
        Err(DedupError::Contention {
            key,
            attempts: MAX_ENQUEUE_ATTEMPTS,
        })
    }

    async fn find_active(&self, key: &TaskKey) -> Result<Option<task_run::Model>, DedupError> {
        let dialect = Dialect::of(self)?;
        Ok(dialect.find_active(self, key, Lookup::Plain).await?)
    }
}

/// A random pause of up to 2^attempt ms (capped at 64 ms), so that callers a deadlock
/// aborted together do not collide again.
fn backoff(attempt: u32) -> Duration {
    let ceiling_ms = 1u64 << attempt.min(6);
    let jitter = std::collections::hash_map::RandomState::new().hash_one(attempt);
    Duration::from_micros(jitter % (ceiling_ms * 1_000))
}
