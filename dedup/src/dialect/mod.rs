//! The dialects: every statement as a whole SQL text, and the error codes that say what
//! a failure means. Nothing here runs SQL; the [executor](crate::executor) does.
//!
//! Each dialect's file holds its statements in the same order ([`Statements`], then what
//! only that dialect needs) and, beside them, its named error codes with the function
//! that classifies them ([`Kind`]). The only fragments spliced into the statements, at
//! compile time, are the column lists ([`columns!`]) and the predicate "holds its key"
//! ([`occupies_key_sql!`](task_dedup_entity::occupies_key_sql)).

use std::borrow::Cow;

use sea_orm::{DbBackend, DbErr};

pub(crate) use self::admin::{Admin, ListShape};

/// Every column of `task_run` the entity maps, in table order: what lookups select and
/// writes return. (The MySQL/MariaDB generated column stays out.)
macro_rules! columns {
    () => {
        "id, user_id, task_type, resource_key, status, payload, result, error, attempts, \
         lease_owner, lease_expires_at, created_at, updated_at, started_at, finished_at, \
         run_at, priority, scope, dedup_window_end, concurrent, snoozes"
    };
}

/// The columns a new task is inserted with: `status` and `attempts` are literals
/// (`'queued'`, `0`) in the statements, the others are bound in this order
/// (`executor::args::row`).
macro_rules! insert_columns {
    () => {
        "id, user_id, task_type, resource_key, status, payload, attempts, created_at, \
         updated_at, run_at, priority, scope, dedup_window_end, concurrent"
    };
}

/// The start of every insert of new tasks up to their rows, where rows are
/// [`row_placeholders!`] (SQLite, MySQL/MariaDB).
#[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(unused_macros))]
macro_rules! insert_into {
    () => {
        concat!("INSERT INTO task_run (", insert_columns!(), ") VALUES ")
    };
}

/// A new task's row, with positional placeholders for the 12 values of `args::row`
/// (SQLite, MySQL/MariaDB).
#[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(unused_macros))]
macro_rules! row_placeholders {
    () => {
        "(?, ?, ?, ?, 'queued', ?, 0, ?, ?, ?, ?, ?, ?, ?)"
    };
}

pub(crate) mod admin;
pub(crate) mod limits;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

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

/// The statements every dialect has, with the same meaning and the same parameters,
/// listed in each field's doc in the order they appear in the text (MySQL's `?` are
/// positional). PostgreSQL and SQLite writes end in `RETURNING` the row; MySQL has no
/// `RETURNING`, and reads the row by id in the same transaction.
pub(crate) struct Statements {
    /// Inserts a new task unless its key is held (the 12 values of
    /// `executor::args::row`). PostgreSQL/SQLite: `DO NOTHING RETURNING id`, a row when
    /// inserted; MySQL: a plain INSERT whose duplicate-key error on the unique index
    /// means "held".
    pub insert: &'static str,
    /// A hit in one statement (PostgreSQL; `None` where the dialect has no such form):
    /// inserts a new task as [`insert`](Self::insert) does (the same values) and returns
    /// its row, or else the task holding its key as the statement's snapshot sees it. No
    /// row: the holder committed after that snapshot, read it with
    /// [`find_occupant_after_conflict`](Self::find_occupant_after_conflict).
    pub insert_or_find: Option<&'static str>,
    /// The task holding a key: user_id, task_type, resource_key, dedup_window_end.
    pub find_occupant: &'static str,
    /// The same, right after a conflict: it must see the row that caused it even from a
    /// REPEATABLE READ snapshot that predates it (MySQL: a locking read).
    pub find_occupant_after_conflict: &'static str,
    /// One task by id: id.
    pub by_id: &'static str,
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
    /// running → queued after a delay, lease cleared, the attempt not counted and the
    /// snooze counted (a handler's "run me again in d"), the key still held: delay, id,
    /// worker_id.
    pub snooze: &'static str,
    /// Running tasks whose lease expired, at most 100: no parameters. Selects `id` and
    /// `attempts`.
    pub expired: &'static str,
    /// An expired task → failed, unless its lease was renewed meanwhile: error, id.
    pub reap_fail: &'static str,
    /// An expired task → queued after a backoff, lease cleared, unless its lease was
    /// renewed meanwhile: delay, id.
    pub reap_requeue: &'static str,
    /// Deletes a batch of the oldest finished tasks of one status that finished more than
    /// an age ago and whose period window (if any) is over: status, minus the age (an
    /// offset from now, like the others), how many at most. MySQL/MariaDB: selects and
    /// locks that batch's ids (`SKIP LOCKED`), which `mysql::prune_ids` then deletes.
    pub prune: &'static str,
    /// Pauses a task type unless it is paused; one row affected when it was not: type.
    pub pause: &'static str,
    /// Resumes a paused task type; one row affected when it was paused: type.
    pub resume: &'static str,
    /// The paused types (`task_type`, `paused_at`), by name: no parameters.
    pub paused: &'static str,
    /// One row (`present`) when `task_run` has a valid unique index named
    /// `task_running_resource_uidx`, none otherwise: whether an optimistic claim can
    /// rely on it ([`Claim`]).
    pub running_index: &'static str,
}

