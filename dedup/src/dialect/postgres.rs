//! PostgreSQL: `ON CONFLICT ... DO NOTHING` against the partial unique index, claims in
//! one `UPDATE` over a `FOR UPDATE SKIP LOCKED` subquery.

use std::sync::LazyLock;

use sea_orm::sea_query::Expr;
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, TransactionTrait};
use task_dedup_entity::active_status_sql;

use super::{
    COLUMNS, Dialect, Lookup, claim_set_sql, find_active_sql as select_active, insert_sql,
    insert_values, model, next_queued_sql,
};
use crate::connection::{self, DedupConnection};
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
    let result = connection::execute(
        db,
        Statement::from_sql_and_values(
            DbBackend::Postgres,
            INSERT_IF_ABSENT.as_str(),
            insert_values(row),
        ),
    )
    .await?;
    Ok(result.rows_affected() == 1)
}

/// Under READ COMMITTED each statement reads a fresh snapshot, so the row `DO NOTHING`
/// yielded to is visible to the next statement. (Under REPEATABLE READ the insert
/// itself fails with 40001 instead.)
pub(super) fn find_active_sql(_lookup: Lookup) -> &'static str {
    &FIND_ACTIVE
}

pub(super) async fn claim<C: ConnectionTrait + TransactionTrait + ?Sized>(
    db: &C,
    worker_id: &str,
    task_types: &[&str],
    lease_micros: i64,
) -> Result<Option<task_run::Model>, DbErr> {
    let sql = format!(
        "UPDATE task_run SET {set} WHERE id = ({next}) RETURNING {columns}",
        set = claim_set_sql(Dialect::Postgres, 0, NOW, LEASE_END),
        next = next_queued_sql(
            Dialect::Postgres,
            2,
            task_types.len(),
            " FOR UPDATE SKIP LOCKED"
        ),
        columns = *COLUMNS,
    );
    let mut values = vec![worker_id.into(), lease_micros.into()];
    values.extend(task_types.iter().map(|t| (*t).into()));
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            values,
        ))
        .await?;
    row.map(|row| model(&row)).transpose()
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
