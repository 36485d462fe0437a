//! MySQL/MariaDB: a plain INSERT against the unique index over the generated `occupied`
//! column, claims with `FOR UPDATE SKIP LOCKED`, and no `RETURNING` (MariaDB has one,
//! MySQL 8 does not): a write and the read of its row run in one short transaction.
//! Times are `UTC_TIMESTAMP(6)`: `datetime(6)` columns hold UTC whatever the session's
//! time zone.

use std::borrow::Cow;

use sea_orm::sqlx::mysql::MySqlDatabaseError;
use task_dedup_entity::task_run::{ACTIVE_RESOURCE_UIDX, RUNNING_RESOURCE_UIDX};

use super::limits::{Limits, SLOT_UIDX};
use super::{Admin, Bulk, Endings, Guarded, Kind, Statements, repeat, squeeze};

pub(crate) const STATEMENTS: Statements = Statements {
    // A plain INSERT, and the duplicate-key error on our index means "held". Not
    // `INSERT IGNORE` (it also turns other errors into warnings) nor `ON DUPLICATE KEY
    // UPDATE` (a write on the hit path, and with CLIENT_FOUND_ROWS the affected-row count
    // cannot tell a no-op from an insert). A failed statement does not abort an InnoDB
    // transaction.
    insert: concat!(insert_into!(), row_placeholders!()),
    // MySQL 8 has no RETURNING; MariaDB has no INSERT inside WITH, and its
    // `ON DUPLICATE KEY UPDATE ... RETURNING` returns the holder only by writing it (an
    // exclusive lock per hit). BENCHMARKS.md says more.
    insert_or_find: None,
    find_occupant: concat!(
        "SELECT ",
        columns!(),
        " FROM task_run \
         WHERE user_id = ? AND task_type = ? AND resource_key = ? \
         AND dedup_window_end = ? AND occupied = 1"
    ),
    // A locking read returns the latest committed row even inside a REPEATABLE READ
    // transaction whose snapshot predates it. The failed insert already holds a shared
    // lock on that index entry, so this takes no lock the caller did not have.
    find_occupant_after_conflict: concat!(
        "SELECT ",
        columns!(),
        " FROM task_run \
         WHERE user_id = ? AND task_type = ? AND resource_key = ? \
         AND dedup_window_end = ? AND occupied = 1 LOCK IN SHARE MODE"
    ),
    by_id: concat!("SELECT ", columns!(), " FROM task_run WHERE id = ?"),
    heartbeat: "UPDATE task_run SET lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
                updated_at = UTC_TIMESTAMP(6) \
                WHERE id = ? AND status = 'running' AND lease_owner = ?",
    complete: COMPLETE,
    fail: "UPDATE task_run SET status = 'failed', error = ?, lease_expires_at = NULL, \
           finished_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6) \
           WHERE id = ? AND status = 'running' AND lease_owner = ?",
    // `lease_owner` stays, so a repeated call by the same worker can tell its own retry.
    retry: "UPDATE task_run SET status = 'queued', error = ?, lease_expires_at = NULL, \
            run_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, updated_at = UTC_TIMESTAMP(6) \
            WHERE id = ? AND status = 'running' AND lease_owner = ?",
    cancel: "UPDATE task_run SET status = 'cancelled', error = ?, lease_expires_at = NULL, \
             finished_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6) \
             WHERE id = ? AND status IN ('queued', 'running')",
    // `lease_owner` stays, so a repeated call by the same worker can tell its own release.
    release: "UPDATE task_run SET status = 'queued', lease_expires_at = NULL, \
              attempts = attempts - 1, updated_at = UTC_TIMESTAMP(6) \
              WHERE id = ? AND status = 'running' AND lease_owner = ?",
    // `lease_owner` stays, as in `release`.
    snooze: "UPDATE task_run SET status = 'queued', lease_expires_at = NULL, \
             attempts = attempts - 1, snoozes = snoozes + 1, \
             run_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, updated_at = UTC_TIMESTAMP(6) \
             WHERE id = ? AND status = 'running' AND lease_owner = ?",
    expired: "SELECT id, attempts FROM task_run \
              WHERE status = 'running' AND lease_expires_at < UTC_TIMESTAMP(6) \
              ORDER BY lease_expires_at LIMIT 100",
    // The expiry is checked again: a heartbeat that renewed the lease first wins.
    reap_fail: "UPDATE task_run SET status = 'failed', error = ?, lease_expires_at = NULL, \
                finished_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6) \
                WHERE id = ? AND status = 'running' AND lease_expires_at < UTC_TIMESTAMP(6)",
    reap_requeue: "UPDATE task_run SET status = 'queued', lease_owner = NULL, \
                   lease_expires_at = NULL, run_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
                   updated_at = UTC_TIMESTAMP(6) \
                   WHERE id = ? AND status = 'running' AND lease_expires_at < UTC_TIMESTAMP(6)",
    // A period task keeps its window until the window is over, finished or not.
    // The oldest first, through `task_run_finished_idx` (whose entries end in the
    // primary key: `finished_at, id` is its order, no filesort). MySQL's DELETE takes no
    // SKIP LOCKED (and cannot read the table it writes in a subquery): this SELECT locks
    // a batch, skipping rows another pruner (or a worker) holds, and `prune_ids` deletes
    // it in the same short transaction (`executor/mysql.rs`). A DELETE with
    // `ORDER BY ... LIMIT` instead waits for every locked row it meets. FORCE INDEX: a
    // locking read locks every row it reads, so a scan and filesort (the optimizer's
    // choice on a small table) would lock the whole table for one batch.
    prune: "SELECT id FROM task_run FORCE INDEX (task_run_finished_idx) WHERE status = ? \
            AND finished_at < UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
            AND dedup_window_end <= UNIX_TIMESTAMP() \
            ORDER BY finished_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
    // `INSERT IGNORE` reports 0 rows for a type already paused (an upsert's count cannot
    // tell, CLIENT_FOUND_ROWS being set). What else it would turn into a warning cannot
    // happen here: the name is validated and the time is the server's.
    pause: "INSERT IGNORE INTO task_dedup_paused (task_type, paused_at) \
            VALUES (?, UTC_TIMESTAMP(6))",
    resume: "DELETE FROM task_dedup_paused WHERE task_type = ?",
    paused: "SELECT task_type, paused_at FROM task_dedup_paused ORDER BY task_type",
    running_index: "SELECT 1 AS present FROM information_schema.statistics \
                    WHERE table_schema = DATABASE() AND table_name = 'task_run' \
                    AND index_name = 'task_running_resource_uidx' AND non_unique = 0 LIMIT 1",
};

