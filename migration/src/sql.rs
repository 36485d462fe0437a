//! Running SQL text on the three dialects: what the frozen migrations and
//! [`ensure_schema`](crate::ensure_schema) share. Nothing here describes the schema.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend, Statement, Value};

/// One of the dialects this crate was compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
    MySql,
}

impl Dialect {
    /// The connection's dialect, or `DbErr::BackendNotSupported` when this crate was built
    /// without its feature (`sqlite`, `postgres`, `mysql`).
    pub(crate) fn of(manager: &SchemaManager<'_>) -> Result<Dialect, DbErr> {
        match manager.get_database_backend() {
            #[cfg(feature = "sqlite")]
            DbBackend::Sqlite => Ok(Dialect::Sqlite),
            #[cfg(feature = "postgres")]
            DbBackend::Postgres => Ok(Dialect::Postgres),
            #[cfg(feature = "mysql")]
            DbBackend::MySql => Ok(Dialect::MySql),
            other => Err(DbErr::BackendNotSupported {
                db: other.as_str(),
                ctx: "task-dedup-migration (enable its feature for this database)",
            }),
        }
    }

    pub(crate) fn backend(self) -> DbBackend {
        match self {
            Dialect::Sqlite => DbBackend::Sqlite,
            Dialect::Postgres => DbBackend::Postgres,
            Dialect::MySql => DbBackend::MySql,
        }
    }
}

/// Runs each statement in order.
pub(crate) async fn run(manager: &SchemaManager<'_>, statements: &[&str]) -> Result<(), DbErr> {
    for sql in statements {
        manager.get_connection().execute_unprepared(sql).await?;
    }
    Ok(())
}

/// Runs `sql` with bound `values`; returns the affected-row count.
pub(crate) async fn execute<C: ConnectionTrait + ?Sized>(
    db: &C,
    sql: &str,
    values: Vec<Value>,
) -> Result<u64, DbErr> {
    let statement = Statement::from_sql_and_values(db.get_database_backend(), sql, values);
    Ok(db.execute_raw(statement).await?.rows_affected())
}

/// Runs `sql` (a `CREATE [UNIQUE] INDEX name ...`) unless the table has an index `name`.
/// Asked first on every dialect: MySQL 8 has no `CREATE INDEX IF NOT EXISTS`.
pub(crate) async fn create_index_if_missing(
    manager: &SchemaManager<'_>,
    name: &str,
    sql: &str,
) -> Result<bool, DbErr> {
    if manager.has_index("task_run", name).await? {
        return Ok(false);
    }
    run(manager, &[sql]).await?;
    Ok(true)
}

/// The columns of index `index` on `task_run`, in index order; empty when it does not
/// exist. Lets a migration tell an index it must replace from the one it creates.
pub(crate) async fn index_columns(
    manager: &SchemaManager<'_>,
    dialect: Dialect,
    index: &str,
) -> Result<Vec<String>, DbErr> {
    let sql = match dialect {
        Dialect::Sqlite => "SELECT name FROM pragma_index_info(?) ORDER BY seqno",
        Dialect::Postgres => {
            "SELECT a.attname::text AS name FROM pg_index i \
             JOIN pg_class c ON c.oid = i.indexrelid \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
             WHERE i.indrelid = 'task_run'::regclass AND c.relname = $1 \
             ORDER BY array_position(i.indkey, a.attnum)"
        }
        Dialect::MySql => {
            "SELECT CAST(COLUMN_NAME AS CHAR) AS name FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'task_run' AND INDEX_NAME = ? \
             ORDER BY SEQ_IN_INDEX"
        }
    };
    let rows = manager
        .get_connection()
        .query_all_raw(Statement::from_sql_and_values(
            dialect.backend(),
            sql,
            [index.into()],
        ))
        .await?;
    rows.iter().map(|row| row.try_get("", "name")).collect()
}
