//! Online builds: the same schema as the frozen migrations, built while `task_run` keeps
//! taking writes.
//!
//! The frozen migrations build every index with a plain `CREATE INDEX` (PostgreSQL: a
//! SHARE lock, every insert waits for the whole build). Each of them is idempotent: it
//! skips an index or column that is already there. An online run uses that: before a
//! migration runs, [`up_online`] builds what it would build, online, outside any
//! transaction, with the same names and definitions; then the frozen migration runs as
//! ever, finds everything in place, and sea-orm-migration records it in the ledger.
//! The schema is the one the migrations leave (the snapshot tests compare both ways).
//!
//! | dialect | indexes | columns |
//! |---|---|---|
//! | PostgreSQL | `CREATE [UNIQUE] INDEX CONCURRENTLY`; a rebuilt index (the claim index, the unique index of scopes) is built under a new name, the old one dropped `CONCURRENTLY` and the new one renamed | `ADD COLUMN` with a constant default: a catalog change under a brief ACCESS EXCLUSIVE lock |
//! | MySQL/MariaDB | `ALGORITHM=INPLACE, LOCK=NONE` | the strongest form the server accepts: `INSTANT`, then `INPLACE, LOCK=NONE`, then `COPY, LOCK=SHARED`; the generated columns behind the unique indexes VIRTUAL (`INSTANT`) in a run that goes through step 12, which makes them so (a STORED one is always a copy: writes wait) |
//! | SQLite | the migrations as they are (one process writes at a time anyway); each step timed | |
//!
//! Every statement that takes a lock writers queue behind runs with
//! [`OnlineOptions::lock_timeout`] (PostgreSQL `lock_timeout`, MySQL `lock_wait_timeout`)
//! and is retried up to [`OnlineOptions::attempts`] times when it times out. A
//! PostgreSQL build itself waits, as long as it takes, for the transactions older than
//! it: its SHARE UPDATE EXCLUSIVE lock never blocks a writer.
//!
//! A build that fails or is killed leaves an INVALID index on PostgreSQL. The next run
//! (and the migrate command's `up` in either mode) drops it and builds it again
//! ([`invalid_indexes`] lists them; `migrate status` shows them).
//!
//! Unique indexes on a live table: existing duplicates are resolved first (keep the
//! oldest; nothing is deleted), then the index is built. A guard trigger serialises the
//! writers of each key and refuses a duplicate as the index will, until the build is
//! done: on PostgreSQL installed before the resolution, so the build meets none; on
//! MySQL/MariaDB after the first resolution (creating a trigger waits for every open
//! transaction there), so from the second attempt on. A duplicate that still reaches
//! the build (written before the guard; a writer whose snapshot predates another's
//! commit) makes it fail with a unique violation; the invalid index is
//! dropped, the new duplicates are resolved the same way, and the build runs again.
//! Once the index is valid the database refuses every further duplicate.

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DatabaseConnection, Statement};

use crate::sql::Dialect;
use crate::{CompatReport, Migrator, SchemaError};

/// How an online run waits for locks and retries.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OnlineOptions {
    /// The longest a statement waits for a lock that writers queue behind (an
    /// `ADD COLUMN`, a rename; on MySQL/MariaDB each `ALTER TABLE`'s metadata lock)
    /// before it gives up and is retried: this on the first attempt, twice this on the
    /// second, and so on (a table too busy for one wait gets a longer one; writers wait
    /// at most that long behind it). Default 1 s; MySQL/MariaDB round it up to whole
    /// seconds.
    pub lock_timeout: Duration,
    /// How many times a statement or a build runs before the run gives up: after a lock
    /// timeout, a deadlock, or a unique build that met duplicates written meanwhile.
    /// Default 10. On MySQL/MariaDB, a unique build's attempts after the first half
    /// block writes for the build ([`Method::InPlaceShared`]), and its last, after
    /// duplicates failed the others, locks the table from the resolution of
    /// duplicates to the end of the build ([`Method::Locked`]).
    pub attempts: u32,
    /// The pause before a retry, multiplied by the attempt's number. Default 200 ms.
    pub retry_delay: Duration,
}

