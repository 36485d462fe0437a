//! SQLite: `ON CONFLICT` against the partial unique index, `UPDATE ... RETURNING`, claims
//! in one UPDATE (no row locks: one statement is atomic under the database's write
//! lock).
//!
//! Timestamps are RFC 3339 text in UTC, the shape sqlx writes for `DateTime<Utc>`, so
//! values the database writes (`strftime(..., 'now')`, millisecond resolution) and values
//! the library writes compare correctly as text.

use std::borrow::Cow;

use sea_orm::sqlx::error::DatabaseError;
use sea_orm::sqlx::sqlite::SqliteError;
use task_dedup_entity::{occupies_key_sql, runs_serially_sql};

use super::limits::Limits;
use super::{Admin, Bulk, Endings, Guarded, Kind, Returning, Statements, repeat, squeeze};

/// running → succeeded, up to `RETURNING`.
macro_rules! complete {
    () => {
        "UPDATE task_run SET status = 'succeeded', result = ?, lease_expires_at = NULL, \
         finished_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'), \
         updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
         WHERE id = ? AND status = 'running' AND lease_owner = ?"
    };
}

/// What every claim sets on the tasks it starts (then the run slot): `running` under
/// the worker's lease (`$owner`, `$lease`: their placeholders, numbered where the
/// statement's other parameters come first in its text), one more attempt.
macro_rules! start_tasks {
    ($owner:literal, $lease:literal) => {
        concat!(
            "UPDATE task_run SET status = 'running', attempts = attempts + 1, lease_owner = ",
            $owner,
            ", lease_expires_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ",
            $lease,
            "), started_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'), \
             updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'), "
        )
    };
}

/// Every claim up to the selection of its tasks: they move to `running` under the lease,
/// with no run slot (as on PostgreSQL).
macro_rules! claim_start {
    () => {
        concat!(
            start_tasks!("?", "?"),
            "run_slot = NULL WHERE id IN (SELECT id FROM "
        )
    };
}

/// The due tasks a claim selects from (then `AND` its own conditions).
///
/// A paused type's tasks are not due (`task_dedup_paused`, read once per claim).
///
/// `+run_at`: the unary plus keeps `run_at` out of the index's search, so the claim
/// index is read in order from `status = 'queued'` and the scan stops at the limit.
/// With statistics (`ANALYZE`, or `PRAGMA optimize` as SQLite advises), SQLite 3.40
/// (Debian 12's, which `sqlx`'s `sqlite-unbundled` links) planned a skip-scan over
/// `status` and `priority` with `run_at` as a range instead, and sorted every due task
/// for each claim. The bundled SQLite (3.50) reads the index in order either way.
macro_rules! due {
    () => {
        concat!(
            due_of_any_limit!(),
            type_unlimited!(),
            no_limit_across_types!()
        )
    };
}

/// A task whose type has no limits of its own (no row in `task_dedup_limits`).
macro_rules! type_unlimited {
    () => {
        "AND task_type NOT IN (SELECT task_type FROM task_dedup_limits) "
    };
}

/// No limit across all types is set (the row of the empty type, which no task has):
/// while one is, every task starts under the limited claims' write lock ([`LIMITS`]'s
/// `rest_candidates`).
macro_rules! no_limit_across_types {
    () => {
        "AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '') "
    };
}

/// [`due!`] without its last condition: the tasks of a limited type are due too. A
/// limited type's claim selects from these ([`LIMITS`]); every other claim passes over
/// limited types (their tasks start only under their limits' lock).
macro_rules! due_of_any_limit {
    () => {
        "task_run t \
         WHERE status = 'queued' \
         AND +run_at <= strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', '+0.001 seconds') \
         AND task_type NOT IN (SELECT task_type FROM task_dedup_paused) "
    };
}

