//! PostgreSQL: every index `CONCURRENTLY`, on one connection of the pool held for the
//! run (its `lock_timeout` is the session's), outside any transaction.
//!
//! Each statement states the definition of the frozen migration that builds the same
//! index or column, word for word but for `CONCURRENTLY` (the snapshot tests compare the
//! schemas both ways leave).

use std::sync::Arc;
use std::time::Instant;

use sea_orm_migration::prelude::*;
// Every statement run here is one of this file's constants, or one made of this
// crate's index names and numbers: nothing comes from input.
use sea_orm_migration::sea_orm::sqlx::{self, AssertSqlSafe, PgConnection, pool::PoolConnection};
use sea_orm_migration::sea_orm::{DatabaseConnectionType, RuntimeErr};

use super::{Method, OnlineError, Run, retry_pause};
use crate::m20261130_000002_task_dedup_active_resource_uidx::cancel_duplicate_active;
use crate::m20261201_000005_task_dedup_serial_per_key::exempt_running_duplicates;
use crate::m20261207_000013_task_dedup_lean_indexes::{
    POSTGRES_DROPPED, POSTGRES_FILLFACTOR, POSTGRES_INDEXES, POSTGRES_RUNNING, RUNNING_INTERIM,
    running_is_lean,
};
use crate::sql::{self, Dialect};

/// Whether index `$1` of `task_run` exists, and whether it is valid.
const INDEX_STATE: &str = "SELECT i.indisvalid AS valid FROM pg_index i \
    JOIN pg_class c ON c.oid = i.indexrelid \
    WHERE i.indrelid = to_regclass('task_run') AND c.relname = $1";

/// The indexes task-dedup builds, final and interim names: the INVALID ones among them
/// are dropped by [`repair`] and built again.
const OURS: [&str; 18] = [
    "task_run_lookup_idx",
    "task_run_claim_idx",
    CLAIM_INTERIM,
    "task_active_resource_uidx",
    OCCUPIED_INTERIM,
    "task_running_resource_uidx",
    "task_run_finished_idx",
    "task_run_status_created_idx",
    "task_run_type_status_created_idx",
    "task_run_created_idx",
    "task_run_key_prefix_idx",
    "task_run_user_queue_idx",
    "task_run_slot_uidx",
    "task_run_queue_idx",
    "task_run_type_status_idx",
    "task_run_key_idx",
    "task_run_retention_idx",
    RUNNING_INTERIM,
];

// m20261130_000001_task_dedup_create_task_run (on a table that exists already).
const LOOKUP_INDEX: &str = "CREATE INDEX CONCURRENTLY task_run_lookup_idx ON task_run \
    (user_id, task_type, resource_key, status, created_at)";
const CLAIM_INDEX: &str =
    "CREATE INDEX CONCURRENTLY task_run_claim_idx ON task_run (status, created_at, id)";

// m20261130_000002_task_dedup_active_resource_uidx
const ACTIVE_INDEX: &str = "CREATE UNIQUE INDEX CONCURRENTLY \"task_active_resource_uidx\" \
    ON \"task_run\" (\"user_id\", \"task_type\", \"resource_key\") \
    WHERE status IN ('queued', 'running')";

// m20261130_000003_task_dedup_scheduling: the claim index is built under an interim name,
// the old one dropped and the new one renamed.
const RUN_AT: &str = "ALTER TABLE task_run ADD COLUMN IF NOT EXISTS run_at \
    timestamp with time zone NOT NULL DEFAULT '1970-01-01 00:00:00+00'";
const PRIORITY: &str =
    "ALTER TABLE task_run ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0";
const CLAIM_INTERIM: &str = "task_run_claim_idx_online";
const SCHEDULED_CLAIM_INDEX: &str = "CREATE INDEX CONCURRENTLY task_run_claim_idx_online \
    ON task_run (status, priority DESC, run_at, created_at, id)";

// m20261130_000004_task_dedup_scopes: the unique index likewise (the frozen migration
// uses the same interim name).
const SCOPE: &str = "ALTER TABLE task_run ADD COLUMN IF NOT EXISTS scope \
    varchar(16) NOT NULL DEFAULT 'active'";
const WINDOW: &str = "ALTER TABLE task_run ADD COLUMN IF NOT EXISTS \
    dedup_window_end bigint NOT NULL DEFAULT 0";