/// running → succeeded: result, id, worker_id.
const COMPLETE: &str = "UPDATE task_run SET status = 'succeeded', result = ?, \
                        lease_expires_at = NULL, finished_at = UTC_TIMESTAMP(6), \
                        updated_at = UTC_TIMESTAMP(6) \
                        WHERE id = ? AND status = 'running' AND lease_owner = ?";

/// [`OnConflict::ReplaceIfQueued`](crate::OnConflict::ReplaceIfQueued), run after the
/// INSERT's duplicate-key error: payload, run_at, priority, updated_at, then the key and
/// window. Only a queued task is updated; `occupied` is the generated column of the
/// unique index (1 while the row holds its key).
pub(crate) const REPLACE: &str = "UPDATE task_run SET payload = ?, run_at = ?, priority = ?, \
                                  updated_at = ? \
                                  WHERE user_id = ? AND task_type = ? AND resource_key = ? \
                                  AND dedup_window_end = ? AND occupied = 1 \
                                  AND status = 'queued'";

// A claim: no UPDATE of a table selected from in a subquery, so the next rows are locked
// here (skipping rows other claimers hold), then updated and read by their ids
// ([`claim_update`], [`claimed`]), in one short transaction. `task_run_claim_idx` serves
// the order, which also keeps InnoDB from locking every row it scans.

// A paused type's tasks are not due (`task_dedup_paused`, a plain read like the probe
// below).
//
// One run per key: a task is due only if no task of its key runs (a probe of
// `task_running_resource_uidx` through its generated column `running_slot`, 1 while a
// task runs and is not `concurrent`), unless it is `concurrent` itself. Blocked tasks
// are passed over in the scan, so a batch fills from unblocked keys however many wait
// ahead of them. The subquery is a plain read (a locking clause does not reach into
// it). The flow keeps the first task of each key among those selected
// (`executor::mysql::claim`).