impl Default for OnlineOptions {
    fn default() -> Self {
        OnlineOptions {
            lock_timeout: Duration::from_secs(1),
            attempts: 10,
            retry_delay: Duration::from_millis(200),
        }
    }
}

impl OnlineOptions {
    /// Refuses options an online run cannot work with.
    ///
    /// # Errors
    /// [`OnlineError::InvalidOptions`]: a `lock_timeout` of zero (it would wait without
    /// bound, with writers queued behind it) or above an hour, `attempts` of zero or
    /// above 1000, a `retry_delay` above a minute.
    pub fn validate(&self) -> Result<(), OnlineError> {
        let invalid = |why: &str| Err(OnlineError::InvalidOptions(why.to_owned()));
        if self.lock_timeout.is_zero() || self.lock_timeout > Duration::from_secs(3600) {
            return invalid("lock_timeout must be more than 0 and at most 1 hour");
        }
        if self.attempts == 0 || self.attempts > 1000 {
            return invalid("attempts must be between 1 and 1000");
        }
        if self.retry_delay > Duration::from_secs(60) {
            return invalid("retry_delay must be at most 1 minute");
        }
        Ok(())
    }
}

/// How a change was made, and so what writers saw meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Method {
    /// PostgreSQL `CREATE INDEX CONCURRENTLY`: writers never wait.
    Concurrently,
    /// A catalog-only change under a brief lock (PostgreSQL `ADD COLUMN` with a constant
    /// default, MySQL `ALGORITHM=INSTANT`, a rename, a `DROP INDEX CONCURRENTLY`).
    Instant,
    /// MySQL/MariaDB `ALGORITHM=INPLACE, LOCK=NONE`: writers never wait but at its
    /// start and end, for the metadata lock.
    InPlace,
    /// MySQL/MariaDB `ALGORITHM=COPY, LOCK=SHARED`: the table is copied, reads go on,
    /// writes wait until it is done.
    Copy,
    /// MySQL/MariaDB `ALGORITHM=INPLACE, LOCK=SHARED`: a unique build that kept meeting
    /// duplicates written during its online attempts; reads go on, writes wait for it.
    InPlaceShared,
    /// MySQL/MariaDB, the last attempt of a unique build after duplicates failed the
    /// others: `task_run` locked (`LOCK TABLES ... WRITE`) from the resolution of
    /// duplicates to the end of an `ALGORITHM=INPLACE, LOCK=SHARED` build; reads and
    /// writes waited.
    Locked,
    /// A plain migration step (SQLite, or a table created by this run): no concurrent
    /// writers to protect.
    Blocking,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Concurrently => "online, CONCURRENTLY",
            Method::Instant => "online, catalog only",
            Method::InPlace => "online, ALGORITHM=INPLACE LOCK=NONE",
            Method::Copy => "NOT online: ALGORITHM=COPY LOCK=SHARED, writes waited",
            Method::Locked => {
                "NOT online: the table locked for the last attempt after duplicates kept \
                 arriving, reads and writes waited"
            }
            Method::InPlaceShared => {
                "NOT online: ALGORITHM=INPLACE LOCK=SHARED after duplicates kept arriving, \
                 writes waited"
            }
            Method::Blocking => "blocking",
        })
    }
}