/// Which of a dialect's two claim statements runs (`crate::claim_mode` picks).
///
/// Both keep one run per key, which `task_running_resource_uidx` guarantees either way;
/// they differ in what a task whose key runs costs. The probing claim looks each
/// candidate's key up in that index and passes over the blocked ones, so its batch fills
/// from free keys however many wait ahead; the optimistic one does not look, and fails
/// ([`Kind::RunningKey`], nothing taken) when it picked one. On a queue of distinct keys
/// the optimistic claim never fails, and saves the probe, the index lookups and the
/// one-per-key step: the cost of the rule on a drain (BENCHMARKS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Passes over tasks whose key runs, and keeps the first task of each key.
    Probing,
    /// Lets the running index refuse a second run of a key.
    Optimistic,
}

/// What PostgreSQL and SQLite do in one statement with `RETURNING`, and MySQL/MariaDB in
/// flows of their own (`executor::mysql`).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) struct Returning {
    /// [`OnConflict::ReplaceIfQueued`](crate::OnConflict::ReplaceIfQueued): the INSERT
    /// with `DO UPDATE ... WHERE status = 'queued' RETURNING` the row (the values of
    /// [`Statements::insert`]).
    pub replace: &'static str,
    /// Claims the next due queued tasks of any type: worker_id, lease, how many. Each
    /// claim statement is the text for a claim of up to the given number of tasks
    /// (PostgreSQL has one per power of two, so that its plan is cached:
    /// `postgres::bound`; SQLite one).
    pub claim_any: fn(i64) -> &'static str,
    /// The same for some task types: worker_id, lease, task types (PostgreSQL an array,
    /// SQLite a JSON array), how many.
    pub claim_types: fn(i64) -> &'static str,
    /// [`claim_any`](Self::claim_any) without looking for running tasks of the keys:
    /// `task_running_resource_uidx` refuses a claim that would start a second run of a
    /// key ([`Kind::RunningKey`]), and then it took nothing. See [`Claim`].
    pub optimistic_claim_any: fn(i64) -> &'static str,
    /// [`claim_types`](Self::claim_types), optimistic alike.
    pub optimistic_claim_types: fn(i64) -> &'static str,
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
}

/// The statements a [`Worker`](crate::Worker) records a batch of task endings with, for
/// `rows` tasks of one shape. Each is a compare-and-set per row on `status = 'running'`
/// and the worker's `lease_owner`, as the single transitions are: a row another worker
/// holds now, or that is no longer running, is left as it is. PostgreSQL and SQLite
/// return the ids of the rows they changed; MySQL/MariaDB (no `RETURNING` in MySQL 8,
/// none on `UPDATE` in MariaDB) report a count, and when it falls short the rows are read
/// back in the same transaction (`mysql::ended_by`). PostgreSQL binds one array per
/// column (constant texts); SQLite and MySQL/MariaDB bind values per row, at most five
/// (MySQL's retry), so a batch of [`MAX_END_BATCH`](crate::MAX_END_BATCH) rows stays
/// within SQLite's 32,766 and MySQL's 65,535 placeholders.
pub(crate) struct Endings {
    /// running → succeeded, each with its result (`Statements::complete` per row).
    pub complete: fn(usize) -> Cow<'static, str>,
    /// running → failed, each with its error (`Statements::fail` per row).
    pub fail: fn(usize) -> Cow<'static, str>,
    /// running → queued, each with its error and its delay, the key still held
    /// (`Statements::retry` per row). A row whose key a queued follow-up took fails the
    /// whole statement with a held-key error: the caller records those one by one.
    pub retry: fn(usize) -> Cow<'static, str>,
}

