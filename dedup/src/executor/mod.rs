//! The executor: every statement task-dedup runs goes through [`Executor`]. It reads the
//! connection's dialect once, picks the dialect's whole statement for an operation,
//! binds its parameters ([`args`]), runs it where the connection says ([`conn`]), and
//! maps the rows. A failure is classified once, where it arises ([`Failure`]).
//!
//! PostgreSQL and SQLite write and read a row in one statement (`RETURNING`); the flows
//! MySQL/MariaDB need instead (a write and the read of its row in one short transaction)
//! live in [`mysql`].

mod admin;
pub(crate) mod args;
mod conn;
#[cfg(feature = "mysql")]
mod galera;
pub(crate) mod limits;
#[cfg(feature = "postgres")]
mod literal;
#[cfg(feature = "mysql")]
mod mysql;
pub(crate) mod notify;
pub(crate) mod pooler;
mod row;

use std::borrow::Cow;
use std::collections::HashSet;

use sea_orm::{DbBackend, QueryResult};
use uuid::Uuid;

pub(crate) use self::admin::ListArgs;
use self::args::Arg;
pub(crate) use self::conn::Pool;
#[cfg(feature = "postgres")]
pub(crate) use self::conn::takes_writes;
use self::conn::{Conn, Txn};
use self::row::TaskRow;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use crate::dialect::Returning;
use crate::dialect::{Claim, Dialect, Failure, Guarded, Statements};
use crate::values::connection::sealed::Sealed;
use crate::values::connection::{PoolerMode, Target};
use task_dedup_entity::task_run;

/// Runs task-dedup's statements on one connection: a pool, the caller's transaction, or
/// a transaction of the executor's own ([`Executor::begin`]).
pub(crate) struct Executor<'c> {
    conn: Conn<'c>,
    dialect: Dialect,
    /// [`PoolerMode::NoPreparedStatements`](crate::PoolerMode): statements go with their
    /// values written in ([`literal`]), without named prepared statements.
    unprepared: bool,
}

/// What an insert of a new task did.
pub(crate) enum Inserted {
    /// The row went in.
    Created,
    /// The key is held by another task (not read yet).
    Held,
    /// The key is held by this task, read in the same statement
    /// ([`Executor::insert_or_find`]).
    Existing(Box<task_run::Model>),
    /// [`OnConflict::ReplaceIfQueued`](crate::OnConflict::ReplaceIfQueued): the queued
    /// task holding the key took this request's payload, run_at and priority.
    Replaced(Box<task_run::Model>),
}

/// What a batch insert did, besides the tasks whose keys were held.
#[derive(Default)]
pub(crate) struct InsertedMany {
    /// The ids of the rows that went in.
    pub created: HashSet<Uuid>,
    /// The queued tasks that took a `ReplaceIfQueued` task's values, as they are now
    /// (PostgreSQL and SQLite; MySQL/MariaDB cannot tell them from held keys here).
    pub replaced: Vec<task_run::Model>,
}

/// A change of a running or queued task, with its (validated) parameters: what the
/// lifecycle's compare-and-set transitions do.
#[derive(Clone, Copy)]
pub(crate) enum Change<'a> {
    /// Extend the lease of a task `worker_id` runs.
    Heartbeat {
        lease_micros: i64,
        worker_id: &'a str,
    },
    /// running → succeeded.
    Complete {
        result: Option<&'a serde_json::Value>,
        worker_id: &'a str,
    },
    /// running → failed.
    Fail { error: &'a str, worker_id: &'a str },
    /// running → queued after `delay_micros`, the key still held.
    Retry {
        error: &'a str,
        delay_micros: i64,
        worker_id: &'a str,
    },
    /// queued or running → cancelled.
    Cancel { reason: &'a str },
    /// running → queued, the attempt not counted.
    Release { worker_id: &'a str },
    /// running → queued after `delay_micros`, the attempt not counted, the snooze
    /// counted, the key still held.
    Snooze {
        delay_micros: i64,
        worker_id: &'a str,
    },
    /// failed or cancelled → queued, due now (an operator's retry, `crate::admin`).
    Requeue,
}

/// A batch of a worker's task endings of one shape, each with its (validated) value:
/// what [`Executor::end_many`] records.
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "worker"), allow(dead_code))]
pub(crate) enum EndMany<'a> {
    /// running → succeeded, with each task's result.
    Complete(&'a [(Uuid, Option<&'a serde_json::Value>)]),
    /// running → failed, with each task's error.
    Fail(&'a [(Uuid, &'a str)]),
    /// running → queued after each task's delay (microseconds), with its error.
    Retry(&'a [(Uuid, &'a str, i64)]),
}

