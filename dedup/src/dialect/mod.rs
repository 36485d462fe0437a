//! The dialect seam. Each dialect's file holds its statements as whole SQL texts, in the
//! same order ([`Statements`]), with the error codes it classifies; the flows that run
//! them live here, once. The only fragments spliced into the statements are the column
//! list ([`columns!`]) and the predicate "holds its key"
//! ([`occupies_key_sql!`](task_dedup_entity::occupies_key_sql)).

use std::borrow::Cow;

use sea_orm::{
    ConnectionTrait, DbBackend, DbErr, FromQueryResult, QueryResult, Statement, TransactionSession,
    TransactionTrait, Value,
};
use uuid::Uuid;

use crate::connection::{self, DedupConnection};
use crate::key::TaskKey;
use crate::task_run;

/// Every column of `task_run` the entity maps, in table order: what lookups select and
/// writes return. (The MySQL/MariaDB generated column stays out.)
macro_rules! columns {
    () => {
        "id, user_id, task_type, resource_key, status, payload, result, error, attempts, \
         lease_owner, lease_expires_at, created_at, updated_at, started_at, finished_at, \
         run_at, priority, scope, dedup_window_end"
    };
}

/// The columns a new task is inserted with: `status` and `attempts` are literals
/// (`'queued'`, `0`) in the statements, the others are bound in this order by
/// `connection::insert_binds`.
macro_rules! insert_columns {
    () => {
        "id, user_id, task_type, resource_key, status, payload, attempts, created_at, \
         updated_at, run_at, priority, scope, dedup_window_end"
    };
}

/// `count` groups of `group`, separated by commas: the rows of a multi-row statement.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
fn repeat(group: &str, count: usize) -> String {
    let mut rows = String::with_capacity((group.len() + 2) * count);
    for n in 0..count {
        if n > 0 {
            rows.push_str(", ");
        }
        rows.push_str(group);
    }
    rows
}

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

/// Every statement of one dialect. Parameters are listed in each field's doc, in the
/// order they appear in the text (MySQL's `?` are positional): a SET's before a WHERE's.
pub(crate) struct Statements {
    /// Inserts a new task unless its key is held (11 row parameters, see
    /// `connection::insert_values`). PostgreSQL/SQLite: `DO NOTHING RETURNING id`, a row
    /// when inserted; MySQL: a plain INSERT whose duplicate-key error on the unique index
    /// means "held".
    pub insert: &'static str,
    /// [`OnConflict::ReplaceIfQueued`](crate::OnConflict::ReplaceIfQueued).
    /// PostgreSQL/SQLite: the INSERT with `DO UPDATE ... WHERE status = 'queued'
    /// RETURNING` (row parameters). MySQL: the UPDATE run after a duplicate-key error
    /// (payload, run_at, priority, updated_at, then the key and window).
    pub replace: &'static str,
    /// The task holding a key: user_id, task_type, resource_key, dedup_window_end.
    pub find_occupant: &'static str,
    /// The same, right after a conflict: it must see the row that caused it even from a
    /// REPEATABLE READ snapshot that predates it (MySQL: a locking read).
    pub find_occupant_after_conflict: &'static str,
    /// One task by id: id.
    pub by_id: &'static str,
    /// Claims the next due queued tasks of any type: worker_id, lease, how many. MySQL:
    /// selects and locks their ids only (how many), then [`Statements::claim_update`]
    /// and [`Statements::claimed`].
    pub claim_any: &'static str,
    /// The same for some task types: worker_id, lease, task types, how many. PostgreSQL
    /// binds an array, SQLite and MySQL a JSON array (MySQL: the types and how many).
    pub claim_types: &'static str,
    /// MySQL: marks the selected tasks claimed, `(?, ...)` of their ids appended:
    /// worker_id, lease, the ids. Unused elsewhere.
    pub claim_update: &'static str,
    /// MySQL: the claimed tasks, `(?, ...)` of their ids appended. Unused elsewhere.
    pub claimed: &'static str,
    /// Extends the lease: lease, id, worker_id.
    pub heartbeat: &'static str,
    /// running → succeeded: result, id, worker_id.
    pub complete: &'static str,
    /// running → failed: error, id, worker_id.
    pub fail: &'static str,
    /// running → queued after a backoff, the key still held: error, delay, id,
    /// worker_id.
    pub retry: &'static str,
    /// queued or running → cancelled: reason, id.
    pub cancel: &'static str,
    /// running → queued, lease cleared, the attempt not counted (a worker shutting down
    /// hands the task back): id, worker_id.
    pub release: &'static str,
    /// Running tasks whose lease expired, at most 100: no parameters. Selects `id` and
    /// `attempts`.
    pub expired: &'static str,
    /// An expired task → failed, unless its lease was renewed meanwhile: error, id.
    pub reap_fail: &'static str,
    /// An expired task → queued after a backoff, lease cleared, unless its lease was
    /// renewed meanwhile: delay, id.
    pub reap_requeue: &'static str,
    /// Deletes finished tasks older than a duration whose period window (if any) is
    /// over: minus the age (an offset from now, like the others).
    pub prune: &'static str,
}