/// A claim up to the selection of the tasks: `CLAIM_ANY` and [`claim_types`] differ in
/// which tasks they select.
macro_rules! claim_select {
    () => {
        concat!(
            optimistic_select!(),
            "AND (concurrent OR NOT EXISTS (SELECT 1 FROM task_run r \
             WHERE r.user_id = t.user_id AND r.task_type = t.task_type \
             AND r.resource_key = t.resource_key AND r.running_slot = 1)) "
        )
    };
}

/// The optimistic claim's selection: due tasks, with no probe. The index refuses the
/// `UPDATE` (`Kind::RunningKey`) when one of them has a task of its key running, and the
/// claim's transaction then takes nothing.
macro_rules! optimistic_select {
    () => {
        concat!(
            "SELECT id, user_id, task_type, resource_key, concurrent FROM task_run t ",
            due_of_any_limit!(),
            type_unlimited!(),
            "AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '') "
        )
    };
}

/// A task whose type has no limits of its own (no row in `task_dedup_limits`). With
/// the last condition of [`optimistic_select!`] (no limit across all types: the row of
/// the empty type, which no task has; while one is set, every task starts under its
/// lock, [`LIMITS`]'s `rest_candidates`), the main claims' selection.
macro_rules! type_unlimited {
    () => {
        "AND task_type NOT IN (SELECT task_type FROM task_dedup_limits) "
    };
}

/// The due tasks, those of limited types included (a limited type's claim selects from
/// these, [`LIMITS`]; every other claim passes over limited types, whose tasks start
/// only under their limits' lock).
macro_rules! due_of_any_limit {
    () => {
        "WHERE status = 'queued' AND run_at <= UTC_TIMESTAMP(6) \
         AND task_type NOT IN (SELECT task_type FROM task_dedup_paused) "
    };
}

/// The end of every claim's selection: the next `LIMIT` due tasks in claim order,
/// locked, skipping rows other claimers hold.
macro_rules! claim_order {
    () => {
        "ORDER BY priority DESC, run_at, created_at, id LIMIT ? FOR UPDATE SKIP LOCKED"
    };
}

/// `Limits::slots_and_candidates` with `$probe` (the probe for running tasks of the
/// candidates' keys, or nothing): the type's next due tasks, locked, then the limit and
/// the running tasks' slots. Two parts of one `UNION ALL`, each planned as it would be
/// alone; the slots are a plain read, so a slot taken by a claim it does not see fails
/// that claim's update in `task_run_slot_uidx`.
macro_rules! slots_and {
    ($probe:expr) => {
        concat!(
            "(SELECT id, user_id, task_type, resource_key, concurrent, NULL AS m, \
             NULL AS status, NULL AS slot FROM task_run t ",
            due_of_any_limit!(),
            "AND task_type = ? ",
            $probe,
            claim_order!(),
            ") UNION ALL (SELECT NULL, NULL, NULL, NULL, NULL, l.max_running, r.status, \
             r.run_slot FROM task_dedup_limits l \
             LEFT JOIN task_run r ON r.task_type = l.task_type AND r.status = 'running' \
             WHERE l.task_type = ? AND l.max_running IS NOT NULL \
             AND l.max_running_per_user IS NULL AND l.rate_starts IS NULL AND NOT l.fair \
             AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = ''))"
        )
    };
}

/// The next due queued tasks of any type, locked (id, key, `concurrent`): how many.
pub(crate) const CLAIM_ANY: &str = concat!(claim_select!(), claim_order!());

/// [`CLAIM_ANY`] without the probe.
pub(crate) const OPTIMISTIC_CLAIM_ANY: &str = concat!(optimistic_select!(), claim_order!());

/// The same for `types` task types: the types, one placeholder each, how many. A list
/// of placeholders, not a JSON_TABLE of them: MariaDB joined the JSON_TABLE as a
/// semi-join, sorted every due task in a temporary table and so locked them all, and one
/// worker at a time claimed (a typed Worker drained at 0.2 x an untyped one).
pub(crate) fn claim_types(types: usize) -> Cow<'static, str> {
    Cow::Owned(format!(
        concat!(claim_select!(), "AND task_type IN ({}) ", claim_order!()),
        repeat("?", types)
    ))
}

/// [`claim_types`] without the probe.
pub(crate) fn optimistic_claim_types(types: usize) -> Cow<'static, str> {
    Cow::Owned(format!(
        concat!(
            optimistic_select!(),
            "AND task_type IN ({}) ",
            claim_order!()
        ),
        repeat("?", types)
    ))
}

