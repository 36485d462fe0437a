//! PostgreSQL: `ON CONFLICT` against the partial unique index, `UPDATE ... RETURNING`,
//! claims over a `FOR UPDATE SKIP LOCKED` subquery. Its statements are this folder's SQL
//! files, read into [`Sql`] once per process ([`sql`]). Times come from
//! `statement_timestamp()`: `now()` would be the start of the caller's transaction,
//! possibly long ago.

use std::sync::OnceLock;

use sea_orm::sqlx::postgres::PgDatabaseError;
use task_dedup_entity::task_run::{ACTIVE_RESOURCE_UIDX, RUNNING_RESOURCE_UIDX};

use super::limits::{Limits, SLOT_UIDX};
use super::render::{Files, Template};
use super::{Admin, Bulk, Endings, Guarded, Kind, Returning, SHARED, Statements};

/// The dialect's SQL files, by family.
pub(crate) const FILES: [(&str, &str); 10] = [
    ("postgres/enqueue.sql", include_str!("enqueue.sql")),
    ("postgres/claim.sql", include_str!("claim.sql")),
    ("postgres/lifecycle.sql", include_str!("lifecycle.sql")),
    ("postgres/endings.sql", include_str!("endings.sql")),
    ("postgres/bulk.sql", include_str!("bulk.sql")),
    ("postgres/limits.sql", include_str!("limits.sql")),
    ("postgres/admin.sql", include_str!("admin.sql")),
    ("postgres/maintenance.sql", include_str!("maintenance.sql")),
    ("postgres/schema.sql", include_str!("schema.sql")),
    ("postgres/wakeups.sql", include_str!("wakeups.sql")),
];

/// Every PostgreSQL statement, rendered from [`FILES`].
pub(crate) struct Sql {
    pub statements: Statements,
    pub returning: Returning,
    pub bulk: Bulk,
    pub endings: Endings,
    pub admin: Admin,
    pub limits: Limits,
    pub lock_free: LockFree,
    /// Whether the database has [`INSERT_OR_FIND_FUNCTION`] (in the search path).
    pub has_insert_or_find: String,
    /// `insert_or_find` in `PoolerMode::NoPreparedStatements`: the function, with the
    /// parameters of [`Statements::insert_or_find`].
    pub insert_or_find_call: String,
    /// Wakes the workers that LISTEN on [`CHANNEL`] (`executor::notify`).
    pub notify: String,
    /// Tells the workers that LISTEN on [`CANCEL_CHANNEL`] that a task that may be
    /// running was cancelled.
    pub notify_cancel: String,
    /// A worker's check that its listener's connection is a session of its own: its
    /// probe channel, the payload, the listener's server process.
    #[cfg_attr(not(feature = "worker"), allow(dead_code))]
    pub probe: String,
    /// Checks the guarantee without writing ([`guard_failure`] reads its error).
    pub guard: String,
    /// Turns JIT off for the rest of a transaction of the admin API's own.
    pub without_jit: String,
    /// What rendering [`FILES`] met: nothing (a unit test checks).
    #[cfg_attr(not(test), allow(dead_code))]
    pub problems: Vec<String>,
}

/// The lock-free claims of a type whose only limit is `max_running` (`limits.sql`):
/// worker_id, lease, the type, how many.
pub(crate) struct LockFree {
    /// A random range of free run slots, probing the keys.
    pub window_claim: Template,
    /// [`window_claim`](Self::window_claim) without the probe for running tasks of the
    /// keys.
    pub optimistic_window_claim: Template,
    /// The free run slots read.
    pub slot_claim: Template,
}

/// The statements, rendered on first use.
pub(crate) fn sql() -> &'static Sql {
    static SQL: OnceLock<Sql> = OnceLock::new();
    SQL.get_or_init(build)
}

fn build() -> Sql {
    let mut files = Files::parse(&FILES, SHARED);
    Sql {
        statements: Statements::read(&mut files),
        returning: Returning::read(&mut files),
        bulk: Bulk::read(&mut files, 5_000),
        endings: Endings::read(&mut files),
        admin: Admin::read(&mut files),
        limits: Limits::read(&mut files),
        lock_free: LockFree {
            window_claim: files.template("limits", "window_claim"),
            optimistic_window_claim: files.template("limits", "optimistic_window_claim"),
            slot_claim: files.template("limits", "slot_claim"),
        },
        has_insert_or_find: files.text("enqueue", "has_insert_or_find"),
        insert_or_find_call: files.text("enqueue", "insert_or_find_call"),
        notify: files.text("wakeups", "notify"),
        notify_cancel: files.text("wakeups", "notify_cancel"),
        probe: files.text("wakeups", "probe"),
        guard: files.text("schema", "guard"),
        without_jit: files.text("admin", "without_jit"),
        problems: files.finish(),
    }
}

/// The channel waiting workers LISTEN on (`wakeups.sql`'s `notify` names it too).
#[cfg_attr(not(feature = "worker"), allow(dead_code))]
pub(crate) const CHANNEL: &str = "task_dedup_wakeup";

