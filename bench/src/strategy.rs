//! The strategies: task-dedup, and the hand-written SQL it is measured against, run
//! through sqlx on the very pool task-dedup uses.

use std::hash::{BuildHasher, DefaultHasher, Hash, Hasher};
use std::time::Duration;

use sea_orm::sqlx::{self, Row};
use sea_orm::{DatabaseConnection, DbBackend};
use task_dedup::{NewTask, OnConflict, Task, TaskDedup, TaskKey, task_run};
use uuid::Uuid;

use crate::args::Strategy;

/// What a call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Existing,
}

/// How many times a retrying strategy tries before the call counts as an error: enough
/// that only a livelock ends there.
const MAX_ATTEMPTS: u32 = 1_000;

const COLUMNS: &str = "id, user_id, task_type, resource_key, status, payload, result, error, \
                       attempts, lease_owner, lease_expires_at, created_at, updated_at, \
                       started_at, finished_at, run_at, priority, scope, dedup_window_end";

/// A task row as hand-written code would map it.
#[allow(dead_code)] // Read only to measure the cost of decoding a row.
#[derive(Debug)]
struct TaskRow {
    id: Uuid,
    user_id: String,
    task_type: String,
    resource_key: String,
    status: String,
    payload: Option<sqlx::types::Json<serde_json::Value>>,
    result: Option<sqlx::types::Json<serde_json::Value>>,
    error: Option<String>,
    attempts: i32,
    lease_owner: Option<String>,
    lease_expires_at: Option<chrono::DateTime<chrono::Utc>>,
    created_at: chrono::DateTime<chrono::Utc>,
    updated_at: chrono::DateTime<chrono::Utc>,
    started_at: Option<chrono::DateTime<chrono::Utc>>,
    finished_at: Option<chrono::DateTime<chrono::Utc>>,
    run_at: chrono::DateTime<chrono::Utc>,
    priority: i16,
    scope: String,
    dedup_window_end: i64,
}

/// The SQL of one dialect. Built once per process and leaked into `&'static str`, which
/// is what hand-written code passes to sqlx (a string literal).
struct Sql {
    insert: &'static str,
    insert_or_nothing: &'static str,
    select_active: &'static str,
    /// MySQL: a locking read, which sees the row that made the insert fail even when a
    /// plain read's snapshot does not.
    select_after_conflict: &'static str,
    /// The `replace` workload: PostgreSQL/SQLite, an upsert that updates a queued row
    /// and returns it; MySQL, the UPDATE after the duplicate-key error.
    replace: &'static str,
    /// `raw-one-statement` (PostgreSQL): the insert-or-nothing and the SELECT of the
    /// holder in one statement.
    insert_or_select: &'static str,
}

impl Sql {
    fn new(backend: DbBackend) -> Sql {
        let p = |n: usize| match backend {
            DbBackend::Postgres => format!("${n}"),
            _ => "?".to_owned(),
        };
        let insert = format!(
            "INSERT INTO task_run (id, user_id, task_type, resource_key, status, payload, \
             attempts, created_at, updated_at, run_at, priority, scope, dedup_window_end) \
             VALUES ({}, {}, {}, {}, 'queued', {}, 0, {}, {}, {}, {}, {}, {})",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            p(6),
            p(7),
            p(8),
            p(9),
            p(10),
            p(11)
        );
        let occupies = task_dedup_entity::OCCUPIES_KEY_SQL;
        let target = format!(
            "ON CONFLICT (user_id, task_type, resource_key, dedup_window_end) WHERE {occupies}"
        );
        let (insert_or_nothing, replace) = match backend {
            // MySQL has no conflict target: a plain INSERT, and the duplicate-key error
            // means "exists".
            DbBackend::MySql => (
                insert.clone(),
                "UPDATE task_run SET payload = ?, run_at = ?, priority = ?, updated_at = ? \
                 WHERE user_id = ? AND task_type = ? AND resource_key = ? \
                 AND dedup_window_end = 0 AND occupied = 1 AND status = 'queued'"
                    .to_owned(),
            ),
            _ => (
                format!("{insert} {target} DO NOTHING RETURNING id"),
                format!(
                    "{insert} {target} DO UPDATE SET payload = excluded.payload, \
                     run_at = excluded.run_at, priority = excluded.priority, \
                     updated_at = excluded.updated_at WHERE task_run.status = 'queued' \
                     RETURNING {COLUMNS}"
                ),
            ),
        };
        let held = match backend {
            DbBackend::MySql => "occupied = 1".to_owned(),
            _ => occupies.to_owned(),
        };
        let select_active = format!(
            "SELECT {COLUMNS} FROM task_run WHERE user_id = {} AND task_type = {} \
             AND resource_key = {} AND dedup_window_end = 0 AND {held}",
            p(1),
            p(2),
            p(3)
        );
        let select_after_conflict = match backend {
            DbBackend::MySql => format!("{select_active} LOCK IN SHARE MODE"),
            _ => select_active.clone(),
        };
        // Both arms bind the key once: $2-$4 are the inserted row's key columns.
        let insert_or_select = format!(
            "WITH ins AS ({insert} {target} DO NOTHING RETURNING {COLUMNS}) \
             SELECT {COLUMNS} FROM ins UNION ALL \
             SELECT {COLUMNS} FROM task_run WHERE user_id = $2 AND task_type = $3 \
             AND resource_key = $4 AND dedup_window_end = 0 AND {held} \
             AND NOT EXISTS (SELECT 1 FROM ins) LIMIT 1"
        );
        Sql {
            insert_or_select: insert_or_select.leak(),
            insert: insert.leak(),
            insert_or_nothing: insert_or_nothing.leak(),
            select_active: select_active.leak(),
            select_after_conflict: select_after_conflict.leak(),
            replace: replace.leak(),
        }
    }
}