/// The statements of `find_or_enqueue_many`, for a chunk of `rows` tasks. PostgreSQL
/// binds one array per column, whatever the number of rows (its texts are constants);
/// SQLite and MySQL/MariaDB bind one value per row and column (their texts repeat the
/// row's placeholders).
pub(crate) struct Bulk {
    /// Rows per chunk: within SQLite's 32,766 and MySQL's 65,535 placeholders, and a
    /// statement size every server takes.
    pub chunk: usize,
    /// Inserts the rows, skipping those whose key is held. PostgreSQL/SQLite return the
    /// ids that went in; MySQL's `ON DUPLICATE KEY UPDATE id = id` changes nothing on a
    /// conflict (not `INSERT IGNORE`, which would also silence other errors).
    pub insert: fn(usize) -> Cow<'static, str>,
    /// The same, replacing the payload, run_at and priority of a queued task holding the
    /// key (`ReplaceIfQueued`). PostgreSQL/SQLite return the rows inserted or updated.
    pub replace: fn(usize) -> Cow<'static, str>,
    /// The tasks holding the given keys and windows, in the caller's transaction (MySQL:
    /// a locking read, which sees rows committed after the caller's snapshot).
    pub find_occupants: fn(usize) -> Cow<'static, str>,
    /// The same, in a transaction of the crate's own whose first read comes after its
    /// insert: the snapshot already holds every row the insert conflicted with, and
    /// the insert's locks keep them as they are. MySQL: a plain read, because a locking
    /// read of a thousand keys waits on rows other batches are inserting, and they on
    /// its locks (a deadlock in one storm out of five of 16 overlapping batches).
    pub find_occupants_after_own_insert: fn(usize) -> Cow<'static, str>,
    /// The tasks of the given ids.
    pub by_ids: fn(usize) -> Cow<'static, str>,
    /// Which of the given ids exist (MySQL: which rows the insert put in).
    pub ids_in: fn(usize) -> Cow<'static, str>,
}

/// One of the dialects this crate was built with (features `postgres`, `sqlite`,
/// `mysql`), read from the connection at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    #[cfg(feature = "postgres")]
    Postgres,
    #[cfg(feature = "sqlite")]
    Sqlite,
    #[cfg(feature = "mysql")]
    MySql,
}

/// What an insert of a new task did.
pub(crate) enum Inserted {
    /// The row went in.
    Created,
    /// The key is held by another task (not read yet).
    Held,
    /// [`OnConflict::ReplaceIfQueued`](crate::OnConflict::ReplaceIfQueued): the queued
    /// task holding the key took this request's payload, run_at and priority.
    Replaced(Box<task_run::Model>),
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