const OCCUPIED_INTERIM: &str = "task_run_occupied_uidx";
const OCCUPIED_INDEX: &str = "CREATE UNIQUE INDEX CONCURRENTLY task_run_occupied_uidx ON task_run \
    (user_id, task_type, resource_key, dedup_window_end) \
    WHERE ((scope = 'active' AND status IN ('queued', 'running')) \
    OR (scope = 'queued' AND status = 'queued') OR scope = 'period')";

// m20261201_000005_task_dedup_serial_per_key
const CONCURRENT: &str = "ALTER TABLE task_run ADD COLUMN IF NOT EXISTS concurrent \
    boolean NOT NULL DEFAULT false";
const RUNNING_INDEX: &str = "CREATE UNIQUE INDEX CONCURRENTLY task_running_resource_uidx \
    ON task_run (user_id, task_type, resource_key) \
    WHERE (status = 'running' AND NOT concurrent)";

// m20261204_000010_task_dedup_snoozes: a constant default, kept in the catalog (no rewrite)
const SNOOZES: &str =
    "ALTER TABLE task_run ADD COLUMN IF NOT EXISTS snoozes integer NOT NULL DEFAULT 0";

// m20261205_000011_task_dedup_limits (the table of limits is the migration's)
const USER_QUEUE_INDEX: &str = "CREATE INDEX CONCURRENTLY task_run_user_queue_idx ON task_run \
    (task_type, user_id, priority DESC, run_at, created_at, id) WHERE status = 'queued'";
const RUN_SLOT: &str = "ALTER TABLE task_run ADD COLUMN IF NOT EXISTS run_slot integer NULL";
const SLOT_INDEX: &str = "CREATE UNIQUE INDEX CONCURRENTLY task_run_slot_uidx ON task_run \
    (task_type, run_slot) WHERE status = 'running' AND run_slot IS NOT NULL";

// m20261202_000006_task_dedup_maintenance (the table of paused types is the migration's)
const FINISHED_INDEX: &str =
    "CREATE INDEX CONCURRENTLY task_run_finished_idx ON task_run (status, finished_at)";

// m20261202_000007_task_dedup_admin
const ADMIN_INDEXES: [(&str, &str); 3] = [
    (
        "task_run_status_created_idx",
        "CREATE INDEX CONCURRENTLY task_run_status_created_idx ON task_run \
         (status, created_at, id)",
    ),
    (
        "task_run_type_status_created_idx",
        "CREATE INDEX CONCURRENTLY task_run_type_status_created_idx ON task_run \
         (task_type, status, created_at, id)",
    ),
    (
        "task_run_created_idx",
        "CREATE INDEX CONCURRENTLY task_run_created_idx ON task_run (created_at, id)",
    ),
];

// m20261203_000008_task_dedup_key_prefix
const KEY_PREFIX_INDEX: &str =
    "CREATE INDEX CONCURRENTLY task_run_key_prefix_idx ON task_run (resource_key COLLATE \"C\")";

/// While a unique index builds, writers that do not go through it (an older,
/// read-then-insert release; an older worker's claim) could add a duplicate at any
/// moment, and `CREATE UNIQUE INDEX CONCURRENTLY` fails on one that arrives before the
/// index takes inserts. This trigger closes that window: it serialises the rows that
/// would join a key (a transaction-scoped advisory lock on the key's hash; under READ
/// COMMITTED each statement of the function reads afresh, so a second writer sees the
/// first one's committed row) and then does what the finished index will do. For the
/// active-key index it refuses the duplicate with the index's own error (23505 naming
/// `task_active_resource_uidx`); for the running-key index it marks the second run of
/// a key `concurrent`, as the resolution does. Installed before the resolution (its
/// lock waits for every transaction that wrote before it), dropped once the index is
/// built or the run gives up; a leftover from a killed run is dropped by [`repair`].
const GUARD_FUNCTION: &str = r#"CREATE OR REPLACE FUNCTION task_dedup_online_guard()
RETURNS trigger LANGUAGE plpgsql AS $guard$
DECLARE
    joins boolean;
