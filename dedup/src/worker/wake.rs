//! How a waiting [`Worker`](super::Worker) learns that there is work: PostgreSQL
//! LISTEN/NOTIFY, an in-process doorbell on SQLite, or polling. The sending side is
//! [`crate::notify`].

use std::sync::Arc;

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
    ///   due, a task written by other means.
    /// - SQLite: a doorbell rung in this process when a task is written through a pool
    ///   of the same file, besides the adaptive poll (for other processes' writes and
    ///   writes in a caller's transaction, which ring before their commit).
    /// - MySQL/MariaDB: the adaptive poll.
    #[default]
    Auto,
    /// The adaptive poll only: [`poll_interval`](super::WorkerBuilder::poll_interval).
    Poll,
}

/// What a waiting worker waits on, besides its poll.
pub(super) struct Waker {
    /// Rung when there may be work; `None` when the worker polls.
    pub bell: Option<Arc<Notify>>,
    /// Whether the bell hears every write (PostgreSQL), so that the worker polls only at
    /// the fallback interval.
    pub replaces_polling: bool,
}

impl Waker {
    /// Starts listening where `wakeups` and the database allow. A PostgreSQL listener
    /// runs on its own connection in `tracker` until `stop`.
    pub(super) fn start(
        db: &DatabaseConnection,
        wakeups: Wakeups,
        tracker: &TaskTracker,
        stop: CancellationToken,
    ) -> Waker {
        let polling = Waker {
            bell: None,
            replaces_polling: false,
        };
        if wakeups == Wakeups::Poll {
            return polling;
        }
        let _ = (tracker, &stop);
        #[allow(unreachable_patterns)]
        match Pool::of(db) {
            #[cfg(feature = "postgres")]
            Some(Pool::Postgres(pool)) => {
                let bell = Arc::new(Notify::new());
                tracker.spawn(listen(pool.clone(), bell.clone(), stop));
                Waker {
                    bell: Some(bell),
                    replaces_polling: true,
                }
            }
            #[cfg(feature = "sqlite")]
            Some(Pool::Sqlite(pool)) => Waker {
                bell: Some(crate::notify::doorbell(
                    pool.connect_options().get_filename(),
                )),
                replaces_polling: false,
            },
            _ => polling,
        }
    }
}

/// Listens on the wake-up channel and rings `bell` for each notification, until `stop`.
/// Rings too after listening again on a new connection (what was notified meanwhile is
/// lost); when that fails, tries again a second later, the worker's poll covering the
/// gap.
#[cfg(feature = "postgres")]
async fn listen(pool: sea_orm::sqlx::PgPool, bell: Arc<Notify>, stop: CancellationToken) {
    use sea_orm::sqlx::postgres::PgListener;
    loop {
        let listener = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(crate::dialect::postgres::CHANNEL).await?;
            bell.notify_waiters();
            loop {
                // `None`: the connection was lost and is listening again; what was
                // notified meanwhile is lost, so ring anyway.
                let _notification = listener.try_recv().await?;
                bell.notify_waiters();
            }
            #[allow(unreachable_code)]
            Ok::<(), sea_orm::sqlx::Error>(())
        };
        tokio::select! {
            () = stop.cancelled() => return,
            outcome = listener => {
                if let Err(err) = outcome {
                    tracing::warn!(error = %err, "wake-up listener failed; listening again in 1 s (polling meanwhile)");
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}