/// Runs one strategy's calls.
pub struct Runner {
    strategy: Strategy,
    db: DatabaseConnection,
    sql: Sql,
}

/// Expands `$body` once per sqlx pool type, with `$pool` bound to the pool.
macro_rules! on_pool {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db.get_database_backend() {
            DbBackend::Postgres => {
                let $pool = $db.get_postgres_connection_pool();
                $body
            }
            DbBackend::MySql => {
                let $pool = $db.get_mysql_connection_pool();
                $body
            }
            _ => {
                let $pool = $db.get_sqlite_connection_pool();
                $body
            }
        }
    };
}

/// Binds a new task's values, in the order of `Sql::insert`, with `$payload`.
macro_rules! bind_new {
    ($query:expr, $key:expr) => {
        bind_new!($query, $key, None::<&serde_json::Value>)
    };
    ($query:expr, $key:expr, $payload:expr) => {{
        let now = task_run::now();
        $query
            .bind(Uuid::now_v7())
            .bind($key.user_id())
            .bind($key.task_type())
            .bind($key.resource_key())
            .bind($payload)
            .bind(now)
            .bind(now)
            .bind(now)
            .bind(0_i16)
            .bind("active")
            .bind(0_i64)
    }};
}

/// Maps a row of `COLUMNS`. The key columns are `VARBINARY` on MySQL, which sqlx's
/// checked `String` decoding refuses; their bytes are UTF-8, so decode them unchecked
/// (as SeaORM does).
macro_rules! decode {
    ($row:expr) => {{
        let row = $row;
        TaskRow {
            id: row.try_get("id")?,
            user_id: row.try_get_unchecked("user_id")?,
            task_type: row.try_get_unchecked("task_type")?,
            resource_key: row.try_get_unchecked("resource_key")?,
            status: row.try_get("status")?,
            payload: row.try_get("payload")?,
            result: row.try_get("result")?,
            error: row.try_get("error")?,
            attempts: row.try_get("attempts")?,
            lease_owner: row.try_get_unchecked("lease_owner")?,
            lease_expires_at: row.try_get("lease_expires_at")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
            started_at: row.try_get("started_at")?,
            finished_at: row.try_get("finished_at")?,
            run_at: row.try_get("run_at")?,
            priority: row.try_get("priority")?,
            scope: row.try_get("scope")?,
            dedup_window_end: row.try_get("dedup_window_end")?,
        }
    }};
}

/// In transaction `$txn`: reads the active task of `$key`, inserts one when there is
/// none, commits.
macro_rules! read_then_insert {
    ($runner:expr, $txn:expr, $key:expr) => {{
        let row = sqlx::query($runner.sql.select_active)
            .bind($key.user_id())
            .bind($key.task_type())
            .bind($key.resource_key())
            .fetch_optional(&mut *$txn)
            .await?;
        let outcome = match row {
            Some(row) => {
                std::hint::black_box(decode!(row));
                Outcome::Existing
            }
            None => {
                bind_new!(sqlx::query($runner.sql.insert), $key)
                    .execute(&mut *$txn)
                    .await?;
                Outcome::Created
            }
        };
        $txn.commit().await?;
        outcome
    }};
}

