//! [`TaskDedup::find_or_enqueue_many`](crate::TaskDedup::find_or_enqueue_many): many
//! tasks in a few statements per chunk, each with the outcome `find_or_enqueue` would
//! have given it.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sea_orm::{
    ConnectionTrait, DbErr, QueryResult, SqliteTransactionMode, TransactionOptions,
    TransactionSession, Value,
};
use uuid::Uuid;

use crate::connection::DedupConnection;
use crate::dialect::{Dialect, is_transaction_conflict, model};
use crate::enqueue::{Enqueued, MAX_ENQUEUE_ATTEMPTS};
use crate::error::DedupError;
use crate::key::TaskKey;
use crate::reconnect::{self, Retrying};
use crate::task::{NewTask, OnConflict};
use crate::task_run::{self, TaskStatus};

/// One task of a batch, with the index of its input.
struct Item {
    index: usize,
    replace: bool,
    row: task_run::Model,
}

/// What became of a task of a chunk; `Created` is the item's own row.
enum Outcome {
    Created,
    Existing(task_run::Model),
    Replaced(task_run::Model),
}

/// The slot a task competes for: its key and window.
type Slot = (String, String, String, i64);

fn slot_of(row: &task_run::Model) -> Slot {
    (
        row.user_id.clone(),
        row.task_type.clone(),
        row.resource_key.clone(),
        row.dedup_window_end,
    )
}

pub(crate) async fn find_or_enqueue_many<C: DedupConnection>(
    db: &C,
    tasks: Vec<NewTask>,
) -> Result<Vec<Enqueued>, DedupError> {
    for (index, task) in tasks.iter().enumerate() {
        task.validate().map_err(|source| DedupError::InvalidItem {
            index,
            source: Box::new(source),
        })?;
    }
    let dialect = Dialect::of(db)?;
    let count = tasks.len();
    let now = task_run::now();
    let mut items: Vec<Item> = tasks
        .into_iter()
        .enumerate()
        .map(|(index, task)| {
            let (on_conflict, row) = task.into_row_at(now);
            let replace = on_conflict == OnConflict::ReplaceIfQueued;
            Item {
                index,
                replace,
                row,
            }
        })
        .collect();
    // Sorted by slot: repeats of a slot become neighbours (the first occurrence
    // decides), and concurrent batches take their locks in one order.
    items.sort_by(|a, b| {
        (
            &a.row.user_id,
            &a.row.task_type,
            &a.row.resource_key,
            a.row.dedup_window_end,
            a.index,
        )
            .cmp(&(
                &b.row.user_id,
                &b.row.task_type,
                &b.row.resource_key,
                b.row.dedup_window_end,
                b.index,
            ))
    });
    let mut repeats = Vec::new();
    items.dedup_by(|later, first| {
        let same = later.row.user_id == first.row.user_id
            && later.row.task_type == first.row.task_type
            && later.row.resource_key == first.row.resource_key
            && later.row.dedup_window_end == first.row.dedup_window_end;
        if same {
            repeats.push((later.index, first.index));
        }
        same
    });

    let mut outcomes: Vec<Option<Enqueued>> = (0..count).map(|_| None).collect();
    let mut items = items.into_iter();
    loop {
        let mut chunk: Vec<Item> = items.by_ref().take(dialect.bulk().chunk).collect();
        if chunk.is_empty() {
            break;
        }
        let chunk_outcomes = enqueue_chunk(db, dialect, &mut chunk).await?;
        for (item, outcome) in chunk.into_iter().zip(chunk_outcomes) {
            outcomes[item.index] = Some(match outcome {
                Outcome::Created => Enqueued::Created(item.row),
                Outcome::Existing(task) => Enqueued::Existing(task),
                Outcome::Replaced(task) => Enqueued::Replaced(task),
            });
        }
    }
    for (index, first) in repeats {
        outcomes[index] = outcomes[first]
            .as_ref()
            .map(|outcome| Enqueued::Existing(outcome.task().clone()));
    }
    tracing::debug!(tasks = count, "batch enqueued");
    outcomes
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| DedupError::Database(DbErr::Custom("a batch item got no outcome".into())))
}

