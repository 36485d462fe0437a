//! The strategies: task-dedup, and the hand-written SQL it is measured against, run
//! through sqlx on the very pool task-dedup uses.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use sea_orm::sqlx::{self, Row};
use sea_orm::{DatabaseConnection, DbBackend};
use task_dedup::{NewTask, TaskDedup, TaskKey, task_run};
use uuid::Uuid;

use crate::args::Strategy;

/// What a call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Existing,
}

/// How many times a retrying strategy tries before the call counts as an error.
const MAX_ATTEMPTS: u32 = 50;

const COLUMNS: &str = "id, user_id, task_type, resource_key, status, payload, result, error, \
                       attempts, lease_owner, lease_expires_at, created_at, updated_at, \
                       started_at, finished_at";

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
}

/// The SQL of one dialect. Built once per process and leaked into `&'static str`, which
/// is what hand-written code passes to sqlx (a string literal).
struct Sql {
    insert: &'static str,
    insert_or_nothing: &'static str,
    select_active: &'static str,
}

impl Sql {
    fn new(backend: DbBackend) -> Sql {
        let p = |n: usize| match backend {
            DbBackend::Postgres => format!("${n}"),
            _ => "?".to_owned(),
        };
        let params: Vec<String> = (1..=9).map(p).collect();
        let insert = format!(
            "INSERT INTO task_run (id, user_id, task_type, resource_key, status, payload, \
             attempts, created_at, updated_at) VALUES ({})",
            params.join(", ")
        );
        let active = task_dedup::active_status_sql();
        let insert_or_nothing = match backend {
            // MySQL has no conflict target: a plain INSERT, and the duplicate-key error
            // means "exists".
            DbBackend::MySql => insert.clone(),
            _ => format!(
                "{insert} ON CONFLICT (user_id, task_type, resource_key) WHERE {active} \
                 DO NOTHING RETURNING id"
            ),
        };
        let select_active = format!(
            "SELECT {COLUMNS} FROM task_run WHERE user_id = {} AND task_type = {} \
             AND resource_key = {} AND {active}",
            p(1),
            p(2),
            p(3)
        );
        Sql {
            insert: insert.leak(),
            insert_or_nothing: insert_or_nothing.leak(),
            select_active: select_active.leak(),
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

/// Binds a new task's values, in the order of `Sql::insert`.
macro_rules! bind_new {
    ($query:expr, $key:expr) => {{
        let now = task_run::now();
        $query
            .bind(Uuid::now_v7())
            .bind($key.user_id())
            .bind($key.task_type())
            .bind($key.resource_key())
            .bind("queued")
            .bind(None::<sqlx::types::Json<serde_json::Value>>)
            .bind(0_i32)
            .bind(now)
            .bind(now)
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
        }
    }};
}

impl Runner {
    pub fn new(strategy: Strategy, db: DatabaseConnection) -> Runner {
        let sql = Sql::new(db.get_database_backend());
        Runner { strategy, db, sql }
    }

    /// One call of the strategy for `key`.
    pub async fn call(&self, key: &TaskKey) -> Result<Outcome, String> {
        let result = match self.strategy {
            Strategy::FindOrEnqueue => {
                return self
                    .db
                    .find_or_enqueue(NewTask::new(key.clone()))
                    .await
                    .map(|outcome| match outcome.is_created() {
                        true => Outcome::Created,
                        false => Outcome::Existing,
                    })
                    .map_err(|e| e.to_string());
            }
            Strategy::RawInsert => self.raw_insert(key).await,
            Strategy::RawDedup => self.raw_dedup(key).await,
            Strategy::Naive => self.naive(key).await,
            Strategy::Serializable => self.serializable(key).await,
            Strategy::AdvisoryLock => self.advisory_lock(key).await,
        };
        result.map_err(|e| e.to_string())
    }

    async fn raw_insert(&self, key: &TaskKey) -> Result<Outcome, sqlx::Error> {
        on_pool!(self.db, pool => {
            bind_new!(sqlx::query(self.sql.insert), key).execute(pool).await?;
        });
        Ok(Outcome::Created)
    }

    async fn raw_dedup(&self, key: &TaskKey) -> Result<Outcome, sqlx::Error> {
        for attempt in 1..=MAX_ATTEMPTS {
            let inserted = on_pool!(self.db, pool => {
                let query = bind_new!(sqlx::query(self.sql.insert_or_nothing), key);
                if self.db.get_database_backend() == DbBackend::MySql {
                    match query.execute(pool).await {
                        Ok(_) => Ok(true),
                        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(false),
                        Err(e) => Err(e),
                    }
                } else {
                    query.fetch_optional(pool).await.map(|row| row.is_some())
                }
            });
            match inserted {
                Ok(true) => return Ok(Outcome::Created),
                Ok(false) => {
                    let found = on_pool!(self.db, pool => {
                        let row = sqlx::query(self.sql.select_active)
                            .bind(key.user_id())
                            .bind(key.task_type())
                            .bind(key.resource_key())
                            .fetch_optional(pool)
                            .await?;
                        match row {
                            Some(row) => Some(decode!(row)),
                            None => None,
                        }
                    });
                    if found.is_some() {
                        return Ok(Outcome::Existing);
                    }
                }
                Err(e) if is_retryable(&e) => backoff(attempt).await,
                Err(e) => return Err(e),
            }
        }
        Err(sqlx::Error::Protocol("raw-dedup: too many attempts".into()))
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
                decode!(row);
                return Ok(Outcome::Existing);
            }
            bind_new!(sqlx::query(self.sql.insert), key).execute(pool).await?;
        });
        Ok(Outcome::Created)
    }

    async fn serializable(&self, key: &TaskKey) -> Result<Outcome, sqlx::Error> {
        for attempt in 1..=MAX_ATTEMPTS {
            let result = on_pool!(self.db, pool => {
                let mut conn = pool.acquire().await?;
                let begin = match self.db.get_database_backend() {
                    DbBackend::Postgres => "BEGIN ISOLATION LEVEL SERIALIZABLE",
                    // Applies to the next transaction of this connection only.
                    DbBackend::MySql => "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
                    // SQLite transactions are serializable; IMMEDIATE takes the write
                    // lock up front so the read-then-write cannot fail with SQLITE_BUSY.
                    _ => "BEGIN IMMEDIATE",
                };
                sqlx::raw_sql(begin).execute(&mut *conn).await?;
                if self.db.get_database_backend() == DbBackend::MySql {
                    sqlx::raw_sql("START TRANSACTION").execute(&mut *conn).await?;
                }
                let attempt_result = async {
                    let row = sqlx::query(self.sql.select_active)
                        .bind(key.user_id())
                        .bind(key.task_type())
                        .bind(key.resource_key())
                        .fetch_optional(&mut *conn)
                        .await?;
                    let outcome = match row {
                        Some(row) => {
                            decode!(row);
                            Outcome::Existing
                        }
                        None => {
                            bind_new!(sqlx::query(self.sql.insert), key).execute(&mut *conn).await?;
                            Outcome::Created
                        }
                    };
                    sqlx::raw_sql("COMMIT").execute(&mut *conn).await?;
                    Ok::<_, sqlx::Error>(outcome)
                }
                .await;
                if attempt_result.is_err() {
                    let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
                }
                attempt_result
            });
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

    async fn advisory_lock(&self, key: &TaskKey) -> Result<Outcome, sqlx::Error> {
        if self.db.get_database_backend() != DbBackend::Postgres {
            return Err(sqlx::Error::Protocol(
                "advisory-lock needs PostgreSQL".into(),
            ));
        }
        let pool = self.db.get_postgres_connection_pool();
        let mut txn = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(key_hash(key))
            .execute(&mut *txn)
            .await?;
        let row = sqlx::query(self.sql.select_active)
            .bind(key.user_id())
            .bind(key.task_type())
            .bind(key.resource_key())
            .fetch_optional(&mut *txn)
            .await?;
        let outcome = match row {
            Some(row) => {
                decode!(row);
                Outcome::Existing
            }
            None => {
                bind_new!(sqlx::query(self.sql.insert), key)
                    .execute(&mut *txn)
                    .await?;
                Outcome::Created
            }
        };
        txn.commit().await?;
        Ok(outcome)
    }
}

/// A 64-bit lock id for the key (one process computes them all, so any fixed hash does).
fn key_hash(key: &TaskKey) -> i64 {
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    hasher.finish() as i64
}

/// Deadlocks and serialization failures: PostgreSQL 40001/40P01, InnoDB 1213 (40001).
fn is_retryable(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e) if matches!(e.code().as_deref(), Some("40001" | "40P01")))
}

async fn backoff(attempt: u32) {
    let micros = 100 * u64::from(attempt.min(20));
    tokio::time::sleep(Duration::from_micros(micros)).await;
}