/// The typed task of the `typed` strategy: the workloads' key (type `bench`) from its
/// fields, and the fields as its payload.
#[derive(serde::Serialize, serde::Deserialize)]
struct BenchTask {
    user: String,
    resource: String,
}

impl Task for BenchTask {
    const TASK_TYPE: &'static str = "bench";

    fn user_id(&self) -> Option<String> {
        Some(self.user.clone())
    }

    fn resource_key(&self) -> String {
        self.resource.clone()
    }
}

fn counted(
    outcome: Result<task_dedup::Enqueued, task_dedup::DedupError>,
) -> Result<Outcome, String> {
    match outcome {
        Ok(outcome) if outcome.is_created() => Ok(Outcome::Created),
        Ok(_) => Ok(Outcome::Existing),
        Err(e) => Err(e.to_string()),
    }
}

impl Runner {
    pub fn new(strategy: Strategy, db: DatabaseConnection) -> Runner {
        let sql = Sql::new(db.get_database_backend());
        Runner { strategy, db, sql }
    }

    /// One call of the strategy for `key`; `replace`: latest payload wins (the
    /// `replace` workload, with `payload`).
    pub async fn call(&self, key: TaskKey, replace: Option<u64>) -> Result<Outcome, String> {
        let result = match (self.strategy, replace) {
            (Strategy::FindOrEnqueue, replace) => {
                let mut task = NewTask::new(key);
                if let Some(n) = replace {
                    task = task
                        .with_payload(serde_json::json!({ "n": n }))
                        .on_conflict(OnConflict::ReplaceIfQueued);
                }
                let outcome = self.db.find_or_enqueue(task).await;
                return match outcome {
                    Ok(outcome) if outcome.is_created() => Ok(Outcome::Created),
                    Ok(_) => Ok(Outcome::Existing),
                    Err(e) => Err(e.to_string()),
                };
            }
            (Strategy::FindOrEnqueuePayload, None) => {
                let payload = serde_json::json!({
                    "user": key.user_id(),
                    "resource": key.resource_key(),
                });
                let outcome = self
                    .db
                    .find_or_enqueue(NewTask::new(key).with_payload(payload))
                    .await;
                return counted(outcome);
            }
            (Strategy::Typed, None) => {
                let task = BenchTask {
                    user: key.user_id().to_owned(),
                    resource: key.resource_key().to_owned(),
                };
                return counted(self.db.enqueue(&task).await);
            }
            (Strategy::RawDedup, Some(n)) => self.raw_replace(&key, n).await,
            (_, Some(_)) => {
                return Err("the replace workload runs find-or-enqueue and raw-dedup only".into());
            }
            (Strategy::RawInsert, None) => self.raw_insert(&key).await,
            (Strategy::RawDedup, None) => self.raw_dedup(&key).await,
            (Strategy::RawOneStatement, None) => self.raw_one_statement(&key).await,
            (Strategy::Naive, None) => self.naive(&key).await,
            (Strategy::Serializable, None) => self.serializable(&key).await,
            (Strategy::AdvisoryLock, None) => self.advisory_lock(&key).await,
        };
        result.map_err(|e| e.to_string())
    }

    /// One batch of the bulk workloads: how many tasks it created.
    pub async fn call_batch(&self, keys: Vec<TaskKey>) -> Result<usize, String> {
        crate::bulk::call(self.strategy, &self.db, keys).await
    }

    async fn raw_insert(&self, key: &TaskKey) -> Result<Outcome, sqlx::Error> {
        on_pool!(self.db, pool => {
            bind_new!(sqlx::query(self.sql.insert), key).execute(pool).await?;
        });
        Ok(Outcome::Created)
    }