BEGIN
    IF TG_ARGV[0] = 'active' THEN
        joins := NEW.status IN ('queued', 'running') AND (TG_OP = 'INSERT'
            OR OLD.status NOT IN ('queued', 'running')
            OR (OLD.user_id, OLD.task_type, OLD.resource_key)
               IS DISTINCT FROM (NEW.user_id, NEW.task_type, NEW.resource_key));
    ELSE
        joins := NEW.status = 'running' AND NOT NEW.concurrent
            AND (TG_OP = 'INSERT' OR OLD.status <> 'running' OR OLD.concurrent);
    END IF;
    IF NOT joins THEN
        RETURN NEW;
    END IF;
    PERFORM pg_advisory_xact_lock(29796,
        hashtext(NEW.user_id || '/' || NEW.task_type || '/' || NEW.resource_key));
    IF TG_ARGV[0] = 'active' THEN
        IF EXISTS (SELECT 1 FROM task_run WHERE user_id = NEW.user_id
            AND task_type = NEW.task_type AND resource_key = NEW.resource_key
            AND status IN ('queued', 'running') AND id <> NEW.id) THEN
            RAISE EXCEPTION 'duplicate key value violates unique constraint "task_active_resource_uidx"'
                USING ERRCODE = 'unique_violation', TABLE = 'task_run',
                CONSTRAINT = 'task_active_resource_uidx';
        END IF;
    ELSIF EXISTS (SELECT 1 FROM task_run WHERE user_id = NEW.user_id
        AND task_type = NEW.task_type AND resource_key = NEW.resource_key
        AND status = 'running' AND NOT concurrent AND id <> NEW.id) THEN
        NEW.concurrent := true;
    END IF;
    RETURN NEW;
END
$guard$"#;
const GUARD_ACTIVE: &str = "CREATE TRIGGER task_dedup_online_guard BEFORE INSERT OR UPDATE \
    ON task_run FOR EACH ROW EXECUTE FUNCTION task_dedup_online_guard('active')";
const GUARD_RUNNING: &str = "CREATE TRIGGER task_dedup_online_guard BEFORE INSERT OR UPDATE \
    ON task_run FOR EACH ROW EXECUTE FUNCTION task_dedup_online_guard('running')";
const UNGUARD: &str = "DROP TRIGGER IF EXISTS task_dedup_online_guard ON task_run";
const UNGUARD_FUNCTION: &str = "DROP FUNCTION IF EXISTS task_dedup_online_guard()";
/// Whether the guard trigger is there (a run was killed while it stood).
const GUARD_STATE: &str = "SELECT EXISTS (SELECT 1 FROM pg_trigger \
    WHERE tgrelid = to_regclass('task_run') AND tgname = 'task_dedup_online_guard')";

/// The session other than this one that has held a lock on `task_run` longest: its pid,
/// its state, how long its transaction has been open, and its (last) statement.
const LOCK_HOLDER: &str = "SELECT format('pid %s (%s, transaction open %s s): %s', a.pid, \
    a.state, round(extract(epoch FROM now() - a.xact_start)::numeric, 1), left(a.query, 200)) \
    FROM pg_stat_activity a WHERE a.pid <> pg_backend_pid() AND a.pid IN \
    (SELECT l.pid FROM pg_locks l WHERE l.relation = to_regclass('task_run') AND l.granted) \
    ORDER BY a.xact_start NULLS LAST LIMIT 1";

/// SQLSTATEs a retry can get past: `lock_timeout` expired, a deadlock (two builds, or a
/// build and a writer), and a unique build that met duplicates.
const LOCK_NOT_AVAILABLE: &str = "55P03";
const DEADLOCK_DETECTED: &str = "40P01";
const UNIQUE_VIOLATION: &str = "23505";

/// What a unique build resolves before each attempt.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dedup {
    /// Not a unique index, or one whose duplicates cannot arise from older writers.
    Nothing,
    /// Active duplicates of a key: the oldest stays, the others are cancelled.
    Active,
    /// Running tasks of a key: the oldest keeps the run, the others become `concurrent`.
    Running,
}

