//! How a waiting [`Worker`](super::Worker) learns that there is work: PostgreSQL
//! LISTEN/NOTIFY, an in-process doorbell on SQLite, or polling. The sending side is
//! [`crate::executor::notify`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sea_orm::DatabaseConnection;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::executor::Pool;

/// How a [`Worker`](super::Worker) learns of new tasks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Wakeups {
    /// The best the database offers.
    ///
    /// - PostgreSQL: LISTEN on `task_dedup_wakeup`, which task-dedup notifies when it
    ///   writes a task that is due now (created, replaced, released, requeued). The
    ///   worker polls only every [`fallback_poll`](super::WorkerBuilder::fallback_poll),
    ///   for what a notification cannot announce: a scheduled task or a retry becoming
    ///   due, a task written by other means. The listener runs on a connection of its
    ///   own (from the worker's pool, or
    ///   [`listen_url`](super::WorkerBuilder::listen_url)), and checks first, and then
    ///   every minute, that it hears a notification the worker sends through its pool.
    ///   Unheard (behind a transaction pooler such as PgBouncer in transaction mode,
    ///   the LISTEN lands on a server connection that goes back to the pool), the
    ///   worker says so once in the log, counts it
    ///   ([`WorkerReport::unheard_listener_checks`](super::WorkerReport), the metric
    ///   `task_dedup_listener_unheard_total`), stops listening and polls adaptively as
    ///   on MySQL.
    /// - SQLite (a file): a doorbell rung in this process when a task is written through
    ///   a pool of the same file, and a change watcher that sees every commit to the
    ///   file, from any connection or process, the caller's transactions included
    ///   (`PRAGMA data_version` on a connection of its own, every 20 ms); the worker then
    ///   polls only every [`fallback_poll`](super::WorkerBuilder::fallback_poll). An
    ///   in-memory database has the doorbell and the adaptive poll.
    /// - MySQL/MariaDB: the adaptive poll.
    ///
    /// The same means tell a worker that a task it runs was cancelled, so that it fires
    /// the handler's cancellation at once: PostgreSQL's listener also LISTENs on
    /// `task_dedup_cancel`; on SQLite a cancel through a pool of the same file in this
    /// process rings a bell. Otherwise (MySQL/MariaDB, another process on SQLite, a
    /// cancel inside a caller's transaction on SQLite, a listener that is down) the
    /// worker looks every [`cancel_poll`](super::WorkerBuilder::cancel_poll).
    #[default]
    Auto,
    /// The adaptive poll only: [`poll_interval`](super::WorkerBuilder::poll_interval).
    Poll,
}

/// What a waiting worker waits on, besides its poll.
pub(super) struct Waker {
    /// Rung when there may be work; `None` when the worker polls.
    pub bell: Option<Arc<Notify>>,
    /// Rung when a task that may be running here was cancelled; `None` when the worker
    /// looks at its running tasks every
    /// [`cancel_poll`](super::WorkerBuilder::cancel_poll) only.
    pub cancels: Option<Arc<Notify>>,
    /// Whether `cancels` hears every cancel now (PostgreSQL's listener, while it is up).
    pub hears_every_cancel: Arc<AtomicBool>,
    /// Whether the bell hears every write now (PostgreSQL's listener, SQLite's change
    /// watcher, while their connections are up), so that the worker polls only at the
    /// fallback interval.
    pub hears_every_write: Arc<AtomicBool>,
    /// The checks of the PostgreSQL listener that went unheard.
    pub unheard: Arc<AtomicU64>,
}

impl Waker {
    pub(super) fn replaces_polling(&self) -> bool {
        self.hears_every_write.load(Ordering::Relaxed)
    }
}

/// How often the SQLite change watcher asks whether the database changed.
#[cfg(feature = "sqlite")]
pub(super) const SQLITE_WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

