//! [`DedupConnection`]: what the library runs on, and whether it is a transaction.

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
use sea_orm::sqlx;
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseExecutor, DatabaseTransaction, DbBackend, DbErr,
    FromQueryResult, Statement, TransactionTrait, Value,
};

use crate::key::TaskKey;
use crate::task_run;

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

/// Runs `$sqlx` with `$pool` bound to the sqlx pool behind `$db` when `$db` is a pool,
/// and `$seaorm` otherwise (a transaction, or a connection without a sqlx pool).
macro_rules! on_sqlx_pool {
    ($db:expr, $pool:ident => $sqlx:expr, else => $seaorm:expr) => {
        match $db.pool().map(|pool| (pool, &pool.inner)) {
            #[cfg(feature = "postgres")]
            Some((pool, sea_orm::DatabaseConnectionType::SqlxPostgresPoolConnection(_))) => {
                let $pool = pool.get_postgres_connection_pool();
                $sqlx
            }
            #[cfg(feature = "mysql")]
            Some((pool, sea_orm::DatabaseConnectionType::SqlxMySqlPoolConnection(_))) => {
                let $pool = pool.get_mysql_connection_pool();
                $sqlx
            }
            #[cfg(feature = "sqlite")]
            Some((pool, sea_orm::DatabaseConnectionType::SqlxSqlitePoolConnection(_))) => {
                let $pool = pool.get_sqlite_connection_pool();
                $sqlx
            }
            _ => $seaorm,
        }
    };
}

/// Runs `sql`, an INSERT of a new task (`row`'s values bound as [`insert_values`]), and
/// says whether the row went in: with `returning_id` (an INSERT ... DO NOTHING
/// RETURNING id), whether it returned a row; otherwise whether it succeeded.
///
/// This statement and [`select_occupant`] are the hot path of `find_or_enqueue`. On a
/// pool they go to sqlx directly, with the values borrowed from the row and the SQL a
/// `&'static str`: SeaORM's statement path copies the SQL twice and every value once
/// more, and its `DatabaseConnection` dispatch boxes a future that holds every driver's
/// state (BENCHMARKS.md has the profile). In a transaction they go through SeaORM,
/// which owns the transaction's connection. Either way a failure is the `DbErr` SeaORM
/// gives for it.
pub(crate) async fn insert_row<C: DedupConnection + ?Sized>(
    db: &C,
    backend: DbBackend,
    sql: &'static str,
    row: &task_run::Model,
    returning_id: bool,
) -> Result<bool, DbErr> {
    on_sqlx_pool!(db, pool => {
        let mut conn = pool.acquire().await.map_err(acquire_err)?;
        let query = bind_row(sqlx::query(sql), row);
        if returning_id {
            // `fetch_all`: see `returned_row`.
            query
                .fetch_all(&mut *conn)
                .await
                .map(|ids| !ids.is_empty())
                .map_err(query_err)
        } else {
            query.execute(&mut *conn).await.map(|_| true).map_err(exec_err)
        }
    }, else => {
        let insert = Statement::from_sql_and_values(backend, sql, insert_values(row));
        if returning_id {
            Ok(returned_row(db, insert).await?.is_some())
        } else {
            db.execute_raw(insert).await.map(|_| true)
        }
    })
}

/// Runs `sql`, an INSERT of a new task that returns a row (an upsert), and maps the row.
/// See [`insert_row`] for the two paths.
pub(crate) async fn upsert_row<C: DedupConnection + ?Sized>(
    db: &C,
    backend: DbBackend,
    sql: &'static str,
    row: &task_run::Model,
) -> Result<Option<task_run::Model>, DbErr> {
    let stored = on_sqlx_pool!(db, pool => {
        let mut conn = pool.acquire().await.map_err(acquire_err)?;
        bind_row(sqlx::query(sql), row)
            .fetch_all(&mut *conn)
            .await
            .map(|rows| rows.into_iter().next().map(sea_orm::QueryResult::from))
            .map_err(query_err)
    }, else => {
        let upsert = Statement::from_sql_and_values(backend, sql, insert_values(row));
        returned_row(db, upsert).await
    })?;
    stored
        .map(|row| task_run::Model::from_query_result(&row, ""))
        .transpose()
}