/// Builds, online, what migration `name` builds; leaves the rest to the migration.
pub(super) async fn prepare(run: &Run<'_>, name: &str) -> Result<(), OnlineError> {
    let manager = run.manager();
    let mut conn = Session::open(run).await?;
    match name {
        "m20261130_000001_task_dedup_create_task_run" => {
            if !manager.has_table("task_run").await? {
                return Ok(());
            }
            let lookup = ("task_run_lookup_idx", LOOKUP_INDEX);
            conn.index(run, name, lookup, Dedup::Nothing).await?;
            // With `priority` there, the scheduling step builds the claim index it wants.
            if !manager.has_column("task_run", "priority").await? {
                let claim = ("task_run_claim_idx", CLAIM_INDEX);
                conn.index(run, name, claim, Dedup::Nothing).await?;
            }
        }
        "m20261130_000002_task_dedup_active_resource_uidx" => {
            // With the scopes' window there, the scopes step builds the index it wants.
            if !manager.has_column("task_run", "dedup_window_end").await? {
                let active = ("task_active_resource_uidx", ACTIVE_INDEX);
                conn.index(run, name, active, Dedup::Active).await?;
            }
        }
        "m20261130_000003_task_dedup_scheduling" => {
            conn.column(run, name, "run_at", RUN_AT).await?;
            conn.column(run, name, "priority", PRIORITY).await?;
            let columns = sql::index_columns(&manager, Dialect::Postgres, "task_run_claim_idx");
            // A lean table (migration 13) has no claim index of this kind to replace.
            if !conn.lean && !columns.await?.iter().any(|c| c == "priority") {
                let interim = (CLAIM_INTERIM, SCHEDULED_CLAIM_INDEX);
                conn.index(run, name, interim, Dedup::Nothing).await?;
                conn.replace(run, name, "task_run_claim_idx", CLAIM_INTERIM)
                    .await?;
            }
        }
        "m20261130_000004_task_dedup_scopes" => {
            conn.column(run, name, "scope", SCOPE).await?;
            conn.column(run, name, "dedup_window_end", WINDOW).await?;
            let columns =
                sql::index_columns(&manager, Dialect::Postgres, "task_active_resource_uidx");
            if !columns.await?.iter().any(|c| c == "dedup_window_end") {
                let interim = (OCCUPIED_INTERIM, OCCUPIED_INDEX);
                conn.index(run, name, interim, Dedup::Nothing).await?;
                conn.replace(run, name, "task_active_resource_uidx", OCCUPIED_INTERIM)
                    .await?;
            }
        }
        "m20261201_000005_task_dedup_serial_per_key" => {
            conn.column(run, name, "concurrent", CONCURRENT).await?;
            let running = ("task_running_resource_uidx", RUNNING_INDEX);
            conn.index(run, name, running, Dedup::Running).await?;
        }
        "m20261202_000006_task_dedup_maintenance" => {
            let finished = ("task_run_finished_idx", FINISHED_INDEX);
            conn.index(run, name, finished, Dedup::Nothing).await?;
        }
        "m20261202_000007_task_dedup_admin" => {
            for index in ADMIN_INDEXES {
                conn.index(run, name, index, Dedup::Nothing).await?;
            }
        }
        "m20261203_000008_task_dedup_key_prefix" => {
            let prefix = ("task_run_key_prefix_idx", KEY_PREFIX_INDEX);
            conn.index(run, name, prefix, Dedup::Nothing).await?;
        }
        // A function (PostgreSQL) or nothing: no lock a writer waits behind.
        "m20261203_000009_task_dedup_pooler_function" => {}
        // MySQL/MariaDB's generated columns: nothing here.
        "m20261206_000012_task_dedup_virtual_markers" => {}
        "m20261205_000011_task_dedup_limits" => {
            let queue = ("task_run_user_queue_idx", USER_QUEUE_INDEX);
            conn.index(run, name, queue, Dedup::Nothing).await?;
            conn.column(run, name, "run_slot", RUN_SLOT).await?;
            // No task has a number yet: nothing to resolve before the unique build.
            let slot = ("task_run_slot_uidx", SLOT_INDEX);
            conn.index(run, name, slot, Dedup::Nothing).await?;
        }
        "m20261204_000010_task_dedup_snoozes" => {
            conn.column(run, name, "snoozes", SNOOZES).await?;
        }
        "m20261207_000013_task_dedup_lean_indexes" => {
            for (index, create) in POSTGRES_INDEXES {
                let create = create.replace("CREATE INDEX ", "CREATE INDEX CONCURRENTLY ");
                conn.index(run, name, (index, &create), Dedup::Nothing)
                    .await?;
            }
            if !running_is_lean(&manager).await? {
                // The old index keeps one run per key while the new one builds (no
                // writer can add a second), and stands until the new one replaces it.
                let create = POSTGRES_RUNNING
                    .replace("CREATE UNIQUE INDEX ", "CREATE UNIQUE INDEX CONCURRENTLY ");
                let interim = (RUNNING_INTERIM, create.as_str());
                conn.index(run, name, interim, Dedup::Nothing).await?;
                conn.replace(run, name, "task_running_resource_uidx", RUNNING_INTERIM)
                    .await?;
            }
            for index in POSTGRES_DROPPED {
                conn.drop_index(run, name, index).await?;
            }
            // A storage parameter: SHARE UPDATE EXCLUSIVE, no writer waits.
            conn.brief(run, "fillfactor", POSTGRES_FILLFACTOR).await?;
        }
        other => return Err(super::unplanned(other)),
    }
    Ok(())
}

