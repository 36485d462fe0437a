//! MySQL/MariaDB: InnoDB online DDL, on one connection of the pool held for a step (its
//! `lock_wait_timeout` bounds each `ALTER TABLE`'s metadata lock, which writers queue
//! behind).
//!
//! Indexes are `ALGORITHM=INPLACE, LOCK=NONE`, generated columns included: InnoDB keeps
//! an indexed virtual column's value in the index. Columns take the strongest form the
//! server accepts, tried in order: `INSTANT`, `INPLACE, LOCK=NONE`, `COPY, LOCK=SHARED`.
//! The generated columns behind the unique indexes are added VIRTUAL (`INSTANT`) when
//! the run goes through step 12, which makes them VIRTUAL anyway; a run that stops
//! before it adds them STORED as steps 2, 4 and 5 do, which is always a copy (MariaDB
//! 10.11 and MySQL 8 refuse INPLACE for it): reads go on, writes wait for the copy, and
//! the change is reported as [`Method::Copy`]. So is step 12's conversion of a table
//! that has them STORED already.
//!
//! Each statement states the definition of the frozen migration that builds the same
//! index or column (the snapshot tests compare the schemas both ways leave).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use chrono::SubsecRound;
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::prelude::Uuid;
// Every statement run here is one of this file's constants, or one made of this
// crate's index names and numbers: nothing comes from input (the values it writes are
// bound).
use sea_orm_migration::sea_orm::sqlx::{
    self, AssertSqlSafe, MySqlConnection, pool::PoolConnection,
};
use sea_orm_migration::sea_orm::{ConnectionTrait, DatabaseConnectionType, RuntimeErr, Statement};

use super::{Method, OnlineError, Run, retry_pause};
use crate::m20261130_000002_task_dedup_active_resource_uidx::cancel_duplicate_active;
use crate::m20261206_000012_task_dedup_virtual_markers::{
    MYSQL_OCCUPIED, MYSQL_RUNNING_SLOT, mysql_conversion, mysql_stored_columns,
};
use crate::sql::{self, Dialect};

// m20261130_000001_task_dedup_create_task_run (on a table that exists already)
const LOOKUP_INDEX: &str = "ALTER TABLE task_run ADD INDEX task_run_lookup_idx \
    (user_id, task_type, resource_key, status, created_at)";
const CLAIM_INDEX: &str =
    "ALTER TABLE task_run ADD INDEX task_run_claim_idx (status, created_at, id)";

// m20261130_000002_task_dedup_active_resource_uidx
const ACTIVE_MARKER: &str = "ALTER TABLE task_run ADD COLUMN active_marker tinyint \
    GENERATED ALWAYS AS (CASE WHEN status IN ('queued', 'running') THEN 1 END) STORED";
const ACTIVE_INDEX: &str = "ALTER TABLE task_run ADD UNIQUE INDEX task_active_resource_uidx \
    (user_id, task_type, resource_key, active_marker)";

// m20261130_000003_task_dedup_scheduling
const RUN_AT: &str = "ALTER TABLE task_run ADD COLUMN run_at datetime(6) NOT NULL \
    DEFAULT '1970-01-01 00:00:00.000000'";
const PRIORITY: &str = "ALTER TABLE task_run ADD COLUMN priority smallint NOT NULL DEFAULT 0";
/// One statement, as in the migration: the table is never without its claim index.
const SCHEDULED_CLAIM_INDEX: &str = "ALTER TABLE task_run DROP INDEX task_run_claim_idx, \
    ADD INDEX task_run_claim_idx (status, priority DESC, run_at, created_at, id)";
const SCHEDULED_CLAIM_INDEX_ONLY: &str = "ALTER TABLE task_run \
    ADD INDEX task_run_claim_idx (status, priority DESC, run_at, created_at, id)";

// m20261130_000004_task_dedup_scopes: the migration's one ALTER TABLE, in three.
const SCOPE: &str = "ALTER TABLE task_run ADD COLUMN scope varchar(16) NOT NULL DEFAULT 'active'";
const WINDOW: &str = "ALTER TABLE task_run ADD COLUMN dedup_window_end bigint NOT NULL DEFAULT 0";
const OCCUPIED: &str = "ALTER TABLE task_run ADD COLUMN occupied tinyint GENERATED ALWAYS AS \
    (CASE WHEN ((scope = 'active' AND status IN ('queued', 'running')) \
    OR (scope = 'queued' AND status = 'queued') OR scope = 'period') THEN 1 END) STORED";
/// One statement: the table always has one of the two unique indexes.
const OCCUPIED_INDEX: &str = "ALTER TABLE task_run DROP INDEX task_active_resource_uidx, \
    ADD UNIQUE INDEX task_active_resource_uidx \
    (user_id, task_type, resource_key, dedup_window_end, occupied)";
const OCCUPIED_INDEX_ONLY: &str = "ALTER TABLE task_run ADD UNIQUE INDEX task_active_resource_uidx \
    (user_id, task_type, resource_key, dedup_window_end, occupied)";
