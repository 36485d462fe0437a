//! [`Arg`]: a statement's parameter, borrowed from the caller's values, and how each
//! group of parameters the statements take is built — a new task's row, a key and its
//! window, PostgreSQL's arrays of a batch — each written once. Bound straight into sqlx
//! on a pool, or converted into SeaORM values in a transaction; both store the same
//! bytes (each value is bound as sea-query-sqlx binds the same value).

use std::borrow::Cow;

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
use sea_orm::sqlx;
use sea_orm::{DbBackend, DbErr, Statement, Value};
use uuid::Uuid;

use super::EndMany;
use crate::dialect::Dialect;
use task_dedup_entity::task_run;

type Time = chrono::DateTime<chrono::Utc>;

/// One parameter of a statement.
#[derive(Debug)]
pub(crate) enum Arg<'a> {
    Uuid(Uuid),
    Str(&'a str),
    /// Text the dialect renders (a SQLite date modifier, a JSON array of task types).
    String(String),
    Json(Option<&'a serde_json::Value>),
    I16(i16),
    I64(i64),
    /// A nullable integer (a limit that is not set).
    OptI64(Option<i64>),
    Bool(bool),
    Time(Time),
    /// A PostgreSQL array: one column of a batch.
    #[cfg(feature = "postgres")]
    Array(Array<'a>),
}

/// A PostgreSQL array parameter.
#[cfg(feature = "postgres")]
#[derive(Debug)]
pub(crate) enum Array<'a> {
    Uuid(Vec<Uuid>),
    Str(Vec<&'a str>),
    /// Payloads; a task without one is `None` here and `false` in the `has_payload`
    /// array beside it (an array of SeaORM values cannot hold NULL elements).
    Json(Vec<Option<&'a serde_json::Value>>),
    Bool(Vec<bool>),
    Time(Vec<Time>),
    I16(Vec<i16>),
    I64(Vec<i64>),
}

/// A new task's values, in the order of the INSERT statements' placeholders: id,
/// user_id, task_type, resource_key, payload, created_at, updated_at, run_at, priority,
/// scope, dedup_window_end, concurrent (`status` and `attempts` are literals there).
pub(crate) fn row(row: &task_run::Model) -> [Arg<'_>; 12] {
    [
        Arg::Uuid(row.id),
        Arg::Str(&row.user_id),
        Arg::Str(&row.task_type),
        Arg::Str(&row.resource_key),
        Arg::Json(row.payload.as_ref()),
        Arg::Time(row.created_at),
        Arg::Time(row.updated_at),
        Arg::Time(row.run_at),
        Arg::I16(row.priority),
        Arg::Str(row.scope.as_str()),
        Arg::I64(row.dedup_window_end),
        Arg::Bool(row.concurrent),
    ]
}

/// A key and its window: user_id, task_type, resource_key, dedup_window_end.
pub(crate) fn slot([user_id, task_type, resource_key]: [&str; 3], window_end: i64) -> [Arg<'_>; 4] {
    [
        Arg::Str(user_id),
        Arg::Str(task_type),
        Arg::Str(resource_key),
        Arg::I64(window_end),
    ]
}

/// The key of a row.
pub(crate) fn key_of(row: &task_run::Model) -> [&str; 3] {
    [&row.user_id, &row.task_type, &row.resource_key]
}

/// A duration as the statements take it: microseconds, or on SQLite a date-function
/// modifier such as `+30.000000 seconds`.
pub(crate) fn interval(dialect: Dialect, micros: i64) -> Arg<'static> {
    match dialect {
        #[cfg(feature = "sqlite")]
        Dialect::Sqlite => Arg::String(crate::dialect::sqlite::seconds_modifier(micros)),
        #[allow(unreachable_patterns)]
        _ => Arg::I64(micros),
    }
}

/// The task types a `RETURNING` claim asks for: a PostgreSQL array, a JSON array on
/// SQLite (MySQL/MariaDB's claim binds a placeholder per type instead).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn task_types<'a>(dialect: Dialect, task_types: &[&'a str]) -> Arg<'a> {
    match dialect {
        #[cfg(feature = "postgres")]
        Dialect::Postgres => Arg::Array(Array::Str(task_types.to_vec())),
        #[allow(unreachable_patterns)]
        _ => Arg::String(serde_json::Value::from(task_types.to_vec()).to_string()),
    }
}

/// The rows of a batch insert: on PostgreSQL one array per column (and the shared
/// creation time once, `$5`), elsewhere each row's values in turn.
pub(crate) fn rows<'a>(dialect: Dialect, rows: &[&'a task_run::Model]) -> Vec<Arg<'a>> {
    #[cfg(feature = "postgres")]
    if dialect == Dialect::Postgres {
        let now = rows
            .first()
            .map_or_else(task_run::now, |row| row.created_at);
        let [user_id, task_type, resource_key, window_end] = key_arrays(rows);
        return vec![
            Arg::Array(Array::Uuid(column(rows, |r| r.id))),
            user_id,
            task_type,
            resource_key,
            Arg::Time(now),
            Arg::Array(Array::Json(column(rows, |r| r.payload.as_ref()))),
            Arg::Array(Array::Bool(column(rows, |r| r.payload.is_some()))),
            Arg::Array(Array::Time(column(rows, |r| r.run_at))),
            Arg::Array(Array::I16(column(rows, |r| r.priority))),
            Arg::Array(Array::Str(column(rows, |r| r.scope.as_str()))),
            window_end,
            Arg::Array(Array::Bool(column(rows, |r| r.concurrent))),
        ];
    }
    let _ = dialect;
    rows.iter().flat_map(|r| row(r)).collect()
}