    async fn raw_dedup(&self, key: &TaskKey) -> Result<Outcome, sqlx::Error> {
        let mysql = self.db.get_database_backend() == DbBackend::MySql;
        for attempt in 1..=MAX_ATTEMPTS {
            let result = on_pool!(self.db, pool => {
                let query = bind_new!(sqlx::query(self.sql.insert_or_nothing), key);
                let inserted = if mysql {
                    match query.execute(pool).await {
                        Ok(_) => Ok(true),
                        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(false),
                        Err(e) => Err(e),
                    }
                } else {
                    // fetch_all: a RETURNING write reset after its first row never runs
                    // SQLite's WAL auto-checkpoint (dedup/src/connection.rs).
                    query.fetch_all(pool).await.map(|rows| !rows.is_empty())
                };
                match inserted {
                    Ok(true) => Ok(Some(Outcome::Created)),
                    Ok(false) => sqlx::query(self.sql.select_after_conflict)
                        .bind(key.user_id())
                        .bind(key.task_type())
                        .bind(key.resource_key())
                        .fetch_optional(pool)
                        .await
                        .and_then(|row| match row {
                            Some(row) => Ok(Some({ std::hint::black_box(decode!(row)); Outcome::Existing })),
                            None => Ok(None),
                        }),
                    Err(e) => Err(e),
                }
            });
            match result {
                Ok(Some(outcome)) => return Ok(outcome),
                // The conflicting task finished before it was read: insert again.
                Ok(None) => {}
                Err(e) if is_retryable(&e) => backoff(attempt).await,
                Err(e) => return Err(e),
            }
        }
        Err(sqlx::Error::Protocol("raw-dedup: too many attempts".into()))
    }

