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
use super::row::TaskRow;
use task_dedup_entity::task_run;

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
        use std::hash::{BuildHasher, Hash, Hasher};
        // foldhash, not std's SipHash: this runs on every enqueue (the guard's cache
        // look-up), the value never leaves the process, and SipHash took about 1,000
        // instructions of a hit's client work (BENCHMARKS.md, "Client CPU per hit").
        let mut hasher = foldhash::fast::FixedState::with_seed(0).build_hasher();
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
    ///
    /// `all`: every idle connection (a pool pointed at another host: they are to the
    /// former one).
    pub(crate) async fn close_dead_connections(self, all: bool) {
        macro_rules! sweep {
            ($pool:expr, $live:expr) => {{
                let mut live = Vec::new();
                // Idle connections only: those in use are someone else's.
                while let Some(mut conn) = $pool.try_acquire() {
                    if $live(&mut *conn).await {
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
            // A server that became read-only (a former primary, demoted) answers a ping
            // but refuses every write (25006): closed too.
            Pool::Postgres(pool) => sweep!(pool, async |conn: &mut sqlx::PgConnection| {
                !all && takes_writes(conn).await
            }),
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => sweep!(pool, async |conn: &mut sqlx::MySqlConnection| {
                !all && sqlx::Connection::ping(conn).await.is_ok()
            }),
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(pool) => sweep!(pool, async |conn: &mut sqlx::SqliteConnection| {
                !all && sqlx::Connection::ping(conn).await.is_ok()
            }),
        }
    }
}

/// Whether the PostgreSQL server of `conn` takes writes (`transaction_read_only` is
/// off: not a standby, nor a primary still being promoted); `false` when it does not
/// answer. In the simple query protocol: no prepared statement, which a transaction
/// pooler in front may not keep.
#[cfg(feature = "postgres")]
pub(crate) async fn takes_writes(conn: &mut sqlx::PgConnection) -> bool {
    use sqlx::Row;
    sqlx::raw_sql(sqlx::AssertSqlSafe("SHOW transaction_read_only"))
        .fetch_one(conn)
        .await
        .is_ok_and(|row| {
            row.try_get::<String, _>(0)
                .is_ok_and(|value| value == "off")
        })
}

/// A connection taken from a [`Pool`] for several statements.
pub(crate) enum Held {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::pool::PoolConnection<sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    MySql(sqlx::pool::PoolConnection<sqlx::MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::pool::PoolConnection<sqlx::Sqlite>),
}

impl Pool<'_> {
    /// One of the pool's connections, until it is dropped.
    pub(crate) async fn hold(self) -> Result<Held, DbErr> {
        Ok(match self {
            #[cfg(feature = "postgres")]
            Pool::Postgres(pool) => Held::Postgres(acquire(pool).await?),
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => Held::MySql(acquire(pool).await?),
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(pool) => Held::Sqlite(acquire(pool).await?),
        })
    }
}

/// A connection of `pool`, until it is dropped.
///
/// Boxed (as the pool's `begin` is, in [`Conn::begin`]): sqlx's acquire may open a
/// connection, and its future (1 to 5 KB) would otherwise sit in the future of every
/// statement, which is copied whole at each step up the call stack (BENCHMARKS.md,
/// "Client CPU per hit"). One allocation per connection taken instead (an enqueue's
/// attempt takes one for all its statements: [`Executor::hold`](super::Executor::hold)).
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
async fn acquire<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
) -> Result<sqlx::pool::PoolConnection<DB>, DbErr> {
    Box::pin(pool.acquire()).await.map_err(acquire_err)
}

/// Where statements run.
pub(crate) enum Conn<'c> {
    /// A sqlx pool, each statement on a connection of its own.
    Pool(Pool<'c>),
    /// One connection of a sqlx pool, for every statement (see
    /// [`Executor::hold`](super::Executor::hold)).
    Held(Pool<'c>, Held),
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
                let mut conn = acquire(pool).await?;
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
                let mut conn = acquire(pool).await?;
                on_sqlx!(sqlx::MySql, &mut *conn, $sql, $args, |$query, $executor| {
                    $sqlx
                })
            }
            #[cfg(feature = "sqlite")]
            Conn::Pool(Pool::Sqlite(pool)) => {
                let mut conn = acquire(pool).await?;
                on_sqlx!(
                    sqlx::Sqlite,
                    &mut *conn,
                    $sql,
                    $args,
                    |$query, $executor| $sqlx
                )
            }
            #[cfg(feature = "postgres")]
            Conn::Held(_, Held::Postgres(conn)) => {
                on_sqlx!(
                    sqlx::Postgres,
                    &mut **conn,
                    $sql,
                    $args,
                    |$query, $executor| $sqlx
                )
            }
            #[cfg(feature = "mysql")]
            Conn::Held(_, Held::MySql(conn)) => {
                on_sqlx!(
                    sqlx::MySql,
                    &mut **conn,
                    $sql,
                    $args,
                    |$query, $executor| { $sqlx }
                )
            }
            #[cfg(feature = "sqlite")]
            Conn::Held(_, Held::Sqlite(conn)) => {
                on_sqlx!(
                    sqlx::Sqlite,
                    &mut **conn,
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
    /// write until the last connection closes (`tests/connections/sqlite.rs`; 900 MB for 20,000 tasks
    /// through a worker, every read slower for it).
    ///
    /// `unprepared`: on PostgreSQL, without a named prepared statement
    /// ([`PoolerMode::NoPreparedStatements`](crate::PoolerMode)).
    pub(crate) async fn fetch_all(
        &mut self,
        backend: DbBackend,
        sql: Cow<'static, str>,
        args: Vec<Arg<'_>>,
        unprepared: bool,
    ) -> Result<Vec<QueryResult>, DbErr> {
        #[cfg(feature = "postgres")]
        if unprepared {
            let sql = super::literal::render(&sql, &args)?;
            return self.unprepared(backend, sql, true).await.map(|done| done.0);
        }
        let _ = unprepared;
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

    /// Runs `sql`, whose rows are tasks ([`columns!`](crate::dialect)), and reads every
    /// row into one ([`TaskRow`]). `unprepared`: as for [`fetch_all`](Self::fetch_all).
    pub(crate) async fn fetch_tasks(
        &mut self,
        backend: DbBackend,
        sql: Cow<'static, str>,
        args: Vec<Arg<'_>>,
        unprepared: bool,
    ) -> Result<Vec<task_run::Model>, DbErr> {
        if unprepared {
            // Boxed: its state would otherwise sit in every read's future, beside the
            // dispatch's.
            let rows = Box::pin(self.fetch_all(backend, sql, args, true)).await?;
            return rows.iter().map(TaskRow::task).collect();
        }
        dispatch! {
            self, backend, sql, args,
            sqlx |query, executor| query
                .fetch_all(executor)
                .await
                .map_err(query_err)?
                .into_iter()
                .map(TaskRow::task)
                .collect(),
            seaorm |db, statement| db
                .query_all_raw(statement)
                .await?
                .iter()
                .map(TaskRow::task)
                .collect()
        }
    }

    /// Runs `sql`, whose rows are tasks, and reads the first into one: for statements of
    /// at most one row. sqlx reads that row alone (`fetch_optional`, no vectors); a
    /// write that returns rows runs to its end before the first is sent, so nothing of
    /// it is cut short. SQLite reads every row, as [`fetch_all`](Self::fetch_all) says
    /// why. `unprepared`: as for [`fetch_all`](Self::fetch_all).
    pub(crate) async fn fetch_task(
        &mut self,
        backend: DbBackend,
        sql: Cow<'static, str>,
        args: Vec<Arg<'_>>,
        unprepared: bool,
    ) -> Result<Option<task_run::Model>, DbErr> {
        if unprepared {
            let tasks = self.fetch_tasks(backend, sql, args, true).await?;
            return Ok(tasks.into_iter().next());
        }
        dispatch! {
            self, backend, sql, args,
            sqlx |query, executor| if backend == DbBackend::Sqlite {
                query
                    .fetch_all(executor)
                    .await
                    .map_err(query_err)?
                    .into_iter()
                    .next()
                    .map(TaskRow::task)
                    .transpose()
            } else {
                query
                    .fetch_optional(executor)
                    .await
                    .map_err(query_err)?
                    .map(TaskRow::task)
                    .transpose()
            },
            seaorm |db, statement| db
                .query_all_raw(statement)
                .await?
                .first()
                .map(TaskRow::task)
                .transpose()
        }
    }

    /// Runs `sql`; returns how many rows it affected. `unprepared`: as for
    /// [`fetch_all`](Self::fetch_all).
    pub(crate) async fn execute(
        &mut self,
        backend: DbBackend,
        sql: Cow<'static, str>,
        args: Vec<Arg<'_>>,
        unprepared: bool,
    ) -> Result<u64, DbErr> {
        #[cfg(feature = "postgres")]
        if unprepared {
            let sql = super::literal::render(&sql, &args)?;
            return self
                .unprepared(backend, sql, false)
                .await
                .map(|done| done.1);
        }
        let _ = unprepared;
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

    /// Runs `sql`, a PostgreSQL statement with its values written in, without a named
    /// prepared statement; its rows if `rows`, and how many rows it affected.
    ///
    /// On a pool and in a transaction of the crate's own, one simple-protocol message
    /// (sqlx's `raw_sql`), which a pooler runs on one server. In a SeaORM transaction a
    /// statement without rows goes the same way (`execute_unprepared`); one read for its
    /// rows can only go through `query_all_raw`, a named statement (sqlx's cache), which
    /// works there because the transaction keeps its server: see [`unprepared_rows`].
    #[cfg(feature = "postgres")]
    async fn unprepared(
        &mut self,
        backend: DbBackend,
        sql: String,
        rows: bool,
    ) -> Result<(Vec<QueryResult>, u64), DbErr> {
        macro_rules! raw {
            ($executor:expr) => {{
                let query = sqlx::raw_sql(sqlx::AssertSqlSafe(sql));
                if rows {
                    let rows = query.fetch_all($executor).await.map_err(query_err)?;
                    let affected = rows.len() as u64;
                    Ok((rows.into_iter().map(QueryResult::from).collect(), affected))
                } else {
                    let done = query.execute($executor).await.map_err(exec_err)?;
                    Ok((Vec::new(), done.rows_affected()))
                }
            }};
        }
        match self {
            Conn::Pool(Pool::Postgres(pool)) => {
                let mut conn = acquire(pool).await?;
                raw!(&mut *conn)
            }
            Conn::Held(_, Held::Postgres(conn)) => raw!(&mut **conn),
            Conn::PgTxn(txn) => raw!(&mut **txn),
            Conn::SeaOrmTxn(txn) if rows => Ok((unprepared_rows(txn, backend, sql).await?, 0)),
            Conn::SeaOrmTxn(txn) => Ok((
                Vec::new(),
                txn.execute_unprepared(&sql).await?.rows_affected(),
            )),
            Conn::SeaOrm(db) if rows => {
                let rows = db
                    .query_all_raw(sea_orm::Statement::from_string(backend, sql))
                    .await?;
                Ok((rows, 0))
            }
            Conn::SeaOrm(db) => Ok((
                Vec::new(),
                db.execute_unprepared(&sql).await?.rows_affected(),
            )),
            #[allow(unreachable_patterns)]
            _ => Err(DbErr::Custom(
                "task-dedup: PostgreSQL's pooler mode on another database's connection".to_owned(),
            )),
        }
    }

    /// Whether statements run in a transaction (the caller's or one of the crate's own).
    pub(crate) fn in_transaction(&self) -> bool {
        !matches!(self, Conn::Pool(_) | Conn::Held(..) | Conn::SeaOrm(_))
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
                Conn::PgTxn(Box::pin(pool.begin()).await.map_err(acquire_err)?)
            }
            #[cfg(feature = "mysql")]
            Conn::Pool(Pool::MySql(pool)) => {
                Conn::MySqlTxn(Box::pin(pool.begin()).await.map_err(acquire_err)?)
            }
            #[cfg(feature = "sqlite")]
            Conn::Pool(Pool::Sqlite(pool)) => Conn::SqliteTxn(
                if immediate {
                    Box::pin(pool.begin_with("BEGIN IMMEDIATE")).await
                } else {
                    Box::pin(pool.begin()).await
                }
                .map_err(acquire_err)?,
            ),
            #[cfg(feature = "postgres")]
            Conn::Held(_, Held::Postgres(conn)) => Conn::PgTxn(
                sqlx::Connection::begin(&mut **conn)
                    .await
                    .map_err(exec_err)?,
            ),
            #[cfg(feature = "mysql")]
            Conn::Held(_, Held::MySql(conn)) => Conn::MySqlTxn(
                sqlx::Connection::begin(&mut **conn)
                    .await
                    .map_err(exec_err)?,
            ),
            #[cfg(feature = "sqlite")]
            Conn::Held(_, Held::Sqlite(conn)) => Conn::SqliteTxn(
                if immediate {
                    sqlx::Connection::begin_with(&mut **conn, "BEGIN IMMEDIATE").await
                } else {
                    sqlx::Connection::begin(&mut **conn).await
                }
                .map_err(exec_err)?,
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
            Conn::Pool(_) | Conn::Held(..) | Conn::SeaOrm(_) | Conn::SeaOrmTxn(Txn::Callers(_)) => {
                Ok(())
            }
        }
    }
}

/// The savepoint [`unprepared_rows`] runs its statement in.
#[cfg(feature = "postgres")]
const SAVEPOINT: &str = "task_dedup_unprepared";

/// Makes each statement [`unprepared_rows`] sends a text sqlx has not seen.
#[cfg(feature = "postgres")]
static STATEMENT_NUMBER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The rows of `sql` (values written in) in a SeaORM transaction, through a pooler that
/// does not follow named prepared statements.
///
/// SeaORM reads rows only through sqlx's named statements. In a transaction the pooler
/// keeps one server, so the statement's Parse and its Bind meet there; what can go
/// wrong is a name: sqlx would run a statement it cached under a name on another server
/// (a text it saw before), and its next name (`sqlx_s_N`, counted per client
/// connection) may be one another client left on this server. So the text is made new
/// (a number in a comment: never found in the cache; the cache's evictions close names
/// the server may not have, which PostgreSQL accepts), and the statement runs in a
/// savepoint: when its name is taken (`42P05`, which a direct connection never sees),
/// the savepoint is rolled back (the caller's transaction stays usable), the server's
/// leftover statements are dropped, and it runs again.
#[cfg(feature = "postgres")]
async fn unprepared_rows(
    txn: &DatabaseTransaction,
    backend: DbBackend,
    sql: String,
) -> Result<Vec<QueryResult>, DbErr> {
    let number = STATEMENT_NUMBER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let sql = format!("{sql} /* task-dedup {number} */");
    txn.execute_unprepared(&format!("SAVEPOINT {SAVEPOINT}"))
        .await?;
    let mut retried = false;
    loop {
        let statement = sea_orm::Statement::from_string(backend, sql.clone());
        match txn.query_all_raw(statement).await {
            Ok(rows) => {
                txn.execute_unprepared(&format!("RELEASE SAVEPOINT {SAVEPOINT}"))
                    .await?;
                return Ok(rows);
            }
            Err(err) if !retried && name_taken(&err) => {
                retried = true;
                txn.execute_unprepared(&format!(
                    "ROLLBACK TO SAVEPOINT {SAVEPOINT}; DEALLOCATE ALL"
                ))
                .await?;
            }
            Err(err) => return Err(err),
        }
    }
}

/// Whether `err` is PostgreSQL's "prepared statement ... already exists".
#[cfg(feature = "postgres")]
fn name_taken(err: &DbErr) -> bool {
    crate::dialect::postgres_error(err).is_some_and(|e| e.code() == "42P05")
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
