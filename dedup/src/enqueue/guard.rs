//! Never silently unguarded: before the first enqueue on a database, check that
//! `task_run` has the unique index the guarantee rests on. A table made from the entity
//! (SeaORM's entity-first workflow), by hand or by an older release lacks it, and then
//! `find_or_enqueue` would insert duplicates without a word; this refuses instead.
//!
//! One catalog read per database and process: the outcome is cached by the database's
//! identity (host, port and name; a SQLite file). The caller's transaction does not say
//! which database it is on, so transactions are checked once per process and dialect.

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use foldhash::fast::FixedState;

use crate::connect::retry::Retrying;
use crate::dialect::{Dialect, Guarded};
use crate::executor::Executor;
use crate::values::connection::DedupConnection;
use crate::values::error::DedupError;

/// A database as the cache knows it: its dialect and identity, `None` for transactions.
type Database = (Dialect, Option<u64>);

/// The databases found guarded (looked up on every enqueue: foldhash, not SipHash).
static GUARDED: LazyLock<Mutex<HashSet<Database, FixedState>>> =
    LazyLock::new(|| Mutex::new(HashSet::with_hasher(FixedState::with_seed(0))));

/// Refuses to go on when `task_run` exists without its guarantee.
///
/// The catalog read is retried like the enqueue it precedes (same `budget`): the first
/// call on a database must not fail on a lost connection that the call itself survives.
///
/// # Errors
/// [`DedupError::Unguarded`] naming what is missing; the errors of the catalog read.
pub(crate) async fn ensure<C: DedupConnection + ?Sized>(
    db: &C,
    budget: Option<Duration>,
    exec: &mut Executor<'_>,
) -> Result<(), DedupError> {
    let key = (exec.dialect(), exec.database_identity());
    if lock().contains(&key) {
        return Ok(());
    }
    // Boxed: the check runs once per database, and its statements' state would otherwise
    // sit in every enqueue's future, which is moved whole at every step up the stack.
    Box::pin(check(db, budget, exec, key)).await
}

async fn check<C: DedupConnection + ?Sized>(
    db: &C,
    budget: Option<Duration>,
    exec: &mut Executor<'_>,
    key: Database,
) -> Result<(), DedupError> {
    let mut retrying = Retrying::new(db, budget, "guard");
    let guarded = loop {
        let attempt = async { Ok(exec.guard().await?) };
        if let Some(outcome) = retrying.run(attempt).await {
            break outcome?;
        }
    };
    match guarded {
        Guarded::Yes => {
            // Whether the reads that answer `Existing` must wait for the other nodes'
            // commits (MariaDB Galera): looked up now, once, rather than on a hit.
            #[cfg(feature = "mysql")]
            if exec.dialect() == crate::dialect::Dialect::MySql {
                exec.is_galera().await?;
            }
            lock().insert(key);
            Ok(())
        }
        // The write itself will say so, as it did before this check.
        Guarded::NoTable => Ok(()),
        Guarded::No(problem) => {
            tracing::error!(%problem, "task_run lacks its unique index: refusing to enqueue");
            Err(DedupError::Unguarded { problem })
        }
    }
}

fn lock() -> std::sync::MutexGuard<'static, HashSet<Database, FixedState>> {
    GUARDED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
