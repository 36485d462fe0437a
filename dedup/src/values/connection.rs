//! [`DedupConnection`]: the database handles task-dedup runs on; [`WithRetryBudget`], a
//! handle with its own retry budget; [`PoolerMode`] and [`WithPoolerMode`], how a
//! handle sends PostgreSQL statements.

use std::time::Duration;

use sea_orm::{DatabaseConnection, DatabaseExecutor, DatabaseTransaction};

pub(crate) use sealed::Target;

/// How long a call keeps retrying after its connection was lost, unless the handle
/// ([`TaskDedup::with_retry_budget`](crate::TaskDedup::with_retry_budget)) or the call
/// ([`NewTask::retry_budget`](crate::NewTask::retry_budget)) says otherwise.
pub const DEFAULT_RETRY_BUDGET: Duration = Duration::from_secs(5);

/// How task-dedup sends its PostgreSQL statements: whether the connection keeps named
/// prepared statements from one statement to the next. Only PostgreSQL has a choice;
/// SQLite and MySQL/MariaDB ignore it.
///
/// | Between task-dedup and PostgreSQL | Mode |
/// |---|---|
/// | nothing (a direct connection), or a pooler in session mode | [`PreparedStatements`](Self::PreparedStatements) |
/// | PgBouncer 1.21 or later in transaction mode with `max_prepared_statements` > 0 (its default since 1.24 is 200) | [`PreparedStatements`](Self::PreparedStatements) |
/// | PgBouncer before 1.21, or `max_prepared_statements = 0`, in transaction or statement mode | [`NoPreparedStatements`](Self::NoPreparedStatements) |
///
/// A pool takes it from [`connect_with_pooler`](crate::connect_with_pooler) (every pool
/// of the same endpoint: host, port and database); any handle, and the caller's
/// transaction in particular, from
/// [`TaskDedup::with_pooler_mode`](crate::TaskDedup::with_pooler_mode), which wins over
/// the pool's. A transaction does not tell task-dedup which pool it came from, so
/// without that it runs in the default mode. The guide's "Poolers" section has the
/// details.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PoolerMode {
    /// Statements are prepared once per connection under a name and run from there with
    /// bound parameters (sqlx's statement cache): the default, and the fastest where it
    /// works.
    #[default]
    PreparedStatements,
    /// For a pooler that may run the messages of one statement on different servers:
    /// each statement is sent as one simple-protocol message with its values written in
    /// as escaped, typed literals, which the pooler runs on one server whatever its
    /// mode. `find_or_enqueue`'s insert-or-find is a call of the function
    /// `task_dedup_insert_or_find_v1` (migration `m20261203_000009`), whose plans the
    /// server keeps per session; while that function is missing, the plain statement,
    /// parsed and planned on every call (one warning per database says so). Inside the
    /// caller's transaction (where SeaORM reads rows only through a named statement) a
    /// statement that returns rows is prepared under a name and run in a savepoint, its
    /// text made unique so that no cached name is used again on another server; a name
    /// another client left on the server is dropped and the statement run again.
    ///
    /// It works on every connection, direct ones included (BENCHMARKS.md has its cost).
    NoPreparedStatements,
}

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

        /// Its pooler mode, if the handle says (else the pool's, or the default).
        fn pooler_mode(&self) -> Option<super::PoolerMode> {
            None
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

    fn pooler_mode(&self) -> Option<PoolerMode> {
        self.db.pooler_mode()
    }
}

impl<C: DedupConnection> DedupConnection for WithRetryBudget<'_, C> {}

/// A handle that sends its PostgreSQL statements as `mode` says, whatever the pool's
/// mode; from [`TaskDedup::with_pooler_mode`](crate::TaskDedup::with_pooler_mode). It
/// offers every operation the handle it wraps does, and wraps and is wrapped by
/// [`WithRetryBudget`] alike.
///
/// What a transaction through a pooler without named prepared statements needs: the
/// transaction cannot tell task-dedup which pool it came from.
#[derive(Debug, Clone, Copy)]
pub struct WithPoolerMode<'c, C> {
    db: &'c C,
    mode: PoolerMode,
}

impl<'c, C: DedupConnection> WithPoolerMode<'c, C> {
    pub(crate) fn new(db: &'c C, mode: PoolerMode) -> WithPoolerMode<'c, C> {
        WithPoolerMode { db, mode }
    }

    /// The handle it wraps.
    pub fn inner(&self) -> &'c C {
        self.db
    }

    /// The mode its statements go in.
    pub fn mode(&self) -> PoolerMode {
        self.mode
    }
}

impl<C: DedupConnection> sealed::Sealed for WithPoolerMode<'_, C> {
    fn target(&self) -> Target<'_> {
        self.db.target()
    }

    fn retry_budget(&self) -> Duration {
        self.db.retry_budget()
    }

    fn pooler_mode(&self) -> Option<PoolerMode> {
        Some(self.mode)
    }
}

impl<C: DedupConnection> DedupConnection for WithPoolerMode<'_, C> {}