    /// PostgreSQL only (`run` refuses the others before any call): a hit in one
    /// statement, and raw-dedup's SELECT when that statement's snapshot predates the
    /// holder.
    async fn raw_one_statement(&self, key: &TaskKey) -> Result<Outcome, sqlx::Error> {
        let pool = self.db.get_postgres_connection_pool();
        for attempt in 1..=MAX_ATTEMPTS {
            let id = Uuid::now_v7();
            let now = task_run::now();
            let row = sqlx::query(self.sql.insert_or_select)
                .bind(id)
                .bind(key.user_id())
                .bind(key.task_type())
                .bind(key.resource_key())
                .bind(None::<&serde_json::Value>)
                .bind(now)
                .bind(now)
                .bind(now)
                .bind(0_i16)
                .bind("active")
                .bind(0_i64)
                .fetch_optional(pool)
                .await;
            let row = match row {
                Ok(Some(row)) => Some(row),
                Ok(None) => {
                    sqlx::query(self.sql.select_after_conflict)
                        .bind(key.user_id())
                        .bind(key.task_type())
                        .bind(key.resource_key())
                        .fetch_optional(pool)
                        .await?
                }
                Err(e) if is_retryable(&e) => {
                    backoff(attempt).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            // None: the holder finished before it was read; insert again.
            if let Some(row) = row {
                let task = decode!(row);
                let outcome = if task.id == id {
                    Outcome::Created
                } else {
                    Outcome::Existing
                };
                std::hint::black_box(task);
                return Ok(outcome);
            }
        }
        Err(sqlx::Error::Protocol(
            "raw-one-statement: too many attempts".into(),
        ))
    }

    /// The hand-written "latest payload wins": PostgreSQL/SQLite one upsert that returns
    /// the inserted or updated row; MySQL the INSERT, then on the duplicate-key error the
    /// UPDATE and a read of the row in one transaction.
    async fn raw_replace(&self, key: &TaskKey, n: u64) -> Result<Outcome, sqlx::Error> {
        let payload = serde_json::json!({ "n": n });
        if self.db.get_database_backend() != DbBackend::MySql {
            return on_pool!(self.db, pool => {
                let row = bind_new!(sqlx::query(self.sql.replace), key, Some(&payload))
                    .fetch_all(pool)
                    .await?
                    .into_iter()
                    .next();
                match row {
                    Some(row) => {
                        std::hint::black_box(decode!(row));
                        Ok(Outcome::Existing)
                    }
                    None => Err(sqlx::Error::Protocol("replace: the key is held by a task that is not queued".into())),
                }
            });
        }
        let pool = self.db.get_mysql_connection_pool();
        for attempt in 1..=MAX_ATTEMPTS {
            match bind_new!(sqlx::query(self.sql.insert), key, Some(&payload))
                .execute(pool)
                .await
            {
                Ok(_) => return Ok(Outcome::Created),
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {}
                Err(e) if is_retryable(&e) => {
                    backoff(attempt).await;
                    continue;
                }
                Err(e) => return Err(e),
            }
            match self.mysql_replace_queued(pool, key, &payload).await {
                Ok(()) => return Ok(Outcome::Existing),
                // InnoDB broke a deadlock between replacers: run the call again.
                Err(e) if is_retryable(&e) => backoff(attempt).await,
                Err(e) => return Err(e),
            }
        }
        Err(sqlx::Error::Protocol("replace: too many attempts".into()))
    }

    /// MySQL, after the duplicate-key error: the UPDATE of the queued row and the read of
    /// it, in one transaction.
    async fn mysql_replace_queued(
        &self,
        pool: &sqlx::MySqlPool,
        key: &TaskKey,
        payload: &serde_json::Value,
    ) -> Result<(), sqlx::Error> {
        let mut txn = pool.begin().await?;
        let now = task_run::now();
        sqlx::query(self.sql.replace)
            .bind(payload)
            .bind(now)
            .bind(0_i16)
            .bind(now)
            .bind(key.user_id())
            .bind(key.task_type())
            .bind(key.resource_key())
            .execute(&mut *txn)
            .await?;
        let row = sqlx::query(self.sql.select_after_conflict)
            .bind(key.user_id())
            .bind(key.task_type())
            .bind(key.resource_key())
            .fetch_one(&mut *txn)
            .await?;
        std::hint::black_box(decode!(row));
        txn.commit().await
    }

    async fn naive(&self, key: &TaskKey) -> Result<Outcome, sqlx::Error> {
        on_pool!(self.db, pool => {
            let row = sqlx::query(self.sql.select_active)
                .bind(key.user_id())
                .bind(key.task_type())
                .bind(key.resource_key())
                .fetch_optional(pool)
                .await?;
            if let Some(row) = row {
                std::hint::black_box(decode!(row));
                return Ok(Outcome::Existing);
            }
            bind_new!(sqlx::query(self.sql.insert), key).execute(pool).await?;
        });
        Ok(Outcome::Created)
    }

    async fn serializable(&self, key: &TaskKey) -> Result<Outcome, sqlx::Error> {
        let backend = self.db.get_database_backend();
        let begin = match backend {
            DbBackend::Postgres => "BEGIN ISOLATION LEVEL SERIALIZABLE",
            DbBackend::MySql => "BEGIN",
            // SQLite transactions are serializable; IMMEDIATE takes the write lock up
            // front so the read-then-write cannot fail with SQLITE_BUSY.
            _ => "BEGIN IMMEDIATE",
        };
        for attempt in 1..=MAX_ATTEMPTS {
            let result = on_pool!(self.db, pool => async {
                let mut conn = pool.acquire().await?;
                if backend == DbBackend::MySql {
                    // SESSION, not the next transaction only: that form fails (1568) on a
                    // connection still inside a transaction, which is what a call the
                    // warm-up deadline abandoned mid-BEGIN hands back to the pool. (BEGIN
                    // commits such a leftover, which a benchmark can live with.)
                    sqlx::raw_sql("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                        .execute(&mut *conn)
                        .await?;
                }
                // A sqlx transaction rolls back when dropped (an error, or the deadline).
                let mut txn = sqlx::Connection::begin_with(&mut *conn, begin).await?;
                Ok::<_, sqlx::Error>(read_then_insert!(self, txn, key))
            }
            .await);
            match result {
                Ok(outcome) => return Ok(outcome),
                Err(e) if is_retryable(&e) => backoff(attempt).await,
                Err(e) => return Err(e),
            }
        }
        Err(sqlx::Error::Protocol(
            "serializable: too many attempts".into(),
        ))
    }

    /// PostgreSQL only (`run` refuses the others before any call).
    async fn advisory_lock(&self, key: &TaskKey) -> Result<Outcome, sqlx::Error> {
        let pool = self.db.get_postgres_connection_pool();
        let mut txn = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(key_hash(key))
            .execute(&mut *txn)
            .await?;
        Ok(read_then_insert!(self, txn, key))
    }
}

/// A 64-bit lock id for the key (one process computes them all, so any fixed hash does).
fn key_hash(key: &TaskKey) -> i64 {
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    hasher.finish() as i64
}

/// Deadlocks and serialization failures: PostgreSQL 40001/40P01, InnoDB 1213 (40001).
/// The codes of `task_dedup::is_transaction_conflict`, which takes a SeaORM `DbErr`;
/// these strategies see sqlx's errors.
pub(crate) fn is_retryable(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e) if matches!(e.code().as_deref(), Some("40001" | "40P01")))
}

/// A random pause that grows with the attempt (up to 5 ms), so that the transactions a
/// deadlock aborted together do not meet again.
pub(crate) async fn backoff(attempt: u32) {
    let ceiling = 100 * u64::from(attempt.min(50));
    let micros = std::collections::hash_map::RandomState::new().hash_one(attempt) % ceiling;
    tokio::time::sleep(Duration::from_micros(micros)).await;
}