/// Runs an `ALTER TABLE` of the compat patch under `lock_timeout`, retried.
pub(super) async fn alter(
    run: &Run<'_>,
    migration: &str,
    object: &str,
    sql: &str,
) -> Result<(), OnlineError> {
    let started = Instant::now();
    let attempts = Session::open(run).await?.brief(run, object, sql).await?;
    run.record(
        migration,
        object.to_owned(),
        Method::Instant,
        started,
        attempts,
        0,
    );
    Ok(())
}

/// Drops task-dedup's INVALID indexes, `CONCURRENTLY`; returns their names.
pub(super) async fn repair(run: &Run<'_>) -> Result<Vec<String>, OnlineError> {
    let invalid = super::invalid_indexes(run.db).await?;
    let ours: Vec<String> = invalid
        .into_iter()
        .filter(|name| OURS.contains(&name.as_str()))
        .collect();
    let mut conn = Session::open(run).await?;
    if conn.guarded().await? {
        tracing::warn!(
            "the online guard trigger of a killed run is still on task_run: dropping it"
        );
        conn.unguard(run, "repair").await?;
    }
    for name in &ours {
        tracing::warn!("index {name} is INVALID (a failed or killed build): dropping it");
        conn.drop_index(run, "repair", name).await?;
    }
    Ok(ours)
}

/// One connection of the pool, held for a step.
struct Session {
    conn: PoolConnection<sqlx::Postgres>,
    /// Whether the table has migration 13's lean indexes already: then no earlier step
    /// builds an index that step drops (an online run goes through every step, applied
    /// or not, and would build each of them on a big table only to drop it).
    lean: bool,
}

impl Session {
    async fn open(run: &Run<'_>) -> Result<Session, DbErr> {
        let DatabaseConnectionType::SqlxPostgresPoolConnection(_) = &run.db.inner else {
            return Err(DbErr::BackendNotSupported {
                db: "PostgreSQL without a sqlx pool",
                ctx: "task-dedup-migration online builds",
            });
        };
        let mut conn = run
            .db
            .get_postgres_connection_pool()
            .acquire()
            .await
            .map_err(db_err)?;
        // Its `lock_timeout` must not reach the pool's other users.
        conn.close_on_drop();
        let lean =
            run.manager().has_table("task_run").await? && running_is_lean(&run.manager()).await?;
        Ok(Session { conn, lean })
    }