const DROP_ACTIVE_MARKER: &str = "ALTER TABLE task_run DROP COLUMN active_marker";

// m20261201_000005_task_dedup_serial_per_key
const CONCURRENT: &str =
    "ALTER TABLE task_run ADD COLUMN concurrent boolean NOT NULL DEFAULT false";
const RUNNING_SLOT: &str = "ALTER TABLE task_run ADD COLUMN running_slot tinyint \
    GENERATED ALWAYS AS (CASE WHEN (status = 'running' AND NOT concurrent) THEN 1 END) STORED";
const RUNNING_INDEX: &str = "ALTER TABLE task_run ADD UNIQUE INDEX task_running_resource_uidx \
    (user_id, task_type, resource_key, running_slot)";

// m20261204_000010_task_dedup_snoozes: ALGORITHM=INSTANT where the server has it
const SNOOZES: &str = "ALTER TABLE task_run ADD COLUMN snoozes int NOT NULL DEFAULT 0";

// m20261205_000011_task_dedup_limits (the table of limits is the migration's)
const USER_QUEUE_INDEX: &str = "ALTER TABLE task_run ADD INDEX task_run_user_queue_idx \
    (task_type, status, user_id, priority DESC, run_at, created_at, id)";
const RUN_SLOT: &str = "ALTER TABLE task_run ADD COLUMN run_slot int NULL";
const RUNNING_RUN_SLOT: &str = "ALTER TABLE task_run ADD COLUMN running_run_slot int \
    GENERATED ALWAYS AS (CASE WHEN status = 'running' THEN run_slot END) VIRTUAL";
const SLOT_INDEX: &str =
    "ALTER TABLE task_run ADD UNIQUE INDEX task_run_slot_uidx (task_type, running_run_slot)";

// m20261202_000006_task_dedup_maintenance (the table of paused types is the migration's)
const FINISHED_INDEX: &str =
    "ALTER TABLE task_run ADD INDEX task_run_finished_idx (status, finished_at)";

// m20261202_000007_task_dedup_admin
const ADMIN_INDEXES: [(&str, &str); 3] = [
    (
        "task_run_status_created_idx",
        "ALTER TABLE task_run ADD INDEX task_run_status_created_idx (status, created_at, id)",
    ),
    (
        "task_run_type_status_created_idx",
        "ALTER TABLE task_run ADD INDEX task_run_type_status_created_idx \
         (task_type, status, created_at, id)",
    ),
    (
        "task_run_created_idx",
        "ALTER TABLE task_run ADD INDEX task_run_created_idx (created_at, id)",
    ),
];

// m20261203_000008_task_dedup_key_prefix
const KEY_PREFIX_INDEX: &str =
    "ALTER TABLE task_run ADD INDEX task_run_key_prefix_idx (resource_key)";

/// The forms of an `ALTER TABLE`, strongest first, and what each means for writers.
const COLUMN_FORMS: [(&str, Method); 3] = [
    (", ALGORITHM=INSTANT", Method::Instant),
    (", ALGORITHM=INPLACE, LOCK=NONE", Method::InPlace),
    (", ALGORITHM=COPY, LOCK=SHARED", Method::Copy),
];
const INDEX_FORMS: [(&str, Method); 2] = [
    (", ALGORITHM=INPLACE, LOCK=NONE", Method::InPlace),
    (", ALGORITHM=COPY, LOCK=SHARED", Method::Copy),
];

/// Who an `ALTER TABLE` most likely waited for: the other session of this database with
/// the oldest open transaction or, failing one, the longest running statement (an idle
/// session in a transaction shows no statement: its id is what to look for). Without
/// `metadata_lock_info` the server does not say which session holds the lock itself.
const LOCK_HOLDER: &str = "SELECT CAST(CONCAT('session ', p.ID, ' (', p.COMMAND, \
    IF(t.trx_started IS NULL, '', CONCAT(', transaction open ', \
    TIMESTAMPDIFF(SECOND, t.trx_started, NOW()), ' s')), \
    IF(p.COMMAND = 'Sleep', CONCAT(', idle ', p.TIME, ' s)'), \
    CONCAT(', statement running ', p.TIME, ' s): ', LEFT(COALESCE(p.INFO, ''), 200)))) AS CHAR) \
    FROM information_schema.PROCESSLIST p \
    LEFT JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = p.ID \
    WHERE p.DB = DATABASE() AND p.ID <> CONNECTION_ID() \
    AND (t.trx_id IS NOT NULL OR p.COMMAND NOT IN ('Sleep', 'Daemon')) \
    ORDER BY COALESCE(t.trx_started, NOW() - INTERVAL p.TIME SECOND) LIMIT 1";