/// Enqueues one chunk: rounds until every task has its outcome. A round runs again for
/// the tasks whose key was held by a task that let go of it before it could be read
/// (with fresh ids), after a deadlock on a pool, and after a lost connection (with the
/// same ids: what the lost round stored is found by id and returned as `Existing`).
async fn enqueue_chunk<C: DedupConnection>(
    db: &C,
    dialect: Dialect,
    chunk: &mut [Item],
) -> Result<Vec<Outcome>, DedupError> {
    let mut outcomes: Vec<Option<Outcome>> = (0..chunk.len()).map(|_| None).collect();
    let mut retrying = Retrying::new(
        db,
        reconnect::default_retry_budget(),
        "find_or_enqueue_many",
    );
    let mut rounds = 0;
    loop {
        let pending: Vec<usize> = (0..chunk.len())
            .filter(|&i| outcomes[i].is_none())
            .collect();
        let Some(&first_pending) = pending.first() else {
            break;
        };
        rounds += 1;
        if rounds > MAX_ENQUEUE_ATTEMPTS {
            let row = &chunk[first_pending].row;
            return Err(DedupError::Contention {
                key: TaskKey::from_trusted_parts(&row.user_id, &row.task_type, &row.resource_key),
                attempts: MAX_ENQUEUE_ATTEMPTS,
            });
        }
        let after_lost_attempt = retrying.after_lost_attempt();
        let attempt = async {
            match round(db, dialect, chunk, &pending, after_lost_attempt).await {
                Ok(found) => Ok(Some(found)),
                Err(err) if is_transaction_conflict(&err) && db.in_transaction() => {
                    Err(DedupError::TransactionAborted(err))
                }
                // A deadlock victim on a pool: the round rolled back; run it again.
                Err(err) if is_transaction_conflict(&err) => Ok(None),
                Err(err) => Err(err.into()),
            }
        };
        match retrying.run(attempt).await {
            None => {}
            Some(Err(err)) => return Err(err),
            Some(Ok(None)) => tokio::time::sleep(deadlock_pause(rounds)).await,
            Some(Ok(Some(found))) => {
                for (i, outcome) in found {
                    outcomes[i] = Some(outcome);
                }
                for &i in &pending {
                    if outcomes[i].is_none() {
                        // Its key's holder let go before it was read: insert again.
                        chunk[i].row.id = Uuid::now_v7();
                    }
                }
            }
        }
    }
    outcomes
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| DedupError::Database(DbErr::Custom("a batch item got no outcome".into())))
}

/// A random pause after a deadlock, up to 2^round ms (at most 64 ms).
fn deadlock_pause(round: u32) -> Duration {
    let ceiling_micros = (1u64 << round.min(6)) * 1_000;
    Duration::from_micros(rand::random_range(0..ceiling_micros))
}

/// One round over the `pending` tasks of `chunk`. On a pool, SQLite and MySQL/MariaDB run
/// it in a transaction of their own: SQLite's IMMEDIATE takes the write lock up front, so
/// nothing changes between the statements; InnoDB keeps the insert's locks until the
/// read. PostgreSQL needs none: a key whose holder let go in between is inserted again.
/// In the caller's transaction everything runs in it.
async fn round<C: DedupConnection>(
    db: &C,
    dialect: Dialect,
    chunk: &[Item],
    pending: &[usize],
    after_lost_attempt: bool,
) -> Result<Vec<(usize, Outcome)>, DbErr> {
    // On a pool the statements go to sqlx directly, as find_or_enqueue's do: SeaORM's
    // statement layer copies every value of a batch once more.
    if let Some(pool) = db.pool() {
        match &pool.inner {
            #[cfg(feature = "postgres")]
            sea_orm::DatabaseConnectionType::SqlxPostgresPoolConnection(_) => {
                let mut conn = Conn::<C>::PgPool(pool.get_postgres_connection_pool());
                return round_on(
                    &mut conn,
                    dialect,
                    chunk,
                    pending,
                    after_lost_attempt,
                    false,
                )
                .await;
            }
            #[cfg(feature = "mysql")]
            sea_orm::DatabaseConnectionType::SqlxMySqlPoolConnection(_) => {
                let txn = pool.get_mysql_connection_pool().begin().await;
                let mut conn = Conn::<C>::MySqlTxn(txn.map_err(crate::connection::acquire_err)?);
                let found =
                    round_on(&mut conn, dialect, chunk, pending, after_lost_attempt, true).await;
                return conn.end(found).await;
            }
            #[cfg(feature = "sqlite")]
            sea_orm::DatabaseConnectionType::SqlxSqlitePoolConnection(_) => {
                let txn = pool
                    .get_sqlite_connection_pool()
                    .begin_with("BEGIN IMMEDIATE")
                    .await;
                let mut conn = Conn::<C>::SqliteTxn(txn.map_err(crate::connection::acquire_err)?);
                let found =
                    round_on(&mut conn, dialect, chunk, pending, after_lost_attempt, true).await;
                return conn.end(found).await;
            }
            _ => {}
        }
    }
    if db.in_transaction() || dialect.binds_arrays() {
        let mut conn = Conn::SeaOrm(db);
        return round_on(
            &mut conn,
            dialect,
            chunk,
            pending,
            after_lost_attempt,
            false,
        )
        .await;
    }
    let txn = if dialect.backend() == sea_orm::DbBackend::Sqlite {
        db.begin_with_options(TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..TransactionOptions::default()
        })
        .await?
    } else {
        db.begin().await?
    };
    match round_on(
        &mut Conn::SeaOrm(&txn),
        dialect,
        chunk,
        pending,
        after_lost_attempt,
        true,
    )
    .await
    {
        Ok(found) => {
            txn.commit().await?;
            Ok(found)
        }
        Err(err) => {
            let _ = txn.rollback().await;
            Err(err)
        }
    }
}