/// Marks `ids` locked tasks claimed, with no run slot (as on PostgreSQL): worker_id,
/// lease, the ids. One primary-key lookup each (a JSON_TABLE of ids made InnoDB scan and
/// lock the whole table).
pub(crate) fn claim_update(ids: usize) -> Cow<'static, str> {
    Cow::Owned(format!(
        "UPDATE task_run SET status = 'running', attempts = attempts + 1, \
         lease_owner = ?, lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
         started_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6), run_slot = NULL \
         WHERE id IN ({})",
        repeat("?", ids)
    ))
}

/// The claimed tasks: the ids.
pub(crate) fn claimed(ids: usize) -> Cow<'static, str> {
    Cow::Owned(format!(
        concat!("SELECT ", columns!(), " FROM task_run WHERE id IN ({})"),
        repeat("?", ids)
    ))
}

/// One multi-row statement per chunk, with the placeholders of the single insert per row.
/// `ON DUPLICATE KEY UPDATE id = id` skips a row whose key is held without silencing any
/// other error (unlike `INSERT IGNORE`); which rows went in is read back by id.
pub(crate) const BULK: Bulk = Bulk {
    chunk: 2_000,
    insert: |rows| {
        Cow::Owned(format!(
            concat!(insert_into!(), "{rows} ON DUPLICATE KEY UPDATE id = id"),
            rows = repeat(row_placeholders!(), rows)
        ))
    },
    // `status` is the held row's: only a queued one takes the new values. (`VALUES()`:
    // MariaDB has no row alias for the new row.)
    replace: |rows| {
        Cow::Owned(format!(
            concat!(
                insert_into!(),
                "{rows} ON DUPLICATE KEY UPDATE \
                 payload = IF(status = 'queued', VALUES(payload), payload), \
                 run_at = IF(status = 'queued', VALUES(run_at), run_at), \
                 priority = IF(status = 'queued', VALUES(priority), priority), \
                 updated_at = IF(status = 'queued', VALUES(updated_at), updated_at)"
            ),
            rows = repeat(row_placeholders!(), rows)
        ))
    },
    // A locking read, as after a single conflict: it sees rows committed after the
    // caller's REPEATABLE READ snapshot.
    find_occupants: |rows| {
        Cow::Owned(format!(
            concat!(
                "SELECT ",
                columns!(),
                " FROM task_run \
                 WHERE (user_id, task_type, resource_key, dedup_window_end) IN ({keys}) \
                 AND occupied = 1 LOCK IN SHARE MODE"
            ),
            keys = repeat("(?, ?, ?, ?)", rows)
        ))
    },
    find_occupants_after_own_insert: |rows| {
        Cow::Owned(format!(
            concat!(
                "SELECT ",
                columns!(),
                " FROM task_run \
                 WHERE (user_id, task_type, resource_key, dedup_window_end) IN ({keys}) \
                 AND occupied = 1"
            ),
            keys = repeat("(?, ?, ?, ?)", rows)
        ))
    },
    by_ids: |rows| {
        Cow::Owned(format!(
            concat!("SELECT ", columns!(), " FROM task_run WHERE id IN ({ids})"),
            ids = repeat("?", rows)
        ))
    },
};

/// A worker's batch endings: per-row values picked by `CASE id WHEN ? THEN ? ... END`
/// over `id IN (...)` (one primary-key lookup each), the worker's id last: a form MySQL 8
/// and MariaDB both take (MariaDB has no `VALUES` table constructor MySQL takes, nor
/// `UPDATE ... RETURNING`). The count of rows matched tells whether all of them changed
/// (sqlx sets CLIENT_FOUND_ROWS); when it falls short, [`ended_by`] reads which did.
pub(crate) const ENDINGS: Endings = Endings {
    complete: |rows| {
        Cow::Owned(format!(
            "UPDATE task_run SET status = 'succeeded', result = CASE id {whens}END, \
             lease_expires_at = NULL, finished_at = UTC_TIMESTAMP(6), \
             updated_at = UTC_TIMESTAMP(6) \
             WHERE id IN ({ids}) AND status = 'running' AND lease_owner = ?",
            whens = "WHEN ? THEN ? ".repeat(rows),
            ids = repeat("?", rows)
        ))
    },
    fail: |rows| {
        Cow::Owned(format!(
            "UPDATE task_run SET status = 'failed', error = CASE id {whens}END, \
             lease_expires_at = NULL, finished_at = UTC_TIMESTAMP(6), \
             updated_at = UTC_TIMESTAMP(6) \
             WHERE id IN ({ids}) AND status = 'running' AND lease_owner = ?",
            whens = "WHEN ? THEN ? ".repeat(rows),
            ids = repeat("?", rows)
        ))
    },
    // `lease_owner` stays, as in `retry`.
    retry: |rows| {
        Cow::Owned(format!(
            "UPDATE task_run SET status = 'queued', error = CASE id {whens}END, \
             lease_expires_at = NULL, \
             run_at = UTC_TIMESTAMP(6) + INTERVAL (CASE id {whens}END) MICROSECOND, \
             updated_at = UTC_TIMESTAMP(6) \
             WHERE id IN ({ids}) AND status = 'running' AND lease_owner = ?",
            whens = "WHEN ? THEN ? ".repeat(rows),
            ids = repeat("?", rows)
        ))
    },
};