/// The server refuses the ALGORITHM or LOCK asked for (it names the one it would take).
const ER_ALTER_OPERATION_NOT_SUPPORTED: u16 = 1845;
const ER_ALTER_OPERATION_NOT_SUPPORTED_REASON: u16 = 1846;
/// A retry can get past these: `lock_wait_timeout` expired, a deadlock.
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
const ER_LOCK_DEADLOCK: u16 = 1213;
/// A unique build met duplicates (also those written while it ran, or InnoDB's
/// spurious ones under concurrent writes).
const ER_DUP_ENTRY: u16 = 1062;

/// The locks of a locked build: `task_run` under every alias its statements use (a
/// locked session must lock each alias it names), and the table its guard's triggers
/// write (locked with it implicitly, named for clarity).
const LOCK_TASK_RUN: &str = "LOCK TABLES task_run WRITE, task_run AS t WRITE, \
    task_run AS o WRITE, task_dedup_online_keys WRITE";

/// Active tasks of keys with more than one, each key's oldest first (as the active
/// index's migration orders them: the oldest is kept).
const ACTIVE_DUPLICATES: &str = "SELECT t.id, t.user_id, t.task_type, t.resource_key \
    FROM task_run t WHERE t.status IN ('queued', 'running') AND EXISTS (SELECT 1 FROM task_run o \
    WHERE o.user_id = t.user_id AND o.task_type = t.task_type \
    AND o.resource_key = t.resource_key AND o.status IN ('queued', 'running') AND o.id <> t.id) \
    ORDER BY t.user_id, t.task_type, t.resource_key, t.created_at, t.id";

/// The rule: `t` runs, not `concurrent`, beside an older run of its key.
macro_rules! runs_beside_an_older {
    () => {
        "t.status = 'running' AND NOT t.concurrent AND EXISTS (SELECT 1 FROM task_run o \
         WHERE o.user_id = t.user_id AND o.task_type = t.task_type \
         AND o.resource_key = t.resource_key AND o.status = 'running' \
         AND NOT o.concurrent AND o.id < t.id)"
    };
}

/// Running tasks of keys that have an older one running (neither `concurrent`): a
/// plain read, which locks nothing. The migration's own marking is one `UPDATE` whose
/// subquery reads the whole table with shared locks, and every writer whose row falls
/// in a locked gap waited for it (2.6 s on 5,000,000 rows under load).
const RUNNING_DUPLICATES: &str = concat!(
    "SELECT t.id FROM task_run t WHERE ",
    runs_beside_an_older!()
);
/// One of them marked `concurrent` if it still runs beside an older run of its key (the
/// migration's rule, read again with locks on that key's rows alone: the oldest run of a
/// key is never marked).
const EXEMPT_RUNNING_DUPLICATE: &str = concat!(
    "UPDATE task_run SET concurrent = true WHERE id IN (SELECT id FROM (SELECT t.id \
     FROM task_run t WHERE t.id = ? AND ",
    runs_beside_an_older!(),
    ") AS duplicates)"
);

const CANCEL_DUPLICATE: &str = "UPDATE task_run SET status = 'cancelled', error = ?, \
    finished_at = ?, updated_at = ? WHERE id = ? AND status IN ('queued', 'running')";

/// While a unique index builds, writers that do not go through it (an older,
/// read-then-insert release; an older worker's claim) could add a duplicate at any
/// moment, and an `INPLACE` build fails at its end on one written meanwhile. These
/// triggers close that window, as PostgreSQL's guard does: a row that would join a key
/// first takes the key's row in `task_dedup_online_keys` (`INSERT ... ON DUPLICATE KEY
/// UPDATE`: an InnoDB row lock held until its transaction ends, so the writers of one
/// key go one at a time), then does what the finished index will do: for the
/// active-key index it refuses the duplicate with the index's own error (1062 naming
/// `task_active_resource_uidx`); for the running-key index it marks the second run of a
/// key `concurrent`, as the resolution does. The check is a plain read: its snapshot is
/// taken after the key's lock (the statement's first read), so it sees the committed
/// row of the writer before (a writer in an explicit transaction that read earlier has
/// an older snapshot and can slip past: the retries catch that). Installed after the
/// first resolution of duplicates (see `Session::alter`), dropped once the index is
/// built or the run gives up; a leftover from a killed run is dropped by [`repair`].
const GUARD_TABLE: &str = "CREATE TABLE IF NOT EXISTS task_dedup_online_keys \
    (key_hash binary(32) NOT NULL PRIMARY KEY) ENGINE=InnoDB";
const UNGUARD_TABLE: &str = "DROP TABLE IF EXISTS task_dedup_online_keys";
const GUARD_INSERT: &str = "task_dedup_online_guard_insert";
const GUARD_UPDATE: &str = "task_dedup_online_guard_update";
/// Takes the lock of `NEW`'s key.
const GUARD_LOCK_KEY: &str = "INSERT INTO task_dedup_online_keys (key_hash) \
    VALUES (UNHEX(SHA2(CONCAT_WS(0x1f, NEW.user_id, NEW.task_type, NEW.resource_key), 256))) \
    ON DUPLICATE KEY UPDATE key_hash = key_hash";