/// Insert first, then read who holds the keys that were taken: a constant number of
/// statements whatever the number of tasks. Returns outcomes by position in `chunk`.
async fn round_on<C: ConnectionTrait>(
    conn: &mut Conn<'_, C>,
    dialect: Dialect,
    chunk: &[Item],
    pending: &[usize],
    after_lost_attempt: bool,
    own_transaction: bool,
) -> Result<Vec<(usize, Outcome)>, DbErr> {
    let bulk = dialect.bulk();
    let mut found = Vec::with_capacity(pending.len());
    let mut rest = pending.to_vec();
    if after_lost_attempt {
        // The lost round may have committed some rows: those are returned as they are.
        let mut stored = by_ids(conn, dialect, rest.iter().map(|&i| chunk[i].row.id)).await?;
        rest.retain(|&i| match stored.remove(&chunk[i].row.id) {
            Some(task) => {
                found.push((i, Outcome::Existing(task)));
                false
            }
            None => true,
        });
    }
    let (replace, plain): (Vec<usize>, Vec<usize>) = rest.iter().partition(|&&i| chunk[i].replace);
    let mut created: HashSet<Uuid> = HashSet::new();
    let mut replaced: HashMap<Slot, task_run::Model> = HashMap::new();
    for (group, sql) in [(&plain, bulk.insert), (&replace, bulk.replace)] {
        if group.is_empty() {
            continue;
        }
        let params = Params::Rows(chunk, group);
        if !dialect.supports_returning() {
            conn.execute(dialect, sql(group.len()), params).await?;
            continue;
        }
        let ours: HashSet<Uuid> = group.iter().map(|&i| chunk[i].row.id).collect();
        for row in conn.query_all(dialect, sql(group.len()), params).await? {
            let id: Uuid = row.try_get_by_index(0)?;
            if ours.contains(&id) {
                created.insert(id);
            } else {
                let task = model(&row)?;
                replaced.insert(slot_of(&task), task);
            }
        }
    }
    if !dialect.supports_returning() && !rest.is_empty() {
        let ids: Vec<Uuid> = rest.iter().map(|&i| chunk[i].row.id).collect();
        let sql = (bulk.ids_in)(ids.len());
        for row in conn.query_all(dialect, sql, Params::Ids(&ids)).await? {
            created.insert(row.try_get_by_index(0)?);
        }
    }
    rest.retain(|&i| {
        let item = &chunk[i];
        if created.contains(&item.row.id) {
            found.push((i, Outcome::Created));
            false
        } else if let Some(task) = replaced.remove(&slot_of(&item.row)) {
            found.push((i, Outcome::Replaced(task)));
            false
        } else {
            true
        }
    });
    if rest.is_empty() {
        return Ok(found);
    }
    let find_occupants = if own_transaction && !after_lost_attempt {
        bulk.find_occupants_after_own_insert
    } else {
        bulk.find_occupants
    };
    let sql = find_occupants(rest.len());
    let mut holders: HashMap<Slot, task_run::Model> = conn
        .query_all(dialect, sql, Params::Slots(chunk, &rest))
        .await?
        .iter()
        .map(|row| model(row).map(|task| (slot_of(&task), task)))
        .collect::<Result<_, _>>()?;
    for i in rest {
        let item = &chunk[i];
        // Not found: its holder let go in between; the round runs again for it.
        let Some(task) = holders.remove(&slot_of(&item.row)) else {
            continue;
        };
        // MySQL/MariaDB: the insert's `ON DUPLICATE KEY UPDATE` replaced every queued
        // holder of a `ReplaceIfQueued` task, and its locks kept it queued since.
        let outcome =
            if item.replace && !dialect.supports_returning() && task.status == TaskStatus::Queued {
                Outcome::Replaced(task)
            } else {
                Outcome::Existing(task)
            };
        found.push((i, outcome));
    }
    Ok(found)
}