    pub(crate) fn backend(self) -> DbBackend {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => DbBackend::Postgres,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => DbBackend::Sqlite,
            #[cfg(feature = "mysql")]
            Dialect::MySql => DbBackend::MySql,
        }
    }

    pub(crate) fn bulk(self) -> &'static Bulk {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => &postgres::BULK,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => &sqlite::BULK,
            #[cfg(feature = "mysql")]
            Dialect::MySql => &mysql::BULK,
        }
    }

    /// Whether the bulk statements bind one array per column (PostgreSQL).
    pub(crate) fn binds_arrays(self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    fn statements(self) -> &'static Statements {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => &postgres::STATEMENTS,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => &sqlite::STATEMENTS,
            #[cfg(feature = "mysql")]
            Dialect::MySql => &mysql::STATEMENTS,
        }
    }

    /// Whether `UPDATE ... RETURNING` exists. MySQL has none (MariaDB's is not in MySQL
    /// 8): there a write and the read of its row run in one short transaction.
    pub(crate) fn supports_returning(self) -> bool {
        match self {
            #[cfg(feature = "mysql")]
            Dialect::MySql => false,
            #[allow(unreachable_patterns)]
            _ => true,
        }
    }

    /// A duration as the statements take it: microseconds, or on SQLite a date-function
    /// modifier such as `+30.000000 seconds`.
    fn interval(self, micros: i64) -> Value {
        match self {
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => sqlite::seconds_modifier(micros).into(),
            #[allow(unreachable_patterns)]
            _ => micros.into(),
        }
    }

    /// Whether `err` is a violation of the unique index `task_active_resource_uidx` (not
    /// of another constraint).
    pub(crate) fn is_held_key_violation(self, err: &DbErr) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => postgres::is_held_key_violation(err),
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => sqlite::is_held_key_violation(err),
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::is_held_key_violation(err),
        }
    }

    pub(crate) fn statement(self, sql: &str, values: Vec<Value>) -> Statement {
        Statement::from_sql_and_values(self.backend(), sql, values)
    }

    /// Inserts `row` unless its key is held; with `replace`, replaces the payload,
    /// run_at and priority of a queued task that holds it. Never infers "created" from a
    /// count a no-op could also produce.
    pub(crate) async fn insert<C: DedupConnection + ?Sized>(
        self,
        db: &C,
        row: &task_run::Model,
        replace: bool,
    ) -> Result<Inserted, DbErr> {
        let statements = self.statements();
        if !self.supports_returning() {
            // MySQL: a plain INSERT; the duplicate-key error on our index means "held".
            let insert = connection::insert_row(db, self.backend(), statements.insert, row, false);
            return match insert.await {
                Ok(_) => Ok(Inserted::Created),
                Err(err) if self.is_held_key_violation(&err) && replace => {
                    self.replace_queued(db, row).await
                }
                Err(err) if self.is_held_key_violation(&err) => Ok(Inserted::Held),
                Err(err) => Err(err),
            };
        }
        if !replace {
            // RETURNING rather than the affected-row count: the same answer, and on
            // SQLite a lower median latency under contention (BENCHMARKS.md).
            let inserted =
                connection::insert_row(db, self.backend(), statements.insert, row, true).await?;
            return Ok(if inserted {
                Inserted::Created
            } else {
                Inserted::Held
            });
        }
        // The upsert returns the row it inserted (our id) or the queued row it updated
        // (another id); nothing when the task holding the key is not queued.
        match connection::upsert_row(db, self.backend(), statements.replace, row).await? {
            Some(stored) if stored.id == row.id => Ok(Inserted::Created),
            Some(stored) => Ok(Inserted::Replaced(Box::new(stored))),
            None => Ok(Inserted::Held),
        }
    }

    /// MySQL/MariaDB after a duplicate-key error, with `ReplaceIfQueued`: the UPDATE and
    /// the read of its row in one transaction, so the row returned is the one written.
    async fn replace_queued<C: DedupConnection + ?Sized>(
        self,
        db: &C,
        row: &task_run::Model,
    ) -> Result<Inserted, DbErr> {
        let statements = self.statements();
        let txn = db.begin().await?;
        let update = self.statement(
            statements.replace,
            vec![
                row.payload.clone().into(),
                row.run_at.into(),
                row.priority.into(),
                row.updated_at.into(),
                row.user_id.clone().into(),
                row.task_type.clone().into(),
                row.resource_key.clone().into(),
                row.dedup_window_end.into(),
            ],
        );
        let replaced = txn.execute_raw(update).await?.rows_affected() == 1;
        let stored = if replaced {
            let key = (&row.user_id, &row.task_type, &row.resource_key);
            let select = self.statement(
                statements.find_occupant_after_conflict,
                vec![
                    key.0.clone().into(),
                    key.1.clone().into(),
                    key.2.clone().into(),
                    row.dedup_window_end.into(),
                ],
            );
            txn.query_one_raw(select).await?
        } else {
            None
        };
        txn.commit().await?;
        match stored {
            Some(stored) => Ok(Inserted::Replaced(Box::new(model(&stored)?))),
            None => Ok(Inserted::Held),
        }
    }

    /// The task holding `key` in window `window_end` (0: the Active/Queued slot).
    pub(crate) async fn find_occupant<C: DedupConnection + ?Sized>(
        self,
        db: &C,
        key: &TaskKey,
        window_end: i64,
        after_conflict: bool,
    ) -> Result<Option<task_run::Model>, DbErr> {
        let statements = self.statements();
        let sql = if after_conflict {
            statements.find_occupant_after_conflict
        } else {
            statements.find_occupant
        };
        connection::select_occupant(db, self.backend(), sql, key, window_end).await
    }

    /// One task by id.
    pub(crate) async fn by_id<C: ConnectionTrait + ?Sized>(
        self,
        db: &C,
        id: Uuid,
    ) -> Result<Option<task_run::Model>, DbErr> {
        let row = db
            .query_one_raw(self.statement(self.statements().by_id, vec![id.into()]))
            .await?;
        row.map(|row| model(&row)).transpose()
    }

    /// Moves up to `max` due queued tasks (of `task_types`, or of any type when empty)
    /// to `running` under `worker_id`'s lease, atomically, in claim order: highest
    /// priority first, then the oldest `run_at`, then the oldest task.
    pub(crate) async fn claim<C: ConnectionTrait + TransactionTrait + ?Sized>(
        self,
        db: &C,
        worker_id: &str,
        task_types: &[&str],
        lease_micros: i64,
        max: i64,
    ) -> Result<Vec<task_run::Model>, DbErr> {
        let statements = self.statements();
        let lease = self.interval(lease_micros);
        let types = (!task_types.is_empty()).then(|| self.task_types(task_types));
        let rows = if self.supports_returning() {
            let mut values = vec![worker_id.into(), lease];
            let sql = match types {
                Some(types) => {
                    values.push(types);
                    statements.claim_types
                }
                None => statements.claim_any,
            };
            values.push(max.into());
            // `query_all`: see `connection::returned_row`.
            db.query_all_raw(self.statement(sql, values)).await?
        } else {
            // MySQL: lock the next rows (skipping rows other claimers hold), update
            // them, read them back, in one short transaction.
            let txn = db.begin().await?;
            let select = match types {
                Some(types) => self.statement(statements.claim_types, vec![types, max.into()]),
                None => self.statement(statements.claim_any, vec![max.into()]),
            };
            let mut ids = Vec::new();
            for row in txn.query_all_raw(select).await? {
                ids.push(Value::from(row.try_get::<Uuid>("", "id")?));
            }
            if ids.is_empty() {
                txn.commit().await?;
                return Ok(Vec::new());
            }
            let placeholders = format!("({})", vec!["?"; ids.len()].join(", "));
            let mut update = vec![worker_id.into(), lease];
            update.extend(ids.iter().cloned());
            let sql = format!("{}{placeholders}", statements.claim_update);
            txn.execute_raw(self.statement(&sql, update)).await?;
            let sql = format!("{}{placeholders}", statements.claimed);
            let claimed = txn.query_all_raw(self.statement(&sql, ids)).await?;
            txn.commit().await?;
            claimed
        };
        let mut tasks = rows.iter().map(model).collect::<Result<Vec<_>, _>>()?;
        // RETURNING and IN keep no order.
        tasks.sort_by_key(|t| (std::cmp::Reverse(t.priority), t.run_at, t.created_at, t.id));
        Ok(tasks)
    }

    /// The task types a claim asks for, as its statement binds them.
    fn task_types(self, task_types: &[&str]) -> Value {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => task_types
                .iter()
                .map(|t| (*t).to_owned())
                .collect::<Vec<String>>()
                .into(),
            #[allow(unreachable_patterns)]
            _ => serde_json::Value::from(task_types.to_vec())
                .to_string()
                .into(),
        }
    }

    /// Runs one of the compare-and-set transitions of task `id` (`transition` picks its
    /// statement, `values` are its parameters) and returns the row as it is afterwards,
    /// or `None` when its guard did not match and nothing changed.
    pub(crate) async fn transition<C: ConnectionTrait + TransactionTrait + ?Sized>(
        self,
        db: &C,
        transition: fn(&Statements) -> &'static str,
        values: Vec<Value>,
        id: Uuid,
    ) -> Result<Option<task_run::Model>, DbErr> {
        let statements = self.statements();
        let sql = transition(statements);
        if self.supports_returning() {
            let row = connection::returned_row(db, self.statement(sql, values)).await?;
            return row.map(|row| model(&row)).transpose();
        }
        // The UPDATE's row lock is held until commit, so the read sees exactly what the
        // UPDATE wrote.
        let txn = db.begin().await?;
        let updated = txn.execute_raw(self.statement(sql, values)).await?;
        let row = if updated.rows_affected() == 1 {
            txn.query_one_raw(self.statement(statements.by_id, vec![id.into()]))
                .await?
        } else {
            None
        };
        txn.commit().await?;
        row.map(|row| model(&row)).transpose()
    }

    /// Runs the transition `transition` selects without reading the task back (its
    /// statement up to `RETURNING`): whether it took effect.
    #[cfg_attr(not(feature = "worker"), allow(dead_code))]
    pub(crate) async fn transition_quietly<C: ConnectionTrait + ?Sized>(
        self,
        db: &C,
        transition: fn(&Statements) -> &'static str,
        values: Vec<Value>,
    ) -> Result<bool, DbErr> {
        let sql = transition(self.statements());
        let sql = sql.split(" RETURNING ").next().unwrap_or(sql);
        Ok(db
            .execute_raw(self.statement(sql, values))
            .await?
            .rows_affected()
            == 1)
    }

    /// A duration parameter of a transition (lease, delay, age).
    pub(crate) fn duration(self, micros: i64) -> Value {
        self.interval(micros)
    }

    /// Running tasks whose lease expired: (id, attempts), at most 100.
    pub(crate) async fn expired<C: ConnectionTrait + ?Sized>(
        self,
        db: &C,
    ) -> Result<Vec<(Uuid, i32)>, DbErr> {
        let rows = db
            .query_all_raw(self.statement(self.statements().expired, vec![]))
            .await?;
        rows.iter()
            .map(|row| Ok((row.try_get("", "id")?, row.try_get("", "attempts")?)))
            .collect()
    }

    /// An expired task's reap (a `reap_fail` or `reap_requeue`): whether it applied.
    pub(crate) async fn reap<C: ConnectionTrait + ?Sized>(
        self,
        db: &C,
        reap: fn(&Statements) -> &'static str,
        values: Vec<Value>,
    ) -> Result<bool, DbErr> {
        let sql = reap(self.statements());
        Ok(db
            .execute_raw(self.statement(sql, values))
            .await?
            .rows_affected()
            == 1)
    }

    /// Deletes finished tasks older than `age_micros`; returns how many.
    pub(crate) async fn prune<C: ConnectionTrait + ?Sized>(
        self,
        db: &C,
        age_micros: i64,
    ) -> Result<u64, DbErr> {
        let offset = self.interval(age_micros.saturating_neg());
        let prune = self.statement(self.statements().prune, vec![offset]);
        Ok(db.execute_raw(prune).await?.rows_affected())
    }
}