/// One of the dialects this crate was built with (features `postgres`, `sqlite`,
/// `mysql`). The executor reads it off the connection once per operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Dialect {
    #[cfg(feature = "postgres")]
    Postgres,
    #[cfg(feature = "sqlite")]
    Sqlite,
    #[cfg(feature = "mysql")]
    MySql,
}

impl Dialect {
    /// The dialect of `backend`, or [`DbErr::BackendNotSupported`] when task-dedup was
    /// built without its feature.
    pub(crate) fn of(backend: DbBackend) -> Result<Dialect, DbErr> {
        match backend {
            #[cfg(feature = "postgres")]
            DbBackend::Postgres => Ok(Dialect::Postgres),
            #[cfg(feature = "sqlite")]
            DbBackend::Sqlite => Ok(Dialect::Sqlite),
            #[cfg(feature = "mysql")]
            DbBackend::MySql => Ok(Dialect::MySql),
            other => Err(DbErr::BackendNotSupported {
                db: other.as_str(),
                ctx: match other {
                    DbBackend::Postgres => "task-dedup: enable its `postgres` feature",
                    DbBackend::MySql => "task-dedup: enable its `mysql` feature",
                    DbBackend::Sqlite => "task-dedup: enable its `sqlite` feature",
                    _ => "task-dedup: enable this database's feature (sqlite, postgres or mysql)",
                },
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

    pub(crate) fn statements(self) -> &'static Statements {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => &postgres::STATEMENTS,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => &sqlite::STATEMENTS,
            #[cfg(feature = "mysql")]
            Dialect::MySql => &mysql::STATEMENTS,
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

    pub(crate) fn endings(self) -> &'static Endings {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => &postgres::ENDINGS,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => &sqlite::ENDINGS,
            #[cfg(feature = "mysql")]
            Dialect::MySql => &mysql::ENDINGS,
        }
    }

    pub(crate) fn admin(self) -> &'static Admin {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => &postgres::ADMIN,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => &sqlite::ADMIN,
            #[cfg(feature = "mysql")]
            Dialect::MySql => &mysql::ADMIN,
        }
    }

    pub(crate) fn limits(self) -> &'static limits::Limits {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => &postgres::LIMITS,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => &sqlite::LIMITS,
            #[cfg(feature = "mysql")]
            Dialect::MySql => &mysql::LIMITS,
        }
    }

    /// Whether a round of `find_or_enqueue_many` on a pool runs in a transaction of its
    /// own. SQLite: an IMMEDIATE one takes the write lock up front, so nothing changes
    /// between the insert and the read; MySQL/MariaDB: InnoDB keeps the insert's locks
    /// until the read. PostgreSQL needs none: a key whose holder let go in between is
    /// inserted again in the next round.
    pub(crate) fn bulk_round_in_transaction(self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => false,
            #[allow(unreachable_patterns)]
            _ => true,
        }
    }
}

/// What the check of `task_active_resource_uidx` found (`crate::guard`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Guarded {
    /// The index is there and is the guarantee.
    Yes,
    /// There is no `task_run` table: nothing to check (writing to it fails loudly).
    NoTable,
    /// `task_run` exists without the guarantee: what is wrong.
    No(String),
}

/// Normalizes SQL text for comparison: lowercase, without quotes, backticks and
/// whitespace.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
fn squeeze(sql: &str) -> String {
    sql.chars()
        .filter(|c| !c.is_whitespace() && !matches!(c, '"' | '`'))
        .flat_map(char::to_lowercase)
        .collect()
}

