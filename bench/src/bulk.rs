//! The bulk workloads: `find_or_enqueue_many` against the hand-written bulk SQL it is
//! measured against (`raw-dedup`: insert-or-nothing, then one lookup of the rest) and the
//! plain-write ceiling (`raw-insert`: COPY on PostgreSQL, a multi-row INSERT elsewhere,
//! on a table without the unique index), through sqlx on the same pool.

use std::sync::LazyLock;

use sea_orm::sqlx::{self, Row};
use sea_orm::{DatabaseConnection, DbBackend};
use task_dedup::{NewTask, TaskDedup, TaskKey, task_run};
use uuid::Uuid;

use crate::args::Strategy;

/// Columns a hand-written bulk insert writes; the others keep their defaults (no
/// payload, priority 0, scope 'active', window 0).
const INSERT: &str = "INSERT INTO task_run (id, user_id, task_type, resource_key, status, attempts, \
     created_at, updated_at, run_at)";

/// What the rows look like when read back, decoded as hand-written code would (the key
/// columns unchecked: they are VARBINARY on MySQL).
const COLUMNS: &str = "id, user_id, task_type, resource_key, status, payload, attempts, \
                       created_at, run_at, priority, scope, dedup_window_end";

/// PostgreSQL: one array per column, so one statement text (prepared once) for any batch.
static PG_INSERT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{INSERT} SELECT id, u, t, r, 'queued', 0, $5, $5, $5 \
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) AS x(id, u, t, r) \
         ON CONFLICT (user_id, task_type, resource_key, dedup_window_end) \
         WHERE {} DO NOTHING RETURNING id",
        task_dedup_entity::OCCUPIES_KEY_SQL
    )
});

/// A lookup per key as a `LATERAL` subquery: as a plain join, the generic plan on a table
/// not analyzed yet scans every occupied row per call (as find_or_enqueue_many's did).
static PG_HOLDERS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT t.* FROM unnest($1::text[], $2::text[], $3::text[]) AS k(ku, kt, kr) \
         CROSS JOIN LATERAL (SELECT {COLUMNS} FROM task_run WHERE user_id = ku \
         AND task_type = kt AND resource_key = kr AND dedup_window_end = 0 AND {} \
         LIMIT 1) AS t",
        task_dedup_entity::OCCUPIES_KEY_SQL
    )
});

/// How many tasks of the batch were created.
pub async fn call(
    strategy: Strategy,
    db: &DatabaseConnection,
    keys: Vec<TaskKey>,
) -> Result<usize, String> {
    let result = match strategy {
        Strategy::FindOrEnqueue => {
            let outcomes = db
                .find_or_enqueue_many(keys.into_iter().map(NewTask::new))
                .await
                .map_err(|e| e.to_string())?;
            return Ok(outcomes.iter().filter(|o| o.is_created()).count());
        }
        Strategy::RawDedup => {
            // In key order, as find_or_enqueue_many does: concurrent batches then lock
            // rows in one order, which keeps InnoDB's deadlocks rare.
            let mut keys = keys;
            keys.sort_by(|a, b| {
                (a.user_id(), a.task_type(), a.resource_key()).cmp(&(
                    b.user_id(),
                    b.task_type(),
                    b.resource_key(),
                ))
            });
            raw_dedup(db, &keys).await
        }
        Strategy::RawInsert => raw_insert(db, &keys).await,
        _ => return Err("the bulk workloads run find-or-enqueue, raw-dedup and raw-insert".into()),
    };
    result.map_err(|e| e.to_string())
}

/// `(?, ?, ...)` groups for `rows` rows of `group`.
fn rows(group: &str, rows: usize) -> String {
    vec![group; rows].join(", ")
}