/// The probing claim up to its selection's `ORDER BY` ([`claim_end!`] closes it):
/// `claim_any` and `claim_types` differ in which tasks they select.
///
/// One run per key: a task is due only if no task of its key runs (a probe of
/// `task_running_resource_uidx`, whose predicate it repeats so that SQLite uses it),
/// unless it is `concurrent`. Blocked tasks are passed over in the scan, so a batch
/// fills from unblocked keys however many wait ahead of them.
macro_rules! claim_set {
    () => {
        concat!(
            claim_start!(),
            "(SELECT id, row_number() OVER (PARTITION BY user_id, \
             task_type, resource_key, CASE WHEN concurrent THEN id END \
             ORDER BY priority DESC, run_at, created_at, id) AS nth \
             FROM (SELECT id, user_id, task_type, resource_key, concurrent, priority, run_at, \
             created_at FROM ",
            due!(),
            "AND (concurrent OR NOT EXISTS (SELECT 1 FROM task_run r \
             WHERE r.user_id = t.user_id AND r.task_type = t.task_type \
             AND r.resource_key = t.resource_key AND ",
            runs_serially_sql!(),
            ")) "
        )
    };
}

/// The end of a probing claim, after its selection: the next due tasks in claim order,
/// then the first of each key among them (a `concurrent` task is a key of its own), so
/// one claim never starts two tasks of one key.
macro_rules! claim_end {
    () => {
        concat!(
            "ORDER BY priority DESC, run_at, created_at, id LIMIT ?)) WHERE nth = 1) \
             RETURNING ",
            columns!()
        )
    };
}

/// The end of the optimistic claim: the next due tasks in claim order, with neither the
/// probe nor the one-per-key step. `task_running_resource_uidx` fails it
/// (`Kind::RunningKey`) when it picked a task whose key runs, or two of one key, and
/// then it took nothing.
macro_rules! optimistic_end {
    () => {
        concat!(
            "ORDER BY priority DESC, run_at, created_at, id LIMIT ?) RETURNING ",
            columns!()
        )
    };
}