/// Which of the given ids are in a status under a lease owner, after a batch ending
/// changed fewer rows than it was given: the ids, the status, the worker's id. Read in the
/// ending's transaction, whose row locks keep the rows it changed as it left them.
pub(crate) fn ended_by(ids: usize) -> Cow<'static, str> {
    Cow::Owned(format!(
        "SELECT id FROM task_run WHERE id IN ({ids}) AND status = ? AND lease_owner = ?",
        ids = repeat("?", ids)
    ))
}

/// Deletes the batch [`STATEMENTS`]`.prune` locked: the ids. Their row locks are the
/// transaction's, so nothing else changed them in between. The multi-table form only
/// for its index hint: a single-table DELETE takes none, and on a small table the
/// optimizer scans it whole instead of looking the ids up, waiting for (and locking)
/// rows other pruners hold.
pub(crate) fn prune_ids(ids: usize) -> Cow<'static, str> {
    Cow::Owned(format!(
        "DELETE task_run FROM task_run FORCE INDEX (PRIMARY) WHERE id IN ({ids})",
        ids = repeat("?", ids)
    ))
}

/// Which of the given ids exist: which rows a bulk insert put in (no `RETURNING`).
pub(crate) fn ids_in(ids: usize) -> Cow<'static, str> {
    Cow::Owned(format!(
        "SELECT id FROM task_run WHERE id IN ({ids})",
        ids = repeat("?", ids)
    ))
}

/// The table, the columns of the unique index in order, and the expression of the
/// generated column it reads (MariaDB and MySQL have no partial indexes: `occupied` is
/// 1 while a row holds its key, NULL otherwise).
pub(crate) const GUARD: &str = "SELECT \
     (SELECT COUNT(*) FROM information_schema.TABLES \
      WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'task_run') AS has_table, \
     (SELECT CAST(GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) AS CHAR) \
      FROM information_schema.STATISTICS \
      WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'task_run' \
      AND INDEX_NAME = 'task_active_resource_uidx' AND NON_UNIQUE = 0) AS key_columns, \
     (SELECT CAST(GENERATION_EXPRESSION AS CHAR) FROM information_schema.COLUMNS \
      WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'task_run' \
      AND COLUMN_NAME = 'occupied') AS occupied";

/// What [`GUARD`]'s row says.
pub(crate) fn guarded(
    has_table: i64,
    key_columns: Option<&str>,
    occupied: Option<&str>,
) -> Guarded {
    const KEY_COLUMNS: &str = "user_id,task_type,resource_key,dedup_window_end,occupied";
    if has_table == 0 {
        return Guarded::NoTable;
    }
    match key_columns {
        None => return Guarded::No("task_active_resource_uidx is missing".to_owned()),
        Some(columns) if columns != KEY_COLUMNS => {
            return Guarded::No(format!(
                "task_active_resource_uidx is on ({columns}), not ({KEY_COLUMNS})"
            ));
        }
        Some(_) => {}
    }
    // The server rewrites the expression (quotes, parentheses); its terms stay.
    let expression = occupied.map(squeeze).unwrap_or_default();
    let reads_the_key = [
        "'active'",
        "'queued'",
        "'running'",
        "'period'",
        "scope",
        "status",
    ]
    .iter()
    .all(|term| expression.contains(term));
    if reads_the_key {
        Guarded::Yes
    } else {
        Guarded::No("the column `occupied` is not generated from scope and status".to_owned())
    }
}