async fn raw_dedup(db: &DatabaseConnection, keys: &[TaskKey]) -> Result<usize, sqlx::Error> {
    let now = task_run::now();
    let ids: Vec<Uuid> = keys.iter().map(|_| Uuid::now_v7()).collect();
    let occupies = task_dedup_entity::OCCUPIES_KEY_SQL;
    match db.get_database_backend() {
        DbBackend::Postgres => {
            let pool = db.get_postgres_connection_pool();
            let (users, types, resources) = columns(keys);
            let created: Vec<Uuid> = sqlx::query_scalar(&**PG_INSERT)
                .bind(&ids)
                .bind(&users)
                .bind(&types)
                .bind(&resources)
                .bind(now)
                .fetch_all(pool)
                .await?;
            let rest: Vec<usize> = rest(&ids, &created);
            if !rest.is_empty() {
                let pick = |v: &Vec<String>| rest.iter().map(|&i| v[i].clone()).collect::<Vec<_>>();
                let rows = sqlx::query(&**PG_HOLDERS)
                    .bind(pick(&users))
                    .bind(pick(&types))
                    .bind(pick(&resources))
                    .fetch_all(pool)
                    .await?;
                decode(&rows)?;
            }
            Ok(created.len())
        }
        DbBackend::Sqlite => {
            let pool = db.get_sqlite_connection_pool();
            let mut conn = pool.acquire().await?;
            let mut txn = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
            let insert = format!(
                "{INSERT} VALUES {} ON CONFLICT (user_id, task_type, resource_key, dedup_window_end) \
                 WHERE {occupies} DO NOTHING RETURNING id",
                rows("(?, ?, ?, ?, 'queued', 0, ?, ?, ?)", keys.len())
            );
            let mut query = sqlx::query_scalar::<_, Uuid>(sqlx::AssertSqlSafe(insert));
            for (id, key) in ids.iter().zip(keys) {
                query = query
                    .bind(*id)
                    .bind(key.user_id())
                    .bind(key.task_type())
                    .bind(key.resource_key())
                    .bind(now)
                    .bind(now)
                    .bind(now);
            }
            let created = query.fetch_all(&mut *txn).await?;
            let rest = rest(&ids, &created);
            if !rest.is_empty() {
                let select = format!(
                    "WITH k(ku, kt, kr) AS (VALUES {}) SELECT {COLUMNS} FROM k \
                     JOIN task_run ON user_id = ku AND task_type = kt AND resource_key = kr \
                     AND dedup_window_end = 0 WHERE {occupies}",
                    rows("(?, ?, ?)", rest.len())
                );
                let mut query = sqlx::query(sqlx::AssertSqlSafe(select));
                for &i in &rest {
                    query = query
                        .bind(keys[i].user_id())
                        .bind(keys[i].task_type())
                        .bind(keys[i].resource_key());
                }
                decode(&query.fetch_all(&mut *txn).await?)?;
            }
            txn.commit().await?;
            Ok(created.len())
        }
        _ => {
            let pool = db.get_mysql_connection_pool();
            for attempt in 1..=1_000u32 {
                match mysql_dedup(pool, keys, &ids, now).await {
                    Err(e) if crate::strategy::is_retryable(&e) => {
                        crate::strategy::backoff(attempt).await;
                    }
                    other => return other,
                }
            }
            Err(sqlx::Error::Protocol("raw bulk: too many deadlocks".into()))
        }
    }
}