impl Waker {
    /// Starts listening where `wakeups` and the database allow. A PostgreSQL listener
    /// runs on its own connection (from the pool, or to `listen_url`) in `tracker`
    /// until `stop`.
    pub(super) fn start(
        db: &DatabaseConnection,
        wakeups: Wakeups,
        listen_url: Option<&str>,
        tracker: &TaskTracker,
        stop: CancellationToken,
    ) -> Waker {
        let hears_every_write = Arc::new(AtomicBool::new(false));
        let unheard = Arc::new(AtomicU64::new(0));
        let polling = Waker {
            bell: None,
            cancels: None,
            hears_every_cancel: Arc::new(AtomicBool::new(false)),
            hears_every_write: hears_every_write.clone(),
            unheard: unheard.clone(),
        };
        if wakeups == Wakeups::Poll {
            return polling;
        }
        let _ = (tracker, &stop, listen_url);
        #[allow(unreachable_patterns)]
        match Pool::of(db) {
            #[cfg(feature = "postgres")]
            Some(Pool::Postgres(pool)) => {
                let bell = Arc::new(Notify::new());
                let cancels = Arc::new(Notify::new());
                let listener = postgres::Listener {
                    pool: pool.clone(),
                    url: listen_url.map(str::to_owned),
                    db: db.clone(),
                    bell: bell.clone(),
                    cancels: cancels.clone(),
                    listening: hears_every_write.clone(),
                    unheard: unheard.clone(),
                };
                tracker.spawn(listener.run(stop));
                Waker {
                    bell: Some(bell),
                    cancels: Some(cancels),
                    hears_every_cancel: hears_every_write.clone(),
                    hears_every_write,
                    unheard,
                }
            }
            #[cfg(feature = "sqlite")]
            Some(Pool::Sqlite(pool)) => {
                let options = pool.connect_options();
                let bell = crate::executor::notify::doorbell(options.get_filename());
                // Cancels through a pool of this file in this process; other processes'
                // and caller transactions' cancels are seen at the cancel poll.
                let cancels = crate::executor::notify::bell(
                    options.get_filename(),
                    crate::executor::notify::Bell::Cancel,
                );
                if !sqlite_in_memory(&options) {
                    let options = (*options).clone();
                    let watching = hears_every_write.clone();
                    tracker.spawn(watch_sqlite(options, bell.clone(), watching, stop));
                }
                Waker {
                    bell: Some(bell),
                    cancels: Some(cancels),
                    hears_every_cancel: Arc::new(AtomicBool::new(false)),
                    hears_every_write,
                    unheard,
                }
            }
            _ => polling,
        }
    }
}

/// SeaORM's `Database::connect` gives SQLite a pool of one connection: the worker's
/// claims, heartbeats and endings then queue behind each other and behind every
/// request of the application. Says so once, at start (`task_dedup::connect` opens 16).
pub(super) fn warn_about_a_single_connection(db: &DatabaseConnection, concurrency: usize) {
    #[cfg(feature = "sqlite")]
    if let Some(Pool::Sqlite(pool)) = Pool::of(db)
        && pool.options().get_max_connections() == 1
        && !sqlite_in_memory(&pool.connect_options())
    {
        tracing::warn!(
            concurrency,
            "the worker's SQLite pool has a single connection (SeaORM's default): its \
             statements queue behind each other and behind the application's; connect with \
             task_dedup::connect, or set max_connections"
        );
    }
    let _ = (db, concurrency);
}

/// Whether `options` open an in-memory database: another connection would not see it
/// (or, in shared cache, would not be told of its changes).
#[cfg(feature = "sqlite")]
fn sqlite_in_memory(options: &sea_orm::sqlx::sqlite::SqliteConnectOptions) -> bool {
    let name = options.get_filename().to_string_lossy();
    name.contains(":memory:")
        || name.contains("mode=memory")
        || name.starts_with("file:sqlx-in-memory")
}

/// Watches a SQLite database for commits from any connection or process, the caller's
/// transactions included (the in-process doorbell rings only for writes through a pool,
/// since a transaction would ring before its commit): `PRAGMA data_version` on a
/// connection of its own changes when another connection commits, and costs a read of
/// the WAL index. Asked every [`SQLITE_WATCH_EVERY`]; rings `bell` on a change. While its
/// connection is down the worker polls.
#[cfg(feature = "sqlite")]
async fn watch_sqlite(
    options: sea_orm::sqlx::sqlite::SqliteConnectOptions,
    bell: Arc<Notify>,
    watching: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    use sea_orm::sqlx::ConnectOptions;
    loop {
        let watcher = async {
            let mut conn = options.connect().await?;
            let mut seen: Option<i64> = None;
            watching.store(true, Ordering::Relaxed);
            // A commit between the worker's last claim and the first look is not missed:
            // the worker claims once after it starts.
            let mut every = tokio::time::interval(SQLITE_WATCH_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let version: i64 = sea_orm::sqlx::query_scalar("PRAGMA data_version")
                    .fetch_one(&mut conn)
                    .await?;
                if seen.is_some_and(|seen| seen != version) {
                    bell.notify_waiters();
                }
                seen = Some(version);
            }
            #[allow(unreachable_code)]
            Ok::<(), sea_orm::sqlx::Error>(())
        };
        tokio::select! {
            () = stop.cancelled() => return,
            outcome = watcher => {
                watching.store(false, Ordering::Relaxed);
                if let Err(err) = outcome {
                    tracing::warn!(error = %err, "SQLite change watcher failed; watching again in 1 s (polling meanwhile)");
                }
            }
        }
        bell.notify_waiters();
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres;