/// The keys and windows of a batch lookup: on PostgreSQL one array per column.
pub(crate) fn slots<'a>(dialect: Dialect, rows: &[&'a task_run::Model]) -> Vec<Arg<'a>> {
    #[cfg(feature = "postgres")]
    if dialect == Dialect::Postgres {
        return key_arrays(rows).into();
    }
    let _ = dialect;
    rows.iter()
        .flat_map(|r| slot(key_of(r), r.dedup_window_end))
        .collect()
}

/// The key and window of each row, one array per column.
#[cfg(feature = "postgres")]
fn key_arrays<'a>(rows: &[&'a task_run::Model]) -> [Arg<'a>; 4] {
    [
        Arg::Array(Array::Str(column(rows, |r| r.user_id.as_str()))),
        Arg::Array(Array::Str(column(rows, |r| r.task_type.as_str()))),
        Arg::Array(Array::Str(column(rows, |r| r.resource_key.as_str()))),
        Arg::Array(Array::I64(column(rows, |r| r.dedup_window_end))),
    ]
}

/// One column of `rows`.
#[cfg(feature = "postgres")]
fn column<'a, T>(rows: &[&'a task_run::Model], value: impl Fn(&'a task_run::Model) -> T) -> Vec<T> {
    rows.iter().map(|r| value(r)).collect()
}

/// Ids: on PostgreSQL one array.
pub(crate) fn ids(dialect: Dialect, ids: &[Uuid]) -> Vec<Arg<'static>> {
    #[cfg(feature = "postgres")]
    if dialect == Dialect::Postgres {
        return vec![Arg::Array(Array::Uuid(ids.to_vec()))];
    }
    let _ = dialect;
    ids.iter().map(|id| Arg::Uuid(*id)).collect()
}

