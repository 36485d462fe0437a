//! MySQL/MariaDB: a plain INSERT against the unique index over the generated marker
//! column, claims with `FOR UPDATE SKIP LOCKED` in a short transaction.

use std::sync::LazyLock;

use sea_orm::sea_query::Expr;
use sea_orm::sqlx::mysql::MySqlDatabaseError;
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, TransactionSession, TransactionTrait};
use task_dedup_entity::task_run::ACTIVE_RESOURCE_UIDX;

use super::{
    COLUMNS, Dialect, Lookup, claim_set_sql, find_active_sql as select_active, insert_sql, model,
    next_queued_sql,
};
use crate::connection::{self, DedupConnection};
use crate::task_run;

static INSERT: LazyLock<String> = LazyLock::new(|| insert_sql(Dialect::MySql, ""));

static FIND_ACTIVE: LazyLock<String> = LazyLock::new(|| select_active(Dialect::MySql, ""));

/// A locking read returns the latest committed row even inside a REPEATABLE READ
/// transaction whose snapshot predates it. The failed insert already holds a shared lock
/// on that index entry, so this takes no lock the caller did not have.
static FIND_ACTIVE_AFTER_CONFLICT: LazyLock<String> =
    LazyLock::new(|| select_active(Dialect::MySql, " LOCK IN SHARE MODE"));

/// A plain INSERT, and the duplicate-key error on our index means "exists". Not
/// `INSERT IGNORE` (it also turns other errors into warnings) nor
/// `ON DUPLICATE KEY UPDATE` (a write on the hit path, and with CLIENT_FOUND_ROWS the
/// affected-row count cannot tell a no-op from an insert). A failed statement does not
/// abort an InnoDB transaction.
pub(super) async fn insert_if_absent<C: DedupConnection + ?Sized>(
    db: &C,
    row: &task_run::Model,
) -> Result<bool, DbErr> {
    match connection::insert_task(db, DbBackend::MySql, &INSERT, row).await {
        Ok(_) => Ok(true),
        Err(err) if is_active_index_violation(&err) => Ok(false),
        Err(err) => Err(err),
    }
}

pub(super) fn find_active_sql(lookup: Lookup) -> &'static str {
    match lookup {
        Lookup::Plain => &FIND_ACTIVE,
        Lookup::AfterConflict => &FIND_ACTIVE_AFTER_CONFLICT,
    }
}

/// No `UPDATE ... RETURNING` and no UPDATE of a table selected from in a subquery:
/// lock the next queued row (skipping rows other claimers hold), update it, read it
/// back, all in one short transaction. The `(status, created_at, id)` index keeps
/// InnoDB from locking every row it scans.
pub(super) async fn claim<C: ConnectionTrait + TransactionTrait + ?Sized>(
    db: &C,
    worker_id: &str,
    task_types: &[&str],
    lease_micros: i64,
) -> Result<Option<task_run::Model>, DbErr> {
    let txn = db.begin().await?;
    let next = next_queued_sql(
        Dialect::MySql,
        0,
        task_types.len(),
        " FOR UPDATE SKIP LOCKED",
    );
    let types = task_types.iter().map(|t| (*t).into());
    let Some(row) = txn
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::MySql,
            next,
            types,
        ))
        .await?
    else {
        txn.commit().await?;
        return Ok(None);
    };
    let id: uuid::Uuid = row.try_get("", "id")?;
    let update = format!(
        "UPDATE task_run SET {set} WHERE id = ?",
        set = claim_set_sql(Dialect::MySql, 0, NOW, LEASE_END)
    );
    txn.execute_raw(Statement::from_sql_and_values(
        DbBackend::MySql,
        update,
        [worker_id.into(), lease_micros.into(), id.into()],
    ))
    .await?;
    let select = format!(
        "SELECT {columns} FROM task_run WHERE id = ?",
        columns = *COLUMNS
    );
    let claimed = txn
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::MySql,
            select,
            [id.into()],
        ))
        .await?;
    txn.commit().await?;
    claimed.map(|row| model(&row)).transpose()
}

/// A duplicate key in a unique index (or the primary key).
const ER_DUP_ENTRY: u16 = 1062;
/// InnoDB broke a deadlock by rolling back this statement's transaction.
const ER_LOCK_DEADLOCK: u16 = 1213;

/// Error 1062 on `task_active_resource_uidx`. The driver gives no index name but in the
/// message (`Duplicate entry '...' for key 'task_active_resource_uidx'`, MySQL 8 prefixes
/// the table), so this reads the message: the one place that does.
fn is_active_index_violation(err: &DbErr) -> bool {
    super::database_error::<MySqlDatabaseError>(err).is_some_and(|e| {
        e.number() == ER_DUP_ENTRY
            && (e.message().ends_with(&format!("'{ACTIVE_RESOURCE_UIDX}'"))
                || e.message().ends_with(&format!(".{ACTIVE_RESOURCE_UIDX}'")))
    })
}

pub(super) fn is_transaction_conflict(err: &DbErr) -> bool {
    super::database_error::<MySqlDatabaseError>(err).is_some_and(|e| e.number() == ER_LOCK_DEADLOCK)
}

/// UTC whatever the session time zone; `datetime(6)` columns hold UTC.
pub(super) const NOW: &str = "UTC_TIMESTAMP(6)";

/// The claim's lease end, from its second parameter (microseconds).
const LEASE_END: &str = "UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND";

pub(super) fn now_plus(micros: i64) -> Expr {
    Expr::cust_with_values(LEASE_END, [micros])
}