    /// Runs `sql` with `lock_timeout` set to `timeout_ms` (0: no limit).
    async fn exec(&mut self, timeout_ms: u128, sql: &str) -> Result<(), sqlx::Error> {
        let conn: &mut PgConnection = &mut self.conn;
        sqlx::raw_sql(AssertSqlSafe(format!("SET lock_timeout = {timeout_ms}")))
            .execute(&mut *conn)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    async fn pause(&mut self, run: &Run<'_>, attempt: u32) -> Result<(), DbErr> {
        let seconds = retry_pause(run.options, attempt).as_secs_f64();
        let conn: &mut PgConnection = &mut self.conn;
        sqlx::raw_sql(AssertSqlSafe(format!("SELECT pg_sleep({seconds})")))
            .execute(conn)
            .await
            .map_err(db_err)?;
        Ok(())
    }

    /// Whether the guard trigger stands on `task_run`.
    async fn guarded(&mut self) -> Result<bool, DbErr> {
        let conn: &mut PgConnection = &mut self.conn;
        sqlx::query_scalar::<_, bool>(GUARD_STATE)
            .fetch_one(conn)
            .await
            .map_err(db_err)
    }

    /// Whether index `name` exists (`Some`), and is valid.
    async fn index_state(&mut self, name: &str) -> Result<Option<bool>, DbErr> {
        let conn: &mut PgConnection = &mut self.conn;
        sqlx::query_scalar::<_, bool>(INDEX_STATE)
            .bind(name)
            .fetch_optional(conn)
            .await
            .map_err(db_err)
    }

    /// Runs a statement that takes a lock writers queue behind (ACCESS EXCLUSIVE for an
    /// `ADD COLUMN`), bounded by `lock_timeout` (times the attempt's number: a busy
    /// table gets a longer wait each time), retried when it expires.
    async fn brief(&mut self, run: &Run<'_>, object: &str, sql: &str) -> Result<u32, OnlineError> {
        let mut attempt = 1;
        loop {
            let timeout_ms = run.options.lock_timeout.as_millis() * u128::from(attempt);
            let err = match self.exec(timeout_ms, sql).await {
                Ok(()) => return Ok(attempt),
                Err(err) => err,
            };
            if code(&err).as_deref() == Some(LOCK_NOT_AVAILABLE) {
                self.report_holder(object, attempt).await;
            }
            if !retryable(&err) || attempt >= run.options.attempts {
                return Err(gave_up(object, attempt, err));
            }
            self.pause(run, attempt).await?;
            attempt += 1;
        }
    }

    /// After `lock_timeout` expired: warns naming the session that has held a lock on
    /// `task_run` longest (`LOCK_HOLDER`).
    async fn report_holder(&mut self, object: &str, attempt: u32) {
        let conn: &mut PgConnection = &mut self.conn;
        let holder = sqlx::query_scalar(LOCK_HOLDER).fetch_optional(conn).await;
        super::report_holder(object, attempt, "lock_timeout", holder);
    }

    /// Adds a column unless the table has it.
    async fn column(
        &mut self,
        run: &Run<'_>,
        migration: &str,
        column: &str,
        sql: &str,
    ) -> Result<(), OnlineError> {
        if run.manager().has_column("task_run", column).await? {
            return Ok(());
        }
        let started = Instant::now();
        let attempts = self.brief(run, column, sql).await?;
        let object = format!("column {column}");
        run.record(migration, object, Method::Instant, started, attempts, 0);
        Ok(())
    }

    /// Builds index `name` with `sql` unless it exists and is valid; drops an INVALID
    /// one first. A unique build resolves the duplicates of `dedup` before each attempt;
    /// one that fails (duplicates written meanwhile, a lock, a deadlock) leaves an
    /// INVALID index, which is dropped before the next attempt.
    async fn index(
        &mut self,
        run: &Run<'_>,
        migration: &str,
        (name, sql): (&str, &str),
        dedup: Dedup,
    ) -> Result<(), OnlineError> {
        if self.lean && POSTGRES_DROPPED.contains(&name) {
            return Ok(());
        }
        match self.index_state(name).await? {
            Some(true) => return Ok(()),
            Some(false) => self.drop_index(run, migration, name).await?,
            None => {}
        }
        let started = Instant::now();
        let guard = match dedup {
            Dedup::Nothing => None,
            Dedup::Active => Some(GUARD_ACTIVE),
            Dedup::Running => Some(GUARD_RUNNING),
        };
        // Every run starts with `repair`, which drops a killed run's guard.
        if let Some(trigger) = guard {
            self.brief(run, name, GUARD_FUNCTION).await?;
            self.brief(run, name, trigger).await?;
        }
        let built = self.build(run, migration, (name, sql), dedup).await;
        if guard.is_some() {
            // Whatever the build's outcome: a guard left standing costs every later
            // write a lock. When this fails too (the connection is gone), the next
            // run's repair drops it; the build's own error is the one to report.
            let unguarded = self.unguard(run, name).await;
            if built.is_ok() {
                unguarded?;
            }
        }
        let (attempt, resolved) = built?;
        let object = name.to_owned();
        run.record(
            migration,
            object,
            Method::Concurrently,
            started,
            attempt,
            resolved,
        );
        Ok(())
    }

    /// Drops the guard trigger and its function, if there.
    async fn unguard(&mut self, run: &Run<'_>, object: &str) -> Result<(), OnlineError> {
        self.brief(run, object, UNGUARD).await?;
        self.brief(run, object, UNGUARD_FUNCTION).await?;
        Ok(())
    }

    /// The attempts of [`Session::index`]'s build; returns how many it took and how many
    /// duplicates it resolved.
    async fn build(
        &mut self,
        run: &Run<'_>,
        migration: &str,
        (name, sql): (&str, &str),
        dedup: Dedup,
    ) -> Result<(u32, u64), OnlineError> {
        let manager = run.manager();
        let mut resolved = 0;
        let mut attempt = 1;
        loop {
            let resolution = match dedup {
                Dedup::Nothing => Ok(0),
                Dedup::Active => cancel_duplicate_active(&manager).await,
                Dedup::Running => exempt_running_duplicates(&manager).await,
            };
            resolved += match resolution {
                Ok(n) => n,
                Err(err) if super::is_deadlock(&err) && attempt < run.options.attempts => {
                    self.pause(run, attempt).await?;
                    attempt += 1;
                    continue;
                }
                Err(err) => return Err(err.into()),
            };
            // No lock_timeout: the build waits for older transactions, and no writer
            // waits for it (SHARE UPDATE EXCLUSIVE).
            let outcome = self.exec(0, sql).await;
            let Err(err) = outcome else { break };
            let again = match code(&err).as_deref() {
                Some(UNIQUE_VIOLATION) => dedup != Dedup::Nothing,
                _ => retryable(&err),
            };
            if !again || attempt >= run.options.attempts {
                // A connection lost with the build leaves the index to the next run.
                let _ = self.drop_index(run, migration, name).await;
                return Err(gave_up(name, attempt, err));
            }
            self.drop_index(run, migration, name).await?;
            self.pause(run, attempt).await?;
            attempt += 1;
        }
        Ok((attempt, resolved))
    }

    /// `DROP INDEX CONCURRENTLY IF EXISTS`, under `lock_timeout` (longer each attempt):
    /// its last step takes the index's ACCESS EXCLUSIVE lock, and while it waits for a
    /// long holder every writer of the table queues behind it (7 s calls in the
    /// 5,000,000-row run without the timeout). A drop that gives up leaves the index
    /// INVALID, which the next attempt drops.
    async fn drop_index(
        &mut self,
        run: &Run<'_>,
        migration: &str,
        name: &str,
    ) -> Result<(), OnlineError> {
        if self.index_state(name).await?.is_none() {
            return Ok(());
        }
        let started = Instant::now();
        let sql = format!("DROP INDEX CONCURRENTLY IF EXISTS {name}");
        let mut attempt = 1;
        loop {
            let timeout_ms = run.options.lock_timeout.as_millis() * u128::from(attempt);
            match self.exec(timeout_ms, &sql).await {
                Ok(()) => break,
                Err(err) if retryable(&err) && attempt < run.options.attempts => {
                    self.pause(run, attempt).await?;
                    attempt += 1;
                }
                Err(err) => return Err(gave_up(name, attempt, err)),
            }
        }
        let object = format!("drop {name}");
        run.record(migration, object, Method::Instant, started, attempt, 0);
        Ok(())
    }

    /// Replaces index `target` by the valid index `interim`: drops `target`, then
    /// renames `interim` (PostgreSQL 12 on: a SHARE UPDATE EXCLUSIVE lock). Both stand
    /// until the drop, so a unique guarantee never lapses.
    async fn replace(
        &mut self,
        run: &Run<'_>,
        migration: &str,
        target: &str,
        interim: &str,
    ) -> Result<(), OnlineError> {
        self.drop_index(run, migration, target).await?;
        let started = Instant::now();
        let sql = format!("ALTER INDEX {interim} RENAME TO {target}");
        let attempts = self.brief(run, target, &sql).await?;
        let object = format!("rename {interim} to {target}");
        run.record(migration, object, Method::Instant, started, attempts, 0);
        Ok(())
    }
}

fn code(err: &sqlx::Error) -> Option<String> {
    err.as_database_error()
        .and_then(|e| e.code())
        .map(|code| code.into_owned())
}

fn retryable(err: &sqlx::Error) -> bool {
    matches!(
        code(err).as_deref(),
        Some(LOCK_NOT_AVAILABLE | DEADLOCK_DETECTED)
    )
}

fn gave_up(object: &str, attempts: u32, err: sqlx::Error) -> OnlineError {
    let why = match code(&err).as_deref() {
        Some(LOCK_NOT_AVAILABLE) => "lock_timeout expired each time",
        Some(DEADLOCK_DETECTED) => "deadlocks",
        Some(UNIQUE_VIOLATION) => "duplicates in the table",
        _ => "an error a retry does not get past",
    };
    OnlineError::GaveUp {
        object: object.to_owned(),
        attempts,
        why,
        last: db_err(err),
    }
}

fn db_err(err: sqlx::Error) -> DbErr {
    DbErr::Exec(RuntimeErr::SqlxError(Arc::new(err)))
}