pub(crate) const STATEMENTS: Statements = Statements {
    // No conflict target: it covers the partial unique index (and the primary key) and,
    // unlike a targeted clause, is not matched against the schema when the statement is
    // prepared. A pooled connection opened before the index existed keeps the old
    // schema in memory, and a targeted clause fails there ("ON CONFLICT clause does not
    // match any PRIMARY KEY or UNIQUE constraint") instead of being re-prepared. NOT NULL
    // and CHECK violations still fail, unlike with `INSERT OR IGNORE`.
    insert: concat!(
        insert_into!(),
        row_placeholders!(),
        " ON CONFLICT DO NOTHING RETURNING id"
    ),
    // No INSERT inside WITH, and a DO NOTHING upsert returns nothing on a conflict. In
    // process, the read after a conflict costs no round trip either (BENCHMARKS.md).
    insert_or_find: None,
    find_occupant: concat!(
        "SELECT ",
        columns!(),
        " FROM task_run \
         WHERE user_id = ? AND task_type = ? AND resource_key = ? \
         AND dedup_window_end = ? AND ",
        occupies_key_sql!()
    ),
    // Writers are serialized: the conflicting row is committed and visible.
    find_occupant_after_conflict: concat!(
        "SELECT ",
        columns!(),
        " FROM task_run \
         WHERE user_id = ? AND task_type = ? AND resource_key = ? \
         AND dedup_window_end = ? AND ",
        occupies_key_sql!()
    ),
    by_id: concat!("SELECT ", columns!(), " FROM task_run WHERE id = ?"),
    heartbeat: concat!(
        "UPDATE task_run SET lease_expires_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?), \
         updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
         WHERE id = ? AND status = 'running' AND lease_owner = ? RETURNING ",
        columns!()
    ),
    complete: concat!(complete!(), " RETURNING ", columns!()),
    fail: concat!(
        "UPDATE task_run SET status = 'failed', error = ?, lease_expires_at = NULL, \
         finished_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'), \
         updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
         WHERE id = ? AND status = 'running' AND lease_owner = ? RETURNING ",
        columns!()
    ),
    // `lease_owner` stays, so a repeated call by the same worker can tell its own retry.
    retry: concat!(
        "UPDATE task_run SET status = 'queued', error = ?, lease_expires_at = NULL, \
         run_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?), \
         updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
         WHERE id = ? AND status = 'running' AND lease_owner = ? RETURNING ",
        columns!()
    ),
    cancel: concat!(
        "UPDATE task_run SET status = 'cancelled', error = ?, lease_expires_at = NULL, \
         finished_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'), \
         updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
         WHERE id = ? AND status IN ('queued', 'running') RETURNING ",
        columns!()
    ),
    // `lease_owner` stays, so a repeated call by the same worker can tell its own release.
    release: concat!(
        "UPDATE task_run SET status = 'queued', lease_expires_at = NULL, \
         attempts = attempts - 1, \
         updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
         WHERE id = ? AND status = 'running' AND lease_owner = ? RETURNING ",
        columns!()
    ),
    // `lease_owner` stays, as in `release`. The delay is a date-function modifier.
    snooze: concat!(
        "UPDATE task_run SET status = 'queued', lease_expires_at = NULL, \
         attempts = attempts - 1, snoozes = snoozes + 1, \
         run_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?), \
         updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
         WHERE id = ? AND status = 'running' AND lease_owner = ? RETURNING ",
        columns!()
    ),
    expired: "SELECT id, attempts FROM task_run \
              WHERE status = 'running' \
              AND lease_expires_at < strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
              ORDER BY lease_expires_at LIMIT 100",
    // The expiry is checked again: a heartbeat that renewed the lease first wins.
    reap_fail: "UPDATE task_run SET status = 'failed', error = ?, lease_expires_at = NULL, \
                finished_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'), \
                updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
                WHERE id = ? AND status = 'running' \
                AND lease_expires_at < strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')",
    reap_requeue: "UPDATE task_run SET status = 'queued', lease_owner = NULL, \
                   lease_expires_at = NULL, \
                   run_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?), \
                   updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
                   WHERE id = ? AND status = 'running' \
                   AND lease_expires_at < strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')",
    // A period task keeps its window until the window is over, finished or not.
    // The oldest first, through `task_run_finished_idx`. No row locks to skip: the
    // statement runs under the database's write lock.
    prune: "DELETE FROM task_run WHERE id IN (SELECT id FROM task_run \
            WHERE status = ? \
            AND finished_at < strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?) \
            AND dedup_window_end <= CAST(strftime('%s', 'now') AS INTEGER) \
            ORDER BY finished_at LIMIT ?)",
    pause: "INSERT INTO task_dedup_paused (task_type, paused_at) \
            VALUES (?, strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')) ON CONFLICT DO NOTHING",
    resume: "DELETE FROM task_dedup_paused WHERE task_type = ?",
    paused: "SELECT task_type, paused_at FROM task_dedup_paused ORDER BY task_type",
    running_index: "SELECT 1 AS present FROM sqlite_master WHERE type = 'index' \
                    AND tbl_name = 'task_run' AND name = 'task_running_resource_uidx' \
                    AND sql LIKE 'CREATE UNIQUE INDEX%'",
};

pub(crate) const RETURNING: Returning = Returning {
    // Untargeted `DO UPDATE` (SQLite 3.35+), for the reason above.
    replace: concat!(
        insert_into!(),
        row_placeholders!(),
        " ON CONFLICT DO UPDATE SET payload = excluded.payload, run_at = excluded.run_at, \
         priority = excluded.priority, updated_at = excluded.updated_at \
         WHERE status = 'queued' \
         RETURNING ",
        columns!()
    ),
    // SQLite drops `FOR UPDATE SKIP LOCKED`; a single UPDATE with the selection as a
    // subquery is atomic under the write lock, so no two workers get one task. SQLite's
    // clock has millisecond resolution and `run_at` microseconds: a task is due within
    // the millisecond of its `run_at` (else a task enqueued in the same millisecond as
    // the claim would wait for the next one).
    claim_any: |_| concat!(claim_set!(), claim_end!()),
    claim_types: |_| {
        concat!(
            claim_set!(),
            "AND task_type IN (SELECT value FROM json_each(?)) ",
            claim_end!()
        )
    },
    optimistic_claim_any: |_| concat!(claim_start!(), due!(), optimistic_end!()),
    optimistic_claim_types: |_| {
        concat!(
            claim_start!(),
            due!(),
            "AND task_type IN (SELECT value FROM json_each(?)) ",
            optimistic_end!()
        )
    },
};