/// A batch of endings as its dialect's statement binds it (`dialect::Endings`), the
/// worker's id last: on PostgreSQL one array per column; on SQLite each row's values in
/// turn; on MySQL/MariaDB an `(id, value)` pair per row for each `CASE`, then the ids.
pub(crate) fn endings<'a>(
    dialect: Dialect,
    batch: EndMany<'a>,
    worker_id: &'a str,
) -> Vec<Arg<'a>> {
    let mut values = Vec::new();
    match dialect {
        #[cfg(feature = "postgres")]
        Dialect::Postgres => {
            values.push(Arg::Array(Array::Uuid(batch.ids())));
            match batch {
                EndMany::Complete(rows) => {
                    values.push(Arg::Array(Array::Json(rows.iter().map(|r| r.1).collect())));
                    values.push(Arg::Array(Array::Bool(
                        rows.iter().map(|r| r.1.is_some()).collect(),
                    )));
                }
                EndMany::Fail(rows) => {
                    values.push(Arg::Array(Array::Str(rows.iter().map(|r| r.1).collect())));
                }
                EndMany::Retry(rows) => {
                    values.push(Arg::Array(Array::Str(rows.iter().map(|r| r.1).collect())));
                    values.push(Arg::Array(Array::I64(rows.iter().map(|r| r.2).collect())));
                }
            }
        }
        #[cfg(feature = "sqlite")]
        Dialect::Sqlite => match batch {
            EndMany::Retry(rows) => {
                for (id, error, delay) in rows {
                    values.extend([Arg::Uuid(*id), Arg::Str(error), interval(dialect, *delay)]);
                }
            }
            _ => id_value_pairs(batch, &mut values),
        },
        #[cfg(feature = "mysql")]
        Dialect::MySql => {
            id_value_pairs(batch, &mut values);
            if let EndMany::Retry(rows) = batch {
                for (id, _, delay) in rows {
                    values.extend([Arg::Uuid(*id), Arg::I64(*delay)]);
                }
            }
            values.extend(batch.ids().into_iter().map(Arg::Uuid));
        }
    }
    values.push(Arg::Str(worker_id));
    values
}

/// Each task's id and its result or error, row after row (a retry's error without its
/// delay), as SQLite's and MySQL/MariaDB's batch statements take them.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
fn id_value_pairs<'a>(batch: EndMany<'a>, values: &mut Vec<Arg<'a>>) {
    match batch {
        EndMany::Complete(rows) => {
            for (id, result) in rows {
                values.extend([Arg::Uuid(*id), Arg::Json(*result)]);
            }
        }
        EndMany::Fail(rows) => {
            for (id, error) in rows {
                values.extend([Arg::Uuid(*id), Arg::Str(error)]);
            }
        }
        EndMany::Retry(rows) => {
            for (id, error, _) in rows {
                values.extend([Arg::Uuid(*id), Arg::Str(error)]);
            }
        }
    }
}

impl From<Arg<'_>> for Value {
    fn from(arg: Arg<'_>) -> Value {
        match arg {
            Arg::Uuid(v) => v.into(),
            Arg::Str(v) => v.into(),
            Arg::String(v) => v.into(),
            Arg::Json(v) => v.cloned().into(),
            Arg::I16(v) => v.into(),
            Arg::I64(v) => v.into(),
            Arg::OptI64(v) => v.into(),
            Arg::Bool(v) => v.into(),
            Arg::Time(v) => v.into(),
            #[cfg(feature = "postgres")]
            Arg::Array(array) => match array {
                Array::Uuid(v) => v.into(),
                Array::Str(v) => v.into_iter().map(str::to_owned).collect::<Vec<_>>().into(),
                Array::Json(v) => v
                    .into_iter()
                    .map(|json| json.cloned().unwrap_or(serde_json::Value::Null))
                    .collect::<Vec<_>>()
                    .into(),
                Array::Bool(v) => v.into(),
                Array::Time(v) => v.into(),
                Array::I16(v) => v.into(),
                Array::I64(v) => v.into(),
            },
        }
    }
}

/// A statement for SeaORM's path.
pub(crate) fn statement(
    backend: DbBackend,
    sql: Cow<'static, str>,
    args: Vec<Arg<'_>>,
) -> Statement {
    let values: Vec<Value> = args.into_iter().map(Value::from).collect();
    Statement::from_sql_and_values(backend, sql, values)
}

/// A sqlx query of `sql`, which is either one of the dialects' constant texts or one
/// they generated for a number of rows (never user input).
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn query<DB: sqlx::Database>(
    sql: Cow<'static, str>,
) -> sqlx::query::Query<'static, DB, <DB as sqlx::Database>::Arguments> {
    match sql {
        Cow::Borrowed(sql) => sqlx::query(sql),
        Cow::Owned(sql) => sqlx::query(sqlx::AssertSqlSafe(sql)),
    }
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
type Query<'q, DB> = sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments>;

