//! [`DedupConnection`]: what the library runs on, and whether it is a transaction.

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseExecutor, DatabaseTransaction, TransactionTrait,
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
}

impl DedupConnection for DatabaseConnection {
    fn in_transaction(&self) -> bool {
        false
    }
}

impl DedupConnection for DatabaseTransaction {
    fn in_transaction(&self) -> bool {
        true
    }
}

impl DedupConnection for DatabaseExecutor<'_> {
    fn in_transaction(&self) -> bool {
        self.is_transaction()
    }
}
