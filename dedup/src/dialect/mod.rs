//! The dialect seam: every statement whose SQL differs between SQLite, PostgreSQL and
//! MySQL/MariaDB is reached through [`Dialect`], with one file per dialect holding the
//! same functions in the same order (`insert_if_absent`, `find_active`, `claim`, clock
//! expressions). Statements that are the same everywhere live here, built once.

use std::sync::LazyLock;

use sea_orm::sea_query::{Expr, ExprTrait, IntoColumnRef, Query, ReturningClause, UpdateStatement};
use sea_orm::{
    ConnectionTrait, DbBackend, DbErr, FromQueryResult, Iterable, QueryResult, Statement,
    TransactionSession, TransactionTrait, Value,
};
use task_dedup_entity::{TaskStatus, active_status_sql};

use crate::connection::{self, DedupConnection};
use crate::key::TaskKey;
use crate::task_run::{self, Column};

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

/// One of the supported dialects this crate was built with (features `postgres`,
/// `sqlite`, `mysql`), read from the connection at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    #[cfg(feature = "postgres")]
    Postgres,
    #[cfg(feature = "sqlite")]
    Sqlite,
    #[cfg(feature = "mysql")]
    MySql,
}

/// Whether a lookup follows a conflict on the unique index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// A plain read of the active task.
    Plain,
    /// The insert just hit the index: the conflicting row must be visible even to a
    /// caller's transaction whose snapshot predates it.
    AfterConflict,
}

impl Dialect {
    /// The connection's dialect, or [`DbErr::BackendNotSupported`] when task-dedup was
    /// built without its feature.
    pub(crate) fn of<C: ConnectionTrait + ?Sized>(db: &C) -> Result<Dialect, DbErr> {
        Dialect::from_backend(db.get_database_backend())
    }

    fn from_backend(backend: DbBackend) -> Result<Dialect, DbErr> {
        match backend {
            #[cfg(feature = "postgres")]
            DbBackend::Postgres => Ok(Dialect::Postgres),
            #[cfg(feature = "sqlite")]
            DbBackend::Sqlite => Ok(Dialect::Sqlite),
            #[cfg(feature = "mysql")]
            DbBackend::MySql => Ok(Dialect::MySql),
            other => Err(DbErr::BackendNotSupported {
                db: other.as_str(),
                ctx: "task-dedup (build it with this database's feature: sqlite, postgres or mysql)",
            }),
        }
    }