/// A duplicate key in a unique index (or the primary key).
const ER_DUP_ENTRY: u16 = 1062;
/// InnoDB broke a deadlock by rolling back this statement's transaction.
const ER_LOCK_DEADLOCK: u16 = 1213;

/// The server went away or the connection dropped during a query (client-side codes).
const CR_SERVER_GONE_ERROR: u16 = 2006;
const CR_SERVER_LOST: u16 = 2013;
/// The server is shutting down (its sessions get this before they close).
const ER_SERVER_SHUTDOWN: u16 = 1053;
/// MariaDB: the session was killed (`KILL CONNECTION`).
const ER_CONNECTION_KILLED: u16 = 1927;
/// MySQL 8: the server disconnected an idle client.
const ER_CLIENT_INTERACTION_TIMEOUT: u16 = 4031;
/// InnoDB gave up waiting for a row lock (`innodb_lock_wait_timeout`).
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
/// MariaDB `max_statement_time`, MySQL `max_execution_time`.
const ER_STATEMENT_TIMEOUT: u16 = 1969;
const ER_QUERY_TIMEOUT: u16 = 3024;

/// What a MySQL/MariaDB error means. The driver gives the violated index only in the
/// message (`Duplicate entry '...' for key 'task_active_resource_uidx'`; MySQL 8 prefixes
/// the table), so a duplicate key is told ours by reading it: the one place that does.
pub(super) fn kind(e: &MySqlDatabaseError) -> Kind {
    match e.number() {
        ER_DUP_ENTRY if names_index(e.message(), ACTIVE_RESOURCE_UIDX) => Kind::HeldKey,
        ER_DUP_ENTRY if names_index(e.message(), RUNNING_RESOURCE_UIDX) => Kind::RunningKey,
        ER_DUP_ENTRY if names_index(e.message(), SLOT_UIDX) => Kind::SlotTaken,
        ER_LOCK_DEADLOCK => Kind::TransactionConflict,
        CR_SERVER_GONE_ERROR
        | CR_SERVER_LOST
        | ER_SERVER_SHUTDOWN
        | ER_CONNECTION_KILLED
        | ER_CLIENT_INTERACTION_TIMEOUT => Kind::ConnectionLost,
        ER_LOCK_WAIT_TIMEOUT | ER_STATEMENT_TIMEOUT | ER_QUERY_TIMEOUT => Kind::Timeout,
        _ => Kind::Other,
    }
}

fn names_index(message: &str, index: &str) -> bool {
    message
        .strip_suffix('\'')
        .and_then(|m| m.strip_suffix(index))
        .is_some_and(|m| m.ends_with('\'') || m.ends_with('.'))
}

/// The admin API's statements (`crate::admin`; lists are built in `dialect::admin`).
/// Minutes are counted from the epoch with `TIMESTAMPDIFF`, not `UNIX_TIMESTAMP`, which
/// would read the UTC `datetime(6)` values in the session's time zone.
/// The database's clock in microseconds since the Unix epoch (`UNIX_TIMESTAMP` of
/// `NOW(6)` reads it in the session's zone, whatever that is).
macro_rules! now_micros {
    () => {
        "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"
    };
}