/// The tasks of `ids`, by id.
async fn by_ids<C: ConnectionTrait>(
    conn: &mut Conn<'_, C>,
    dialect: Dialect,
    ids: impl Iterator<Item = Uuid>,
) -> Result<HashMap<Uuid, task_run::Model>, DbErr> {
    let ids: Vec<Uuid> = ids.collect();
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let sql = (dialect.bulk().by_ids)(ids.len());
    let rows: Vec<QueryResult> = conn.query_all(dialect, sql, Params::Ids(&ids)).await?;
    rows.iter()
        .map(|row| model(row).map(|task| (task.id, task)))
        .collect()
}

/// Where a round's statements run. Through sqlx, failures are the `DbErr`s SeaORM gives.
enum Conn<'a, C> {
    /// Through SeaORM: the caller's transaction, or a pool's own.
    SeaOrm(&'a C),
    /// A PostgreSQL pool, through sqlx: the arrays bound straight from the rows.
    #[cfg(feature = "postgres")]
    PgPool(&'a sea_orm::sqlx::PgPool),
    /// A transaction on a MySQL/MariaDB pool, through sqlx.
    #[cfg(feature = "mysql")]
    MySqlTxn(sea_orm::sqlx::Transaction<'static, sea_orm::sqlx::MySql>),
    /// An IMMEDIATE transaction on a SQLite pool, through sqlx.
    #[cfg(feature = "sqlite")]
    SqliteTxn(sea_orm::sqlx::Transaction<'static, sea_orm::sqlx::Sqlite>),
}

/// A bulk statement's parameters, borrowed from the chunk: the rows of positions
/// `group`, their slots, or ids.
#[derive(Clone, Copy)]
enum Params<'a> {
    Rows(&'a [Item], &'a [usize]),
    Slots(&'a [Item], &'a [usize]),
    Ids(&'a [Uuid]),
}

impl Params<'_> {
    fn values(self, dialect: Dialect) -> Vec<Value> {
        match self {
            Params::Rows(chunk, group) => row_values(dialect, chunk, group),
            Params::Slots(chunk, group) => slot_values(dialect, chunk, group),
            Params::Ids(ids) => id_values(dialect, ids.to_vec()),
        }
    }
}

impl<C: ConnectionTrait> Conn<'_, C> {
    async fn query_all(
        &mut self,
        dialect: Dialect,
        sql: Cow<'static, str>,
        params: Params<'_>,
    ) -> Result<Vec<QueryResult>, DbErr> {
        match self {
            Conn::SeaOrm(conn) => {
                conn.query_all_raw(dialect.statement(&sql, params.values(dialect)))
                    .await
            }
            #[cfg(feature = "postgres")]
            Conn::PgPool(pool) => pg::query_all(pool, sql, params).await,
            #[cfg(feature = "mysql")]
            Conn::MySqlTxn(txn) => {
                let rows = flat::bind(flat::query(sql), params)
                    .fetch_all(&mut **txn)
                    .await
                    .map_err(crate::connection::query_err)?;
                Ok(rows.into_iter().map(QueryResult::from).collect())
            }
            #[cfg(feature = "sqlite")]
            Conn::SqliteTxn(txn) => {
                let rows = flat::bind(flat::query(sql), params)
                    .fetch_all(&mut **txn)
                    .await
                    .map_err(crate::connection::query_err)?;
                Ok(rows.into_iter().map(QueryResult::from).collect())
            }
        }
    }

    async fn execute(
        &mut self,
        dialect: Dialect,
        sql: Cow<'static, str>,
        params: Params<'_>,
    ) -> Result<(), DbErr> {
        match self {
            Conn::SeaOrm(conn) => {
                conn.execute_raw(dialect.statement(&sql, params.values(dialect)))
                    .await?;
                Ok(())
            }
            #[cfg(feature = "postgres")]
            Conn::PgPool(pool) => pg::query_all(pool, sql, params).await.map(drop),
            #[cfg(feature = "mysql")]
            Conn::MySqlTxn(txn) => flat::bind(flat::query(sql), params)
                .execute(&mut **txn)
                .await
                .map(drop)
                .map_err(crate::connection::exec_err),
            #[cfg(feature = "sqlite")]
            Conn::SqliteTxn(txn) => flat::bind(flat::query(sql), params)
                .execute(&mut **txn)
                .await
                .map(drop)
                .map_err(crate::connection::exec_err),
        }
    }

    /// Commits the round's own transaction when it succeeded, rolls it back otherwise.
    #[cfg(any(feature = "mysql", feature = "sqlite"))]
    async fn end<T>(self, outcome: Result<T, DbErr>) -> Result<T, DbErr> {
        match self {
            #[cfg(feature = "mysql")]
            Conn::MySqlTxn(txn) => finish(txn, outcome).await,
            #[cfg(feature = "sqlite")]
            Conn::SqliteTxn(txn) => finish(txn, outcome).await,
            _ => outcome,
        }
    }
}

/// Commits `txn` after `outcome` succeeded, or rolls it back.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
async fn finish<DB: sea_orm::sqlx::Database, T>(
    txn: sea_orm::sqlx::Transaction<'static, DB>,
    outcome: Result<T, DbErr>,
) -> Result<T, DbErr> {
    match outcome {
        Ok(found) => {
            txn.commit().await.map_err(crate::connection::exec_err)?;
            Ok(found)
        }
        Err(err) => {
            let _ = txn.rollback().await;
            Err(err)
        }
    }
}

/// MySQL/MariaDB and SQLite through sqlx: one value per row and column, in the order the
/// statements' placeholders take them, borrowed.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
mod flat {
    use std::borrow::Cow;

    use sea_orm::sqlx::{self, Database, Encode, Type};

    use super::Params;

    type Query<'q, DB> = sqlx::query::Query<'q, DB, <DB as Database>::Arguments>;

    pub(super) fn query<DB: Database>(sql: Cow<'static, str>) -> Query<'static, DB> {
        match sql {
            Cow::Borrowed(sql) => sqlx::query(sql),
            Cow::Owned(sql) => sqlx::query(sqlx::AssertSqlSafe(sql)),
        }
    }

    pub(super) fn bind<'q, DB>(mut query: Query<'q, DB>, params: Params<'q>) -> Query<'q, DB>
    where
        DB: Database,
        uuid::Uuid: Encode<'q, DB> + Type<DB>,
        &'q str: Encode<'q, DB> + Type<DB>,
        Option<&'q serde_json::Value>: Encode<'q, DB> + Type<DB>,
        i16: Encode<'q, DB> + Type<DB>,
        i64: Encode<'q, DB> + Type<DB>,
        chrono::DateTime<chrono::Utc>: Encode<'q, DB> + Type<DB>,
    {
        match params {
            Params::Rows(chunk, group) => {
                for &i in group {
                    query = crate::connection::bind_row(query, &chunk[i].row);
                }
            }
            Params::Slots(chunk, group) => {
                for &i in group {
                    let row = &chunk[i].row;
                    query = query
                        .bind(row.user_id.as_str())
                        .bind(row.task_type.as_str())
                        .bind(row.resource_key.as_str())
                        .bind(row.dedup_window_end);
                }
            }
            Params::Ids(ids) => {
                for id in ids {
                    query = query.bind(*id);
                }
            }
        }
        query
    }
}

/// PostgreSQL through sqlx: the same arrays SeaORM would bind, borrowed.
#[cfg(feature = "postgres")]
mod pg {
    use std::borrow::Cow;

    use sea_orm::sqlx::types::Json;
    use sea_orm::sqlx::{self, PgPool};
    use sea_orm::{DbErr, QueryResult};

    use super::Params;
    use crate::connection::{acquire_err, query_err};

    pub(super) async fn query_all(
        pool: &PgPool,
        sql: Cow<'static, str>,
        params: Params<'_>,
    ) -> Result<Vec<QueryResult>, DbErr> {
        let query = match sql {
            Cow::Borrowed(sql) => sqlx::query(sql),
            Cow::Owned(sql) => sqlx::query(sqlx::AssertSqlSafe(sql)),
        };
        let query = match params {
            Params::Rows(chunk, group) => {
                let rows = || group.iter().map(|&i| &chunk[i].row);
                let now = rows().next().map(|row| row.created_at);
                query
                    .bind(rows().map(|r| r.id).collect::<Vec<_>>())
                    .bind(rows().map(|r| r.user_id.as_str()).collect::<Vec<_>>())
                    .bind(rows().map(|r| r.task_type.as_str()).collect::<Vec<_>>())
                    .bind(rows().map(|r| r.resource_key.as_str()).collect::<Vec<_>>())
                    .bind(now)
                    .bind(
                        rows()
                            .map(|r| r.payload.as_ref().map(Json))
                            .collect::<Vec<_>>(),
                    )
                    .bind(rows().map(|r| r.payload.is_some()).collect::<Vec<_>>())
                    .bind(rows().map(|r| r.run_at).collect::<Vec<_>>())
                    .bind(rows().map(|r| r.priority).collect::<Vec<_>>())
                    .bind(rows().map(|r| r.scope.as_str()).collect::<Vec<_>>())
                    .bind(rows().map(|r| r.dedup_window_end).collect::<Vec<_>>())
            }
            Params::Slots(chunk, group) => {
                let rows = || group.iter().map(|&i| &chunk[i].row);
                query
                    .bind(rows().map(|r| r.user_id.as_str()).collect::<Vec<_>>())
                    .bind(rows().map(|r| r.task_type.as_str()).collect::<Vec<_>>())
                    .bind(rows().map(|r| r.resource_key.as_str()).collect::<Vec<_>>())
                    .bind(rows().map(|r| r.dedup_window_end).collect::<Vec<_>>())
            }
            Params::Ids(ids) => query.bind(ids),
        };
        let mut conn = pool.acquire().await.map_err(acquire_err)?;
        let rows = query.fetch_all(&mut *conn).await.map_err(query_err)?;
        Ok(rows.into_iter().map(QueryResult::from).collect())
    }
}

/// The insert's parameters for the tasks `group` of `chunk`: on PostgreSQL one array per
/// column (and the shared creation time once), elsewhere each row's values in turn, as
/// the single insert binds them.
fn row_values(dialect: Dialect, chunk: &[Item], group: &[usize]) -> Vec<Value> {
    let rows = group.iter().map(|&i| &chunk[i].row);
    #[cfg(feature = "postgres")]
    if dialect.binds_arrays() {
        let now = rows
            .clone()
            .next()
            .map(|row| row.created_at)
            .unwrap_or_else(task_run::now);
        return vec![
            array(rows.clone(), |r| r.id),
            array(rows.clone(), |r| r.user_id.clone()),
            array(rows.clone(), |r| r.task_type.clone()),
            array(rows.clone(), |r| r.resource_key.clone()),
            now.into(),
            array(rows.clone(), |r| {
                r.payload.clone().unwrap_or(serde_json::Value::Null)
            }),
            array(rows.clone(), |r| r.payload.is_some()),
            array(rows.clone(), |r| r.run_at),
            array(rows.clone(), |r| r.priority),
            array(rows.clone(), |r| r.scope.as_str().to_owned()),
            array(rows, |r| r.dedup_window_end),
        ];
    }
    let _ = dialect;
    rows.flat_map(crate::connection::insert_values).collect()
}

/// The occupant lookup's parameters: key and window of each task of `group`.
fn slot_values(dialect: Dialect, chunk: &[Item], group: &[usize]) -> Vec<Value> {
    let rows = group.iter().map(|&i| &chunk[i].row);
    #[cfg(feature = "postgres")]
    if dialect.binds_arrays() {
        return vec![
            array(rows.clone(), |r| r.user_id.clone()),
            array(rows.clone(), |r| r.task_type.clone()),
            array(rows.clone(), |r| r.resource_key.clone()),
            array(rows, |r| r.dedup_window_end),
        ];
    }
    let _ = dialect;
    let mut values = Vec::with_capacity(group.len() * 4);
    for row in rows {
        values.extend([
            row.user_id.clone().into(),
            row.task_type.clone().into(),
            row.resource_key.clone().into(),
            row.dedup_window_end.into(),
        ]);
    }
    values
}

/// One column of `rows` as a PostgreSQL array parameter.
#[cfg(feature = "postgres")]
fn array<'a, T>(
    rows: impl Iterator<Item = &'a task_run::Model>,
    column: impl Fn(&task_run::Model) -> T,
) -> Value
where
    Vec<T>: Into<Value>,
{
    rows.map(column).collect::<Vec<_>>().into()
}

/// The id lookup's parameters.
fn id_values(dialect: Dialect, ids: Vec<Uuid>) -> Vec<Value> {
    #[cfg(feature = "postgres")]
    if dialect.binds_arrays() {
        return vec![ids.into()];
    }
    let _ = dialect;
    ids.into_iter().map(Value::from).collect()
}