/// One multi-row statement per chunk, with the 12 placeholders of the single insert per
/// row: 2,000 rows stay within SQLite's 32,766 placeholders.
pub(crate) const BULK: Bulk = Bulk {
    chunk: 2_000,
    insert: |rows| {
        Cow::Owned(format!(
            concat!(insert_into!(), "{rows} ON CONFLICT DO NOTHING RETURNING id"),
            rows = repeat(row_placeholders!(), rows)
        ))
    },
    replace: |rows| {
        Cow::Owned(format!(
            concat!(
                insert_into!(),
                "{rows} ON CONFLICT DO UPDATE SET payload = excluded.payload, run_at = excluded.run_at, \
                 priority = excluded.priority, updated_at = excluded.updated_at \
                 WHERE status = 'queued' RETURNING ",
                columns!()
            ),
            rows = repeat(row_placeholders!(), rows)
        ))
    },
    find_occupants,
    // No locks to avoid: the same read.
    find_occupants_after_own_insert: find_occupants,
    by_ids: |rows| {
        Cow::Owned(format!(
            concat!("SELECT ", columns!(), " FROM task_run WHERE id IN ({ids})"),
            ids = repeat("?", rows)
        ))
    },
};

/// A worker's batch endings: the rows as a `VALUES` list joined to the table by id
/// (`UPDATE ... FROM`, SQLite 3.33+), the worker's id last.
pub(crate) const ENDINGS: Endings = Endings {
    complete: |rows| {
        Cow::Owned(format!(
            "WITH e(id, result) AS (VALUES {rows}) \
             UPDATE task_run SET status = 'succeeded', result = e.result, \
             lease_expires_at = NULL, \
             finished_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'), \
             updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
             FROM e WHERE task_run.id = e.id AND task_run.status = 'running' \
             AND task_run.lease_owner = ? RETURNING id",
            rows = repeat("(?, ?)", rows)
        ))
    },
    fail: |rows| {
        Cow::Owned(format!(
            "WITH e(id, error) AS (VALUES {rows}) \
             UPDATE task_run SET status = 'failed', error = e.error, lease_expires_at = NULL, \
             finished_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'), \
             updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
             FROM e WHERE task_run.id = e.id AND task_run.status = 'running' \
             AND task_run.lease_owner = ? RETURNING id",
            rows = repeat("(?, ?)", rows)
        ))
    },
    // `lease_owner` stays, as in `retry`. The delay is a date-function modifier.
    retry: |rows| {
        Cow::Owned(format!(
            "WITH e(id, error, delay) AS (VALUES {rows}) \
             UPDATE task_run SET status = 'queued', error = e.error, lease_expires_at = NULL, \
             run_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', e.delay), \
             updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
             FROM e WHERE task_run.id = e.id AND task_run.status = 'running' \
             AND task_run.lease_owner = ? RETURNING id",
            rows = repeat("(?, ?, ?)", rows)
        ))
    },
};

/// The tasks holding the given keys and windows: a join, so that each key is looked up
/// in the unique index.
fn find_occupants(rows: usize) -> Cow<'static, str> {
    Cow::Owned(format!(
        concat!(
            "WITH k(k_user_id, k_task_type, k_resource_key, k_window_end) AS (VALUES {rows}) \
             SELECT ",
            columns!(),
            " FROM k \
             JOIN task_run ON user_id = k_user_id AND task_type = k_task_type \
             AND resource_key = k_resource_key AND dedup_window_end = k_window_end \
             WHERE ",
            occupies_key_sql!()
        ),
        rows = repeat("(?, ?, ?, ?)", rows)
    ))
}