impl EndMany<'_> {
    /// The tasks, in the batch's order.
    pub(crate) fn ids(self) -> Vec<Uuid> {
        match self {
            EndMany::Complete(rows) => rows.iter().map(|row| row.0).collect(),
            EndMany::Fail(rows) => rows.iter().map(|row| row.0).collect(),
            EndMany::Retry(rows) => rows.iter().map(|row| row.0).collect(),
        }
    }

    /// The status each task is left in.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn status(self) -> task_dedup_entity::TaskStatus {
        match self {
            EndMany::Complete(_) => task_dedup_entity::TaskStatus::Succeeded,
            EndMany::Fail(_) => task_dedup_entity::TaskStatus::Failed,
            EndMany::Retry(_) => task_dedup_entity::TaskStatus::Queued,
        }
    }
}

impl<'a> Change<'a> {
    /// Its statement and parameters.
    fn statement(self, dialect: Dialect, id: Uuid) -> (&'static str, Vec<Arg<'a>>) {
        let s = dialect.statements();
        match self {
            Change::Heartbeat {
                lease_micros,
                worker_id,
            } => (
                s.heartbeat.as_str(),
                vec![
                    args::interval(dialect, lease_micros),
                    Arg::Uuid(id),
                    Arg::Str(worker_id),
                ],
            ),
            Change::Complete { result, worker_id } => (
                s.complete.as_str(),
                vec![Arg::Json(result), Arg::Uuid(id), Arg::Str(worker_id)],
            ),
            Change::Fail { error, worker_id } => (
                s.fail.as_str(),
                vec![Arg::Str(error), Arg::Uuid(id), Arg::Str(worker_id)],
            ),
            Change::Retry {
                error,
                delay_micros,
                worker_id,
            } => (
                s.retry.as_str(),
                vec![
                    Arg::Str(error),
                    args::interval(dialect, delay_micros),
                    Arg::Uuid(id),
                    Arg::Str(worker_id),
                ],
            ),
            Change::Cancel { reason } => (s.cancel.as_str(), vec![Arg::Str(reason), Arg::Uuid(id)]),
            Change::Release { worker_id } => {
                (s.release.as_str(), vec![Arg::Uuid(id), Arg::Str(worker_id)])
            }
            Change::Snooze {
                delay_micros,
                worker_id,
            } => (
                s.snooze.as_str(),
                vec![
                    args::interval(dialect, delay_micros),
                    Arg::Uuid(id),
                    Arg::Str(worker_id),
                ],
            ),
            Change::Requeue => (dialect.admin().retry.as_str(), vec![Arg::Uuid(id)]),
        }
    }
}

impl<'c> Executor<'c> {
    /// An executor on the handle `db`, in the pooler mode it says, else its pool's.
    pub(crate) fn on<C: Sealed + ?Sized>(db: &'c C) -> Result<Executor<'c>, Failure> {
        Executor::new(db.target(), db.pooler_mode())
    }

    /// An executor on `target`, or [`DbErr::BackendNotSupported`](sea_orm::DbErr) when
    /// task-dedup was built without the database's feature. `mode`: the handle's pooler
    /// mode; without one, a pool's is its endpoint's ([`pooler`]), and a transaction,
    /// which does not tell its pool, runs in the default.
    pub(crate) fn new(
        target: Target<'c>,
        mode: Option<PoolerMode>,
    ) -> Result<Executor<'c>, Failure> {
        use sea_orm::ConnectionTrait;
        let (conn, backend) = match target {
            Target::Pool(db) => match Pool::of(db) {
                Some(pool) => (Conn::Pool(pool), db.get_database_backend()),
                None => (Conn::SeaOrm(db), db.get_database_backend()),
            },
            Target::Transaction(txn) => (
                Conn::SeaOrmTxn(Txn::Callers(txn)),
                txn.get_database_backend(),
            ),
        };
        let dialect = Dialect::of(backend)?;
        #[cfg(feature = "postgres")]
        let unprepared = dialect == Dialect::Postgres
            && match (mode, &conn) {
                (Some(mode), _) => mode == PoolerMode::NoPreparedStatements,
                (None, Conn::Pool(pool)) => pooler::unprepared(|| pool.identity()),
                (None, _) => false,
            };
        #[cfg(not(feature = "postgres"))]
        let unprepared = {
            let _ = mode;
            false
        };
        Ok(Executor {
            conn,
            dialect,
            unprepared,
        })
    }

    pub(crate) fn dialect(&self) -> Dialect {
        self.dialect
    }