/// What a killed run's guard left: its triggers, its table.
const GUARD_STATE: &str = "SELECT (SELECT COUNT(*) FROM information_schema.TRIGGERS \
    WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = 'task_run' \
    AND TRIGGER_NAME LIKE 'task\\_dedup\\_online\\_guard%') \
    + (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() \
    AND TABLE_NAME = 'task_dedup_online_keys') AS n";

/// The guard's two triggers for `dedup` (an active or a running build).
fn guard_triggers(dedup: Dedup) -> [String; 2] {
    let key = "user_id = NEW.user_id AND task_type = NEW.task_type \
               AND resource_key = NEW.resource_key";
    let (joins_insert, joins_update, holder, act) = match dedup {
        Dedup::Running => (
            "NEW.status = 'running' AND NOT NEW.concurrent",
            "NEW.status = 'running' AND NOT NEW.concurrent \
             AND (OLD.status <> 'running' OR OLD.concurrent)",
            "status = 'running' AND NOT concurrent",
            "SET NEW.concurrent = TRUE;",
        ),
        _ => (
            "NEW.status IN ('queued', 'running')",
            "NEW.status IN ('queued', 'running') AND (OLD.status NOT IN ('queued', 'running') \
             OR NOT (OLD.user_id <=> NEW.user_id AND OLD.task_type <=> NEW.task_type \
             AND OLD.resource_key <=> NEW.resource_key))",
            "status IN ('queued', 'running')",
            "SIGNAL SQLSTATE '23000' SET MYSQL_ERRNO = 1062, \
             MESSAGE_TEXT = 'Duplicate entry for key ''task_active_resource_uidx'' \
             (task_dedup_online_guard)';",
        ),
    };
    let trigger = |name: &str, event: &str, joins: &str, other: &str| {
        format!(
            "CREATE TRIGGER {name} BEFORE {event} ON task_run FOR EACH ROW BEGIN \
             IF {joins} THEN {GUARD_LOCK_KEY}; \
             IF EXISTS (SELECT 1 FROM task_run WHERE {key} AND {holder}{other}) THEN {act} \
             END IF; END IF; END"
        )
    };
    [
        trigger(GUARD_INSERT, "INSERT", joins_insert, ""),
        trigger(GUARD_UPDATE, "UPDATE", joins_update, " AND id <> NEW.id"),
    ]
}

/// Drops what a killed run's guard left on `task_run`.
pub(super) async fn repair(run: &Run<'_>) -> Result<Vec<String>, OnlineError> {
    let mut conn = Session::open(run).await?;
    let left: i64 = sqlx::query_scalar(AssertSqlSafe(GUARD_STATE))
        .fetch_one(&mut *conn.conn)
        .await
        .map_err(db_err)?;
    if left > 0 {
        tracing::warn!(
            "the online guard of a killed run (its triggers, its table of keys) is still there: dropping it"
        );
        conn.unguard(run, "repair").await?;
    }
    Ok(Vec::new())
}

/// A row of `ACTIVE_DUPLICATES`: the id and the key's columns, as bytes (`VARBINARY`,
/// or the `utf8mb4` of a compat table's binary-collation `VARCHAR`: equal keys, equal
/// bytes either way).
type ActiveRow = (Uuid, Vec<u8>, Vec<u8>, Vec<u8>);

/// Of `ACTIVE_DUPLICATES`'s rows, those that lose to their key's first, each with the
/// id of that first.
fn superseded(rows: Vec<ActiveRow>) -> Vec<(Uuid, Uuid)> {
    let mut losers = Vec::new();
    let mut keeper: Option<(Uuid, [Vec<u8>; 3])> = None;
    for (id, user_id, task_type, resource_key) in rows {
        let key = [user_id, task_type, resource_key];
        match &keeper {
            Some((kept, kept_key)) if *kept_key == key => losers.push((id, *kept)),
            _ => keeper = Some((id, key)),
        }
    }
    losers
}

/// Step 5's marking of running duplicates, without locking the table: the duplicates
/// found by a plain read, then each marked by its id. Returns how many were marked.
async fn exempt_running_duplicates(manager: &SchemaManager<'_>) -> Result<u64, DbErr> {
    let db = manager.get_connection();
    let backend = manager.get_database_backend();
    let rows = db
        .query_all_raw(Statement::from_string(backend, RUNNING_DUPLICATES))
        .await?;
    let mut marked = 0;
    for row in rows {
        let id: Uuid = row.try_get("", "id")?;
        marked += sql::execute(db, EXEMPT_RUNNING_DUPLICATE, vec![id.into()]).await?;
    }
    Ok(marked)
}

/// What a unique build resolves before each attempt.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dedup {
    Nothing,
    Active,
    Running,
}