/// Maps a row of [`columns!`] to the model.
pub(crate) fn model(row: &QueryResult) -> Result<task_run::Model, DbErr> {
    task_run::Model::from_query_result(row, "")
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

/// Whether `err` means the connection was lost or could not be had, so that the same
/// statement may succeed on a fresh connection: an I/O error (reset, broken pipe, end of
/// stream, connection refused while a server restarts), a TLS failure mid-session, a
/// crashed SQLite worker, or a server saying so (PostgreSQL SQLSTATE class 08, 57P01
/// admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now; MySQL/MariaDB 2006
/// server gone, 2013 lost connection, 1927 connection killed, 1053 server shutdown, 4031
/// disconnected for inactivity). Pool timeouts and a closed pool are not: waiting again
/// would not help.
///
/// Use it on your own statements; task-dedup's own errors say it with
/// [`DedupError::ConnectionLost`](crate::DedupError::ConnectionLost).
pub fn is_connection_lost(err: &DbErr) -> bool {
    #[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
    {
        use sea_orm::RuntimeErr;
        use sea_orm::sqlx::Error;
        let (DbErr::Exec(RuntimeErr::SqlxError(e))
        | DbErr::Query(RuntimeErr::SqlxError(e))
        | DbErr::Conn(RuntimeErr::SqlxError(e))) = err
        else {
            return false;
        };
        match e.as_ref() {
            Error::Io(_) | Error::Tls(_) | Error::WorkerCrashed => return true,
            Error::Database(_) => {}
            _ => return false,
        }
    }
    #[cfg(feature = "postgres")]
    if postgres::is_connection_lost(err) {
        return true;
    }
    #[cfg(feature = "mysql")]
    if mysql::is_connection_lost(err) {
        return true;
    }
    let _ = err;
    false
}

/// Whether the database gave up waiting: PostgreSQL 57014 (statement timeout, or a
/// cancel) and 55P03 (lock timeout), MySQL/MariaDB 1205 (lock wait timeout), 1969 and 3024
/// (statement time limits), SQLite's busy timeout (SQLITE_BUSY).
pub(crate) fn is_timeout(err: &DbErr) -> bool {
    #[cfg(feature = "postgres")]
    if postgres::is_timeout(err) {
        return true;
    }
    #[cfg(feature = "mysql")]
    if mysql::is_timeout(err) {
        return true;
    }
    #[cfg(feature = "sqlite")]
    if sqlite::is_timeout(err) {
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

#[cfg(test)]
mod tests {
    use sea_orm::Iterable;

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

    /// Every statement of `statements`, one after the other, under its name.
    fn render(statements: &Statements) -> String {
        let all = [
            ("insert", statements.insert),
            ("replace", statements.replace),
            ("find_occupant", statements.find_occupant),
            (
                "find_occupant_after_conflict",
                statements.find_occupant_after_conflict,
            ),
            ("by_id", statements.by_id),
            ("claim_any", statements.claim_any),
            ("claim_types", statements.claim_types),
            ("claim_update", statements.claim_update),
            ("claimed", statements.claimed),
            ("heartbeat", statements.heartbeat),
            ("complete", statements.complete),
            ("fail", statements.fail),
            ("retry", statements.retry),
            ("cancel", statements.cancel),
            ("release", statements.release),
            ("expired", statements.expired),
            ("reap_fail", statements.reap_fail),
            ("reap_requeue", statements.reap_requeue),
            ("prune", statements.prune),
        ];
        all.iter()
            .filter(|(_, sql)| !sql.is_empty())
            .map(|(name, sql)| format!("{name}:\n{sql}\n"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    // Each dialect's statements, pinned as whole texts in `snapshots/`: a change to any
    // of them shows up in review as a diff of the SQL itself.
    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_statements_are_pinned() {
        insta::assert_snapshot!(render(&postgres::STATEMENTS));
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_statements_are_pinned() {
        insta::assert_snapshot!(render(&sqlite::STATEMENTS));
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_statements_are_pinned() {
        insta::assert_snapshot!(render(&mysql::STATEMENTS));
    }

    /// Each dialect's bulk statements, for two rows, pinned like the others.
    fn render_bulk(bulk: &Bulk) -> String {
        format!(
            "chunk: {}\n\ninsert:\n{}\n\nreplace:\n{}\n\nfind_occupants:\n{}\n\n\
             find_occupants_after_own_insert:\n{}\n\nby_ids:\n{}\n\nids_in:\n{}\n",
            bulk.chunk,
            (bulk.insert)(2),
            (bulk.replace)(2),
            (bulk.find_occupants)(2),
            (bulk.find_occupants_after_own_insert)(2),
            (bulk.by_ids)(2),
            (bulk.ids_in)(2)
        )
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_bulk_statements_are_pinned() {
        insta::assert_snapshot!(render_bulk(&postgres::BULK));
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_bulk_statements_are_pinned() {
        insta::assert_snapshot!(render_bulk(&sqlite::BULK));
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_bulk_statements_are_pinned() {
        insta::assert_snapshot!(render_bulk(&mysql::BULK));
    }

    #[test]
    fn column_list_is_the_entitys() {
        let entity: Vec<&str> = task_run::Column::iter()
            .map(|c| sea_orm::IdenStatic::as_str(&c))
            .collect();
        assert_eq!(columns!(), entity.join(", "));
    }
}
