//! [`Conn`]: where a statement runs — straight on a sqlx pool, through SeaORM in the
//! caller's transaction, or in a transaction of the crate's own — and the one place that
//! looks inside a SeaORM connection for its sqlx pool ([`Pool::of`]).
//!
//! On a pool statements go to sqlx directly, with the values borrowed and the SQL a
//! `&'static str`: SeaORM's statement path copies the SQL twice and every value once
//! more, and its `DatabaseConnection` dispatch boxes a future that holds every driver's
//! state (BENCHMARKS.md has the profile). In the caller's transaction they go through
//! SeaORM, which owns the transaction's connection. Either way a failure is the `DbErr`
//! SeaORM gives for it: `Conn` when no connection can be had, `Query` for statements
//! read with `fetch_all`, `Exec` for the others.

use std::borrow::Cow;

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
use sea_orm::sqlx;
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, QueryResult,
    TransactionTrait,
};

use super::args::{self, Arg};

/// The sqlx pool behind a SeaORM pool.
#[derive(Clone, Copy)]
pub(crate) enum Pool<'c> {
    #[cfg(feature = "postgres")]
    Postgres(&'c sqlx::PgPool),
    #[cfg(feature = "mysql")]
    MySql(&'c sqlx::MySqlPool),
    #[cfg(feature = "sqlite")]
    Sqlite(&'c sqlx::SqlitePool),
}

impl<'c> Pool<'c> {
    /// The sqlx pool of `db`, if it has one (not a mock, a proxy or a closed pool).
    pub(crate) fn of(db: &'c DatabaseConnection) -> Option<Pool<'c>> {
        #[allow(unreachable_patterns)]
        match &db.inner {
            #[cfg(feature = "postgres")]
            sea_orm::DatabaseConnectionType::SqlxPostgresPoolConnection(_) => {
                Some(Pool::Postgres(db.get_postgres_connection_pool()))
            }
            #[cfg(feature = "mysql")]
            sea_orm::DatabaseConnectionType::SqlxMySqlPoolConnection(_) => {
                Some(Pool::MySql(db.get_mysql_connection_pool()))
            }
            #[cfg(feature = "sqlite")]
            sea_orm::DatabaseConnectionType::SqlxSqlitePoolConnection(_) => {
                Some(Pool::Sqlite(db.get_sqlite_connection_pool()))
            }
            _ => None,
        }
    }

    /// Which database the pool connects to (host, port and database name; a SQLite
    /// file), hashed: pools of one database share it.
    pub(crate) fn identity(self) -> u64 {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let mut hasher = DefaultHasher::new();
        match self {
            #[cfg(feature = "postgres")]
            Pool::Postgres(pool) => {
                let options = pool.connect_options();
                (
                    "postgres",
                    options.get_host(),
                    options.get_port(),
                    options.get_database(),
                )
                    .hash(&mut hasher);
            }
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => {
                let options = pool.connect_options();
                (
                    "mysql",
                    options.get_host(),
                    options.get_port(),
                    options.get_database(),
                )
                    .hash(&mut hasher);
            }
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(pool) => {
                ("sqlite", pool.connect_options().get_filename()).hash(&mut hasher);
            }
        }
        hasher.finish()
    }

    /// Closes the pool's idle connections that no longer answer a ping (the server
    /// dropped them), so the next statements get live or new ones. Called after a lost
    /// connection only: one ping per idle connection then, nothing on the way to a
    /// healthy database.
    pub(crate) async fn close_dead_connections(self) {
        macro_rules! sweep {
            ($pool:expr) => {{
                let mut live = Vec::new();
                // Idle connections only: those in use are someone else's.
                while let Some(mut conn) = $pool.try_acquire() {
                    if sqlx::Connection::ping(&mut *conn).await.is_ok() {
                        live.push(conn);
                    } else {
                        conn.close_on_drop();
                    }
                }
                // The live ones go back to the pool here.
            }};
        }
        match self {
            #[cfg(feature = "postgres")]
            Pool::Postgres(pool) => sweep!(pool),
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => sweep!(pool),
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(pool) => sweep!(pool),
        }
    }
}

/// Where statements run.
pub(crate) enum Conn<'c> {
    /// A sqlx pool, each statement on a connection of its own.
    Pool(Pool<'c>),
    /// Through SeaORM: a connection without a sqlx pool (a mock or a proxy).
    SeaOrm(&'c DatabaseConnection),
    /// Through SeaORM: the caller's transaction, or one of the crate's own in it (a
    /// savepoint) or on a connection without a sqlx pool.
    SeaOrmTxn(Txn<'c>),
    /// A transaction of the crate's own on a PostgreSQL pool (or a savepoint in one).
    #[cfg(feature = "postgres")]
    PgTxn(sqlx::Transaction<'c, sqlx::Postgres>),
    /// The same on MySQL/MariaDB.
    #[cfg(feature = "mysql")]
    MySqlTxn(sqlx::Transaction<'c, sqlx::MySql>),
    /// The same on SQLite.
    #[cfg(feature = "sqlite")]
    SqliteTxn(sqlx::Transaction<'c, sqlx::Sqlite>),
}

/// A SeaORM transaction: the caller's (ended by the caller), or the crate's own.
pub(crate) enum Txn<'c> {
    Callers(&'c DatabaseTransaction),
    Own(DatabaseTransaction),
}

impl std::ops::Deref for Txn<'_> {
    type Target = DatabaseTransaction;

    fn deref(&self) -> &DatabaseTransaction {
        match self {
            Txn::Callers(txn) => txn,
            Txn::Own(txn) => txn,
        }
    }
}

/// Runs `$sqlx` with `$query` the statement bound for `$db` and `$executor` where it
/// runs.
macro_rules! on_sqlx {
    ($db:ty, $executor_expr:expr, $sql:expr, $args:expr,
     |$query:ident, $executor:ident| $sqlx:expr) => {{
        let $query = args::bind::<$db>($sql, $args)?;
        let $executor = $executor_expr;
        $sqlx
    }};
}

/// Runs `$sqlx` (see [`on_sqlx!`]) on a sqlx pool or transaction, or `$seaorm` with
/// `$db` a SeaORM connection and `$statement` the statement.
macro_rules! dispatch {
    ($conn:expr, $backend:expr, $sql:expr, $args:expr,
     sqlx |$query:ident, $executor:ident| $sqlx:expr,
     seaorm |$db:ident, $statement:ident| $seaorm:expr) => {
        match $conn {
            #[cfg(feature = "postgres")]
            Conn::Pool(Pool::Postgres(pool)) => {
                let mut conn = pool.acquire().await.map_err(acquire_err)?;
                on_sqlx!(
                    sqlx::Postgres,
                    &mut *conn,
                    $sql,
                    $args,
                    |$query, $executor| $sqlx
                )
            }
            #[cfg(feature = "mysql")]
            Conn::Pool(Pool::MySql(pool)) => {
                let mut conn = pool.acquire().await.map_err(acquire_err)?;
                on_sqlx!(sqlx::MySql, &mut *conn, $sql, $args, |$query, $executor| {
                    $sqlx
                })
            }
            #[cfg(feature = "sqlite")]
            Conn::Pool(Pool::Sqlite(pool)) => {
                let mut conn = pool.acquire().await.map_err(acquire_err)?;
                on_sqlx!(
                    sqlx::Sqlite,
                    &mut *conn,
                    $sql,
                    $args,
                    |$query, $executor| $sqlx
                )
            }
            #[cfg(feature = "postgres")]
            Conn::PgTxn(txn) => {
                on_sqlx!(
                    sqlx::Postgres,
                    &mut **txn,
                    $sql,
                    $args,
                    |$query, $executor| $sqlx
                )
            }
            #[cfg(feature = "mysql")]
            Conn::MySqlTxn(txn) => {
                on_sqlx!(sqlx::MySql, &mut **txn, $sql, $args, |$query, $executor| {
                    $sqlx
                })
            }
            #[cfg(feature = "sqlite")]
            Conn::SqliteTxn(txn) => {
                on_sqlx!(
                    sqlx::Sqlite,
                    &mut **txn,
                    $sql,
                    $args,
                    |$query, $executor| $sqlx
                )
            }
            Conn::SeaOrm($db) => {
                let $statement = args::statement($backend, $sql, $args);
                $seaorm
            }
            Conn::SeaOrmTxn(txn) => {
                let $db = &**txn;
                let $statement = args::statement($backend, $sql, $args);
                $seaorm
            }
        }
    };
}

impl<'c> Conn<'c> {
    /// Runs `sql` and returns every row.
    ///
    /// Every row is read, even of a write that returns one: SQLite runs its WAL
    /// auto-checkpoint only when a write statement steps to its end, and sqlx's
    /// `fetch_optional`/`fetch_one` reset the statement after the first row. The write
    /// commits either way, but the WAL is then never checkpointed and grows with every
    /// write until the last connection closes (`tests/sqlite.rs`; 900 MB for 20,000 tasks
    /// through a worker, every read slower for it).
    pub(crate) async fn fetch_all(
        &mut self,
        backend: DbBackend,
        sql: Cow<'static, str>,
        args: Vec<Arg<'_>>,
    ) -> Result<Vec<QueryResult>, DbErr> {
        dispatch! {
            self, backend, sql, args,
            sqlx |query, executor| query
                .fetch_all(executor)
                .await
                .map(|rows| rows.into_iter().map(QueryResult::from).collect())
                .map_err(query_err),
            seaorm |db, statement| db.query_all_raw(statement).await
        }
    }

    /// Runs `sql`; returns how many rows it affected.
    pub(crate) async fn execute(
        &mut self,
        backend: DbBackend,
        sql: Cow<'static, str>,
        args: Vec<Arg<'_>>,
    ) -> Result<u64, DbErr> {
        dispatch! {
            self, backend, sql, args,
            sqlx |query, executor| query
                .execute(executor)
                .await
                .map(|done| done.rows_affected())
                .map_err(exec_err),
            seaorm |db, statement| db.execute_raw(statement).await.map(|done| done.rows_affected())
        }
    }

    /// Whether statements run in a transaction (the caller's or one of the crate's own).
    pub(crate) fn in_transaction(&self) -> bool {
        !matches!(self, Conn::Pool(_) | Conn::SeaOrm(_))
    }

    /// Starts a transaction of the crate's own: on a pool a new one, inside a
    /// transaction a savepoint. `immediate`: on SQLite, `BEGIN IMMEDIATE` (the write
    /// lock up front; ignored inside a transaction, which has its own mode).
    pub(crate) async fn begin(
        &mut self,
        backend: DbBackend,
        immediate: bool,
    ) -> Result<Conn<'_>, DbErr> {
        let _ = (backend, immediate);
        Ok(match self {
            #[cfg(feature = "postgres")]
            Conn::Pool(Pool::Postgres(pool)) => {
                Conn::PgTxn(pool.begin().await.map_err(acquire_err)?)
            }
            #[cfg(feature = "mysql")]
            Conn::Pool(Pool::MySql(pool)) => {
                Conn::MySqlTxn(pool.begin().await.map_err(acquire_err)?)
            }
            #[cfg(feature = "sqlite")]
            Conn::Pool(Pool::Sqlite(pool)) => Conn::SqliteTxn(
                if immediate {
                    pool.begin_with("BEGIN IMMEDIATE").await
                } else {
                    pool.begin().await
                }
                .map_err(acquire_err)?,
            ),
            #[cfg(feature = "postgres")]
            Conn::PgTxn(txn) => {
                Conn::PgTxn(sqlx::Acquire::begin(&mut *txn).await.map_err(exec_err)?)
            }
            #[cfg(feature = "mysql")]
            Conn::MySqlTxn(txn) => {
                Conn::MySqlTxn(sqlx::Acquire::begin(&mut *txn).await.map_err(exec_err)?)
            }
            #[cfg(feature = "sqlite")]
            Conn::SqliteTxn(txn) => {
                Conn::SqliteTxn(sqlx::Acquire::begin(&mut *txn).await.map_err(exec_err)?)
            }
            Conn::SeaOrm(db) if immediate && backend == DbBackend::Sqlite => {
                let options = sea_orm::TransactionOptions {
                    sqlite_transaction_mode: Some(sea_orm::SqliteTransactionMode::Immediate),
                    ..sea_orm::TransactionOptions::default()
                };
                Conn::SeaOrmTxn(Txn::Own(db.begin_with_options(options).await?))
            }
            Conn::SeaOrm(db) => Conn::SeaOrmTxn(Txn::Own(db.begin().await?)),
            Conn::SeaOrmTxn(txn) => Conn::SeaOrmTxn(Txn::Own(txn.begin().await?)),
        })
    }

    /// Commits a transaction of the crate's own; nothing otherwise.
    pub(crate) async fn commit(self) -> Result<(), DbErr> {
        self.end(true).await
    }

    /// Rolls back a transaction of the crate's own; nothing otherwise.
    pub(crate) async fn rollback(self) -> Result<(), DbErr> {
        self.end(false).await
    }

    async fn end(self, commit: bool) -> Result<(), DbErr> {
        macro_rules! end {
            ($txn:expr) => {
                if commit {
                    $txn.commit().await
                } else {
                    $txn.rollback().await
                }
            };
        }
        match self {
            #[cfg(feature = "postgres")]
            Conn::PgTxn(txn) => end!(txn).map_err(exec_err),
            #[cfg(feature = "mysql")]
            Conn::MySqlTxn(txn) => end!(txn).map_err(exec_err),
            #[cfg(feature = "sqlite")]
            Conn::SqliteTxn(txn) => end!(txn).map_err(exec_err),
            Conn::SeaOrmTxn(Txn::Own(txn)) => end!(txn),
            Conn::Pool(_) | Conn::SeaOrm(_) | Conn::SeaOrmTxn(Txn::Callers(_)) => Ok(()),
        }
    }
}

/// The `DbErr` SeaORM gives when it cannot get a connection from the pool, so that
/// callers see the same error on both paths (sea-orm's `sqlx_conn_acquire_err`).
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn acquire_err(err: sqlx::Error) -> DbErr {
    use sea_orm::{ConnAcquireErr, RuntimeErr};
    match err {
        sqlx::Error::PoolTimedOut => DbErr::ConnectionAcquire(ConnAcquireErr::Timeout),
        sqlx::Error::PoolClosed => DbErr::ConnectionAcquire(ConnAcquireErr::ConnectionClosed),
        err => DbErr::Conn(RuntimeErr::SqlxError(err.into())),
    }
}

/// The `DbErr` SeaORM gives when a statement run with `execute` fails.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn exec_err(err: sqlx::Error) -> DbErr {
    DbErr::Exec(sea_orm::RuntimeErr::SqlxError(err.into()))
}

/// The `DbErr` SeaORM gives when a query (a statement that returns rows) fails.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn query_err(err: sqlx::Error) -> DbErr {
    DbErr::Query(sea_orm::RuntimeErr::SqlxError(err.into()))
}
