//! The dialects: every statement as a whole SQL text, and the error codes that say what
//! a failure means. Nothing here runs SQL; the [executor](crate::executor) does.
//!
//! Each dialect is a folder: its statements in SQL files by family (`enqueue.sql`,
//! `claim.sql`, `lifecycle.sql`, `endings.sql`, `bulk.sql`, `limits.sql`, `admin.sql`,
//! `maintenance.sql`, `schema.sql`, and PostgreSQL's `wakeups.sql`), the same names in
//! each, and `mod.rs`, which reads them into the tables below once per process
//! ([`render`], the one step between a file and the texts the database runs) and holds
//! the dialect's named error codes with the function that classifies them ([`Kind`]).
//! A statement's parameters and the reasons for its shape are `--` comments beside it in
//! its file; the fields below say what each statement is for.

use sea_orm::{DbBackend, DbErr};

pub(crate) use self::admin::{Admin, ListShape};
use self::render::{Files, Template};

/// The statements two or more dialects run word for word (`shared.sql`), read by each as
/// from its own files.
pub(crate) const SHARED: (&str, &str) = ("shared.sql", include_str!("shared.sql"));

pub(crate) mod admin;
pub(crate) mod limits;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod render;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

/// The statements every dialect has, with the same meaning and the same parameters,
/// listed in each field's doc in the order they appear in the text (MySQL's `?` are
/// positional). PostgreSQL and SQLite writes end in `RETURNING` the row; MySQL has no
/// `RETURNING`, and reads the row by id in the same transaction.
pub(crate) struct Statements {
    /// Inserts a new task unless its key is held (the 12 values of
    /// `executor::args::row`). PostgreSQL/SQLite: `DO NOTHING RETURNING id`, a row when
    /// inserted; MySQL: a plain INSERT whose duplicate-key error on the unique index
    /// means "held".
    pub insert: String,
    /// A hit in one statement (PostgreSQL; `None` where the dialect has no such form):
    /// inserts a new task as [`insert`](Self::insert) does (the same values) and returns
    /// its row, or else the task holding its key as the statement's snapshot sees it. No
    /// row: the holder committed after that snapshot, read it with
    /// [`find_occupant_after_conflict`](Self::find_occupant_after_conflict).
    pub insert_or_find: Option<String>,
    /// The task holding a key: user_id, task_type, resource_key, dedup_window_end.
    pub find_occupant: String,
    /// The same, right after a conflict: it must see the row that caused it even from a
    /// REPEATABLE READ snapshot that predates it (MySQL: a locking read).
    pub find_occupant_after_conflict: String,
    /// One task by id: id.
    pub by_id: String,
    /// Extends the lease: lease, id, worker_id.
    pub heartbeat: String,
    /// running → succeeded: result, id, worker_id.
    pub complete: String,
    /// running → failed: error, id, worker_id.
    pub fail: String,
    /// running → queued after a backoff, the key still held: error, delay, id,
    /// worker_id.
    pub retry: String,
    /// queued or running → cancelled: reason, id.
    pub cancel: String,
    /// running → queued, lease cleared, the attempt not counted (a worker shutting down
    /// hands the task back): id, worker_id.
    pub release: String,
    /// running → queued after a delay, lease cleared, the attempt not counted and the
    /// snooze counted (a handler's "run me again in d"), the key still held: delay, id,
    /// worker_id.
    pub snooze: String,
    /// Running tasks whose lease expired, at most 100: no parameters. Selects `id` and
    /// `attempts`.
    pub expired: String,
    /// An expired task → failed, unless its lease was renewed meanwhile: error, id.
    pub reap_fail: String,
    /// An expired task → queued after a backoff, lease cleared, unless its lease was
    /// renewed meanwhile: delay, id.
    pub reap_requeue: String,
    /// Deletes a batch of the oldest finished tasks of one status that finished more than
    /// an age ago and whose period window (if any) is over: status, minus the age (an
    /// offset from now, like the others), how many at most. MySQL/MariaDB: selects and
    /// locks that batch's ids (`SKIP LOCKED`), which `mysql::prune_ids` then deletes.
    pub prune: String,
    /// Pauses a task type unless it is paused; one row affected when it was not: type.
    pub pause: String,
    /// Resumes a paused task type; one row affected when it was paused: type.
    pub resume: String,
    /// The paused types (`task_type`, `paused_at`), by name: no parameters.
    pub paused: String,
    /// One row (`present`) when `task_run` has a valid unique index named
    /// `task_running_resource_uidx`, none otherwise: whether an optimistic claim can
    /// rely on it ([`Claim`]).
    pub running_index: String,
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

impl Statements {
    /// The statements every dialect has, from its files: the read right after a conflict
    /// is `find_occupant` unless the dialect's `enqueue.sql` has its own
    /// `find_occupant_after_conflict` (MySQL/MariaDB: a locking read); `insert_or_find`
    /// where it has one (PostgreSQL).
    pub(crate) fn read(files: &mut Files) -> Statements {
        let find_occupant = files.text("enqueue", "find_occupant");
        let enqueue = files.file("enqueue");
        let insert_or_find = enqueue.optional("insert_or_find");
        let find_occupant_after_conflict = enqueue
            .optional("find_occupant_after_conflict")
            .unwrap_or_else(|| find_occupant.clone());
        Statements {
            insert: files.text("enqueue", "insert"),
            insert_or_find,
            find_occupant,
            find_occupant_after_conflict,
            by_id: files.text("enqueue", "by_id"),
            heartbeat: files.text("lifecycle", "heartbeat"),
            complete: files.text("lifecycle", "complete"),
            fail: files.text("lifecycle", "fail"),
            retry: files.text("lifecycle", "retry"),
            cancel: files.text("lifecycle", "cancel"),
            release: files.text("lifecycle", "release"),
            snooze: files.text("lifecycle", "snooze"),
            expired: files.text("lifecycle", "expired"),
            reap_fail: files.text("lifecycle", "reap_fail"),
            reap_requeue: files.text("lifecycle", "reap_requeue"),
            prune: files.text("maintenance", "prune"),
            pause: files.text("maintenance", "pause"),
            resume: files.text("maintenance", "resume"),
            paused: files.text("maintenance", "paused"),
            running_index: files.text("schema", "running_index"),
        }
    }
}

/// What PostgreSQL and SQLite do in one statement with `RETURNING`, and MySQL/MariaDB in
/// flows of their own (`executor::mysql`).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) struct Returning {
    /// [`OnConflict::ReplaceIfQueued`](crate::OnConflict::ReplaceIfQueued): the INSERT
    /// with `DO UPDATE ... WHERE status = 'queued' RETURNING` the row (the values of
    /// [`Statements::insert`]).
    pub replace: String,
    /// Claims the next due queued tasks of any type: worker_id, lease, how many. Each
    /// claim statement has a text for a claim of up to the given number of tasks
    /// ([`Template::at`]: PostgreSQL has one per power of two, so that its plan is cached,
    /// [`render::bound`]; SQLite one).
    pub claim_any: Template,
    /// The same for some task types: worker_id, lease, task types (PostgreSQL an array,
    /// SQLite a JSON array), how many.
    pub claim_types: Template,
    /// [`claim_any`](Self::claim_any) without looking for running tasks of the keys:
    /// `task_running_resource_uidx` refuses a claim that would start a second run of a
    /// key ([`Kind::RunningKey`]), and then it took nothing. See [`Claim`].
    pub optimistic_claim_any: Template,
    /// [`claim_types`](Self::claim_types), optimistic alike.
    pub optimistic_claim_types: Template,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl Returning {
    /// The replace of `enqueue.sql` and the claims of `claim.sql`.
    pub(crate) fn read(files: &mut Files) -> Returning {
        Returning {
            replace: files.text("enqueue", "replace"),
            claim_any: files.template("claim", "claim_any"),
            claim_types: files.template("claim", "claim_types"),
            optimistic_claim_any: files.template("claim", "optimistic_claim_any"),
            optimistic_claim_types: files.template("claim", "optimistic_claim_types"),
        }
    }
}

/// The statements of `find_or_enqueue_many`, for a chunk of tasks. PostgreSQL binds one
/// array per column, whatever the number of rows (its texts are constants); SQLite and
/// MySQL/MariaDB bind one value per row and column: their texts repeat a row's
/// placeholders per task (the lists `rows` of the inserts, `keys` of the reads of
/// holders, `ids` of `by_ids`).
pub(crate) struct Bulk {
    /// Rows per chunk: within SQLite's 32,766 and MySQL's 65,535 placeholders, and a
    /// statement size every server takes.
    pub chunk: usize,
    /// Inserts the rows, skipping those whose key is held. PostgreSQL/SQLite return the
    /// ids that went in; MySQL's `ON DUPLICATE KEY UPDATE id = id` changes nothing on a
    /// conflict (not `INSERT IGNORE`, which would also silence other errors).
    pub insert: Template,
    /// The same, replacing the payload, run_at and priority of a queued task holding the
    /// key (`ReplaceIfQueued`). PostgreSQL/SQLite return the rows inserted or updated.
    pub replace: Template,
    /// The tasks holding the given keys and windows, in the caller's transaction (MySQL:
    /// a locking read, which sees rows committed after the caller's snapshot).
    pub find_occupants: Template,
    /// The same, in a transaction of the crate's own whose first read comes after its
    /// insert: the snapshot already holds every row the insert conflicted with, and
    /// the insert's locks keep them as they are. MySQL: a plain read, because a locking
    /// read of a thousand keys waits on rows other batches are inserting, and they on
    /// its locks (a deadlock in one storm out of five of 16 overlapping batches).
    pub find_occupants_after_own_insert: Template,
    /// The tasks of the given ids.
    pub by_ids: Template,
}

impl Bulk {
    /// The statements of `bulk.sql`, in chunks of `chunk` rows: the read after the
    /// crate's own insert is `find_occupants` unless the file has its own (MySQL/MariaDB:
    /// a plain read beside its locking one).
    pub(crate) fn read(files: &mut Files, chunk: usize) -> Bulk {
        let bulk = files.file("bulk");
        let find_occupants = bulk.template("find_occupants");
        let after_own_insert = if bulk.has("find_occupants_after_own_insert") {
            bulk.template("find_occupants_after_own_insert")
        } else {
            bulk.template("find_occupants")
        };
        Bulk {
            chunk,
            insert: bulk.template("insert"),
            replace: bulk.template("replace"),
            find_occupants,
            find_occupants_after_own_insert: after_own_insert,
            by_ids: bulk.template("by_ids"),
        }
    }
}

/// The statements a [`Worker`](crate::Worker) records a batch of task endings with, for
/// `rows` tasks of one shape. Each is a compare-and-set per row on `status = 'running'`
/// and the worker's `lease_owner`, as the single transitions are: a row another worker
/// holds now, or that is no longer running, is left as it is. PostgreSQL and SQLite
/// return the ids of the rows they changed; MySQL/MariaDB (no `RETURNING` in MySQL 8,
/// none on `UPDATE` in MariaDB) report a count, and when it falls short the rows are read
/// back in the same transaction (`mysql::Sql::ended_by`). PostgreSQL binds one array per
/// column (constant texts); SQLite and MySQL/MariaDB bind values per row (the list
/// `rows`), at most five
/// (MySQL's retry), so a batch of [`MAX_END_BATCH`](crate::MAX_END_BATCH) rows stays
/// within SQLite's 32,766 and MySQL's 65,535 placeholders.
pub(crate) struct Endings {
    /// running → succeeded, each with its result (`Statements::complete` per row).
    pub complete: Template,
    /// running → failed, each with its error (`Statements::fail` per row).
    pub fail: Template,
    /// running → queued, each with its error and its delay, the key still held
    /// (`Statements::retry` per row). A row whose key a queued follow-up took fails the
    /// whole statement with a held-key error: the caller records those one by one.
    pub retry: Template,
}

impl Endings {
    /// The statements of `endings.sql`.
    pub(crate) fn read(files: &mut Files) -> Endings {
        let endings = files.file("endings");
        Endings {
            complete: endings.template("complete"),
            fail: endings.template("fail"),
            retry: endings.template("retry"),
        }
    }
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
            Dialect::Postgres => &postgres::sql().statements,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => &sqlite::sql().statements,
            #[cfg(feature = "mysql")]
            Dialect::MySql => &mysql::sql().statements,
        }
    }

    pub(crate) fn bulk(self) -> &'static Bulk {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => &postgres::sql().bulk,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => &sqlite::sql().bulk,
            #[cfg(feature = "mysql")]
            Dialect::MySql => &mysql::sql().bulk,
        }
    }

    pub(crate) fn endings(self) -> &'static Endings {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => &postgres::sql().endings,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => &sqlite::sql().endings,
            #[cfg(feature = "mysql")]
            Dialect::MySql => &mysql::sql().endings,
        }
    }

    pub(crate) fn admin(self) -> &'static Admin {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => &postgres::sql().admin,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => &sqlite::sql().admin,
            #[cfg(feature = "mysql")]
            Dialect::MySql => &mysql::sql().admin,
        }
    }

    pub(crate) fn limits(self) -> &'static limits::Limits {
        match self {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => &postgres::sql().limits,
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => &sqlite::sql().limits,
            #[cfg(feature = "mysql")]
            Dialect::MySql => &mysql::sql().limits,
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
        // sqlx's acquire tries to connect until its timeout and then reports the timeout,
        // not why: a server that is down or being replaced looks exactly like a pool whose
        // connections are all busy. Both can pass within a retry budget.
        if matches!(
            err,
            DbErr::ConnectionAcquire(sea_orm::ConnAcquireErr::Timeout)
        ) {
            return Kind::ConnectionLost;
        }
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

    use super::render::{File, Template};
    use super::*;
    use task_dedup_entity::task_run;

    /// The claim size whose statements the snapshots pin: PostgreSQL's texts for a
    /// bound of 8, which differ from the other bounds' only in that number.
    pub(crate) const PINNED_MAX: i64 = 8;

    /// How many elements each list has in the pinned texts.
    const PINNED_LIST: usize = 2;

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

    /// Every statement of a dialect's files as the database sees it, by file and name:
    /// PostgreSQL's claims at the pinned bound, every list with [`PINNED_LIST`]
    /// elements.
    pub(crate) fn rendered(files: &[(&'static str, &'static str)]) -> Vec<(String, String)> {
        let mut all = Vec::new();
        for (path, text) in files {
            let family = path
                .rsplit('/')
                .next()
                .and_then(|f| f.strip_suffix(".sql"))
                .unwrap_or(path);
            let names: Vec<&str> = text
                .lines()
                .filter_map(|line| line.trim().strip_prefix("-- name:"))
                .map(str::trim)
                .collect();
            let mut file = File::parse(path, text);
            for name in names {
                let template: &'static Template = Box::leak(Box::new(file.template(name)));
                let raw = template.at(PINNED_MAX).to_owned();
                let lists: Vec<(&str, usize)> = raw
                    .split("{{")
                    .skip(1)
                    .filter_map(|m| m.split([',', ' ', '}']).next())
                    .map(|name| (name, PINNED_LIST))
                    .collect();
                let lists: Vec<(&'static str, usize)> = lists
                    .into_iter()
                    .map(|(n, c)| (&*Box::leak(n.to_owned().into_boxed_str()), c))
                    .collect();
                all.push((
                    format!("{family}.{name}"),
                    template.render(PINNED_MAX, &lists).into_owned(),
                ));
            }
            assert!(file.finish().is_empty());
        }
        all
    }

    /// A file's statements as the snapshots pin them: each under its name, as the
    /// database sees it.
    fn pinned(files: &[(&'static str, &'static str)], family: &str) -> String {
        let prefix = format!("{family}.");
        rendered(files)
            .into_iter()
            .filter_map(|(key, sql)| {
                let name = key.strip_prefix(&prefix)?;
                Some(format!("-- name: {name}\n{sql};\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every statement of every file of a dialect, pinned as whole texts in `snapshots/`
    /// (a snapshot per file): a change to any of them shows up in review as a diff of the
    /// SQL the database sees. The files themselves hold the markers and the comments.
    fn pin_files(dialect: &str, files: &[(&'static str, &'static str)], problems: &[String]) {
        assert!(problems.is_empty(), "{problems:?}");
        for (path, _) in files {
            let family = path
                .rsplit('/')
                .next()
                .and_then(|f| f.strip_suffix(".sql"))
                .unwrap_or(path);
            insta::assert_snapshot!(format!("{dialect}_{family}"), pinned(files, family));
        }
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_statements_are_pinned() {
        pin_files("postgres", &postgres::FILES, &postgres::sql().problems);
        insta::assert_snapshot!("postgres_admin_lists", lists(Dialect::Postgres));
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_statements_are_pinned() {
        pin_files("sqlite", &sqlite::FILES, &sqlite::sql().problems);
        insta::assert_snapshot!("sqlite_admin_lists", lists(Dialect::Sqlite));
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_statements_are_pinned() {
        pin_files("mysql", &mysql::FILES, &mysql::sql().problems);
        insta::assert_snapshot!("mysql_admin_lists", lists(Dialect::MySql));
    }

    /// Every SQL file of a dialect's folder is one its table reads, and `shared.sql` is
    /// the only other: a file nothing includes would never reach the database.
    #[test]
    fn every_sql_file_is_read() {
        let dir = format!("{}/src/dialect", env!("CARGO_MANIFEST_DIR"));
        let mut on_disk = Vec::new();
        for folder in ["", "postgres", "sqlite", "mysql"] {
            let path = format!("{dir}/{folder}");
            for entry in std::fs::read_dir(&path).unwrap() {
                let name = entry.unwrap().file_name().into_string().unwrap();
                if name.ends_with(".sql") {
                    on_disk.push(if folder.is_empty() {
                        name
                    } else {
                        format!("{folder}/{name}")
                    });
                }
            }
        }
        on_disk.sort();
        let mut read: Vec<String> = vec![SHARED.0.to_owned()];
        #[cfg(feature = "postgres")]
        read.extend(postgres::FILES.iter().map(|(path, _)| (*path).to_owned()));
        #[cfg(feature = "sqlite")]
        read.extend(sqlite::FILES.iter().map(|(path, _)| (*path).to_owned()));
        #[cfg(feature = "mysql")]
        read.extend(mysql::FILES.iter().map(|(path, _)| (*path).to_owned()));
        read.sort();
        if cfg!(all(
            feature = "postgres",
            feature = "sqlite",
            feature = "mysql"
        )) {
            assert_eq!(read, on_disk);
        }
    }

    /// The statements two or more dialects share, pinned like each dialect's.
    #[test]
    fn shared_statements_are_pinned() {
        insta::assert_snapshot!("shared", pinned(&[SHARED], "shared"));
    }

    /// The admin list, built from parts: a few shapes.
    fn lists(dialect: Dialect) -> String {
        admin::tests::lists(dialect)
            .into_iter()
            .map(|(name, sql)| format!("-- {name}\n{sql};\n"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn column_list_is_the_entitys() {
        let entity: Vec<&str> = task_run::Column::iter()
            .map(|c| sea_orm::IdenStatic::as_str(&c))
            .collect();
        assert_eq!(render::COLUMNS, entity.join(", "));
    }
}