pub(crate) const LIMITS: Limits = Limits {
    types: "SELECT task_type FROM task_dedup_limits",
    lock: concat!(
        "SELECT task_type, max_running, max_running_per_user, rate_starts, \
         rate_window_micros, window_start_micros, window_starts, fair, fair_cursor, ",
        now_micros!(),
        " AS now_micros FROM task_dedup_limits WHERE task_type IN (?, '') \
         ORDER BY task_type FOR UPDATE"
    ),
    running: "SELECT user_id, run_slot FROM task_run \
              WHERE task_type = ? AND status = 'running' LOCK IN SHARE MODE",
    running_users: "SELECT user_id FROM task_run WHERE status = 'running' LOCK IN SHARE MODE",
    window_claim: None,
    optimistic_window_claim: None,
    slot_claim: None,
    slots_and_candidates: Some(slots_and!(
        "AND (concurrent OR NOT EXISTS (SELECT 1 FROM task_run r \
         WHERE r.user_id = t.user_id AND r.task_type = t.task_type \
         AND r.resource_key = t.resource_key AND r.running_slot = 1)) "
    )),
    slots_and_optimistic_candidates: Some(slots_and!("")),
    candidates: |excluded, _| {
        let mut sql = String::from(concat!(
            "SELECT id, user_id, task_type, resource_key, concurrent FROM task_run t ",
            due_of_any_limit!(),
            "AND task_type = ? AND (concurrent OR NOT EXISTS (SELECT 1 FROM task_run r \
             WHERE r.user_id = t.user_id AND r.task_type = t.task_type \
             AND r.resource_key = t.resource_key AND r.running_slot = 1)) "
        ));
        if excluded > 0 {
            sql.push_str(&format!("AND user_id NOT IN ({}) ", repeat("?", excluded)));
        }
        sql.push_str(claim_order!());
        Cow::Owned(sql)
    },
    rest_candidates: |types, excluded, _| {
        let mut sql = String::from(concat!(
            "SELECT id, user_id, task_type, resource_key, concurrent FROM task_run t ",
            due_of_any_limit!(),
            type_unlimited!(),
            "AND (concurrent OR NOT EXISTS (SELECT 1 FROM task_run r \
             WHERE r.user_id = t.user_id AND r.task_type = t.task_type \
             AND r.resource_key = t.resource_key AND r.running_slot = 1)) "
        ));
        if types > 0 {
            sql.push_str(&format!("AND task_type IN ({}) ", repeat("?", types)));
        }
        if excluded > 0 {
            sql.push_str(&format!("AND user_id NOT IN ({}) ", repeat("?", excluded)));
        }
        sql.push_str(claim_order!());
        Cow::Owned(sql)
    },
    // `task_run_user_queue_idx (task_type, status, user_id, ...)` serves each step's
    // `min` and the heads' order.
    fair_users: "WITH RECURSIVE walk (user_id, n) AS ( \
                 SELECT (SELECT min(user_id) FROM task_run \
                 WHERE task_type = ? AND status = 'queued' AND user_id > ?), 1 \
                 UNION ALL \
                 SELECT (SELECT min(t.user_id) FROM task_run t \
                 WHERE t.task_type = ? AND t.status = 'queued' AND t.user_id > walk.user_id), \
                 walk.n + 1 FROM walk WHERE walk.user_id IS NOT NULL AND walk.n < ?) \
                 SELECT user_id FROM walk WHERE user_id IS NOT NULL",
    fair_heads: concat!(
        "SELECT id, user_id, task_type, resource_key, concurrent FROM task_run t ",
        due_of_any_limit!(),
        "AND task_type = ? AND user_id = ? \
         AND (concurrent OR NOT EXISTS (SELECT 1 FROM task_run r \
         WHERE r.user_id = t.user_id AND r.task_type = t.task_type \
         AND r.resource_key = t.resource_key AND r.running_slot = 1)) \
         ORDER BY priority DESC, run_at, created_at, id LIMIT ?"
    ),
    fair_cursor: "UPDATE task_dedup_limits SET fair_cursor = ? WHERE task_type = ?",
    claim_ids: |ids| {
        Cow::Owned(format!(
            "UPDATE task_run SET status = 'running', attempts = attempts + 1, \
             lease_owner = ?, lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
             started_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6), \
             run_slot = CASE id {} END \
             WHERE id IN ({}) AND status = 'queued'",
            vec!["WHEN ? THEN ?"; ids].join(" "),
            repeat("?", ids)
        ))
    },
    window: "UPDATE task_dedup_limits SET window_start_micros = ?, window_starts = ? \
             WHERE task_type = ?",
    set: "INSERT INTO task_dedup_limits (task_type, max_running, max_running_per_user, \
          rate_starts, rate_window_micros, fair, updated_at) \
          VALUES (?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6)) \
          ON DUPLICATE KEY UPDATE max_running = VALUES(max_running), \
          max_running_per_user = VALUES(max_running_per_user), \
          rate_starts = VALUES(rate_starts), rate_window_micros = VALUES(rate_window_micros), \
          fair = VALUES(fair), updated_at = VALUES(updated_at)",
    clear: "DELETE FROM task_dedup_limits WHERE task_type = ?",
    list: concat!(
        "SELECT task_type, max_running, max_running_per_user, rate_starts, rate_window_micros, \
         window_start_micros, window_starts, fair, fair_cursor, updated_at, \
         (SELECT count(*) FROM task_run r WHERE r.task_type = l.task_type \
         AND r.status = 'running') AS running, ",
        now_micros!(),
        " AS now_micros FROM task_dedup_limits l ORDER BY task_type"
    ),
};