/// A sqlx database task-dedup binds [`Arg`]s for.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) trait Binds: sqlx::Database {
    /// Binds `arg` in place (the query is not moved: it is a few hundred bytes, and a
    /// statement binds up to a dozen values). `Err`: the value did not encode, or this
    /// database takes no such parameter (an array outside PostgreSQL: a bug of the
    /// caller).
    fn bind_arg<'q>(query: &mut Query<'q, Self>, arg: Arg<'q>) -> Result<(), DbErr>;
}

/// Binds a scalar [`Arg`], or hands the argument to `$other`.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
macro_rules! bind_scalar {
    ($query:expr, $arg:expr, $other:ident => $otherwise:expr) => {
        match $arg {
            Arg::Uuid(v) => $query.try_bind(v),
            Arg::Str(v) => $query.try_bind(v),
            Arg::String(v) => $query.try_bind(v),
            Arg::Json(v) => $query.try_bind(v),
            Arg::I16(v) => $query.try_bind(v),
            Arg::I64(v) => $query.try_bind(v),
            Arg::OptI64(v) => $query.try_bind(v),
            Arg::Bool(v) => $query.try_bind(v),
            Arg::Time(v) => $query.try_bind(v),
            #[allow(unreachable_patterns)]
            $other => $otherwise,
        }
    };
}

#[cfg(feature = "postgres")]
impl Binds for sqlx::Postgres {
    fn bind_arg<'q>(query: &mut Query<'q, Self>, arg: Arg<'q>) -> Result<(), DbErr> {
        use sqlx::types::Json;
        bind_scalar!(query, arg, other => match other {
            Arg::Array(Array::Uuid(v)) => query.try_bind(v),
            Arg::Array(Array::Str(v)) => query.try_bind(v),
            Arg::Array(Array::Json(v)) => {
                query.try_bind(v.into_iter().map(|j| j.map(Json)).collect::<Vec<_>>())
            }
            Arg::Array(Array::Bool(v)) => query.try_bind(v),
            Arg::Array(Array::Time(v)) => query.try_bind(v),
            Arg::Array(Array::I16(v)) => query.try_bind(v),
            Arg::Array(Array::I64(v)) => query.try_bind(v),
            other => return Err(not_taken(&other)),
        })
        .map_err(encode_err)
    }
}

/// MySQL/MariaDB and SQLite take scalars only.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
macro_rules! binds_scalars {
    ($db:ty) => {
        impl Binds for $db {
            fn bind_arg<'q>(query: &mut Query<'q, Self>, arg: Arg<'q>) -> Result<(), DbErr> {
                bind_scalar!(query, arg, other => return Err(not_taken(&other)))
                    .map_err(encode_err)
            }
        }
    };
}

#[cfg(feature = "mysql")]
binds_scalars!(sqlx::MySql);
#[cfg(feature = "sqlite")]
binds_scalars!(sqlx::Sqlite);

/// A parameter the database does not take.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn not_taken(arg: &Arg<'_>) -> DbErr {
    DbErr::Custom(format!(
        "task-dedup: a parameter this database does not take: {arg:?}"
    ))
}

/// A value that did not encode: the error sqlx would give when the statement ran
/// (`Query::bind` keeps it until then), as SeaORM reports a failed query.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn encode_err(err: sqlx::error::BoxDynError) -> DbErr {
    DbErr::Query(sea_orm::RuntimeErr::SqlxError(
        sqlx::Error::Encode(err).into(),
    ))
}

/// `sql` with `args` bound, for sqlx.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) fn bind<'q, DB: Binds>(
    sql: Cow<'static, str>,
    args: Vec<Arg<'q>>,
) -> Result<Query<'q, DB>, DbErr> {
    let mut query = self::query(sql);
    for arg in args {
        DB::bind_arg(&mut query, arg)?;
    }
    Ok(query)
}