/// One change an online run made.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Change {
    /// The migration it belongs to (its name in the ledger).
    pub migration: String,
    /// What changed: an index, `column <name>`, `drop <index>`, `rename <a> to <b>`, or
    /// the whole migration step (SQLite).
    pub object: String,
    /// How.
    pub method: Method,
    /// How long it took, retries included.
    pub duration: Duration,
    /// How many times it ran (1 unless it was retried).
    pub attempts: u32,
    /// Duplicate rows resolved before the build (cancelled, or marked `concurrent`).
    pub resolved_duplicates: u64,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} ({}) in {:.3} s",
            self.migration,
            self.object,
            self.method,
            self.duration.as_secs_f64()
        )?;
        if self.attempts > 1 {
            write!(f, ", {} attempts", self.attempts)?;
        }
        if self.resolved_duplicates > 0 {
            write!(f, ", {} duplicate(s) resolved", self.resolved_duplicates)?;
        }
        Ok(())
    }
}

/// What [`up_online`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OnlineReport {
    /// `task_run` did not exist: the migrations ran as they are (nothing to protect).
    pub fresh: bool,
    /// INVALID indexes found (left by a failed or killed build) and dropped; they were
    /// built again below.
    pub repaired: Vec<String>,
    /// The migrations applied, in order.
    pub applied: Vec<String>,
    /// Every change, in order.
    pub changes: Vec<Change>,
}

/// Why an online run stopped. What it built stays built; running it again picks up
/// where it stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OnlineError {
    /// [`OnlineOptions::validate`] refused the options; nothing ran.
    #[error("invalid online migration options: {0}")]
    InvalidOptions(String),
    /// A statement still failed after [`OnlineOptions::attempts`] runs.
    #[error("{object}: gave up after {attempts} attempt(s) ({why}): {last}")]
    GaveUp {
        /// The index or column.
        object: String,
        /// How many times it ran.
        attempts: u32,
        /// Lock timeouts, or duplicates that kept arriving.
        why: &'static str,
        /// The last error.
        last: DbErr,
    },
    /// A database error.
    #[error(transparent)]
    Database(#[from] DbErr),
}

/// Applies the pending migrations of the standalone [`Migrator`] (at most `steps`), each
/// one's indexes built online first (see the [module](self)), after dropping the INVALID
/// indexes earlier builds left ([`repair_invalid_indexes`]). A database without
/// `task_run` is migrated as [`Migrator::up`] does: there is nothing to protect.
///
/// # Errors
/// [`OnlineError::InvalidOptions`] before anything runs; [`OnlineError::GaveUp`] when a
/// statement kept timing out or a unique build kept meeting new duplicates;
/// [`OnlineError::Database`] otherwise (`DbErr::BackendNotSupported` without a sqlx pool
/// of PostgreSQL or MySQL/MariaDB).
pub async fn up_online(
    db: &DatabaseConnection,
    steps: Option<u32>,
    options: &OnlineOptions,
) -> Result<OnlineReport, OnlineError> {
    options.validate()?;
    let mut run = Run::new(db, options)?;
    let manager = SchemaManager::new(db);
    let mut report = OnlineReport {
        fresh: !manager.has_table("task_run").await?,
        ..OnlineReport::default()
    };
    let blocking = report.fresh || run.dialect == Dialect::Sqlite;
    if !blocking {
        report.repaired = run.repair_applied().await?;
    }
    let pending = Migrator::get_pending_migrations(db).await?;
    let limit = steps.map_or(usize::MAX, |n| n as usize);
    let pending = &pending[..pending.len().min(limit)];
    run.virtual_markers = pending.iter().any(|m| m.name() == VIRTUAL_MARKERS);
    for migration in pending {
        let name = migration.name().to_owned();
        let started = Instant::now();
        if !blocking {
            run.prepare(&name).await?;
        }
        Migrator::up(db, Some(1)).await?;
        if blocking {
            run.record(&name, name.clone(), Method::Blocking, started, 1, 0);
        }
        report.applied.push(name);
    }
    report.changes = run.take_changes();
    Ok(report)
}

