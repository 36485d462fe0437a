//! PostgreSQL: `ON CONFLICT ... DO NOTHING` against the partial unique index, claims in
//! one `UPDATE` over a `FOR UPDATE SKIP LOCKED` subquery.

use std::sync::LazyLock;

use sea_orm::sea_query::Expr;
use sea_orm::sqlx::postgres::PgDatabaseError;
use sea_orm::{ConnectionTrait, DbErr};
use task_dedup_entity::active_status_sql;

use super::{
    Dialect, Lookup, claim_returning, find_active_sql as select_active, insert_do_nothing,
    insert_sql,
};
use crate::connection::DedupConnection;
use crate::task_run;

/// The conflict target repeats the index predicate, as literals: with bound values,
/// PostgreSQL fails with 42P10 once a cached statement switches to a generic plan.
static INSERT_IF_ABSENT: LazyLock<String> = LazyLock::new(|| {
    insert_sql(
        Dialect::Postgres,
        &format!(
            " ON CONFLICT (user_id, task_type, resource_key) WHERE {} DO NOTHING",
            active_status_sql()
        ),
    )
});

static FIND_ACTIVE: LazyLock<String> = LazyLock::new(|| select_active(Dialect::Postgres, ""));

/// `DO NOTHING`, not catching the unique violation: a failed INSERT would abort the
/// caller's transaction, `DO NOTHING` leaves it usable. The affected-row count is exact.
pub(super) async fn insert_if_absent<C: DedupConnection + ?Sized>(
    db: &C,
    row: &task_run::Model,
) -> Result<bool, DbErr> {
    insert_do_nothing(db, Dialect::Postgres, &INSERT_IF_ABSENT, row).await
}

/// Under READ COMMITTED each statement reads a fresh snapshot, so the row `DO NOTHING`
/// yielded to is visible to the next statement. (Under REPEATABLE READ the insert
/// itself fails with 40001 instead.)
pub(super) fn find_active_sql(_lookup: Lookup) -> &'static str {
    &FIND_ACTIVE
}

/// `SKIP LOCKED`: concurrent claimers pass over each other's rows instead of queueing
/// behind them.
pub(super) async fn claim<C: ConnectionTrait + ?Sized>(
    db: &C,
    worker_id: &str,
    task_types: &[&str],
    lease_micros: i64,
) -> Result<Option<task_run::Model>, DbErr> {
    let lease = (LEASE_END, lease_micros.into());
    claim_returning(
        db,
        Dialect::Postgres,
        worker_id,
        task_types,
        lease,
        " FOR UPDATE SKIP LOCKED",
    )
    .await
}

/// SQLSTATE of a serialization failure (REPEATABLE READ / SERIALIZABLE).
const SERIALIZATION_FAILURE: &str = "40001";
/// SQLSTATE of a deadlock the server broke by aborting this statement.
const DEADLOCK_DETECTED: &str = "40P01";

pub(super) fn is_transaction_conflict(err: &DbErr) -> bool {
    super::database_error::<PgDatabaseError>(err)
        .is_some_and(|e| matches!(e.code(), SERIALIZATION_FAILURE | DEADLOCK_DETECTED))
}

/// `now()` would be the start of the caller's transaction, possibly long ago.
pub(super) const NOW: &str = "statement_timestamp()";

/// The claim's lease end, from its second parameter (microseconds).
const LEASE_END: &str = "statement_timestamp() + $2 * interval '1 microsecond'";

pub(super) fn now_plus(micros: i64) -> Expr {
    Expr::cust_with_values(
        "statement_timestamp() + $1 * interval '1 microsecond'",
        [micros],
    )
}
