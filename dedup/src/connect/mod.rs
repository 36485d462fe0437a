//! Reaching the database: [`connect`] opens a pool with the per-dialect settings the
//! guarantees depend on, and [`retry`] is the one driver that decides whether an attempt
//! lost with its connection (or to a deadlock) runs again.

#[cfg(feature = "postgres")]
pub(crate) mod formation;
pub(crate) mod retry;

use std::time::Duration;

use sea_orm::{ConnectOptions, Database, DatabaseConnection};

use crate::values::connection::PoolerMode;
use crate::values::error::DedupError;

/// Pool size used when the options do not set one. SeaORM's own default for SQLite is a
/// single connection, which serializes every caller behind one another.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 16;

/// How long SQLite waits for the write lock before giving up with `SQLITE_BUSY`. Writers
/// queue on this lock; the wait must outlast a burst of concurrent writers.
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Connects with task-dedup's defaults: see [`connect_with`]. Also turns SeaORM's
/// per-statement logging off (task-dedup emits its own `tracing` events) and pings a
/// pooled connection only after it sat idle for 30 s, not on every checkout.
///
/// `url` is `sqlite://path?mode=rwc`, `sqlite::memory:`, `postgres://...` or
/// `mysql://...`; the dialect is chosen from it at run time.
///
/// # Errors
/// [`DedupError::Database`] when the URL is invalid, [`DedupError::ConnectionLost`] when
/// the database cannot be reached (refused, unknown host), another variant as SeaORM
/// reports it (e.g. a timeout within the pool's connect timeout).
///
/// ```no_run
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let db = task_dedup::connect("sqlite::memory:").await?;
/// # Ok::<(), task_dedup::DedupError>(())
/// # }).unwrap();
/// ```
pub async fn connect(url: &str) -> Result<DatabaseConnection, DedupError> {
    let mut options = ConnectOptions::new(url);
    options
        .sqlx_logging(false)
        .test_before_acquire_if_idle_for(Duration::from_secs(30));
    connect_with(options).await
}

/// Connects with the caller's options plus what the guarantees need:
///
/// - a pool of [`DEFAULT_MAX_CONNECTIONS`] when `max_connections` is unset;
/// - SQLite files: WAL (readers never block the writer), a busy timeout of
///   [`SQLITE_BUSY_TIMEOUT`] so concurrent writers wait for the lock instead of failing,
///   `synchronous = NORMAL` (durable in WAL mode), on every pooled connection;
/// - in-memory SQLite: one connection kept open, which is the whole database (it
///   vanishes when the last connection closes, and shared-cache connections would fail
///   on table locks instead of waiting);
/// - a PostgreSQL URL with several hosts, as an HA manager gives them
///   (`postgres://app@db1:5432,db2:5432/app?target_session_attrs=read-write`), which
///   sqlx refuses: the pool opens on the first host, in the URL's order, that answers
///   and, with `target_session_attrs=read-write` (or `primary`), takes writes; with it,
///   a new connection to a read-only server is refused. After a failover or a
///   switchover, the first call that loses its connection (or meets a read-only server,
///   SQLSTATE 25006) finds the new primary and points the pool at it, within its retry
///   budget. Of `options`, what SeaORM lets one read is kept (pool sizes, timeouts,
///   logging, the idle ping); callbacks (`after_connect`, `map_sqlx_*`) are not.
///
/// # Errors
/// As [`connect`]; with several hosts, [`DedupError::ConnectionLost`] when none of them
/// answers (or, with `target_session_attrs=read-write`, takes writes).
pub async fn connect_with(mut options: ConnectOptions) -> Result<DatabaseConnection, DedupError> {
    let url = options.get_url().to_owned();
    if url.starts_with("sqlite:") {
        if is_in_memory(&url) {
            options
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None);
        } else {
            if options.get_max_connections().is_none() {
                options.max_connections(DEFAULT_MAX_CONNECTIONS);
            }
            #[cfg(feature = "sqlite")]
            options.map_sqlx_sqlite_opts(|opts| {
                use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
                opts.journal_mode(SqliteJournalMode::Wal)
                    .busy_timeout(SQLITE_BUSY_TIMEOUT)
                    .synchronous(SqliteSynchronous::Normal)
            });
        }
    } else if options.get_max_connections().is_none() {
        options.max_connections(DEFAULT_MAX_CONNECTIONS);
    }
    #[cfg(feature = "postgres")]
    if let Some(hosts) = formation::parse(&url) {
        return formation::connect(&options, hosts).await;
    }
    let db = Database::connect(options).await?;
    // A database SeaORM connects to but task-dedup was built without says so now, not at
    // the first enqueue.
    crate::dialect::Dialect::of(sea_orm::ConnectionTrait::get_database_backend(&db))?;
    Ok(db)
}

/// Connects as [`connect_with`] does, and sends task-dedup's statements on every pool of
/// the same endpoint (host, port and database) as `mode` says: what a pooler without
/// named prepared statements needs ([`PoolerMode::NoPreparedStatements`]).
///
/// Every task-dedup call on such a pool, the [`Worker`](crate::Worker) and the admin
/// API ([`TaskAdmin`](crate::TaskAdmin)) on it included, then goes through the pooler.
/// Inside your transaction ([`DedupConnection`](crate::DedupConnection) on a
/// `DatabaseTransaction`) task-dedup cannot tell which pool the transaction came from:
/// say it with [`TaskDedup::with_pooler_mode`](crate::TaskDedup::with_pooler_mode)
/// (`txn.with_pooler_mode(PoolerMode::NoPreparedStatements)`); a bare transaction runs
/// in the default mode, as your own SeaORM statements in it do.
///
/// Your own SeaORM statements are sqlx's named prepared statements and are not changed:
/// through PgBouncer before 1.21 in transaction mode they fail (sqlx issue #4328) unless
/// they run outside it. Migrations need a direct connection too (the README says why).
///
/// # Errors
/// As [`connect`].
///
/// ```no_run
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use task_dedup::PoolerMode;
/// let options = sea_orm::ConnectOptions::new("postgres://app@pgbouncer:6432/app");
/// let db = task_dedup::connect_with_pooler(options, PoolerMode::NoPreparedStatements).await?;
/// # Ok::<(), task_dedup::DedupError>(())
/// # }).unwrap();
/// ```
pub async fn connect_with_pooler(
    options: ConnectOptions,
    mode: PoolerMode,
) -> Result<DatabaseConnection, DedupError> {
    let db = connect_with(options).await?;
    crate::executor::pooler::register(&db, mode == PoolerMode::NoPreparedStatements);
    Ok(db)
}

fn is_in_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}