/// Builds, online, everything task-dedup's migrations would still build on `db`, in
/// their order, without recording anything: for an application that splices
/// [`migrations()`](crate::migrations) into its own migrator. Run it before that
/// migrator, which then finds every index in place and only records the steps. Drops
/// and rebuilds INVALID indexes first. Nothing to do (an empty report with `fresh`) when
/// `task_run` does not exist yet.
///
/// # Errors
/// As [`up_online`].
pub async fn prepare_online(
    db: &DatabaseConnection,
    options: &OnlineOptions,
) -> Result<OnlineReport, OnlineError> {
    options.validate()?;
    let run = Run::new(db, options)?;
    let mut report = OnlineReport {
        fresh: !SchemaManager::new(db).has_table("task_run").await?,
        ..OnlineReport::default()
    };
    if report.fresh || run.dialect == Dialect::Sqlite {
        return Ok(report);
    }
    report.repaired = run.repair().await?;
    for migration in crate::migrations() {
        run.prepare(migration.name()).await?;
    }
    report.changes = run.take_changes();
    Ok(report)
}

/// [`ensure_schema`](crate::ensure_schema), online: the same checks (a table it cannot
/// fix is refused before anything changes), the same result, but every index is built
/// online and every `ALTER TABLE` bounded by [`OnlineOptions::lock_timeout`], outside
/// any transaction; each change is listed in [`CompatReport::online`]. Duplicate active
/// rows are resolved first, and again when a unique build meets new ones (see the
/// [module](self)). MySQL/MariaDB: `utf8mb4` `VARCHAR` key columns take the server's
/// byte-exact collation online (no copy); key columns of any other type or character
/// set are converted to `VARBINARY`, which copies the table (reads go on, writes
/// wait), and so does step 12 on STORED generated columns the table already has; new
/// ones are added VIRTUAL, instantly. SQLite, or no
/// `task_run` yet: [`ensure_schema`](crate::ensure_schema) itself.
///
/// # Errors
/// As [`ensure_schema`](crate::ensure_schema), and [`SchemaError::Online`] when an online
/// build gave up; what was built stays, and calling again picks up where it stopped.
pub async fn ensure_schema_online(
    db: &DatabaseConnection,
    options: &OnlineOptions,
) -> Result<CompatReport, SchemaError> {
    options.validate()?;
    let run = Run::new(db, options)?;
    let manager = SchemaManager::new(db);
    if run.dialect == Dialect::Sqlite || !manager.has_table("task_run").await? {
        return crate::ensure_schema(db).await;
    }
    run.repair().await?;
    crate::compat::ensure_schema_in(&manager, run.dialect, Some(&run)).await
}

/// Drops the INVALID indexes of `task_run` that task-dedup builds (PostgreSQL; what a
/// failed or killed `CREATE INDEX CONCURRENTLY` leaves) and builds those of the
/// migrations the standalone [`Migrator`]'s ledger records as applied again, online.
/// An INVALID index still counts for `has_index`, so a migration would take it for
/// built: the migrate command's `up` calls this first in either mode, and
/// [`up_online`], [`prepare_online`] and [`ensure_schema_online`] do the same. The
/// indexes of pending migrations are left to them. Both server dialects also drop the
/// guard a killed run left (its triggers; on MySQL/MariaDB its table of keys). Nothing
/// to do on SQLite.
///
/// # Errors
/// As [`up_online`].
pub async fn repair_invalid_indexes(
    db: &DatabaseConnection,
    options: &OnlineOptions,
) -> Result<OnlineReport, OnlineError> {
    options.validate()?;
    let run = Run::new(db, options)?;
    let repaired = run.repair_applied().await?;
    Ok(OnlineReport {
        repaired,
        changes: run.take_changes(),
        ..OnlineReport::default()
    })
}

/// The INVALID indexes of `task_run` (PostgreSQL: `pg_index.indisvalid` false; an index
/// a failed or killed `CREATE INDEX CONCURRENTLY` left), by name, whoever built them.
/// Always empty on SQLite and MySQL/MariaDB, which never leave one.
///
/// # Errors
/// A database error.
pub async fn invalid_indexes<C: ConnectionTrait>(db: &C) -> Result<Vec<String>, DbErr> {
    if db.get_database_backend() != sea_orm_migration::sea_orm::DbBackend::Postgres {
        return Ok(Vec::new());
    }
    let rows = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            INVALID_INDEXES,
        ))
        .await?;
    rows.iter().map(|row| row.try_get("", "name")).collect()
}