/// The table and the unique index as the schema has them: `type`, `sql` of `task_run` and
/// of `task_active_resource_uidx`. Read from `sqlite_master`, which is always current:
/// a statement with a targeted `ON CONFLICT` would be checked against the schema a pooled
/// connection cached when it opened.
pub(crate) const GUARD: &str = "SELECT type, sql FROM sqlite_master \
                                WHERE (type = 'table' AND name = 'task_run') \
                                OR (type = 'index' AND name = 'task_active_resource_uidx' \
                                AND tbl_name = 'task_run')";

/// What the rows of [`GUARD`] (type, sql) say.
pub(crate) fn guarded(rows: &[(String, Option<String>)]) -> Guarded {
    if !rows.iter().any(|(kind, _)| kind == "table") {
        return Guarded::NoTable;
    }
    let Some(sql) = rows
        .iter()
        .find(|(kind, _)| kind == "index")
        .and_then(|(_, sql)| sql.as_deref())
    else {
        return Guarded::No("task_active_resource_uidx is missing".to_owned());
    };
    let wanted = squeeze(concat!(
        "CREATE UNIQUE INDEX task_active_resource_uidx ON task_run ",
        "(user_id, task_type, resource_key, dedup_window_end) WHERE ",
        occupies_key_sql!()
    ));
    if squeeze(sql) == wanted {
        Guarded::Yes
    } else {
        Guarded::No(format!(
            "task_active_resource_uidx is not the guarantee: {sql}"
        ))
    }
}

/// Extended result code of a UNIQUE constraint failure.
const SQLITE_CONSTRAINT_UNIQUE: &str = "2067";
/// Primary result code of a lock not obtained within the busy timeout
/// (SQLITE_BUSY and its extended codes: 5, 261, 517, ...).
const SQLITE_BUSY: i32 = 5;
/// The columns of `task_active_resource_uidx`, as SQLite names them in the message of a
/// UNIQUE failure.
const HELD_KEY_COLUMNS: &str = "task_run.user_id, task_run.task_type, \
                                task_run.resource_key, task_run.dedup_window_end";
/// The same for `task_running_resource_uidx`, after the colon that ends the prefix.
const RUNNING_KEY_COLUMNS: &str = ": task_run.user_id, task_run.task_type, \
                                   task_run.resource_key";
/// `task_run_slot_uidx`'s columns.
const SLOT_COLUMNS: &str = ": task_run.task_type, task_run.run_slot";

/// What a SQLite error means. SQLite names the columns of the violated index, not the
/// index: `UNIQUE constraint failed: task_run.user_id, ..., task_run.dedup_window_end`.
/// Reading the message is the only way to tell ours; this is the one place that does.
pub(super) fn kind(e: &SqliteError) -> Kind {
    let code = e.code();
    let code = code.as_deref();
    if code == Some(SQLITE_CONSTRAINT_UNIQUE) && e.message().ends_with(HELD_KEY_COLUMNS) {
        return Kind::HeldKey;
    }
    if code == Some(SQLITE_CONSTRAINT_UNIQUE) && e.message().ends_with(RUNNING_KEY_COLUMNS) {
        return Kind::RunningKey;
    }
    if code == Some(SQLITE_CONSTRAINT_UNIQUE) && e.message().ends_with(SLOT_COLUMNS) {
        return Kind::SlotTaken;
    }
    match code.and_then(|code| code.parse::<i32>().ok()) {
        Some(code) if code & 0xff == SQLITE_BUSY => Kind::Timeout,
        _ => Kind::Other,
    }
}

/// A date-function modifier such as `+30.000000 seconds`.
pub(crate) fn seconds_modifier(micros: i64) -> String {
    let sign = if micros < 0 { '-' } else { '+' };
    let abs = micros.unsigned_abs();
    format!("{sign}{}.{:06} seconds", abs / 1_000_000, abs % 1_000_000)
}

/// The database's clock in microseconds since the Unix epoch, to the millisecond (as
/// every time SQLite writes here; `unixepoch('subsec')` needs SQLite 3.42).
macro_rules! now_micros {
    () => {
        "(CAST(strftime('%s', 'now') AS INTEGER) * 1000000 \
         + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER) * 1000)"
    };
}