    fn backend(self) -> DbBackend {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => DbBackend::Postgres,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => DbBackend::Sqlite,
            #[cfg(feature = "mysql")]
            Dialect::MySql => DbBackend::MySql,
        }
    }

    /// Whether `UPDATE ... RETURNING` exists. MySQL has none (and MariaDB's is not in
    /// MySQL 8), so there a transition is an UPDATE and a read in one short transaction.
    fn supports_returning(self) -> bool {
        match self {
            #[cfg(feature = "mysql")]
            Dialect::MySql => false,
            #[allow(unreachable_patterns)]
            _ => true,
        }
    }

    /// The `n`-th (1-based) bind parameter.
    pub(crate) fn param(self, n: usize) -> String {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => format!("${n}"),
            #[allow(unreachable_patterns)]
            _ => "?".to_owned(),
        }
    }

    /// Inserts `row` unless the key already has an active task. `true` when this call
    /// inserted it: never inferred from a count that a no-op could also produce.
    pub(crate) async fn insert_if_absent<C: DedupConnection + ?Sized>(
        self,
        db: &C,
        row: &task_run::Model,
    ) -> Result<bool, DbErr> {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => postgres::insert_if_absent(db, row).await,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => sqlite::insert_if_absent(db, row).await,
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::insert_if_absent(db, row).await,
        }
    }

    /// The active task of `key`, if any.
    pub(crate) async fn find_active<C: DedupConnection + ?Sized>(
        self,
        db: &C,
        key: &TaskKey,
        lookup: Lookup,
    ) -> Result<Option<task_run::Model>, DbErr> {
        let sql = match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => postgres::find_active_sql(lookup),
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => sqlite::find_active_sql(lookup),
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::find_active_sql(lookup),
        };
        connection::select_task(db, self.backend(), sql, key).await
    }

    /// Moves the oldest `queued` task (of `task_types`, or any) to `running` under
    /// `worker_id`'s lease, atomically.
    pub(crate) async fn claim<C: ConnectionTrait + TransactionTrait + ?Sized>(
        self,
        db: &C,
        worker_id: &str,
        task_types: &[&str],
        lease_micros: i64,
    ) -> Result<Option<task_run::Model>, DbErr> {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => postgres::claim(db, worker_id, task_types, lease_micros).await,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => sqlite::claim(db, worker_id, task_types, lease_micros).await,
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::claim(db, worker_id, task_types, lease_micros).await,
        }
    }

    /// The database clock, as an SQL expression of the timestamp columns' type. Lease
    /// times use it so that workers on several machines agree.
    pub(crate) fn now(self) -> Expr {
        Expr::cust(self.now_sql())
    }

    fn now_sql(self) -> &'static str {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => postgres::NOW,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => sqlite::NOW,
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::NOW,
        }
    }

    /// The database clock plus `micros` (which may be negative).
    pub(crate) fn now_plus(self, micros: i64) -> Expr {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => postgres::now_plus(micros),
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => sqlite::now_plus(micros),
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::now_plus(micros),
        }
    }

    /// Runs a compare-and-set UPDATE on one row and returns the row as it is afterwards,
    /// or `None` when the guard did not match (nothing changed).
    pub(crate) async fn update_returning<C: ConnectionTrait + TransactionTrait + ?Sized>(
        self,
        db: &C,
        mut update: UpdateStatement,
        id: uuid::Uuid,
    ) -> Result<Option<task_run::Model>, DbErr> {
        update.and_where(Expr::col(Column::Id).eq(id));
        if self.supports_returning() {
            update.returning(returning_all());
            let row = db.query_one(&update).await?;
            return row.map(|row| model(&row)).transpose();
        }
        // The UPDATE's row lock is held until commit, so the read sees exactly what the
        // UPDATE wrote.
        let txn = db.begin().await?;
        let updated = txn.execute(&update).await?.rows_affected();
        let row = if updated == 1 {
            let select = Query::select()
                .columns(Column::iter())
                .from(task_run::Entity)
                .and_where(Expr::col(Column::Id).eq(id))
                .to_owned();
            txn.query_one(&select).await?
        } else {
            None
        };
        txn.commit().await?;
        row.map(|row| model(&row)).transpose()
    }
}

/// Whether the database aborted a statement to resolve a deadlock or a serialization
/// conflict: PostgreSQL SQLSTATE 40001 (serialization failure) or 40P01 (deadlock),
/// MySQL/MariaDB error 1213 (deadlock; SQLSTATE 40001). SQLite has neither: one writer
/// at a time.
///
/// Inside a transaction the whole transaction is gone (InnoDB rolls it back, PostgreSQL
/// refuses every further statement): roll it back and run it again from the start. Use
/// this on your own statements that share a transaction with `find_or_enqueue`; for
/// task-dedup's own errors see [`DedupError::is_retryable`](crate::DedupError::is_retryable).
pub fn is_transaction_conflict(err: &DbErr) -> bool {
    #[cfg(feature = "postgres")]
    if postgres::is_transaction_conflict(err) {
        return true;
    }
    #[cfg(feature = "mysql")]
    if mysql::is_transaction_conflict(err) {
        return true;
    }
    let _ = err;
    false
}

/// The database's own error behind `err`, when it is one of driver type `E`.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn database_error<E: sea_orm::sqlx::error::DatabaseError>(err: &DbErr) -> Option<&E> {
    use sea_orm::RuntimeErr;
    match err {
        DbErr::Exec(RuntimeErr::SqlxError(e))
        | DbErr::Query(RuntimeErr::SqlxError(e))
        | DbErr::Conn(RuntimeErr::SqlxError(e)) => match e.as_ref() {
            sea_orm::sqlx::Error::Database(db_err) => db_err.try_downcast_ref::<E>(),
            _ => None,
        },
        _ => None,
    }
}

/// `RETURNING` every entity column.
fn returning_all() -> ReturningClause {
    Query::returning().columns(Column::iter().map(IntoColumnRef::into_column_ref))
}

/// Maps a row of [`COLUMNS`] to the model.
pub(crate) fn model(row: &QueryResult) -> Result<task_run::Model, DbErr> {
    task_run::Model::from_query_result(row, "")
}

/// Every entity column, in entity order: what lookups select and updates return. The
/// MySQL marker column is left out on purpose.
pub(crate) static COLUMNS: LazyLock<String> = LazyLock::new(|| {
    Column::iter()
        .map(|column| sea_orm::IdenStatic::as_str(&column))
        .collect::<Vec<_>>()
        .join(", ")
});