/// What a database error means to task-dedup. Each failure is classified once, where it
/// arises ([`Failure`]), by its dialect's named codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A violation of `task_active_resource_uidx`: the key is held (not another
    /// constraint).
    HeldKey,
    /// A violation of `task_running_resource_uidx`: a claim lost the race for a key's one
    /// run to a concurrent claim (both picked tasks of a key none of whose tasks ran).
    RunningKey,
    /// A violation of `task_run_slot_uidx`: a claim of a type with `max_running` took a
    /// run slot (a number below the limit) that a concurrent claim took first.
    SlotTaken,
    /// The connection was lost or could not be had ([`crate::is_connection_lost`]).
    ConnectionLost,
    /// The database aborted the statement to resolve a deadlock or a serialization
    /// conflict ([`crate::is_transaction_conflict`]).
    TransactionConflict,
    /// The database gave up waiting ([`crate::is_timeout`]).
    Timeout,
    /// Anything else.
    Other,
}

impl Kind {
    /// Classifies `err` by the codes of the dialect whose driver raised it.
    pub(crate) fn of(err: &DbErr) -> Kind {
        #[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
        {
            use sea_orm::sqlx::Error;
            match sqlx_error(err) {
                Some(Error::Io(_) | Error::Tls(_) | Error::WorkerCrashed) => {
                    return Kind::ConnectionLost;
                }
                Some(Error::Database(db_err)) => {
                    #[cfg(feature = "postgres")]
                    if let Some(e) = db_err.try_downcast_ref() {
                        return postgres::kind(e);
                    }
                    #[cfg(feature = "mysql")]
                    if let Some(e) = db_err.try_downcast_ref() {
                        return mysql::kind(e);
                    }
                    #[cfg(feature = "sqlite")]
                    if let Some(e) = db_err.try_downcast_ref() {
                        return sqlite::kind(e);
                    }
                }
                _ => {}
            }
        }
        let _ = err;
        Kind::Other
    }
}

/// PostgreSQL's own error behind `err`, if it is one.
#[cfg(feature = "postgres")]
pub(crate) fn postgres_error(err: &DbErr) -> Option<&sea_orm::sqlx::postgres::PgDatabaseError> {
    match sqlx_error(err)? {
        sea_orm::sqlx::Error::Database(db_err) => db_err.try_downcast_ref(),
        _ => None,
    }
}

/// The sqlx error behind `err`, when SeaORM's error wraps one from a statement or a
/// connection.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
fn sqlx_error(err: &DbErr) -> Option<&sea_orm::sqlx::Error> {
    use sea_orm::RuntimeErr;
    match err {
        DbErr::Exec(RuntimeErr::SqlxError(e))
        | DbErr::Query(RuntimeErr::SqlxError(e))
        | DbErr::Conn(RuntimeErr::SqlxError(e)) => Some(e.as_ref()),
        _ => None,
    }
}

/// A database error and what it means, classified once where it arose.
#[derive(Debug)]
pub(crate) struct Failure {
    pub kind: Kind,
    pub err: DbErr,
}

impl From<DbErr> for Failure {
    fn from(err: DbErr) -> Failure {
        Failure {
            kind: Kind::of(&err),
            err,
        }
    }
}

impl Failure {
    /// Whether the statement ran into a task holding the key.
    pub(crate) fn is_held_key(&self) -> bool {
        self.kind == Kind::HeldKey
    }

    /// Whether a claim ran into a task of its key that another claim started meanwhile.
    pub(crate) fn is_running_key(&self) -> bool {
        self.kind == Kind::RunningKey
    }

