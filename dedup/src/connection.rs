//! [`DedupConnection`]: what the library runs on, and whether it is a transaction.

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseConnectionType, DatabaseExecutor,
    DatabaseTransaction, DbErr, ExecResult, QueryResult, Statement, TransactionTrait,
};

mod sealed {
    pub trait Sealed {}
    impl Sealed for sea_orm::DatabaseConnection {}
    impl Sealed for sea_orm::DatabaseTransaction {}
    impl Sealed for sea_orm::DatabaseExecutor<'_> {}
}

/// A database handle task-dedup runs on: a pool ([`DatabaseConnection`]), the caller's
/// transaction ([`DatabaseTransaction`]) or SeaORM's [`DatabaseExecutor`] wrapping either.
///
/// The library needs to know which: when the database aborts a statement to resolve a
/// deadlock (InnoDB under churn), it retries on a pool, but inside a transaction the
/// whole transaction is gone and only the caller can run it again
/// ([`DedupError::TransactionAborted`](crate::DedupError::TransactionAborted)).
pub trait DedupConnection:
    ConnectionTrait + TransactionTrait + Send + Sync + sealed::Sealed
{
    /// Whether statements run inside a transaction the caller owns.
    fn in_transaction(&self) -> bool;

    /// The pool, when statements run on one rather than in a transaction.
    #[doc(hidden)]
    fn pool(&self) -> Option<&DatabaseConnection>;
}

impl DedupConnection for DatabaseConnection {
    fn in_transaction(&self) -> bool {
        false
    }

    fn pool(&self) -> Option<&DatabaseConnection> {
        Some(self)
    }
}

impl DedupConnection for DatabaseTransaction {
    fn in_transaction(&self) -> bool {
        true
    }

    fn pool(&self) -> Option<&DatabaseConnection> {
        None
    }
}

impl DedupConnection for DatabaseExecutor<'_> {
    fn in_transaction(&self) -> bool {
        self.is_transaction()
    }

    fn pool(&self) -> Option<&DatabaseConnection> {
        match self {
            DatabaseExecutor::Connection(db) => Some(db),
            _ => None,
        }
    }
}

/// Runs `stmt` like [`ConnectionTrait::execute_raw`]. On a pool it calls SeaORM's sqlx
/// driver directly: `DatabaseConnection`'s dispatch boxes and copies a future that holds
/// every driver's state, which measured as a third of the client CPU of a dedup hit on
/// SQLite (see BENCHMARKS.md).
pub(crate) async fn execute<C: DedupConnection + ?Sized>(
    db: &C,
    stmt: Statement,
) -> Result<ExecResult, DbErr> {
    match db.pool().map(|pool| &pool.inner) {
        Some(DatabaseConnectionType::SqlxPostgresPoolConnection(conn)) => conn.execute(stmt).await,
        Some(DatabaseConnectionType::SqlxMySqlPoolConnection(conn)) => conn.execute(stmt).await,
        Some(DatabaseConnectionType::SqlxSqlitePoolConnection(conn)) => conn.execute(stmt).await,
        _ => db.execute_raw(stmt).await,
    }
}

/// Runs `stmt` like [`ConnectionTrait::query_one_raw`], as [`execute`] does.
pub(crate) async fn query_one<C: DedupConnection + ?Sized>(
    db: &C,
    stmt: Statement,
) -> Result<Option<QueryResult>, DbErr> {
    match db.pool().map(|pool| &pool.inner) {
        Some(DatabaseConnectionType::SqlxPostgresPoolConnection(conn)) => {
            conn.query_one(stmt).await
        }
        Some(DatabaseConnectionType::SqlxMySqlPoolConnection(conn)) => conn.query_one(stmt).await,
        Some(DatabaseConnectionType::SqlxSqlitePoolConnection(conn)) => conn.query_one(stmt).await,
        _ => db.query_one_raw(stmt).await,
    }
}