/// `task_run`'s INVALID indexes, by name (PostgreSQL).
const INVALID_INDEXES: &str = "SELECT c.relname::text AS name FROM pg_index i \
    JOIN pg_class c ON c.oid = i.indexrelid \
    WHERE i.indrelid = to_regclass('task_run') AND NOT i.indisvalid ORDER BY 1";

/// The step that makes MySQL/MariaDB's generated key columns VIRTUAL.
const VIRTUAL_MARKERS: &str = "m20261206_000012_task_dedup_virtual_markers";

/// What an online run shares between its steps.
pub(crate) struct Run<'a> {
    pub(crate) db: &'a DatabaseConnection,
    pub(crate) dialect: Dialect,
    // Read by the server dialects' builds only.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) options: &'a OnlineOptions,
    /// MySQL/MariaDB: [`VIRTUAL_MARKERS`] is among this run's steps, so the generated
    /// columns of earlier steps are added VIRTUAL (instantly) rather than STORED (a
    /// table copy each) only for that step to convert them. True unless `up_online`
    /// stops before it.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) virtual_markers: bool,
    /// MySQL/MariaDB, with `virtual_markers`: the plain columns of every step are in
    /// place (added before the first step's own work; later steps skip the check).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) plain_columns_added: AtomicBool,
    changes: Mutex<Vec<Change>>,
}

impl<'a> Run<'a> {
    pub(crate) fn new(
        db: &'a DatabaseConnection,
        options: &'a OnlineOptions,
    ) -> Result<Run<'a>, DbErr> {
        let dialect = Dialect::of(&SchemaManager::new(db))?;
        Ok(Run {
            db,
            dialect,
            options,
            virtual_markers: true,
            plain_columns_added: AtomicBool::new(false),
            changes: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn manager(&self) -> SchemaManager<'a> {
        SchemaManager::new(self.db)
    }

    /// Records a change (and says so through `tracing`).
    pub(crate) fn record(
        &self,
        migration: &str,
        object: String,
        method: Method,
        started: Instant,
        attempts: u32,
        resolved_duplicates: u64,
    ) {
        let change = Change {
            migration: migration.to_owned(),
            object,
            method,
            duration: started.elapsed(),
            attempts,
            resolved_duplicates,
        };
        tracing::info!("{change}");
        self.lock().push(change);
    }

    pub(crate) fn take_changes(&self) -> Vec<Change> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Change>> {
        self.changes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// [`Run::repair`], then builds again what the applied migrations built.
    async fn repair_applied(&self) -> Result<Vec<String>, OnlineError> {
        let repaired = self.repair().await?;
        if !repaired.is_empty() {
            // Read-only: never creates the standalone ledger in an application's database.
            for migration in Migrator::get_applied_migrations_read_only(self.db).await? {
                self.prepare(migration.name()).await?;
            }
        }
        Ok(repaired)
    }

    async fn repair(&self) -> Result<Vec<String>, OnlineError> {
        match self.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => postgres::repair(self).await,
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::repair(self).await,
            _ => Ok(Vec::new()),
        }
    }
}

impl Run<'_> {
    /// Builds, online, what migration `name` builds (each dialect's file says how).
    pub(crate) async fn prepare(&self, name: &str) -> Result<(), OnlineError> {
        let run = self;
        match run.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => postgres::prepare(run, name).await,
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::prepare(run, name).await,
            // One writer at a time: the migration itself, timed.
            Dialect::Sqlite => {
                let _ = name;
                Ok(())
            }
            #[allow(unreachable_patterns)]
            _ => Err(not_built()),
        }
    }

    /// Runs an `ALTER TABLE` of the compat patch: PostgreSQL under `lock_timeout`,
    /// retried; MySQL/MariaDB in the strongest form the server accepts.
    pub(crate) async fn alter(
        &self,
        migration: &str,
        object: String,
        sql: &str,
    ) -> Result<(), OnlineError> {
        match self.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => postgres::alter(self, migration, &object, sql).await,
            #[cfg(feature = "mysql")]
            Dialect::MySql => mysql::alter(self, migration, &object, sql).await,
            Dialect::Sqlite => {
                // Not recorded: SQLite's steps are plain migrations.
                let _ = (migration, object);
                crate::sql::run(&self.manager(), &[sql]).await?;
                Ok(())
            }
            #[allow(unreachable_patterns)]
            _ => Err(not_built()),
        }
    }
}

