//! Which PostgreSQL pools send statements without named prepared statements
//! ([`PoolerMode::NoPreparedStatements`](crate::PoolerMode)): a registry of endpoints,
//! written by [`connect_with_pooler`](crate::connect_with_pooler) and read once per
//! [`Executor`](super::Executor).

use sea_orm::DatabaseConnection;

#[cfg(feature = "postgres")]
use super::Pool;

/// The endpoints (host, port, database: [`Pool::identity`])
/// whose pools run in [`PoolerMode::NoPreparedStatements`](crate::PoolerMode).
#[cfg(feature = "postgres")]
static UNPREPARED: std::sync::RwLock<Vec<u64>> = std::sync::RwLock::new(Vec::new());

/// Whether [`UNPREPARED`] ever held an endpoint: while not, nothing else is read.
#[cfg(feature = "postgres")]
static ANY_UNPREPARED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether statements on a PostgreSQL pool of endpoint `identity` (`None`: in the
/// caller's transaction, which does not tell its pool) are sent without named prepared
/// statements. In a transaction: once any pool of the process uses the mode, since the
/// mode works on every connection and a wrong guess the other way fails.
#[cfg(feature = "postgres")]
pub(crate) fn unprepared(identity: impl FnOnce() -> Option<u64>) -> bool {
    if !ANY_UNPREPARED.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    let Some(identity) = identity() else {
        return true;
    };
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