/// Runs an `INSERT ... ON CONFLICT ... DO NOTHING` of `row` (PostgreSQL, SQLite):
/// `true` when the row went in. Their affected-row count is exact.
async fn insert_do_nothing<C: DedupConnection + ?Sized>(
    db: &C,
    dialect: Dialect,
    sql: &'static str,
    row: &task_run::Model,
) -> Result<bool, DbErr> {
    Ok(connection::insert_task(db, dialect.backend(), sql, row).await? == 1)
}

/// Claims in one statement (PostgreSQL, SQLite): `UPDATE ... WHERE id = (the next
/// queued task, then `lock`) RETURNING` every column. `lease` is the SQL of the lease
/// end, reading its value from the second parameter, and that value.
async fn claim_returning<C: ConnectionTrait + ?Sized>(
    db: &C,
    dialect: Dialect,
    worker_id: &str,
    task_types: &[&str],
    (lease_end, lease_value): (&str, Value),
    lock: &str,
) -> Result<Option<task_run::Model>, DbErr> {
    let sql = format!(
        "UPDATE task_run SET {set} WHERE id = ({next}) RETURNING {columns}",
        set = claim_set_sql(dialect, 0, dialect.now_sql(), lease_end),
        next = next_queued_sql(dialect, 2, task_types.len(), lock),
        columns = *COLUMNS,
    );
    let mut values = vec![worker_id.into(), lease_value];
    values.extend(task_types.iter().map(|t| (*t).into()));
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            dialect.backend(),
            sql,
            values,
        ))
        .await?;
    row.map(|row| model(&row)).transpose()
}

/// `INSERT INTO task_run (...) VALUES (...)` followed by `suffix`.
fn insert_sql(dialect: Dialect, suffix: &str) -> String {
    let params: Vec<String> = (1..=9).map(|n| dialect.param(n)).collect();
    format!(
        "INSERT INTO task_run ({}) VALUES ({}){suffix}",
        connection::INSERT_COLUMNS,
        params.join(", ")
    )
}

/// The active task of a key, followed by `suffix`.
fn find_active_sql(dialect: Dialect, suffix: &str) -> String {
    format!(
        "SELECT {columns} FROM task_run WHERE user_id = {p1} AND task_type = {p2} \
         AND resource_key = {p3} AND {active}{suffix}",
        columns = *COLUMNS,
        p1 = dialect.param(1),
        p2 = dialect.param(2),
        p3 = dialect.param(3),
        active = active_status_sql(),
    )
}

/// The claim's SET clause, `params_before` parameters in: owner and lease length.
fn claim_set_sql(dialect: Dialect, params_before: usize, now: &str, lease_end: &str) -> String {
    format!(
        "status = '{running}', attempts = attempts + 1, lease_owner = {owner}, \
         lease_expires_at = {lease_end}, started_at = {now}, updated_at = {now}",
        running = TaskStatus::Running.as_str(),
        owner = dialect.param(params_before + 1),
    )
}

/// The oldest queued task's id (of `type_count` task types given as parameters from
/// `params_before + 1` on, or of any type), followed by `suffix`.
fn next_queued_sql(
    dialect: Dialect,
    params_before: usize,
    type_count: usize,
    suffix: &str,
) -> String {
    let types = if type_count == 0 {
        String::new()
    } else {
        let params: Vec<String> = (1..=type_count)
            .map(|n| dialect.param(params_before + n))
            .collect();
        format!(" AND task_type IN ({})", params.join(", "))
    };
    format!(
        "SELECT id FROM task_run WHERE status = '{queued}'{types} \
         ORDER BY created_at, id LIMIT 1{suffix}",
        queued = TaskStatus::Queued.as_str(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each backend is supported exactly when its feature is on; otherwise the error says
    /// which feature to enable. CI also runs this in single-feature builds.
    #[test]
    fn a_dialect_built_without_its_feature_is_a_clear_error() {
        for (backend, enabled) in [
            (DbBackend::Sqlite, cfg!(feature = "sqlite")),
            (DbBackend::Postgres, cfg!(feature = "postgres")),
            (DbBackend::MySql, cfg!(feature = "mysql")),
        ] {
            match Dialect::from_backend(backend) {
                Ok(dialect) => {
                    assert!(enabled, "{backend:?}");
                    assert_eq!(dialect.backend(), backend);
                }
                Err(DbErr::BackendNotSupported { ctx, .. }) => {
                    assert!(!enabled, "{backend:?}");
                    assert!(ctx.contains("feature"), "{ctx}");
                }
                Err(other) => panic!("{other}"),
            }
        }
    }
}