/// Runs `sql`, a SELECT of every column by key and window (four parameters), and maps
/// the row. See [`insert_row`] for the two paths.
pub(crate) async fn select_occupant<C: DedupConnection + ?Sized>(
    db: &C,
    backend: DbBackend,
    sql: &'static str,
    key: &TaskKey,
    window_end: i64,
) -> Result<Option<task_run::Model>, DbErr> {
    let row = on_sqlx_pool!(db, pool => {
        let mut conn = pool.acquire().await.map_err(acquire_err)?;
        sqlx::query(sql)
            .bind(key.user_id())
            .bind(key.task_type())
            .bind(key.resource_key())
            .bind(window_end)
            .fetch_optional(&mut *conn)
            .await
            .map(|row| row.map(sea_orm::QueryResult::from))
            .map_err(query_err)
    }, else => {
        let values = vec![
            key.user_id().into(),
            key.task_type().into(),
            key.resource_key().into(),
            window_end.into(),
        ];
        db.query_one_raw(Statement::from_sql_and_values(backend, sql, values))
            .await
    })?;
    row.map(|row| task_run::Model::from_query_result(&row, ""))
        .transpose()
}

/// The row a write with `RETURNING` returns (at most one), through SeaORM.
///
/// Read with `query_all`, which steps the statement to its end: SQLite runs its WAL
/// auto-checkpoint only when a write statement steps to its end, and sqlx's
/// `fetch_optional`/`fetch_one` reset the statement after the first row. The write
/// commits either way, but the WAL is then never checkpointed and grows with every write
/// until the last connection closes (`tests/sqlite.rs`; 900 MB for 20,000 tasks through
/// a worker, every read slower for it). The sqlx paths use `fetch_all` for the same
/// reason.
pub(crate) async fn returned_row<C: ConnectionTrait + ?Sized>(
    db: &C,
    statement: Statement,
) -> Result<Option<sea_orm::QueryResult>, DbErr> {
    Ok(db.query_all_raw(statement).await?.into_iter().next())
}

/// Binds a new task's values for sqlx, in the order of [`insert_values`]. Each value is
/// bound as SeaORM binds the same value (sea-query-sqlx), so both paths store the same
/// bytes.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) fn bind_row<'q, DB>(
    query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>,
    row: &'q task_run::Model,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>
where
    DB: sqlx::Database,
    uuid::Uuid: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<&'q serde_json::Value>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i16: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    chrono::DateTime<chrono::Utc>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    query
        .bind(row.id)
        .bind(row.user_id.as_str())
        .bind(row.task_type.as_str())
        .bind(row.resource_key.as_str())
        .bind(row.payload.as_ref())
        .bind(row.created_at)
        .bind(row.updated_at)
        .bind(row.run_at)
        .bind(row.priority)
        .bind(row.scope.as_str())
        .bind(row.dedup_window_end)
}

/// A new task's bound values, in the order of the INSERT statements' placeholders:
/// id, user_id, task_type, resource_key, payload, created_at, updated_at, run_at,
/// priority, scope, dedup_window_end (`status` and `attempts` are literals there).
pub(crate) fn insert_values(row: &task_run::Model) -> Vec<Value> {
    vec![
        row.id.into(),
        row.user_id.clone().into(),
        row.task_type.clone().into(),
        row.resource_key.clone().into(),
        row.payload.clone().into(),
        row.created_at.into(),
        row.updated_at.into(),
        row.run_at.into(),
        row.priority.into(),
        row.scope.as_str().into(),
        row.dedup_window_end.into(),
    ]
}

/// Closes the pool's idle connections that no longer answer a ping (the server dropped
/// them), so the next statements get live or new ones. Called after a lost connection
/// only: one ping per idle connection then, nothing on the way to a healthy database.
pub(crate) async fn close_dead_connections(db: &DatabaseConnection) {
    on_sqlx_pool!(db, pool => {
        let mut live = Vec::new();
        // Idle connections only: those in use are someone else's.
        while let Some(mut conn) = pool.try_acquire() {
            if sqlx::Connection::ping(&mut *conn).await.is_ok() {
                live.push(conn);
            } else {
                conn.close_on_drop();
            }
        }
        // The live ones go back to the pool here.
    }, else => {})
}

/// The `DbErr` SeaORM gives when it cannot get a connection from the pool, so that
/// callers see the same error on both paths (sea-orm's `sqlx_conn_acquire_err`).
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) fn acquire_err(err: sqlx::Error) -> DbErr {
    use sea_orm::{ConnAcquireErr, RuntimeErr};
    match err {
        sqlx::Error::PoolTimedOut => DbErr::ConnectionAcquire(ConnAcquireErr::Timeout),
        sqlx::Error::PoolClosed => DbErr::ConnectionAcquire(ConnAcquireErr::ConnectionClosed),
        err => DbErr::Conn(RuntimeErr::SqlxError(err.into())),
    }
}

/// The `DbErr` SeaORM gives when a statement run with `execute` fails.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) fn exec_err(err: sqlx::Error) -> DbErr {
    DbErr::Exec(sea_orm::RuntimeErr::SqlxError(err.into()))
}

/// The `DbErr` SeaORM gives when a query (a statement that returns rows) fails.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) fn query_err(err: sqlx::Error) -> DbErr {
    DbErr::Query(sea_orm::RuntimeErr::SqlxError(err.into()))
}
