//! Wake-up signals sent when a task becomes claimable now (created, replaced, released or
//! requeued due, or a running task ended: with one run per key, a follow-up waiting for
//! it is due then), so that waiting [`Worker`](crate::Worker)s claim it at once instead
//! of at their next poll.
//!
//! - PostgreSQL: `NOTIFY` on [`CHANNEL`], at most once per [`NOTIFY_DEBOUNCE`] per
//!   database and process. A notifying transaction takes a database-wide lock from its
//!   commit's start to its end, so notifying every insert serialised concurrent commits:
//!   measured, a trigger notifying each insert cut 16 clients' creates from 8,000/s to
//!   3,300/s. Debounced, one create in many pays one extra statement. A worker that
//!   hears a notification claims again [`NOTIFY_DEBOUNCE`] later, which finds the tasks
//!   whose notification the debounce swallowed (River does the same: a limited
//!   notification on insert, a leading and a trailing fetch).
//! - SQLite: an in-process doorbell per database file, rung for writes outside a
//!   caller's transaction; other processes' workers poll.
//! - MySQL/MariaDB: nothing; workers poll.
//!
//! A cancel of a task that may be running ([`task_cancelled`]) is announced apart, so
//! that the worker running it cancels its handler at once: PostgreSQL `NOTIFY` on
//! [`CANCEL_CHANNEL`](crate::dialect::postgres::CANCEL_CHANNEL) (not debounced), an
//! in-process bell on SQLite; MySQL/MariaDB workers look at their running tasks every
//! [`cancel_poll`](crate::WorkerBuilder::cancel_poll).

#[cfg(any(feature = "postgres", feature = "worker"))]
use std::time::Duration;

use super::Executor;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use crate::dialect::Dialect;
use crate::dialect::Failure;

/// The shortest time between two notifications for one database from this process.
#[cfg(any(feature = "postgres", feature = "worker"))]
pub(crate) const NOTIFY_DEBOUNCE: Duration = Duration::from_millis(10);

/// Signals that a task claimable now was written through `exec`. On PostgreSQL inside a
/// caller's transaction the notification goes out at its commit (and not at all on a
/// rollback).
///
/// # Errors
/// Only inside a PostgreSQL transaction, when the notification failed: the transaction
/// is aborted then, and with it the write. Outside one a failed notification is logged
/// and the task waits for the workers' poll.
pub(crate) async fn task_due(exec: &mut Executor<'_>) -> Result<(), Failure> {
    match exec.dialect() {
        #[cfg(feature = "postgres")]
        Dialect::Postgres => postgres::notify(exec).await,
        #[cfg(feature = "sqlite")]
        Dialect::Sqlite => {
            // A pool: the write is committed (a caller's transaction rings nothing: it
            // would ring before its commit).
            if let Some(crate::executor::Pool::Sqlite(pool)) = exec.pool() {
                sqlite::ring(pool);
            }
            Ok(())
        }
        #[allow(unreachable_patterns)]
        _ => Ok(()),
    }
}

/// Signals that a running task ended through `exec` (completed, failed, retried,
/// cancelled, reaped): a follow-up of its key that waited for the key's one run is
/// claimable now. The same signal as [`task_due`], debounced alike.
///
/// # Errors
/// As [`task_due`].
pub(crate) async fn run_ended(exec: &mut Executor<'_>) -> Result<(), Failure> {
    task_due(exec).await
}