/// The window claim's `picked` (the next `?4` due tasks of type `?3` whose key does not
/// run unless `concurrent`, one per key, numbered in claim order) and the start of its
/// `UPDATE` up to the run slot.
macro_rules! picked_and_started {
    () => {
        concat!(
            "picked AS (SELECT id AS pid, row_number() OVER (ORDER BY priority DESC, run_at, created_at, id) AS pn \
             FROM (SELECT id, priority, run_at, created_at, row_number() OVER (PARTITION BY user_id, \
             resource_key, CASE WHEN concurrent THEN id END \
             ORDER BY priority DESC, run_at, created_at, id) AS nth \
             FROM (SELECT id, user_id, resource_key, concurrent, priority, run_at, created_at FROM ",
            due_of_any_limit!(),
            "AND task_type = ?3 AND (concurrent OR NOT EXISTS (SELECT 1 FROM task_run r \
             WHERE r.user_id = t.user_id AND r.task_type = t.task_type \
             AND r.resource_key = t.resource_key AND ",
            runs_serially_sql!(),
            ")) ORDER BY priority DESC, run_at, created_at, id LIMIT ?4)) WHERE nth = 1) ",
            start_tasks!("?1", "?2")
        )
    };
}

/// The room a type whose only limit is `max_running` has: the limit less its running
/// tasks, counted in the claim's own statement (one writer at a time: no other claim
/// starts a task between the count and the start). No row for a type with other
/// limits, or while a limit across all types is set.
macro_rules! window_room {
    () => {
        concat!(
            "SELECT l.max_running - (SELECT count(*) FROM task_run x \
             WHERE x.task_type = ?3 AND x.status = 'running') AS room \
             FROM task_dedup_limits l \
             WHERE l.task_type = ?3 AND l.max_running IS NOT NULL \
             AND l.max_running_per_user IS NULL AND l.rate_starts IS NULL AND NOT l.fair ",
            no_limit_across_types!()
        )
    };
}

/// [`LIMITS`]'s `window_claim` (one text for every claim size): the picked tasks that
/// the room leaves, without run slots.
const WINDOW_CLAIM: &str = concat!(
    "WITH lim AS (",
    window_room!(),
    "), ",
    picked_and_started!(),
    "run_slot = NULL WHERE id IN (SELECT pid FROM picked, lim WHERE pn <= lim.room) \
     RETURNING ",
    columns!()
);

/// [`LIMITS`]'s `optimistic_window_claim`: the next due tasks of the type, as many as
/// the room leaves (none without a room: a negative `LIMIT` would be none at all).
const OPTIMISTIC_WINDOW_CLAIM: &str = concat!(
    start_tasks!("?1", "?2"),
    "run_slot = NULL WHERE id IN (SELECT id FROM ",
    due_of_any_limit!(),
    "AND task_type = ?3 ORDER BY priority DESC, run_at, created_at, id \
     LIMIT max(0, min(?4, coalesce((",
    window_room!(),
    "), 0)))) RETURNING ",
    columns!()
);

