//! [`DedupConnection`]: the database handles task-dedup runs on, and
//! [`WithRetryBudget`], a handle with its own retry budget.

use std::time::Duration;

use sea_orm::{DatabaseConnection, DatabaseExecutor, DatabaseTransaction};

pub(crate) use sealed::Target;

/// How long a call keeps retrying after its connection was lost, unless the handle
/// ([`TaskDedup::with_retry_budget`](crate::TaskDedup::with_retry_budget)) or the call
/// ([`NewTask::retry_budget`](crate::NewTask::retry_budget)) says otherwise.
pub const DEFAULT_RETRY_BUDGET: Duration = Duration::from_secs(5);

pub(crate) mod sealed {
    use std::time::Duration;

    use sea_orm::{DatabaseConnection, DatabaseTransaction};

    /// Where a handle's statements run.
    #[derive(Clone, Copy)]
    pub enum Target<'c> {
        /// A pool: each statement on a connection of its own.
        Pool(&'c DatabaseConnection),
        /// The caller's transaction.
        Transaction(&'c DatabaseTransaction),
    }

    /// What the crate needs of a handle, out of users' reach (the trait cannot be named
    /// outside the crate, so neither implemented nor called).
    pub trait Sealed {
        /// Where its statements run.
        fn target(&self) -> Target<'_>;

        /// Its retry budget after a lost connection.
        fn retry_budget(&self) -> Duration {
            super::DEFAULT_RETRY_BUDGET
        }
    }
}

/// A database handle task-dedup runs on: a pool ([`DatabaseConnection`]), the caller's
/// transaction ([`DatabaseTransaction`]), SeaORM's [`DatabaseExecutor`] wrapping either,
/// or one of those [`WithRetryBudget`].
///
/// The library needs to know which: when the database aborts a statement to resolve a
/// deadlock (InnoDB under churn), or the connection is lost, it retries on a pool, but
/// inside a transaction the whole transaction is gone and only the caller can run it
/// again ([`DedupError::TransactionAborted`](crate::DedupError::TransactionAborted)).
///
/// Sealed: implemented for SeaORM's handles only. Use it (or
/// [`TaskDedup`](crate::TaskDedup)) as the bound of code generic over them:
///
/// ```
/// use task_dedup::{DedupConnection, DedupError, NewTask, TaskDedup, TaskKey};
///
/// /// Works on a pool and inside the caller's transaction alike.
/// async fn request_export<C: DedupConnection>(db: &C, user: &str) -> Result<bool, DedupError> {
///     let key = TaskKey::new(user, "export", "all")?;
///     Ok(db.find_or_enqueue(NewTask::new(key)).await?.is_created())
/// }
/// ```
pub trait DedupConnection: sealed::Sealed + Send + Sync {
    /// Whether statements run inside a transaction the caller owns.
    fn in_transaction(&self) -> bool {
        matches!(self.target(), Target::Transaction(_))
    }
}

impl sealed::Sealed for DatabaseConnection {
    fn target(&self) -> Target<'_> {
        Target::Pool(self)
    }
}

impl DedupConnection for DatabaseConnection {}

impl sealed::Sealed for DatabaseTransaction {
    fn target(&self) -> Target<'_> {
        Target::Transaction(self)
    }
}

impl DedupConnection for DatabaseTransaction {}

impl sealed::Sealed for DatabaseExecutor<'_> {
    fn target(&self) -> Target<'_> {
        match self {
            DatabaseExecutor::Connection(db) => Target::Pool(db),
            DatabaseExecutor::Transaction(txn) => Target::Transaction(txn),
            DatabaseExecutor::OwnedTransaction(txn) => Target::Transaction(txn),
        }
    }
}

impl DedupConnection for DatabaseExecutor<'_> {}

/// A handle whose calls retry on a fresh connection for `budget` after their connection
/// was lost, instead of [`DEFAULT_RETRY_BUDGET`]; from
/// [`TaskDedup::with_retry_budget`](crate::TaskDedup::with_retry_budget). It offers
/// every operation the handle it wraps does. `Duration::ZERO` turns the retries off.
#[derive(Debug, Clone, Copy)]
pub struct WithRetryBudget<'c, C> {
    db: &'c C,
    budget: Duration,
}

impl<'c, C: DedupConnection> WithRetryBudget<'c, C> {
    pub(crate) fn new(db: &'c C, budget: Duration) -> WithRetryBudget<'c, C> {
        WithRetryBudget { db, budget }
    }

    /// The handle it wraps.
    pub fn inner(&self) -> &'c C {
        self.db
    }
}

impl<C: DedupConnection> sealed::Sealed for WithRetryBudget<'_, C> {
    fn target(&self) -> Target<'_> {
        self.db.target()
    }

    fn retry_budget(&self) -> Duration {
        self.budget
    }
}

impl<C: DedupConnection> DedupConnection for WithRetryBudget<'_, C> {}