/// MySQL/MariaDB: insert with `ON DUPLICATE KEY UPDATE id = id`, read which ids went
/// in, read the holders of the rest, in one transaction. The reads take no locks: the
/// transaction's snapshot starts after the insert, whose locks hold the rows it hit (a
/// locking read deadlocks with the other batches' inserts, as find_or_enqueue_many's
/// did).
async fn mysql_dedup(
    pool: &sqlx::MySqlPool,
    keys: &[TaskKey],
    ids: &[Uuid],
    now: chrono::DateTime<chrono::Utc>,
) -> Result<usize, sqlx::Error> {
    let mut txn = pool.begin().await?;
    let insert = format!(
        "{INSERT} VALUES {} ON DUPLICATE KEY UPDATE id = id",
        rows("(?, ?, ?, ?, 'queued', 0, ?, ?, ?)", keys.len())
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(insert));
    for (id, key) in ids.iter().zip(keys) {
        query = query
            .bind(*id)
            .bind(key.user_id())
            .bind(key.task_type())
            .bind(key.resource_key())
            .bind(now)
            .bind(now)
            .bind(now);
    }
    query.execute(&mut *txn).await?;
    let select = format!(
        "SELECT id FROM task_run WHERE id IN ({})",
        rows("?", ids.len())
    );
    let mut query = sqlx::query_scalar::<_, Uuid>(sqlx::AssertSqlSafe(select));
    for id in ids {
        query = query.bind(*id);
    }
    let created = query.fetch_all(&mut *txn).await?;
    let rest = rest(ids, &created);
    if !rest.is_empty() {
        let select = format!(
            "SELECT {COLUMNS} FROM task_run WHERE (user_id, task_type, resource_key, \
             dedup_window_end) IN ({}) AND occupied = 1",
            rows("(?, ?, ?, 0)", rest.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(select));
        for &i in &rest {
            query = query
                .bind(keys[i].user_id())
                .bind(keys[i].task_type())
                .bind(keys[i].resource_key());
        }
        decode(&query.fetch_all(&mut *txn).await?)?;
    }
    txn.commit().await?;
    Ok(created.len())
}

/// The plain-write ceiling, on a table without the unique index: COPY on PostgreSQL, one
/// multi-row INSERT elsewhere.
async fn raw_insert(db: &DatabaseConnection, keys: &[TaskKey]) -> Result<usize, sqlx::Error> {
    let now = task_run::now();
    match db.get_database_backend() {
        DbBackend::Postgres => {
            let pool = db.get_postgres_connection_pool();
            let mut conn = pool.acquire().await?;
            let mut copy = conn
                .copy_in_raw(
                    "COPY task_run (id, user_id, task_type, resource_key, status, attempts, \
                     created_at, updated_at, run_at) FROM STDIN",
                )
                .await?;
            let stamp = now.to_rfc3339();
            let mut data = String::with_capacity(keys.len() * 160);
            for key in keys {
                data.push_str(&format!(
                    "{}\t{}\t{}\t{}\tqueued\t0\t{stamp}\t{stamp}\t{stamp}\n",
                    Uuid::now_v7(),
                    key.user_id(),
                    key.task_type(),
                    key.resource_key()
                ));
            }
            copy.send(data.into_bytes()).await?;
            copy.finish().await?;
            Ok(keys.len())
        }
        backend => {
            let insert = format!(
                "{INSERT} VALUES {}",
                rows("(?, ?, ?, ?, 'queued', 0, ?, ?, ?)", keys.len())
            );
            macro_rules! run {
                ($pool:expr) => {{
                    let mut query = sqlx::query(sqlx::AssertSqlSafe(insert));
                    for key in keys {
                        query = query
                            .bind(Uuid::now_v7())
                            .bind(key.user_id())
                            .bind(key.task_type())
                            .bind(key.resource_key())
                            .bind(now)
                            .bind(now)
                            .bind(now);
                    }
                    query.execute($pool).await?;
                }};
            }
            if backend == DbBackend::MySql {
                run!(db.get_mysql_connection_pool());
            } else {
                run!(db.get_sqlite_connection_pool());
            }
            Ok(keys.len())
        }
    }
}

/// The key columns as three arrays.
fn columns(keys: &[TaskKey]) -> (Vec<String>, Vec<String>, Vec<String>) {
    (
        keys.iter().map(|k| k.user_id().to_owned()).collect(),
        keys.iter().map(|k| k.task_type().to_owned()).collect(),
        keys.iter().map(|k| k.resource_key().to_owned()).collect(),
    )
}

/// Positions of the ids that did not go in.
fn rest(ids: &[Uuid], created: &[Uuid]) -> Vec<usize> {
    let created: std::collections::HashSet<&Uuid> = created.iter().collect();
    (0..ids.len())
        .filter(|&i| !created.contains(&ids[i]))
        .collect()
}

/// Decodes the rows as hand-written code would map them.
fn decode<R: Row>(rows: &[R]) -> Result<(), sqlx::Error>
where
    for<'r> Uuid: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i16: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> chrono::DateTime<chrono::Utc>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<sqlx::types::Json<serde_json::Value>>:
        sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    usize: sqlx::ColumnIndex<R>,
{
    for row in rows {
        std::hint::black_box((
            row.try_get::<Uuid, _>(0)?,
            row.try_get_unchecked::<String, _>(1)?,
            row.try_get_unchecked::<String, _>(2)?,
            row.try_get_unchecked::<String, _>(3)?,
            row.try_get::<String, _>(4)?,
            row.try_get::<Option<sqlx::types::Json<serde_json::Value>>, _>(5)?,
            row.try_get::<i32, _>(6)?,
            row.try_get::<chrono::DateTime<chrono::Utc>, _>(7)?,
            row.try_get::<chrono::DateTime<chrono::Utc>, _>(8)?,
            row.try_get::<i16, _>(9)?,
            row.try_get::<String, _>(10)?,
            row.try_get::<i64, _>(11)?,
        ));
    }
    Ok(())
}