pub(crate) const ADMIN: Admin = Admin {
    now: "SELECT UTC_TIMESTAMP(6) AS now",
    // No RETURNING: the row is read by id in the same transaction.
    retry: "UPDATE task_run SET status = 'queued', attempts = 0, lease_owner = NULL, \
            lease_expires_at = NULL, finished_at = NULL, run_at = UTC_TIMESTAMP(6), \
            updated_at = UTC_TIMESTAMP(6) \
            WHERE id = ? AND status IN ('failed', 'cancelled')",
    delete: "DELETE FROM task_run WHERE id = ? AND status IN ('succeeded', 'failed', 'cancelled')",
    counts: "SELECT task_type, status, COUNT(*) AS n FROM task_run \
             GROUP BY task_type, status ORDER BY task_type, status",
    // A loose index scan of `task_run_type_status_created_idx`: one entry per type.
    task_types: "SELECT DISTINCT task_type FROM task_run ORDER BY task_type",
    // Positional parameters: the type and the limit, once per arm.
    counts_of_type: "SELECT 'cancelled' AS status, COUNT(*) AS n FROM (SELECT 1 FROM task_run \
                     WHERE task_type = ? AND status = 'cancelled' \
                     ORDER BY created_at LIMIT ?) AS c \
                     UNION ALL SELECT 'failed' AS status, COUNT(*) AS n FROM (SELECT 1 FROM task_run \
                     WHERE task_type = ? AND status = 'failed' \
                     ORDER BY created_at LIMIT ?) AS c \
                     UNION ALL SELECT 'queued' AS status, COUNT(*) AS n FROM (SELECT 1 FROM task_run \
                     WHERE task_type = ? AND status = 'queued' \
                     ORDER BY created_at LIMIT ?) AS c \
                     UNION ALL SELECT 'running' AS status, COUNT(*) AS n FROM (SELECT 1 FROM task_run \
                     WHERE task_type = ? AND status = 'running' \
                     ORDER BY created_at LIMIT ?) AS c \
                     UNION ALL SELECT 'succeeded' AS status, COUNT(*) AS n FROM (SELECT 1 FROM task_run \
                     WHERE task_type = ? AND status = 'succeeded' \
                     ORDER BY created_at LIMIT ?) AS c",
    // The window's start from the clock: the minute 59 minutes ago.
    throughput: "SELECT 'created' AS what, \
                 TIMESTAMPDIFF(MINUTE, '1970-01-01 00:00:00', created_at) AS minute, \
                 COUNT(*) AS n FROM task_run \
                 WHERE created_at >= DATE_FORMAT(UTC_TIMESTAMP(), '%Y-%m-%d %H:%i:00') \
                 - INTERVAL 59 MINUTE GROUP BY 2 \
                 UNION ALL SELECT status, \
                 TIMESTAMPDIFF(MINUTE, '1970-01-01 00:00:00', finished_at), COUNT(*) \
                 FROM task_run \
                 WHERE finished_at >= DATE_FORMAT(UTC_TIMESTAMP(), '%Y-%m-%d %H:%i:00') \
                 - INTERVAL 59 MINUTE AND status IN ('succeeded', 'failed') GROUP BY 1, 2",
    // MariaDB reads this with a loose index scan of `task_run_type_status_created_idx`
    // ("Using index for group-by"): one entry per type.
    oldest_queued: "SELECT task_type, MIN(created_at) AS oldest FROM task_run \
                    WHERE status = 'queued' GROUP BY task_type ORDER BY task_type",
    // Counts the rows matched (sqlx sets CLIENT_FOUND_ROWS): with the status in the
    // condition, those are the rows changed.
    cancel_many: |rows| {
        Cow::Owned(format!(
            "UPDATE task_run SET status = 'cancelled', error = ?, lease_expires_at = NULL, \
             finished_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6) \
             WHERE id IN ({ids}) AND status IN ('queued', 'running')",
            ids = repeat("?", rows)
        ))
    },
    delete_many: |rows| {
        Cow::Owned(format!(
            "DELETE FROM task_run WHERE id IN ({ids}) \
             AND status IN ('succeeded', 'failed', 'cancelled')",
            ids = repeat("?", rows)
        ))
    },
};