#[allow(dead_code)]
fn not_built() -> OnlineError {
    OnlineError::Database(DbErr::BackendNotSupported {
        db: "this dialect",
        ctx: "task-dedup-migration online builds (enable its feature)",
    })
}

/// A migration no online plan covers: refused rather than built blocking unawares.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
fn unplanned(name: &str) -> OnlineError {
    OnlineError::Database(DbErr::Migration(format!(
        "no online plan for migration {name}"
    )))
}

/// After a lock wait expired (`timeout`: the setting that bounded it): a warning naming
/// what the dialect's query found holding `task_run`'s lock longest, so that an operator
/// knows what to end or wait for; nothing when nothing holds it any more.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn report_holder(
    object: &str,
    attempt: u32,
    timeout: &str,
    holder: Result<Option<String>, sea_orm_migration::sea_orm::sqlx::Error>,
) {
    match holder {
        Ok(Some(holder)) => tracing::warn!(
            object,
            attempt,
            "{timeout} expired waiting for a lock on task_run; it is held longest by {holder}"
        ),
        Ok(None) => {}
        Err(err) => tracing::debug!(%err, "could not read who holds task_run's lock"),
    }
}

/// Whether `err` is a deadlock (PostgreSQL 40P01, MySQL/MariaDB 1213, SQLSTATE 40001):
/// the resolution of duplicates, an UPDATE, can meet writers that way, and runs again.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) fn is_deadlock(err: &DbErr) -> bool {
    use sea_orm_migration::sea_orm::RuntimeErr;
    let (DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e))) = err
    else {
        return false;
    };
    let code = e.as_database_error().and_then(|d| d.code());
    matches!(code.as_deref(), Some("40P01" | "40001"))
}

/// The pause before retry `attempt` (1-based), on the server, so that this crate needs
/// no runtime of its own.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn retry_pause(options: &OnlineOptions, attempt: u32) -> Duration {
    options.retry_delay.saturating_mul(attempt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_validated() {
        assert!(OnlineOptions::default().validate().is_ok());
        for bad in [
            OnlineOptions {
                lock_timeout: Duration::ZERO,
                ..OnlineOptions::default()
            },
            OnlineOptions {
                attempts: 0,
                ..OnlineOptions::default()
            },
            OnlineOptions {
                retry_delay: Duration::from_secs(61),
                ..OnlineOptions::default()
            },
        ] {
            assert!(matches!(
                bad.validate(),
                Err(OnlineError::InvalidOptions(_))
            ));
        }
    }

    #[test]
    fn changes_say_how_and_how_long() {
        let change = Change {
            migration: "m".to_owned(),
            object: "task_active_resource_uidx".to_owned(),
            method: Method::Concurrently,
            duration: Duration::from_millis(1500),
            attempts: 2,
            resolved_duplicates: 1,
        };
        assert_eq!(
            change.to_string(),
            "m: task_active_resource_uidx (online, CONCURRENTLY) in 1.500 s, 2 attempts, \
             1 duplicate(s) resolved"
        );
    }
}