/// Signals that a task that may have been running was cancelled through `exec`, so that
/// the worker running it cancels its handler now rather than at its next heartbeat.
///
/// # Errors
/// As [`task_due`].
pub(crate) async fn task_cancelled(exec: &mut Executor<'_>) -> Result<(), Failure> {
    match exec.dialect() {
        #[cfg(feature = "postgres")]
        Dialect::Postgres => match Box::pin(exec.notify_cancel()).await {
            Ok(()) => Ok(()),
            Err(failure) if exec.in_transaction() => Err(failure),
            Err(failure) => {
                tracing::debug!(error = %failure.err, "cancel notification failed; the handler hears of it at its next heartbeat");
                Ok(())
            }
        },
        #[cfg(feature = "sqlite")]
        Dialect::Sqlite => {
            if let Some(crate::executor::Pool::Sqlite(pool)) = exec.pool() {
                sqlite::ring_bell(pool, sqlite::Bell::Cancel);
            }
            Ok(())
        }
        #[allow(unreachable_patterns)]
        _ => Ok(()),
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::collections::HashMap;
    use std::sync::{LazyLock, Mutex};
    use std::time::Instant;

    use super::NOTIFY_DEBOUNCE;
    use crate::dialect::Failure;
    use crate::executor::{Executor, Pool};

    /// When this process last notified each database (by [`database_key`]).
    static LAST_NOTIFIED: LazyLock<Mutex<HashMap<u64, Instant>>> =
        LazyLock::new(|| Mutex::new(HashMap::new()));

    pub(super) async fn notify(exec: &mut Executor<'_>) -> Result<(), Failure> {
        if !due(database_key(exec.pool())) {
            return Ok(());
        }
        // Boxed: sent once per debounce interval, and its statement's state would
        // otherwise sit in every enqueue's future.
        match Box::pin(exec.notify()).await {
            Ok(()) => Ok(()),
            Err(failure) if exec.in_transaction() => Err(failure),
            Err(failure) => {
                tracing::debug!(error = %failure.err, "wake-up notification failed; workers will poll");
                Ok(())
            }
        }
    }

    /// Whether a notification for `database` is due, and if so notes it as sent.
    fn due(database: u64) -> bool {
        let now = Instant::now();
        let mut last = LAST_NOTIFIED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match last.get_mut(&database) {
            Some(at) if now.duration_since(*at) < NOTIFY_DEBOUNCE => false,
            Some(at) => {
                *at = now;
                true
            }
            None => {
                last.insert(database, now);
                true
            }
        }
    }

    /// The database behind a pool. A caller's transaction does not tell, so
    /// transactions share one key; two databases written in transactions from one
    /// process may then swallow each other's notification within the debounce, and the
    /// task waits for the workers' fallback poll.
    fn database_key(pool: Option<Pool<'_>>) -> u64 {
        pool.map_or(0, Pool::identity)
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, LazyLock, Mutex, Weak};

    use sea_orm::sqlx::SqlitePool;
    use tokio::sync::Notify;

    /// Whether any worker ever waited here: until one does, ringing costs one load.
    static IN_USE: AtomicBool = AtomicBool::new(false);

    /// What a bell announces.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Bell {
        /// A task is due.
        Due = 0,
        /// A task that may be running was cancelled.
        Cancel = 1,
    }

    /// The bells of each database file, indexed by [`Bell`].
    static DOORBELLS: LazyLock<Mutex<HashMap<PathBuf, [Weak<Notify>; 2]>>> =
        LazyLock::new(|| Mutex::new(HashMap::new()));

    /// The `bell` of `database` (a SQLite file), shared by every worker of it in this
    /// process.
    #[cfg_attr(not(feature = "worker"), allow(dead_code))]
    pub(crate) fn bell(database: &Path, bell: Bell) -> Arc<Notify> {
        IN_USE.store(true, Ordering::Relaxed);
        let mut doorbells = DOORBELLS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(bell) = doorbells
            .get(database)
            .and_then(|bells| bells[bell as usize].upgrade())
        {
            return bell;
        }
        let new = Arc::new(Notify::new());
        doorbells.retain(|_, bells| bells.iter().any(|bell| bell.strong_count() > 0));
        doorbells
            .entry(database.to_path_buf())
            .or_insert_with(|| [Weak::new(), Weak::new()])[bell as usize] = Arc::downgrade(&new);
        new
    }

    /// The doorbell of `database`: rung when a task is due.
    #[cfg_attr(not(feature = "worker"), allow(dead_code))]
    pub(crate) fn doorbell(database: &Path) -> Arc<Notify> {
        bell(database, Bell::Due)
    }

    /// Rings the doorbell of the database behind `pool`, if a worker of this process
    /// waits on it.
    pub(super) fn ring(pool: &SqlitePool) {
        ring_bell(pool, Bell::Due);
    }

    /// Rings `bell` of the database behind `pool`, if a worker of this process waits on
    /// it.
    pub(super) fn ring_bell(pool: &SqlitePool, bell: Bell) {
        if !IN_USE.load(Ordering::Relaxed) {
            return;
        }
        let options = pool.connect_options();
        let doorbells = DOORBELLS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(bell) = doorbells
            .get(options.get_filename())
            .and_then(|bells| bells[bell as usize].upgrade())
        {
            bell.notify_waiters();
        }
    }
}

#[cfg(all(feature = "sqlite", feature = "worker"))]
pub(crate) use sqlite::{Bell, bell, doorbell};