    fn backend(&self) -> DbBackend {
        self.dialect.backend()
    }

    fn statements(&self) -> &'static Statements {
        self.dialect.statements()
    }

    /// Whether statements run in a transaction: the caller's, whose work a deadlock
    /// would take with it, or one of the executor's own.
    pub(crate) fn in_transaction(&self) -> bool {
        self.conn.in_transaction()
    }

    /// The sqlx pool statements run on, if they run on one.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn pool(&self) -> Option<Pool<'c>> {
        match self.conn {
            Conn::Pool(pool) | Conn::Held(pool, _) => Some(pool),
            _ => None,
        }
    }

    /// Every row `sql` returns.
    async fn rows(
        &mut self,
        sql: impl Into<Cow<'static, str>>,
        args: Vec<Arg<'_>>,
    ) -> Result<Vec<QueryResult>, Failure> {
        let backend = self.backend();
        Ok(self
            .conn
            .fetch_all(backend, sql.into(), args, self.unprepared)
            .await?)
    }

    /// How many rows `sql` affected.
    async fn affected(
        &mut self,
        sql: impl Into<Cow<'static, str>>,
        args: Vec<Arg<'_>>,
    ) -> Result<u64, Failure> {
        let backend = self.backend();
        Ok(self
            .conn
            .execute(backend, sql.into(), args, self.unprepared)
            .await?)
    }

    /// The tasks `sql` returns.
    async fn tasks(
        &mut self,
        sql: impl Into<Cow<'static, str>>,
        args: Vec<Arg<'_>>,
    ) -> Result<Vec<task_run::Model>, Failure> {
        let backend = self.backend();
        Ok(self
            .conn
            .fetch_tasks(backend, sql.into(), args, self.unprepared)
            .await?)
    }

    /// The task `sql` returns, if any.
    async fn task(
        &mut self,
        sql: impl Into<Cow<'static, str>>,
        args: Vec<Arg<'_>>,
    ) -> Result<Option<task_run::Model>, Failure> {
        let backend = self.backend();
        Ok(self
            .conn
            .fetch_task(backend, sql.into(), args, self.unprepared)
            .await?)
    }

    /// Starts a transaction of the executor's own (a savepoint inside a transaction).
    /// `immediate`: on SQLite, take the write lock up front.
    pub(crate) async fn begin(&mut self, immediate: bool) -> Result<Executor<'_>, Failure> {
        let backend = self.backend();
        Ok(Executor {
            conn: self.conn.begin(backend, immediate).await?,
            dialect: self.dialect,
            unprepared: self.unprepared,
        })
    }

    /// Ends a transaction of the executor's own: commits it after `outcome` succeeded,
    /// rolls it back otherwise.
    pub(crate) async fn finish<T>(self, outcome: Result<T, Failure>) -> Result<T, Failure> {
        match outcome {
            Ok(value) => {
                self.conn.commit().await?;
                Ok(value)
            }
            Err(err) => {
                let _ = self.conn.rollback().await;
                Err(err)
            }
        }
    }

    /// Inserts `row` unless its key is held; with `replace`, replaces the payload,
    /// run_at and priority of a queued task that holds it. Never infers "created" from a
    /// count a no-op could also produce. In PostgreSQL's pooler mode, without `replace`,
    /// the holder may come back too ([`Inserted::Existing`]).
    pub(crate) async fn insert(
        &mut self,
        row: &task_run::Model,
        replace: bool,
    ) -> Result<Inserted, Failure> {
        match self.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => {
                // The pooler mode's function answers a create faster than the plain
                // insert it would otherwise parse and plan (and a hit in the same call).
                if self.unprepared
                    && !replace
                    && let Some(inserted) = self.call_insert_or_find(row).await?
                {
                    return Ok(inserted);
                }
                self.insert_returning(&crate::dialect::postgres::sql().returning, row, replace)
                    .await
            }
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => {
                self.insert_returning(&crate::dialect::sqlite::sql().returning, row, replace)
                    .await
            }
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::insert(self, row, replace).await,
        }
    }

    /// The plain [`insert`](Self::insert) (never replacing), and where a holder could
    /// finish between the insert and the read of it (MySQL on a pool), both in one
    /// transaction that keeps the holder in place: for the attempts after a holder let
    /// go before it was read.
    pub(crate) async fn insert_then_read(
        &mut self,
        row: &task_run::Model,
    ) -> Result<Inserted, Failure> {
        #[cfg(feature = "mysql")]
        if self.dialect == Dialect::MySql && !self.in_transaction() {
            // Boxed: only attempts after a miss take it, and its transaction's state
            // would otherwise sit in every insert's future.
            return Box::pin(mysql::insert_then_read(self, row)).await;
        }
        self.insert(row, false).await
    }

    /// Whether [`insert_or_find`](Self::insert_or_find) answers a hit in the same
    /// statement as the insert (PostgreSQL), rather than only inserting.
    pub(crate) fn finds_in_insert(&self) -> bool {
        self.statements().insert_or_find.is_some()
    }

    /// Inserts `row` unless its key is held, and then returns the task holding it, in one
    /// statement where the dialect has one ([`Statements::insert_or_find`]); elsewhere
    /// the plain [`insert`](Self::insert). [`Inserted::Held`]: the holder is not visible
    /// to the statement (it committed while the insert waited for it); read it.
    pub(crate) async fn insert_or_find(
        &mut self,
        row: &task_run::Model,
    ) -> Result<Inserted, Failure> {
        #[cfg(feature = "postgres")]
        if self.unprepared
            && let Some(inserted) = self.call_insert_or_find(row).await?
        {
            return Ok(inserted);
        }
        let Some(sql) = &self.statements().insert_or_find else {
            return self.insert(row, false).await;
        };
        Ok(
            match self.task(sql.as_str(), args::row(row).into()).await? {
                Some(stored) if stored.id == row.id => Inserted::Created,
                Some(stored) => Inserted::Existing(Box::new(stored)),
                None => Inserted::Held,
            },
        )
    }

    /// [`insert_or_find`](Self::insert_or_find) in `PoolerMode::NoPreparedStatements`:
    /// a call of the function that keeps its plans per server session, where the
    /// database has it (looked up once, [`pooler::has_function`]); `None` where it does
    /// not, and the plain statement runs instead.
    #[cfg(feature = "postgres")]
    async fn call_insert_or_find(
        &mut self,
        row: &task_run::Model,
    ) -> Result<Option<Inserted>, Failure> {
        let sql = crate::dialect::postgres::sql();
        let identity = self.database_identity();
        let present = match pooler::has_function(identity) {
            Some(present) => present,
            None => {
                let rows = self
                    .rows(sql.has_insert_or_find.as_str(), Vec::new())
                    .await?;
                let present = rows
                    .first()
                    .and_then(|row| row.try_get_by_index::<bool>(0).ok())
                    .unwrap_or(false);
                pooler::record_function(identity, present);
                present
            }
        };
        if !present {
            return Ok(None);
        }
        match self
            .task(sql.insert_or_find_call.as_str(), args::row(row).into())
            .await
        {
            Ok(Some(stored)) if stored.id == row.id => Ok(Some(Inserted::Created)),
            Ok(Some(stored)) => Ok(Some(Inserted::Existing(Box::new(stored)))),
            Ok(None) => Ok(Some(Inserted::Held)),
            // 42883: gone since it was found (a migration rolled back). On a pool the
            // plain statement runs now; in a transaction, which the error aborted, the
            // caller's next call looks again.
            Err(failure)
                if crate::dialect::postgres_error(&failure.err)
                    .is_some_and(|e| e.code() == "42883") =>
            {
                pooler::forget_function(identity);
                if self.in_transaction() {
                    Err(failure)
                } else {
                    Ok(None)
                }
            }
            Err(failure) => Err(failure),
        }
    }

    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    async fn insert_returning(
        &mut self,
        returning: &'static Returning,
        row: &task_run::Model,
        replace: bool,
    ) -> Result<Inserted, Failure> {
        if !replace {
            // RETURNING rather than the affected-row count: the same answer, and on
            // SQLite a lower median latency under contention (BENCHMARKS.md).
            let inserted = self
                .rows(self.statements().insert.as_str(), args::row(row).into())
                .await?;
            return Ok(if inserted.is_empty() {
                Inserted::Held
            } else {
                Inserted::Created
            });
        }
        // The upsert returns the row it inserted (our id) or the queued row it updated
        // (another id); nothing when the task holding the key is not queued.
        Ok(
            match self
                .task(returning.replace.as_str(), args::row(row).into())
                .await?
            {
                Some(stored) if stored.id == row.id => Inserted::Created,
                Some(stored) => Inserted::Replaced(Box::new(stored)),
                None => Inserted::Held,
            },
        )
    }

    /// The task holding the key `(user_id, task_type, resource_key)` in window
    /// `window_end` (0: the Active/Queued slot). `after_conflict`: right after an insert
    /// ran into it, from a snapshot that may predate it.
    pub(crate) async fn find_occupant(
        &mut self,
        key: [&str; 3],
        window_end: i64,
        after_conflict: bool,
    ) -> Result<Option<task_run::Model>, Failure> {
        let statements = self.statements();
        let sql = if after_conflict {
            &statements.find_occupant_after_conflict
        } else {
            &statements.find_occupant
        };
        let sql = self.causal(Cow::Borrowed(sql.as_str())).await?;
        self.task(sql, args::slot(key, window_end).into()).await
    }

    /// `sql`, a read whose answer a caller is given (the task holding a key), as a read
    /// that sees every commit made anywhere before it: on a MariaDB Galera node it waits
    /// until the node has applied the others' ([`galera`]); elsewhere unchanged.
    async fn causal(&mut self, sql: Cow<'static, str>) -> Result<Cow<'static, str>, Failure> {
        #[cfg(feature = "mysql")]
        if self.dialect == Dialect::MySql && self.is_galera().await? {
            return Ok(Cow::Owned(format!("{}{sql}", galera::CAUSAL_READ)));
        }
        Ok(sql)
    }

    /// Whether the database is a node of a MariaDB Galera cluster: looked up once per
    /// database (and once for the caller's transactions), by the enqueue's check of the
    /// schema ([`guard`](crate::enqueue)) or the first read that needs to know.
    #[cfg(feature = "mysql")]
    pub(crate) async fn is_galera(&mut self) -> Result<bool, Failure> {
        let identity = self.database_identity();
        if let Some(galera) = galera::known(identity) {
            return Ok(galera);
        }
        let rows = self
            .rows(crate::dialect::mysql::sql().galera.as_str(), Vec::new())
            .await?;
        let galera = match rows.first() {
            Some(row) => row
                .try_get_by_index::<String>(1)?
                .eq_ignore_ascii_case("ON"),
            None => false,
        };
        galera::record(identity, galera);
        Ok(galera)
    }

    /// One task by id.
    pub(crate) async fn by_id(&mut self, id: Uuid) -> Result<Option<task_run::Model>, Failure> {
        self.task(self.statements().by_id.as_str(), vec![Arg::Uuid(id)])
            .await
    }

    /// Moves up to `max` due queued tasks (of `task_types`, or of any type when empty)
    /// to `running` under `worker_id`'s lease, atomically, in claim order: highest
    /// priority first, then the oldest `run_at`, then the oldest task; one per key, and
    /// none of a key with a task running (`concurrent` tasks aside).
    ///
    /// A claim that lost the race for a key's run to a concurrent claim, or an
    /// [optimistic](Claim::Optimistic) one that picked a task whose key runs, fails with
    /// [`Kind::RunningKey`](crate::dialect::Kind::RunningKey) and took nothing.
    pub(crate) async fn claim(
        &mut self,
        how: Claim,
        worker_id: &str,
        task_types: &[&str],
        lease_micros: i64,
        max: i64,
    ) -> Result<Vec<task_run::Model>, Failure> {
        let mut tasks = match self.dialect {
            // In the caller's transaction, a savepoint: a lost race (a unique violation)
            // would otherwise abort the whole transaction.
            #[cfg(feature = "postgres")]
            Dialect::Postgres if self.in_transaction() => {
                let returning = &crate::dialect::postgres::sql().returning;
                let mut txn = self.begin(false).await?;
                let outcome = txn
                    .claim_returning(returning, how, worker_id, task_types, lease_micros, max)
                    .await;
                txn.finish(outcome).await?
            }
            #[cfg(feature = "postgres")]
            Dialect::Postgres => {
                let returning = &crate::dialect::postgres::sql().returning;
                self.claim_returning(returning, how, worker_id, task_types, lease_micros, max)
                    .await?
            }
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => {
                let returning = &crate::dialect::sqlite::sql().returning;
                self.claim_returning(returning, how, worker_id, task_types, lease_micros, max)
                    .await?
            }
            #[cfg(feature = "mysql")]
            Dialect::MySql => {
                mysql::claim(self, how, worker_id, task_types, lease_micros, max).await?
            }
        };
        // RETURNING and IN keep no order.
        tasks.sort_by_key(|t| (std::cmp::Reverse(t.priority), t.run_at, t.created_at, t.id));
        Ok(tasks)
    }

    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    async fn claim_returning(
        &mut self,
        returning: &'static Returning,
        how: Claim,
        worker_id: &str,
        task_types: &[&str],
        lease_micros: i64,
        max: i64,
    ) -> Result<Vec<task_run::Model>, Failure> {
        let mut values = vec![
            Arg::Str(worker_id),
            args::interval(self.dialect, lease_micros),
        ];
        let sql = match (how, task_types.is_empty()) {
            (Claim::Probing, true) => returning.claim_any.at(max),
            (Claim::Optimistic, true) => returning.optimistic_claim_any.at(max),
            (how, false) => {
                values.push(args::task_types(self.dialect, task_types));
                match how {
                    Claim::Probing => returning.claim_types.at(max),
                    Claim::Optimistic => returning.optimistic_claim_types.at(max),
                }
            }
        };
        values.push(Arg::I64(max));
        self.tasks(sql, values).await
    }

    /// Applies `change` to task `id` if its guard holds, and returns the row as it is
    /// afterwards; `None` when the guard did not match and nothing changed.
    pub(crate) async fn transition(
        &mut self,
        id: Uuid,
        change: Change<'_>,
    ) -> Result<Option<task_run::Model>, Failure> {
        let (sql, values) = change.statement(self.dialect, id);
        match self.dialect {
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::transition(self, id, sql, values).await,
            #[allow(unreachable_patterns)]
            _ => self.task(sql, values).await,
        }
    }

    /// Records a batch of endings, each only where its task still runs under
    /// `worker_id`'s lease; the ids of the tasks it ended (MySQL/MariaDB: with those an
    /// earlier attempt of the same batch ended, which the caller counts as ended too). A
    /// held key (a retry whose key a queued follow-up took) fails the whole statement,
    /// which then changed nothing.
    pub(crate) async fn end_many(
        &mut self,
        worker_id: &str,
        batch: EndMany<'_>,
    ) -> Result<Vec<Uuid>, Failure> {
        let endings = self.dialect.endings();
        let ids = batch.ids();
        let sql = match batch {
            EndMany::Complete(_) => &endings.complete,
            EndMany::Fail(_) => &endings.fail,
            EndMany::Retry(_) => &endings.retry,
        }
        .render(0, &[("rows", ids.len())]);
        let values = args::endings(self.dialect, batch, worker_id);
        match self.dialect {
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::end_many(self, sql, values, batch, ids, worker_id).await,
            #[allow(unreachable_patterns)]
            _ => {
                let rows = self.rows(sql, values).await?;
                Ok(rows
                    .iter()
                    .map(|row| row.try_get_by_index(0))
                    .collect::<Result<_, _>>()?)
            }
        }
    }

    /// Running tasks whose lease expired: (id, attempts), at most 100.
    pub(crate) async fn expired(&mut self) -> Result<Vec<(Uuid, i32)>, Failure> {
        let rows = self
            .rows(self.statements().expired.as_str(), vec![])
            .await?;
        Ok(rows
            .iter()
            .map(|row| Ok((row.try_get("", "id")?, row.try_get("", "attempts")?)))
            .collect::<Result<_, sea_orm::DbErr>>()?)
    }

    /// Fails expired task `id` with `error`, unless its lease was renewed meanwhile.
    /// Whether it applied.
    pub(crate) async fn reap_fail(&mut self, id: Uuid, error: &str) -> Result<bool, Failure> {
        let values = vec![Arg::Str(error), Arg::Uuid(id)];
        Ok(self
            .affected(self.statements().reap_fail.as_str(), values)
            .await?
            == 1)
    }

    /// Requeues expired task `id` due after `delay_micros`, unless its lease was renewed
    /// meanwhile. Whether it applied.
    pub(crate) async fn reap_requeue(
        &mut self,
        id: Uuid,
        delay_micros: i64,
    ) -> Result<bool, Failure> {
        let values = vec![args::interval(self.dialect, delay_micros), Arg::Uuid(id)];
        Ok(self
            .affected(self.statements().reap_requeue.as_str(), values)
            .await?
            == 1)
    }

    /// Deletes up to `limit` of the oldest `status` tasks that finished more than
    /// `age_micros` ago (period tasks only once their window is over); returns how many.
    pub(crate) async fn prune(
        &mut self,
        status: &str,
        age_micros: i64,
        limit: i64,
    ) -> Result<u64, Failure> {
        let offset = args::interval(self.dialect, age_micros.saturating_neg());
        let values = vec![Arg::Str(status), offset, Arg::I64(limit)];
        match self.dialect {
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::prune(self, values).await,
            #[allow(unreachable_patterns)]
            _ => {
                self.affected(self.statements().prune.as_str(), values)
                    .await
            }
        }
    }

    /// Pauses `task_type`; whether it was not paused before.
    pub(crate) async fn pause(&mut self, task_type: &str) -> Result<bool, Failure> {
        let values = vec![Arg::Str(task_type)];
        Ok(self
            .affected(self.statements().pause.as_str(), values)
            .await?
            == 1)
    }

    /// Resumes `task_type`; whether it was paused.
    pub(crate) async fn resume(&mut self, task_type: &str) -> Result<bool, Failure> {
        let values = vec![Arg::Str(task_type)];
        Ok(self
            .affected(self.statements().resume.as_str(), values)
            .await?
            == 1)
    }

    /// The paused task types and when each was paused, by name.
    pub(crate) async fn paused(
        &mut self,
    ) -> Result<Vec<(String, chrono::DateTime<chrono::Utc>)>, Failure> {
        let rows = self.rows(self.statements().paused.as_str(), vec![]).await?;
        Ok(rows
            .iter()
            .map(|row| Ok((row.try_get("", "task_type")?, row.try_get("", "paused_at")?)))
            .collect::<Result<_, sea_orm::DbErr>>()?)
    }

    /// Whether `task_run` has `task_running_resource_uidx` (valid and unique), which an
    /// [optimistic](Claim::Optimistic) claim relies on.
    pub(crate) async fn has_running_index(&mut self) -> Result<bool, Failure> {
        let rows = self
            .rows(self.statements().running_index.as_str(), vec![])
            .await?;
        Ok(!rows.is_empty())
    }

    /// Inserts the rows of a batch, `plain` skipping held keys and `replace` replacing
    /// queued holders (`ReplaceIfQueued`), in one statement each.
    pub(crate) async fn insert_many(
        &mut self,
        plain: &[&task_run::Model],
        replace: &[&task_run::Model],
    ) -> Result<InsertedMany, Failure> {
        let bulk = self.dialect.bulk();
        let mut inserted = InsertedMany::default();
        #[cfg(feature = "mysql")]
        if self.dialect == Dialect::MySql {
            // No RETURNING: which rows went in is read back by id.
            for (group, sql) in [(plain, &bulk.insert), (replace, &bulk.replace)] {
                if !group.is_empty() {
                    let values = args::rows(self.dialect, group);
                    self.affected(sql.render(0, &[("rows", group.len())]), values)
                        .await?;
                }
            }
            let ids: Vec<Uuid> = plain.iter().chain(replace).map(|row| row.id).collect();
            if !ids.is_empty() {
                let values = args::ids(self.dialect, &ids);
                let sql = crate::dialect::mysql::sql()
                    .ids_in
                    .render(0, &[("ids", ids.len())]);
                for row in self.rows(sql, values).await? {
                    inserted.created.insert(row.try_get_by_index(0)?);
                }
            }
            return Ok(inserted);
        }
        for (group, sql) in [(plain, &bulk.insert), (replace, &bulk.replace)] {
            if group.is_empty() {
                continue;
            }
            let ours: HashSet<Uuid> = group.iter().map(|row| row.id).collect();
            let values = args::rows(self.dialect, group);
            let sql = sql.render(0, &[("rows", group.len())]);
            for row in self.rows(sql, values).await? {
                let id: Uuid = row.try_get_by_index(0)?;
                if ours.contains(&id) {
                    inserted.created.insert(id);
                } else {
                    inserted.replaced.push(row.task()?);
                }
            }
        }
        Ok(inserted)
    }

    /// Whether [`insert_many`](Self::insert_many) reports the queued tasks it replaced.
    pub(crate) fn reports_replaced(&self) -> bool {
        match self.dialect {
            #[cfg(feature = "mysql")]
            Dialect::MySql => false,
            #[allow(unreachable_patterns)]
            _ => true,
        }
    }

    /// The tasks holding the keys and windows of `rows`. `after_own_insert`: in a
    /// transaction of the executor's own, right after its insert (see
    /// [`Bulk::find_occupants_after_own_insert`](crate::dialect::Bulk)).
    pub(crate) async fn find_occupants(
        &mut self,
        rows: &[&task_run::Model],
        after_own_insert: bool,
    ) -> Result<Vec<task_run::Model>, Failure> {
        let bulk = self.dialect.bulk();
        let sql = if after_own_insert {
            &bulk.find_occupants_after_own_insert
        } else {
            &bulk.find_occupants
        };
        let values = args::slots(self.dialect, rows);
        let sql = self.causal(sql.render(0, &[("keys", rows.len())])).await?;
        self.tasks(sql, values).await
    }

    /// The tasks of `ids` that exist.
    pub(crate) async fn by_ids(&mut self, ids: &[Uuid]) -> Result<Vec<task_run::Model>, Failure> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let values = args::ids(self.dialect, ids);
        let sql = self.dialect.bulk().by_ids.render(0, &[("ids", ids.len())]);
        self.tasks(sql, values).await
    }

    /// Whether `task_run` holds the guarantee: its unique index is there and is the one
    /// the statements rely on. Reads the catalog (PostgreSQL: plans an insert, in a
    /// savepoint inside the caller's transaction, whose failure would abort it).
    pub(crate) async fn guard(&mut self) -> Result<Guarded, Failure> {
        match self.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => {
                let mut txn = self.begin(false).await?;
                let outcome = txn
                    .affected(crate::dialect::postgres::sql().guard.as_str(), vec![])
                    .await;
                let _ = txn.conn.rollback().await;
                match outcome {
                    Ok(_) => Ok(Guarded::Yes),
                    Err(failure) => {
                        let schema = crate::dialect::postgres_error(&failure.err)
                            .and_then(crate::dialect::postgres::guard_failure);
                        schema.ok_or(failure)
                    }
                }
            }
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => {
                let rows = self
                    .rows(crate::dialect::sqlite::sql().guard.as_str(), vec![])
                    .await?;
                let rows = rows
                    .iter()
                    .map(|row| Ok((row.try_get("", "type")?, row.try_get("", "sql")?)))
                    .collect::<Result<Vec<_>, sea_orm::DbErr>>()?;
                Ok(crate::dialect::sqlite::guarded(&rows))
            }
            #[cfg(feature = "mysql")]
            Dialect::MySql => {
                let rows = self
                    .rows(crate::dialect::mysql::sql().guard.as_str(), vec![])
                    .await?;
                let Some(row) = rows.first() else {
                    return Ok(Guarded::NoTable);
                };
                let has_table: i64 = row.try_get("", "has_table")?;
                let columns: Option<String> = row.try_get("", "key_columns")?;
                let occupied: Option<String> = row.try_get("", "occupied")?;
                Ok(crate::dialect::mysql::guarded(
                    has_table,
                    columns.as_deref(),
                    occupied.as_deref(),
                ))
            }
        }
    }

    /// The identity of the database behind a pool (see [`Pool::identity`]); `None` in
    /// the caller's transaction, which does not tell.
    pub(crate) fn database_identity(&self) -> Option<u64> {
        match self.conn {
            Conn::Pool(pool) | Conn::Held(pool, _) => Some(pool.identity()),
            _ => None,
        }
    }

    /// Runs every further statement on one connection of the pool, until the executor
    /// is dropped (nothing in a transaction, or without a sqlx pool).
    ///
    /// For an enqueue's attempt: one acquire for its statements (a hit is two on
    /// MySQL/MariaDB and SQLite), each acquire being a boxed future of a few KB.
    ///
    /// For a statement run again after the server refused it: PostgreSQL sends the error
    /// before it releases the statement's row locks, so a rerun on another connection
    /// can find the rows the failed statement had picked still locked (`SKIP LOCKED`
    /// passes over them), while the same connection waits for the server to be ready.
    pub(crate) async fn hold(&mut self) -> Result<(), Failure> {
        if let Conn::Pool(pool) = self.conn {
            self.conn = Conn::Held(pool, pool.hold().await?);
        }
        Ok(())
    }

    /// Wakes PostgreSQL workers that LISTEN (inside a transaction: at its commit).
    #[cfg(feature = "postgres")]
    pub(crate) async fn notify(&mut self) -> Result<(), Failure> {
        self.affected(crate::dialect::postgres::sql().notify.as_str(), vec![])
            .await
            .map(drop)
    }

    /// Tells PostgreSQL workers that LISTEN that a task that may be running was
    /// cancelled (inside a transaction: at its commit).
    #[cfg(feature = "postgres")]
    pub(crate) async fn notify_cancel(&mut self) -> Result<(), Failure> {
        self.affected(
            crate::dialect::postgres::sql().notify_cancel.as_str(),
            vec![],
        )
        .await
        .map(drop)
    }

    /// Notifies `payload` on a worker's probe `channel` if its listener's server
    /// process `pid` is idle (see `wakeups.sql`'s `probe`); whether it did.
    #[cfg(all(feature = "postgres", feature = "worker"))]
    pub(crate) async fn probe(
        &mut self,
        channel: &str,
        payload: &str,
        pid: i64,
    ) -> Result<bool, Failure> {
        let args = vec![Arg::Str(channel), Arg::Str(payload), Arg::I64(pid)];
        let notified = self
            .affected(crate::dialect::postgres::sql().probe.as_str(), args)
            .await?;
        Ok(notified > 0)
    }
}