/// The channel on which a cancel of a task that may be running is announced, so that
/// the worker running it fires its handler's cancellation at once instead of at its
/// next heartbeat (`wakeups.sql`'s `notify_cancel`).
#[cfg_attr(not(feature = "worker"), allow(dead_code))]
pub(crate) const CANCEL_CHANNEL: &str = "task_dedup_cancel";

/// The function `PoolerMode::NoPreparedStatements` calls for a hit or a create, with its
/// argument types: what `has_insert_or_find` looks up, for the warning while it is
/// missing. A changed function comes under a new name.
pub(crate) const INSERT_OR_FIND_FUNCTION: &str = "task_dedup_insert_or_find_v1(uuid, text, text, text, jsonb, timestamptz, \
     timestamptz, timestamptz, int2, text, int8, bool)";

/// The migration that creates [`INSERT_OR_FIND_FUNCTION`].
pub(crate) const INSERT_OR_FIND_MIGRATION: &str = "m20261203_000009_task_dedup_pooler_function";

/// What `guard` failing with `e` means, if it is about the schema.
pub(crate) fn guard_failure(e: &PgDatabaseError) -> Option<Guarded> {
    match e.code() {
        UNDEFINED_TABLE => Some(Guarded::NoTable),
        INVALID_COLUMN_REFERENCE => Some(Guarded::No(format!(
            "no unique index matches the dedup key and its predicate ({ACTIVE_RESOURCE_UIDX} \
             is missing or is not the guarantee)"
        ))),
        UNDEFINED_COLUMN => Some(Guarded::No(format!(
            "the table predates task-dedup's schema: {}",
            e.message()
        ))),
        _ => None,
    }
}

/// SQLSTATE of a unique violation.
const UNIQUE_VIOLATION: &str = "23505";
/// SQLSTATE of a serialization failure (REPEATABLE READ / SERIALIZABLE).
const SERIALIZATION_FAILURE: &str = "40001";
/// SQLSTATE of a deadlock the server broke by aborting this statement.
const DEADLOCK_DETECTED: &str = "40P01";
/// SQLSTATE class of connection exceptions (08000, 08003, 08006, 08001, 08004, ...).
const CONNECTION_EXCEPTION_CLASS: &str = "08";
/// SQLSTATEs of a session the server ended: an administrator or a shutdown
/// (`pg_terminate_backend`, fast shutdown), a crash of another backend, a server still
/// starting up.
const ADMIN_SHUTDOWN: &str = "57P01";
const CRASH_SHUTDOWN: &str = "57P02";
const CANNOT_CONNECT_NOW: &str = "57P03";
/// SQLSTATE of a cancelled statement: `statement_timeout` (or `pg_cancel_backend`).
const QUERY_CANCELED: &str = "57014";
/// SQLSTATE of a lock not obtained within `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// SQLSTATE of a relation that does not exist.
const UNDEFINED_TABLE: &str = "42P01";
/// SQLSTATE of a write on a read-only server: a standby, or a primary an HA manager
/// demoted (or is still promoting). Another connection, to the primary, takes it: a
/// lost connection for the retry driver, whose sweep closes the read-only ones.
const READ_ONLY_SQL_TRANSACTION: &str = "25006";
/// SQLSTATE of a column that does not exist.
const UNDEFINED_COLUMN: &str = "42703";
/// SQLSTATE of an `ON CONFLICT` target no unique index matches.
const INVALID_COLUMN_REFERENCE: &str = "42P10";

/// What a PostgreSQL error means. PostgreSQL names the violated constraint (here: the
/// index) in its own field.
pub(super) fn kind(e: &PgDatabaseError) -> Kind {
    match e.code() {
        UNIQUE_VIOLATION if e.constraint() == Some(ACTIVE_RESOURCE_UIDX) => Kind::HeldKey,
        UNIQUE_VIOLATION if e.constraint() == Some(RUNNING_RESOURCE_UIDX) => Kind::RunningKey,
        UNIQUE_VIOLATION if e.constraint() == Some(SLOT_UIDX) => Kind::SlotTaken,
        SERIALIZATION_FAILURE | DEADLOCK_DETECTED => Kind::TransactionConflict,
        ADMIN_SHUTDOWN | CRASH_SHUTDOWN | CANNOT_CONNECT_NOW | READ_ONLY_SQL_TRANSACTION => {
            Kind::ConnectionLost
        }
        code if code.starts_with(CONNECTION_EXCEPTION_CLASS) => Kind::ConnectionLost,
        QUERY_CANCELED | LOCK_NOT_AVAILABLE => Kind::Timeout,
        _ => Kind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names the listener uses are those the statements notify.
    #[test]
    fn the_channels_are_the_statements() {
        let sql = sql();
        assert!(sql.notify.contains(&format!("'{CHANNEL}'")));
        assert!(sql.notify_cancel.contains(&format!("'{CANCEL_CHANNEL}'")));
        assert!(sql.has_insert_or_find.contains(INSERT_OR_FIND_FUNCTION));
    }
}
