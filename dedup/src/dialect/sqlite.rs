//! SQLite: `ON CONFLICT DO NOTHING` against the partial unique index, claims in one
//! `UPDATE` (SQLite has no row locks; one statement is atomic under its write lock).

use std::sync::LazyLock;

use sea_orm::sea_query::Expr;
use sea_orm::{ConnectionTrait, DbErr};

use super::{
    Dialect, Lookup, claim_returning, find_active_sql as select_active, insert_do_nothing,
    insert_sql,
};
use crate::connection::DedupConnection;
use crate::task_run;

/// `ON CONFLICT DO NOTHING` without a conflict target: it covers the partial unique
/// index (and the primary key) and, unlike a targeted clause, is not matched against
/// the schema when the statement is prepared. A pooled connection opened before the
/// index was created still has the old schema in memory, and a targeted clause fails
/// there ("ON CONFLICT clause does not match any PRIMARY KEY or UNIQUE constraint")
/// instead of being re-prepared; this one is re-prepared on the schema change. NOT NULL
/// and CHECK violations still fail, unlike with `INSERT OR IGNORE`.
static INSERT_IF_ABSENT: LazyLock<String> =
    LazyLock::new(|| insert_sql(Dialect::Sqlite, " ON CONFLICT DO NOTHING"));

static FIND_ACTIVE: LazyLock<String> = LazyLock::new(|| select_active(Dialect::Sqlite, ""));

/// One write statement takes the write lock at once (waiting out `busy_timeout`): no
/// read-to-write upgrade that could fail with SQLITE_BUSY. The affected-row count is
/// exact.
pub(super) async fn insert_if_absent<C: DedupConnection + ?Sized>(
    db: &C,
    row: &task_run::Model,
) -> Result<bool, DbErr> {
    insert_do_nothing(db, Dialect::Sqlite, &INSERT_IF_ABSENT, row).await
}

/// Writers are serialized, so the conflicting row is committed and visible.
pub(super) fn find_active_sql(_lookup: Lookup) -> &'static str {
    &FIND_ACTIVE
}

/// SQLite drops `FOR UPDATE SKIP LOCKED`; a single UPDATE with the selection as a
/// subquery is atomic under the database write lock, so no two workers get one task.
pub(super) async fn claim<C: ConnectionTrait + ?Sized>(
    db: &C,
    worker_id: &str,
    task_types: &[&str],
    lease_micros: i64,
) -> Result<Option<task_run::Model>, DbErr> {
    let lease = (LEASE_END, seconds_modifier(lease_micros).into());
    claim_returning(db, Dialect::Sqlite, worker_id, task_types, lease, "").await
}

/// The text shape sqlx writes for `DateTime<Utc>` (RFC 3339, `+00:00`), so values the
/// database writes and values the library writes compare correctly as text. SQLite's
/// clock has millisecond resolution.
pub(super) const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')";

/// The claim's lease end, from its second parameter (a `'+N seconds'` modifier).
const LEASE_END: &str = "strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?)";

pub(super) fn now_plus(micros: i64) -> Expr {
    Expr::cust_with_values(LEASE_END, [seconds_modifier(micros)])
}

/// A date-function modifier such as `+30.000000 seconds`.
fn seconds_modifier(micros: i64) -> String {
    let sign = if micros < 0 { '-' } else { '+' };
    let abs = micros.unsigned_abs();
    format!("{sign}{}.{:06} seconds", abs / 1_000_000, abs % 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::seconds_modifier;

    #[test]
    fn modifier_keeps_sign_and_microseconds() {
        assert_eq!(seconds_modifier(30_000_000), "+30.000000 seconds");
        assert_eq!(seconds_modifier(-1_500), "-0.001500 seconds");
    }
}
