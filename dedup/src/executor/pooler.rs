//! Which PostgreSQL pools send statements without named prepared statements
//! ([`PoolerMode::NoPreparedStatements`](crate::values::connection::PoolerMode)): a registry of endpoints, written by
//! [`connect_with_pooler`](crate::connect_with_pooler) and read once per
//! [`Executor`](super::Executor) on a pool (a handle's own mode wins:
//! [`WithPoolerMode`](crate::WithPoolerMode)); and whether a database has the function
//! that mode's insert-or-find calls ([`INSERT_OR_FIND_FUNCTION`]).

use sea_orm::DatabaseConnection;

#[cfg(feature = "postgres")]
use super::Pool;
#[cfg(feature = "postgres")]
use crate::dialect::postgres::{INSERT_OR_FIND_FUNCTION, INSERT_OR_FIND_MIGRATION};

/// The endpoints (host, port, database: [`Pool::identity`])
/// whose pools run in `PoolerMode::NoPreparedStatements`.
#[cfg(feature = "postgres")]
static UNPREPARED: std::sync::RwLock<Vec<u64>> = std::sync::RwLock::new(Vec::new());

/// Whether [`UNPREPARED`] ever held an endpoint: while not, nothing else is read.
#[cfg(feature = "postgres")]
static ANY_UNPREPARED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether statements on a PostgreSQL pool of endpoint `identity` are sent without
/// named prepared statements.
#[cfg(feature = "postgres")]
pub(crate) fn unprepared(identity: impl FnOnce() -> u64) -> bool {
    if !ANY_UNPREPARED.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    let identity = identity();
    UNPREPARED
        .read()
        .map_or(true, |endpoints| endpoints.contains(&identity))
}

/// Records whether the PostgreSQL pool of `db` (its endpoint: every pool of the same host,
/// port and database) sends statements without named prepared statements.
pub(crate) fn register(db: &DatabaseConnection, unprepared: bool) {
    #[cfg(feature = "postgres")]
    if let Some(pool @ Pool::Postgres(_)) = Pool::of(db) {
        let identity = pool.identity();
        if let Ok(mut endpoints) = UNPREPARED.write() {
            endpoints.retain(|&e| e != identity);
            if unprepared {
                endpoints.push(identity);
                ANY_UNPREPARED.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
    #[cfg(not(feature = "postgres"))]
    let _ = (db, unprepared);
}

/// How long a database found without [`INSERT_OR_FIND_FUNCTION`] is taken to lack it
/// before it is looked up again (the migration may run meanwhile).
#[cfg(feature = "postgres")]
const RECHECK_MISSING: std::time::Duration = std::time::Duration::from_secs(60);

/// A database's [`INSERT_OR_FIND_FUNCTION`] as last looked up: its identity (`None`: the
/// caller's transactions, which do not tell their database), whether it was there, when.
#[cfg(feature = "postgres")]
type Lookup = (Option<u64>, bool, std::time::Instant);

#[cfg(feature = "postgres")]
static FUNCTIONS: std::sync::RwLock<Vec<Lookup>> = std::sync::RwLock::new(Vec::new());

/// Whether the database `identity` has [`INSERT_OR_FIND_FUNCTION`], if known: found
/// there once (kept), or missing less than [`RECHECK_MISSING`] ago.
#[cfg(feature = "postgres")]
pub(crate) fn has_function(identity: Option<u64>) -> Option<bool> {
    let lookups = FUNCTIONS.read().ok()?;
    let &(_, present, at) = lookups.iter().find(|lookup| lookup.0 == identity)?;
    (present || at.elapsed() < RECHECK_MISSING).then_some(present)
}

/// Whether the warning for transactions was given.
#[cfg(feature = "postgres")]
static WARNED_IN_TRANSACTIONS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Records what a look-up of [`INSERT_OR_FIND_FUNCTION`] on database `identity` found;
/// warns the first time it is missing there.
///
/// Transactions (`None`) share one entry per process, as the guard's check does, and
/// keep only a function found: one missing is looked up again at every call (a call
/// already slow for want of it), so that a process with a database that has it and one
/// that does not never takes the one for the other. A function found in one and called
/// in the other fails that call (42883), and the next call looks again.
#[cfg(feature = "postgres")]
pub(crate) fn record_function(identity: Option<u64>, present: bool) {
    let Ok(mut lookups) = FUNCTIONS.write() else {
        return;
    };
    let before = lookups.iter().position(|lookup| lookup.0 == identity);
    let first_miss = match identity {
        Some(_) => before.is_none_or(|i| lookups[i].1),
        None => !WARNED_IN_TRANSACTIONS.swap(true, std::sync::atomic::Ordering::Relaxed),
    };
    if !present && first_miss {
        tracing::warn!(
            function = INSERT_OR_FIND_FUNCTION,
            migration = INSERT_OR_FIND_MIGRATION,
            "PoolerMode::NoPreparedStatements: the database lacks the insert-or-find \
             function; find_or_enqueue sends its plain statement, planned on every call, \
             until the migration runs"
        );
    }
    if identity.is_none() && !present {
        lookups.retain(|lookup| lookup.0.is_some());
        return;
    }
    let lookup = (identity, present, std::time::Instant::now());
    match before {
        Some(i) => lookups[i] = lookup,
        None => lookups.push(lookup),
    }
}

/// Forgets what was found of [`INSERT_OR_FIND_FUNCTION`] on database `identity`: a call
/// found it gone (a migration rolled back), so the next call looks again.
#[cfg(feature = "postgres")]
pub(crate) fn forget_function(identity: Option<u64>) {
    if let Ok(mut lookups) = FUNCTIONS.write() {
        lookups.retain(|lookup| lookup.0 != identity);
    }
}
