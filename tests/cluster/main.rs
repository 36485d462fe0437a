//! The guarantees on clusters: the nodes of a MariaDB Galera cluster taking writes and
//! Workers at once (`galera`), and a PostgreSQL primary replaced under an HA manager
//! (`failover`). Each needs its cluster running (`.ci/galera.sh start`,
//! `.ci/pg-auto-failover.sh start`, whose exports point the tests at it): without it a
//! suite is skipped with a line on stderr, and fails under `CI=true`.
//!
//! The tests of this binary run one at a time: they share a cluster, and one of them
//! kills its nodes.

mod failover;
mod galera;
mod load;

/// Held by each test for its whole run.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}