/// The limited claim runs in an IMMEDIATE transaction: its write lock is the type's
/// lock, so `lock` and the candidates need no locking clause.
pub(crate) const LIMITS: Limits = Limits {
    types: "SELECT task_type FROM task_dedup_limits",
    lock: concat!(
        "SELECT task_type, max_running, max_running_per_user, rate_starts, \
         rate_window_micros, window_start_micros, window_starts, fair, fair_cursor, ",
        now_micros!(),
        " AS now_micros FROM task_dedup_limits WHERE task_type IN (?, '') ORDER BY task_type"
    ),
    running: "SELECT user_id, run_slot FROM task_run WHERE task_type = ? AND status = 'running'",
    running_users: "SELECT user_id FROM task_run WHERE status = 'running'",
    slots_and_candidates: None,
    // Writers take turns on SQLite, so a count in the claim's statement is exact and no
    // run slot is needed: the window claims start what the count leaves, and a type at
    // its limit has no other lock-free try.
    window_claim: Some(|_| WINDOW_CLAIM),
    optimistic_window_claim: Some(|_| OPTIMISTIC_WINDOW_CLAIM),
    slot_claim: None,
    slots_and_optimistic_candidates: None,
    candidates: |_, _| {
        Cow::Borrowed(concat!(
            "SELECT id, user_id, task_type, resource_key, concurrent FROM ",
            due_of_any_limit!(),
            "AND task_type = ? AND user_id NOT IN (SELECT value FROM json_each(?)) \
             AND (concurrent OR NOT EXISTS (SELECT 1 FROM task_run r \
             WHERE r.user_id = t.user_id AND r.task_type = t.task_type \
             AND r.resource_key = t.resource_key AND ",
            runs_serially_sql!(),
            ")) ORDER BY priority DESC, run_at, created_at, id LIMIT ?"
        ))
    },
    rest_candidates: |_, _, _| {
        Cow::Borrowed(concat!(
            "SELECT id, user_id, task_type, resource_key, concurrent FROM ",
            due_of_any_limit!(),
            type_unlimited!(),
            "AND (json_array_length(?1) = 0 OR task_type IN (SELECT value FROM json_each(?1))) \
             AND user_id NOT IN (SELECT value FROM json_each(?2)) \
             AND (concurrent OR NOT EXISTS (SELECT 1 FROM task_run r \
             WHERE r.user_id = t.user_id AND r.task_type = t.task_type \
             AND r.resource_key = t.resource_key AND ",
            runs_serially_sql!(),
            ")) ORDER BY priority DESC, run_at, created_at, id LIMIT ?3"
        ))
    },
    fair_users: "WITH RECURSIVE walk (user_id, n) AS ( \
                 SELECT (SELECT min(user_id) FROM task_run \
                 WHERE task_type = ? AND status = 'queued' AND user_id > ?), 1 \
                 UNION ALL \
                 SELECT (SELECT min(t.user_id) FROM task_run t \
                 WHERE t.task_type = ? AND t.status = 'queued' AND t.user_id > walk.user_id), \
                 walk.n + 1 FROM walk WHERE walk.user_id IS NOT NULL AND walk.n < ?) \
                 SELECT user_id FROM walk WHERE user_id IS NOT NULL",
    fair_heads: concat!(
        "SELECT id, user_id, task_type, resource_key, concurrent FROM ",
        due_of_any_limit!(),
        "AND task_type = ? AND user_id = ? \
         AND (concurrent OR NOT EXISTS (SELECT 1 FROM task_run r \
         WHERE r.user_id = t.user_id AND r.task_type = t.task_type \
         AND r.resource_key = t.resource_key AND ",
        runs_serially_sql!(),
        ")) ORDER BY priority DESC, run_at, created_at, id LIMIT ?"
    ),
    fair_cursor: "UPDATE task_dedup_limits SET fair_cursor = ? WHERE task_type = ?",
    claim_ids: |ids| {
        Cow::Owned(format!(
            concat!(
                start_tasks!("?", "?"),
                "run_slot = CASE id {} END \
                 WHERE id IN ({}) AND status = 'queued' RETURNING ",
                columns!()
            ),
            vec!["WHEN ? THEN ?"; ids].join(" "),
            repeat("?", ids)
        ))
    },
    window: "UPDATE task_dedup_limits SET window_start_micros = ?, window_starts = ? \
             WHERE task_type = ?",
    set: "INSERT INTO task_dedup_limits (task_type, max_running, max_running_per_user, \
          rate_starts, rate_window_micros, fair, updated_at) \
          VALUES (?, ?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')) \
          ON CONFLICT (task_type) DO UPDATE SET max_running = excluded.max_running, \
          max_running_per_user = excluded.max_running_per_user, \
          rate_starts = excluded.rate_starts, rate_window_micros = excluded.rate_window_micros, \
          fair = excluded.fair, updated_at = excluded.updated_at",
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

/// The admin API's statements (`crate::admin`; lists are built in `dialect::admin`).
/// Minutes come from `strftime('%s', ...)`, which reads the stored RFC 3339 text.
pub(crate) const ADMIN: Admin = Admin {
    now: "SELECT strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') AS now",
    retry: concat!(
        "UPDATE task_run SET status = 'queued', attempts = 0, lease_owner = NULL, \
         lease_expires_at = NULL, finished_at = NULL, \
         run_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'), \
         updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
         WHERE id = ? AND status IN ('failed', 'cancelled') RETURNING ",
        columns!()
    ),
    delete: "DELETE FROM task_run WHERE id = ? AND status IN ('succeeded', 'failed', 'cancelled')",
    counts: "SELECT task_type, status, COUNT(*) AS n FROM task_run \
             GROUP BY task_type, status ORDER BY task_type, status",
    // As PostgreSQL's: one index descent per type, then walks that stop at the limit.
    task_types: "WITH RECURSIVE types(task_type) AS (SELECT MIN(task_type) FROM task_run \
                 UNION ALL SELECT (SELECT r.task_type FROM task_run r \
                 WHERE r.task_type > types.task_type ORDER BY r.task_type LIMIT 1) \
                 FROM types WHERE types.task_type IS NOT NULL) \
                 SELECT task_type FROM types WHERE task_type IS NOT NULL",
    counts_of_type: "SELECT 'cancelled' AS status, COUNT(*) AS n FROM (SELECT 1 FROM task_run \
                     WHERE task_type = ?1 AND status = 'cancelled' \
                     ORDER BY created_at LIMIT ?2) AS c \
                     UNION ALL SELECT 'failed' AS status, COUNT(*) AS n FROM (SELECT 1 FROM task_run \
                     WHERE task_type = ?1 AND status = 'failed' \
                     ORDER BY created_at LIMIT ?2) AS c \
                     UNION ALL SELECT 'queued' AS status, COUNT(*) AS n FROM (SELECT 1 FROM task_run \
                     WHERE task_type = ?1 AND status = 'queued' \
                     ORDER BY created_at LIMIT ?2) AS c \
                     UNION ALL SELECT 'running' AS status, COUNT(*) AS n FROM (SELECT 1 FROM task_run \
                     WHERE task_type = ?1 AND status = 'running' \
                     ORDER BY created_at LIMIT ?2) AS c \
                     UNION ALL SELECT 'succeeded' AS status, COUNT(*) AS n FROM (SELECT 1 FROM task_run \
                     WHERE task_type = ?1 AND status = 'succeeded' \
                     ORDER BY created_at LIMIT ?2) AS c",
    // The window's start from the clock (the minute 59 minutes ago), compared as text
    // with the stored RFC 3339 values.
    throughput: "SELECT 'created' AS what, CAST(strftime('%s', created_at) AS INTEGER) / 60 AS minute, \
                 COUNT(*) AS n FROM task_run \
                 WHERE created_at >= strftime('%Y-%m-%dT%H:%M:00+00:00', 'now', '-59 minutes') \
                 GROUP BY 2 \
                 UNION ALL SELECT status, CAST(strftime('%s', finished_at) AS INTEGER) / 60, \
                 COUNT(*) FROM task_run \
                 WHERE finished_at >= strftime('%Y-%m-%dT%H:%M:00+00:00', 'now', '-59 minutes') \
                 AND status IN ('succeeded', 'failed') GROUP BY 1, 2",
    oldest_queued: "SELECT task_type, MIN(created_at) AS oldest FROM task_run \
                    WHERE status = 'queued' GROUP BY task_type ORDER BY task_type",
    cancel_many: |rows| {
        Cow::Owned(format!(
            "UPDATE task_run SET status = 'cancelled', error = ?, lease_expires_at = NULL, \
             finished_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'), \
             updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
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

#[cfg(test)]
mod tests {
    use super::seconds_modifier;

    #[test]
    fn modifier_keeps_sign_and_microseconds() {
        assert_eq!(seconds_modifier(30_000_000), "+30.000000 seconds");
        assert_eq!(seconds_modifier(-1_500), "-0.001500 seconds");
    }
}