/// The plain columns of later steps, in the order the migrations add them, each with
/// its step.
const PLAIN_COLUMNS: [(&str, &str, &str); 7] = [
    ("m20261130_000003_task_dedup_scheduling", "run_at", RUN_AT),
    (
        "m20261130_000003_task_dedup_scheduling",
        "priority",
        PRIORITY,
    ),
    ("m20261130_000004_task_dedup_scopes", "scope", SCOPE),
    (
        "m20261130_000004_task_dedup_scopes",
        "dedup_window_end",
        WINDOW,
    ),
    (
        "m20261201_000005_task_dedup_serial_per_key",
        "concurrent",
        CONCURRENT,
    ),
    ("m20261204_000010_task_dedup_snoozes", "snoozes", SNOOZES),
    ("m20261205_000011_task_dedup_limits", "run_slot", RUN_SLOT),
];

/// Builds, online, what migration `name` builds; leaves the rest to the migration.
///
/// In a run that goes through step 12 the plain columns of every step come first:
/// MariaDB adds a column `INSTANT` (or rebuilds the table in place, `LOCK=NONE`) only
/// while the table has no indexed VIRTUAL column, so once the first unique index over
/// a VIRTUAL column stands, each further column would be a table copy. They are
/// appended in the migrations' order, and the VIRTUAL columns added `AFTER` the column
/// they follow in the migrations' table, so the table ends as the migrations leave it.
pub(super) async fn prepare(run: &Run<'_>, name: &str) -> Result<(), OnlineError> {
    let manager = run.manager();
    let mut conn = Session::open(run).await?;
    if run.virtual_markers
        && !run.plain_columns_added.load(Ordering::Relaxed)
        && manager.has_table("task_run").await?
    {
        for (migration, column, sql) in PLAIN_COLUMNS {
            conn.column(run, migration, column, sql).await?;
        }
        run.plain_columns_added.store(true, Ordering::Relaxed);
    }
    match name {
        "m20261130_000001_task_dedup_create_task_run" => {
            if !manager.has_table("task_run").await? {
                return Ok(());
            }
            conn.index(
                run,
                name,
                ("task_run_lookup_idx", LOOKUP_INDEX),
                Dedup::Nothing,
            )
            .await?;
            if run.virtual_markers {
                // `run_at` and `priority` came first (above): step 3's claim index at
                // once, under the name this step checks, rather than this step's, which
                // step 3 would build again.
                let claim = ("task_run_claim_idx", SCHEDULED_CLAIM_INDEX_ONLY);
                conn.index(run, name, claim, Dedup::Nothing).await?;
            } else if !manager.has_column("task_run", "priority").await? {
                conn.index(
                    run,
                    name,
                    ("task_run_claim_idx", CLAIM_INDEX),
                    Dedup::Nothing,
                )
                .await?;
            }
        }
        "m20261130_000002_task_dedup_active_resource_uidx" => {
            if run.virtual_markers {
                // Step 4's unique index at once, under the name this step checks: no
                // `active_marker` to add, nor to drop again (dropping a column copies
                // the table once an indexed VIRTUAL column stands). On the rows there
                // are (scope `active`, window 0, the defaults) it admits what this
                // step's index admits.
                let occupied = generated(run, OCCUPIED, MYSQL_OCCUPIED, "dedup_window_end");
                conn.column(run, name, "occupied", &occupied).await?;
                let active = ("task_active_resource_uidx", OCCUPIED_INDEX_ONLY);
                conn.index(run, name, active, Dedup::Active).await?;
                return Ok(());
            }
            if manager.has_column("task_run", "dedup_window_end").await? {
                return Ok(());
            }
            conn.column(run, name, "active_marker", ACTIVE_MARKER)
                .await?;
            let active = ("task_active_resource_uidx", ACTIVE_INDEX);
            conn.index(run, name, active, Dedup::Active).await?;
        }
        "m20261130_000003_task_dedup_scheduling" => {
            conn.column(run, name, "run_at", RUN_AT).await?;
            conn.column(run, name, "priority", PRIORITY).await?;
            let columns =
                sql::index_columns(&manager, Dialect::MySql, "task_run_claim_idx").await?;
            if !columns.iter().any(|c| c == "priority") {
                let sql = if columns.is_empty() {
                    SCHEDULED_CLAIM_INDEX_ONLY
                } else {
                    SCHEDULED_CLAIM_INDEX
                };
                conn.alter(
                    run,
                    name,
                    "task_run_claim_idx",
                    sql,
                    &INDEX_FORMS,
                    Dedup::Nothing,
                )
                .await?;
            }
        }
        "m20261130_000004_task_dedup_scopes" => {
            conn.column(run, name, "scope", SCOPE).await?;
            conn.column(run, name, "dedup_window_end", WINDOW).await?;
            let columns =
                sql::index_columns(&manager, Dialect::MySql, "task_active_resource_uidx").await?;
            if !columns.iter().any(|c| c == "dedup_window_end") {
                let occupied = generated(run, OCCUPIED, MYSQL_OCCUPIED, "dedup_window_end");
                conn.column(run, name, "occupied", &occupied).await?;
                let sql = if columns.is_empty() {
                    OCCUPIED_INDEX_ONLY
                } else {
                    OCCUPIED_INDEX
                };
                let object = "task_active_resource_uidx";
                conn.alter(run, name, object, sql, &INDEX_FORMS, Dedup::Nothing)
                    .await?;
            }
            if manager.has_column("task_run", "active_marker").await? {
                let object = "drop column active_marker";
                conn.alter(
                    run,
                    name,
                    object,
                    DROP_ACTIVE_MARKER,
                    &COLUMN_FORMS,
                    Dedup::Nothing,
                )
                .await?;
            }
        }
        "m20261201_000005_task_dedup_serial_per_key" => {
            conn.column(run, name, "concurrent", CONCURRENT).await?;
            if !manager
                .has_index("task_run", "task_running_resource_uidx")
                .await?
            {
                let slot = generated(run, RUNNING_SLOT, MYSQL_RUNNING_SLOT, "concurrent");
                conn.column(run, name, "running_slot", &slot).await?;
                let running = ("task_running_resource_uidx", RUNNING_INDEX);
                conn.index(run, name, running, Dedup::Running).await?;
            }
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
        "m20261205_000011_task_dedup_limits" => {
            let queue = ("task_run_user_queue_idx", USER_QUEUE_INDEX);
            conn.index(run, name, queue, Dedup::Nothing).await?;
            conn.column(run, name, "run_slot", RUN_SLOT).await?;
            conn.column(run, name, "running_run_slot", RUNNING_RUN_SLOT)
                .await?;
            let slot = ("task_run_slot_uidx", SLOT_INDEX);
            conn.index(run, name, slot, Dedup::Nothing).await?;
        }
        "m20261204_000010_task_dedup_snoozes" => {
            conn.column(run, name, "snoozes", SNOOZES).await?;
        }
        // PostgreSQL's indexes only.
        "m20261207_000013_task_dedup_lean_indexes" => {}
        "m20261206_000012_task_dedup_virtual_markers" => {
            let stored = mysql_stored_columns(&manager).await?;
            if !stored.is_empty() {
                let object = format!("columns {} made VIRTUAL", stored.join(", "));
                let sql = mysql_conversion(&stored, "VIRTUAL");
                conn.alter(run, name, &object, &sql, &COLUMN_FORMS, Dedup::Nothing)
                    .await?;
            }
        }
        other => return Err(super::unplanned(other)),
    }
    Ok(())
}

/// The `ADD COLUMN` of a generated column behind a unique index: as its step states it
/// (`stored`), or as step 12 makes it (`column_virtual`, a column definition, placed
/// after `after`) when the run goes through step 12.
fn generated(run: &Run<'_>, stored: &str, column_virtual: &str, after: &str) -> String {
    if run.virtual_markers {
        format!("ALTER TABLE task_run ADD COLUMN {column_virtual} AFTER {after}")
    } else {
        stored.to_owned()
    }
}

/// Runs an `ALTER TABLE` of the compat patch in the strongest form the server accepts.
pub(super) async fn alter(
    run: &Run<'_>,
    migration: &str,
    object: &str,
    sql: &str,
) -> Result<(), OnlineError> {
    let mut conn = Session::open(run).await?;
    conn.alter(run, migration, object, sql, &COLUMN_FORMS, Dedup::Nothing)
        .await
}

/// One connection of the pool, held for a step.
struct Session {
    conn: PoolConnection<sqlx::MySql>,
}

impl Session {
    async fn open(run: &Run<'_>) -> Result<Session, DbErr> {
        let DatabaseConnectionType::SqlxMySqlPoolConnection(_) = &run.db.inner else {
            return Err(DbErr::BackendNotSupported {
                db: "MySQL without a sqlx pool",
                ctx: "task-dedup-migration online builds",
            });
        };
        let mut conn = run
            .db
            .get_mysql_connection_pool()
            .acquire()
            .await
            .map_err(db_err)?;
        // Its `lock_wait_timeout` must not reach the pool's other users.
        conn.close_on_drop();
        Ok(Session { conn })
    }

    /// Bounds the metadata lock waits of the next `ALTER TABLE`: `lock_timeout` times the
    /// attempt's number (a busy table gets a longer wait each time), in whole seconds.
    async fn lock_wait(&mut self, run: &Run<'_>, attempt: u32) -> Result<(), DbErr> {
        let seconds = (run.options.lock_timeout.as_secs_f64() * f64::from(attempt))
            .ceil()
            .max(1.0);
        self.exec(&format!("SET SESSION lock_wait_timeout = {seconds}"))
            .await
            .map_err(db_err)
    }

    async fn exec(&mut self, sql: &str) -> Result<(), sqlx::Error> {
        let conn: &mut MySqlConnection = &mut self.conn;
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(conn)
            .await
            .map(|_| ())
    }

    async fn pause(&mut self, run: &Run<'_>, attempt: u32) -> Result<(), DbErr> {
        let seconds = retry_pause(run.options, attempt).as_secs_f64();
        self.exec(&format!("DO SLEEP({seconds})"))
            .await
            .map_err(db_err)
    }

    /// Cancels duplicate active tasks (with `active`, as the active index's migration
    /// does: the oldest of a key is kept) and runs `sql`, with `task_run` locked for
    /// this session alone (`LOCK TABLES ... WRITE`: reads and writes of others wait),
    /// then unlocks it, whatever happened. Returns the duplicates resolved.
    ///
    /// Statements only, no transaction: `BEGIN` would release the table locks.
    async fn locked_build(&mut self, sql: &str, active: bool) -> Result<u64, sqlx::Error> {
        self.exec(LOCK_TASK_RUN).await?;
        let outcome = self.resolve_and_build(sql, active).await;
        let unlocked = self.exec("UNLOCK TABLES").await;
        let resolved = outcome?;
        unlocked?;
        Ok(resolved)
    }

    async fn resolve_and_build(&mut self, sql: &str, active: bool) -> Result<u64, sqlx::Error> {
        let conn: &mut MySqlConnection = &mut self.conn;
        let mut cancelled = 0;
        if active {
            let rows: Vec<ActiveRow> = sqlx::query_as(AssertSqlSafe(ACTIVE_DUPLICATES))
                .fetch_all(&mut *conn)
                .await?;
            let now = chrono::Utc::now().trunc_subsecs(6);
            for (id, keeper) in superseded(rows) {
                let error = format!(
                    "cancelled by task-dedup: duplicate active task for this key, \
                     superseded by task {keeper}"
                );
                cancelled += sqlx::query(AssertSqlSafe(CANCEL_DUPLICATE))
                    .bind(error)
                    .bind(now)
                    .bind(now)
                    .bind(id)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected();
            }
        }
        sqlx::raw_sql(AssertSqlSafe(format!(
            "{sql}, ALGORITHM=INPLACE, LOCK=SHARED"
        )))
        .execute(conn)
        .await?;
        Ok(cancelled)
    }

    /// Adds a column unless the table has it, in the strongest form the server takes.
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
        let object = format!("column {column}");
        self.alter(run, migration, &object, sql, &COLUMN_FORMS, Dedup::Nothing)
            .await
    }

    /// Adds index `name` unless the table has it (InnoDB leaves nothing of a failed
    /// build).
    async fn index(
        &mut self,
        run: &Run<'_>,
        migration: &str,
        (name, sql): (&str, &str),
        dedup: Dedup,
    ) -> Result<(), OnlineError> {
        if run.manager().has_index("task_run", name).await? {
            return Ok(());
        }
        let built = self
            .alter(run, migration, name, sql, &INDEX_FORMS, dedup)
            .await;
        if dedup != Dedup::Nothing {
            // Whatever the build's outcome: a guard left standing costs every later write
            // a lock. When this fails too (the connection is gone), the next run's repair
            // drops it; the build's own error is the one to report.
            let unguarded = self.unguard(run, name).await;
            if built.is_ok() {
                unguarded?;
            }
        }
        built
    }

    /// Installs the guard for a unique build of `dedup` (see `GUARD_TABLE`).
    async fn guard(
        &mut self,
        run: &Run<'_>,
        object: &str,
        dedup: Dedup,
    ) -> Result<(), OnlineError> {
        self.brief(run, object, GUARD_TABLE).await?;
        for trigger in guard_triggers(dedup) {
            self.brief(run, object, &trigger).await?;
        }
        Ok(())
    }

    /// Drops the guard's triggers and table, if there.
    async fn unguard(&mut self, run: &Run<'_>, object: &str) -> Result<(), OnlineError> {
        for name in [GUARD_INSERT, GUARD_UPDATE] {
            let sql = format!("DROP TRIGGER IF EXISTS {name}");
            self.brief(run, object, &sql).await?;
        }
        self.brief(run, object, UNGUARD_TABLE).await
    }

    /// After `lock_wait_timeout` expired: warns naming the session that most likely
    /// holds `task_run`'s metadata lock (`LOCK_HOLDER`).
    async fn report_holder(&mut self, object: &str, attempt: u32) {
        let conn: &mut MySqlConnection = &mut self.conn;
        let holder = sqlx::query_scalar(AssertSqlSafe(LOCK_HOLDER))
            .fetch_optional(conn)
            .await;
        super::report_holder(object, attempt, "lock_wait_timeout", holder);
    }

    /// Runs a statement that takes `task_run`'s metadata lock for a moment (a trigger's
    /// creation or drop) under `lock_wait_timeout`, retried as an `ALTER TABLE` is.
    async fn brief(&mut self, run: &Run<'_>, object: &str, sql: &str) -> Result<(), OnlineError> {
        let mut attempt = 1;
        loop {
            self.lock_wait(run, attempt).await?;
            let Err(err) = self.exec(sql).await else {
                return Ok(());
            };
            if number(&err) == Some(ER_LOCK_WAIT_TIMEOUT) {
                self.report_holder(object, attempt).await;
            }
            let again = matches!(number(&err), Some(ER_LOCK_WAIT_TIMEOUT | ER_LOCK_DEADLOCK));
            if !again || attempt >= run.options.attempts {
                return Err(gave_up(object, attempt, err));
            }
            self.pause(run, attempt).await?;
            attempt += 1;
        }
    }

    /// Runs `sql` in the first of `forms` the server accepts, retrying lock timeouts and
    /// deadlocks, and (when `dedup` resolves them) duplicates written during the build.
    async fn alter(
        &mut self,
        run: &Run<'_>,
        migration: &str,
        object: &str,
        sql: &str,
        forms: &[(&str, Method)],
        dedup: Dedup,
    ) -> Result<(), OnlineError> {
        let started = Instant::now();
        let manager = run.manager();
        let mut resolved = 0;
        let mut attempt = 1;
        let mut form = 0;
        let mut duplicates_met = false;
        let mut guarded = false;
        loop {
            // The last attempt after duplicates failed the others: nothing left between
            // the resolution and the build for a writer to slip a duplicate into.
            // (Running duplicates are resolved on the migration's connection, which the
            // lock would keep out: those builds keep to the attempts above.)
            if attempt == run.options.attempts
                && attempt > 1
                && duplicates_met
                && dedup != Dedup::Running
            {
                self.lock_wait(run, attempt).await?;
                let n = (self.locked_build(sql, dedup == Dedup::Active).await)
                    .map_err(|err| gave_up(object, attempt, err))?;
                let (name, method) = (object.to_owned(), Method::Locked);
                run.record(migration, name, method, started, attempt, resolved + n);
                return Ok(());
            }
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
            // After the first resolution, not before as on PostgreSQL: creating a
            // trigger waits for every open transaction on the table (its exclusive
            // metadata lock), and a writer of a duplicate that waits for the resolution
            // would wait for it in turn. A duplicate written in between fails this first
            // build; the next attempt resolves it, and from then on the guard refuses
            // them.
            if dedup != Dedup::Nothing && !guarded {
                self.guard(run, object, dedup).await?;
                guarded = true;
            }
            let (mut clause, mut method) = forms[form];
            // Duplicates that keep arriving (a race-prone writer faster than one build)
            // would fail every online attempt: the second half of the attempts blocks
            // writes for the build, so that only the moment between the resolution and
            // the build's start is left to them.
            if dedup != Dedup::Nothing && attempt > run.options.attempts / 2 && form == 0 {
                (clause, method) = (", ALGORITHM=INPLACE, LOCK=SHARED", Method::InPlaceShared);
            }
            self.lock_wait(run, attempt).await?;
            let Err(err) = self.exec(&format!("{sql}{clause}")).await else {
                run.record(
                    migration,
                    object.to_owned(),
                    method,
                    started,
                    attempt,
                    resolved,
                );
                return Ok(());
            };
            let number = number(&err);
            if number == Some(ER_LOCK_WAIT_TIMEOUT) {
                self.report_holder(object, attempt).await;
            }
            if matches!(
                number,
                Some(ER_ALTER_OPERATION_NOT_SUPPORTED | ER_ALTER_OPERATION_NOT_SUPPORTED_REASON)
            ) && form + 1 < forms.len()
            {
                form += 1;
                continue;
            }
            let again = match number {
                // Also retried without anything to resolve: InnoDB's online build of a
                // unique index can report a duplicate that never existed, when
                // concurrent writes change a key back and forth while it runs (seen on
                // MariaDB 10.11 rebuilding task_active_resource_uidx, which the old
                // index kept unique, under 16 writers). A real one fails every attempt.
                Some(ER_DUP_ENTRY) => {
                    duplicates_met = true;
                    true
                }
                Some(ER_LOCK_WAIT_TIMEOUT | ER_LOCK_DEADLOCK) => true,
                _ => false,
            };
            if !again || attempt >= run.options.attempts {
                return Err(gave_up(object, attempt, err));
            }
            self.pause(run, attempt).await?;
            attempt += 1;
        }
    }
}

fn number(err: &sqlx::Error) -> Option<u16> {
    err.as_database_error()
        .and_then(|e| e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .map(|e| e.number())
}

fn gave_up(object: &str, attempts: u32, err: sqlx::Error) -> OnlineError {
    let why = match number(&err) {
        Some(ER_LOCK_WAIT_TIMEOUT) => "lock_wait_timeout expired each time",
        Some(ER_LOCK_DEADLOCK) => "deadlocks",
        Some(ER_DUP_ENTRY) => "duplicates in the table",
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