    /// Whether a claim lost a race to another claim: for a key's run, or for a run slot.
    /// It took nothing, and runs again.
    pub(crate) fn is_lost_claim_race(&self) -> bool {
        matches!(self.kind, Kind::RunningKey | Kind::SlotTaken)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use sea_orm::Iterable;

    use super::*;
    use task_dedup_entity::task_run;

    /// The claim size whose statements the snapshots pin: PostgreSQL's texts for a
    /// bound of 8, which differ from the other bounds' only in that number
    /// (`postgres::tests::claims_differ_only_in_their_bound`).
    pub(crate) const PINNED_MAX: i64 = 8;

    /// Each backend is supported exactly when its feature is on; otherwise the error says
    /// which feature to enable. CI also runs this in single-feature builds.
    #[test]
    fn a_dialect_built_without_its_feature_is_a_clear_error() {
        for (backend, enabled) in [
            (DbBackend::Sqlite, cfg!(feature = "sqlite")),
            (DbBackend::Postgres, cfg!(feature = "postgres")),
            (DbBackend::MySql, cfg!(feature = "mysql")),
        ] {
            match Dialect::of(backend) {
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

    /// Every statement every dialect has, one after the other, under its name.
    fn render_common(statements: &Statements) -> Vec<(&'static str, Cow<'static, str>)> {
        [
            ("insert", statements.insert),
            ("find_occupant", statements.find_occupant),
            (
                "find_occupant_after_conflict",
                statements.find_occupant_after_conflict,
            ),
            ("by_id", statements.by_id),
            ("heartbeat", statements.heartbeat),
            ("complete", statements.complete),
            ("fail", statements.fail),
            ("retry", statements.retry),
            ("cancel", statements.cancel),
            ("release", statements.release),
            ("snooze", statements.snooze),
            ("expired", statements.expired),
            ("reap_fail", statements.reap_fail),
            ("reap_requeue", statements.reap_requeue),
            ("prune", statements.prune),
            ("pause", statements.pause),
            ("resume", statements.resume),
            ("paused", statements.paused),
            ("running_index", statements.running_index),
        ]
        .into_iter()
        .chain(statements.insert_or_find.map(|sql| ("insert_or_find", sql)))
        .map(|(name, sql)| (name, Cow::Borrowed(sql)))
        .collect()
    }

    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    fn render_returning(
        statements: &Statements,
        returning: &Returning,
    ) -> Vec<(&'static str, Cow<'static, str>)> {
        let mut all = render_common(statements);
        all.extend([
            ("replace", Cow::Borrowed(returning.replace)),
            (
                "claim_any",
                Cow::Borrowed((returning.claim_any)(PINNED_MAX)),
            ),
            (
                "claim_types",
                Cow::Borrowed((returning.claim_types)(PINNED_MAX)),
            ),
            (
                "optimistic_claim_any",
                Cow::Borrowed((returning.optimistic_claim_any)(PINNED_MAX)),
            ),
            (
                "optimistic_claim_types",
                Cow::Borrowed((returning.optimistic_claim_types)(PINNED_MAX)),
            ),
        ]);
        all
    }

    /// The order statements are pinned in: what each dialect lacks is skipped.
    const ORDER: [&str; 31] = [
        "insert",
        "insert_or_find",
        "replace",
        "find_occupant",
        "find_occupant_after_conflict",
        "by_id",
        "claim_any",
        "claim_types",
        "optimistic_claim_any",
        "optimistic_claim_types",
        "claim_update",
        "claimed",
        "heartbeat",
        "complete",
        "fail",
        "retry",
        "cancel",
        "release",
        "snooze",
        "expired",
        "reap_fail",
        "reap_requeue",
        "prune",
        "pause",
        "resume",
        "paused",
        "running_index",
        "notify",
        "notify_cancel",
        "probe",
        "guard",
    ];

    fn render(all: Vec<(&'static str, Cow<'static, str>)>) -> String {
        for (name, sql) in &all {
            assert!(ORDER.contains(name), "{name} has no place in ORDER");
            assert!(!sql.is_empty(), "{name} is empty");
        }
        ORDER
            .iter()
            .filter_map(|name| all.iter().find(|(n, _)| n == name))
            .map(|(name, sql)| format!("{name}:\n{sql}\n"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    // Each dialect's statements, pinned as whole texts in `snapshots/`: a change to any
    // of them shows up in review as a diff of the SQL itself.
    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_statements_are_pinned() {
        let mut all = render_returning(&postgres::STATEMENTS, &postgres::RETURNING);
        all.push(("notify", Cow::Borrowed(postgres::NOTIFY)));
        all.push(("notify_cancel", Cow::Borrowed(postgres::NOTIFY_CANCEL)));
        all.push(("probe", Cow::Borrowed(postgres::PROBE)));
        all.push(("guard", Cow::Borrowed(postgres::GUARD)));
        insta::assert_snapshot!(render(all));
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_statements_are_pinned() {
        let mut all = render_returning(&sqlite::STATEMENTS, &sqlite::RETURNING);
        all.push(("guard", Cow::Borrowed(sqlite::GUARD)));
        insta::assert_snapshot!(render(all));
    }

    /// MySQL's flows of its own, with two tasks where a statement takes a list of ids.
    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_statements_are_pinned() {
        let mut all = render_common(&mysql::STATEMENTS);
        all.extend([
            ("replace", Cow::Borrowed(mysql::REPLACE)),
            ("claim_any", Cow::Borrowed(mysql::CLAIM_ANY)),
            ("claim_types", mysql::claim_types(2)),
            (
                "optimistic_claim_any",
                Cow::Borrowed(mysql::OPTIMISTIC_CLAIM_ANY),
            ),
            ("optimistic_claim_types", mysql::optimistic_claim_types(2)),
            ("claim_update", mysql::claim_update(2)),
            ("claimed", mysql::claimed(2)),
            ("guard", Cow::Borrowed(mysql::GUARD)),
        ]);
        insta::assert_snapshot!(render(all));
    }

    /// Each dialect's bulk statements, for two rows, pinned like the others.
    fn render_bulk(bulk: &Bulk) -> String {
        format!(
            "chunk: {}\n\ninsert:\n{}\n\nreplace:\n{}\n\nfind_occupants:\n{}\n\n\
             find_occupants_after_own_insert:\n{}\n\nby_ids:\n{}\n",
            bulk.chunk,
            (bulk.insert)(2),
            (bulk.replace)(2),
            (bulk.find_occupants)(2),
            (bulk.find_occupants_after_own_insert)(2),
            (bulk.by_ids)(2),
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
        let ids_in = mysql::ids_in(2);
        let prune_ids = mysql::prune_ids(2);
        insta::assert_snapshot!(format!(
            "{}\nids_in:\n{ids_in}\n\nprune_ids:\n{prune_ids}\n",
            render_bulk(&mysql::BULK)
        ));
    }

    /// Each dialect's batch endings, for two rows, pinned like the others.
    fn render_endings(endings: &Endings) -> String {
        format!(
            "complete:\n{}\n\nfail:\n{}\n\nretry:\n{}\n",
            (endings.complete)(2),
            (endings.fail)(2),
            (endings.retry)(2),
        )
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_ending_statements_are_pinned() {
        insta::assert_snapshot!(render_endings(&postgres::ENDINGS));
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_ending_statements_are_pinned() {
        insta::assert_snapshot!(render_endings(&sqlite::ENDINGS));
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_ending_statements_are_pinned() {
        let ended_by = mysql::ended_by(2);
        insta::assert_snapshot!(format!(
            "{}\nended_by:\n{ended_by}\n",
            render_endings(&mysql::ENDINGS)
        ));
    }

    // The admin API's statements and a few list shapes, pinned like the others.
    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_admin_statements_are_pinned() {
        let dialect = Dialect::Postgres;
        insta::assert_snapshot!(admin::tests::render(dialect, dialect.admin()));
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_admin_statements_are_pinned() {
        let dialect = Dialect::Sqlite;
        insta::assert_snapshot!(admin::tests::render(dialect, dialect.admin()));
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_admin_statements_are_pinned() {
        let dialect = Dialect::MySql;
        insta::assert_snapshot!(admin::tests::render(dialect, dialect.admin()));
    }

    // The limited claim's and the limits' statements.
    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_limit_statements_are_pinned() {
        insta::assert_snapshot!(limits::tests::render(Dialect::Postgres.limits()));
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_limit_statements_are_pinned() {
        insta::assert_snapshot!(limits::tests::render(Dialect::Sqlite.limits()));
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_limit_statements_are_pinned() {
        insta::assert_snapshot!(limits::tests::render(Dialect::MySql.limits()));
    }

    #[test]
    fn column_list_is_the_entitys() {
        let entity: Vec<&str> = task_run::Column::iter()
            .map(|c| sea_orm::IdenStatic::as_str(&c))
            .collect();
        assert_eq!(columns!(), entity.join(", "));
    }
}
