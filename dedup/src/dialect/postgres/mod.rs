//! PostgreSQL: `ON CONFLICT` against the partial unique index, `UPDATE ... RETURNING`,
//! claims over a `FOR UPDATE SKIP LOCKED` subquery. Times come from
//! `statement_timestamp()`: `now()` would be the start of the caller's transaction,
//! possibly long ago.

use std::borrow::Cow;

use sea_orm::sqlx::postgres::PgDatabaseError;
use task_dedup_entity::task_run::{ACTIVE_RESOURCE_UIDX, RUNNING_RESOURCE_UIDX};
use task_dedup_entity::{occupies_key_sql, runs_serially_sql};

use super::limits::{Limits, SLOT_UIDX};
use super::{Admin, Bulk, Endings, Guarded, Kind, Returning, Statements};

/// running → succeeded, up to `RETURNING`.
macro_rules! complete {
    () => {
        "UPDATE task_run SET status = 'succeeded', result = $1, lease_expires_at = NULL, \
         finished_at = statement_timestamp(), updated_at = statement_timestamp() \
         WHERE id = $2 AND status = 'running' AND lease_owner = $3"
    };
}

/// A new task's row up to its conflict target (the unique index): `insert` and
/// `replace` differ in what a conflict does.
macro_rules! insert_on_conflict {
    () => {
        concat!(
            "INSERT INTO task_run (",
            insert_columns!(),
            ") \
             VALUES ($1, $2, $3, $4, 'queued', $5, 0, $6, $7, $8, $9, $10, $11, $12) \
             ON CONFLICT (user_id, task_type, resource_key, dedup_window_end) \
             WHERE ",
            occupies_key_sql!()
        )
    };
}

/// What `ReplaceIfQueued` does on a conflict: the queued row holding the key takes the
/// new values in the same atomic step; a running or finished one is left alone and
/// nothing comes back.
macro_rules! replace_queued {
    () => {
        concat!(
            " \
             DO UPDATE SET payload = EXCLUDED.payload, run_at = EXCLUDED.run_at, \
             priority = EXCLUDED.priority, updated_at = EXCLUDED.updated_at \
             WHERE task_run.status = 'queued' \
             RETURNING ",
            columns!()
        )
    };
}

/// A claim's statement once per bound, the powers of two up to [`LARGEST_BOUND`]: its
/// locked selection is `LIMIT <bound>` in the text and `LIMIT $n` (the claim's size) on
/// top. With the size only as a parameter PostgreSQL planned the statement at every
/// execution (a `LIMIT $n` makes the generic plan look costlier than any custom one,
/// so the plan cache never switches to it): 0.2 ms of planning per main claim and
/// 0.6 ms per window claim in a drain, a quarter and two fifths of their server time.
/// With a literal bound the generic plan wins after five executions (BENCHMARKS.md,
/// "Claims planned once") where the claimed type is a fair share of the queue; beside
/// a far bigger backlog of other types a custom plan still looks cheaper, and is
/// taken. The rows are locked as the outer `LIMIT` pulls them, so a claim locks no
/// more than it takes, and they come in the selection's order (nothing above it
/// sorts: the locked claims' candidates rely on it). Eleven texts per claim, prepared
/// on a connection as it uses them.
macro_rules! bounded {
    ($statement:ident) => {
        [
            $statement!("1"),
            $statement!("2"),
            $statement!("4"),
            $statement!("8"),
            $statement!("16"),
            $statement!("32"),
            $statement!("64"),
            $statement!("128"),
            $statement!("256"),
            $statement!("512"),
            $statement!("1024"),
        ]
    };
}

/// How many texts [`bounded!`] makes.
const BOUNDS: usize = 11;

/// The largest claim [`bounded!`]'s texts hold: at least `MAX_CLAIM` (asserted where
/// that is defined).
pub(crate) const LARGEST_BOUND: i64 = 1 << (BOUNDS - 1);

/// The index in [`bounded!`]'s texts of the smallest bound at least `max` (1 to
/// `MAX_CLAIM`, checked before).
pub(crate) fn bound(max: i64) -> usize {
    let max = u64::try_from(max.max(1)).unwrap_or(1);
    (max.next_power_of_two().trailing_zeros() as usize).min(BOUNDS - 1)
}

/// Every claim up to the selection of its tasks: they move to `running` under the lease.
/// `id = ANY(ARRAY(...))`: the selection runs once, then one primary-key lookup per
/// task. No run slot: a type without limits has none (one left from a run under a
/// limit would otherwise meet another's in `task_run_slot_uidx`).
macro_rules! claim_start {
    () => {
        concat!(
            start_tasks!(),
            "run_slot = NULL WHERE id = ANY(ARRAY(SELECT "
        )
    };
}

/// What every claim sets on the tasks it starts (then the run slot): `running` under
/// worker `$1`'s lease of `$2` microseconds, one more attempt.
macro_rules! start_tasks {
    () => {
        "UPDATE task_run SET status = 'running', attempts = attempts + 1, \
         lease_owner = $1, lease_expires_at = statement_timestamp() + $2 * interval '1 microsecond', \
         started_at = statement_timestamp(), updated_at = statement_timestamp(), "
    };
}

/// The due tasks a claim selects from (then `AND` its own conditions).
///
/// A paused type's tasks are not due: one primary-key probe of `task_dedup_paused` per
/// candidate, fenced by `OFFSET 0` like the key's probe of the probing claim. Not
/// `NOT (task_type = ANY(ARRAY(SELECT ... FROM task_dedup_paused)))`: PostgreSQL
/// estimates `task_type = <unknown>` as 1 / (distinct types), so on a table of one
/// task type it expected no due task at all, planned a scan of every queued task and a
/// sort instead of the claim index in order, and a drain of 10,000 tasks ran at a sixth
/// of its speed once the table had statistics. A fenced probe is estimated at one half.
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
        "AND NOT EXISTS (SELECT 1 FROM task_dedup_limits l \
         WHERE l.task_type = t.task_type OFFSET 0) "
    };
}

/// No limit across all types is set (the row of the empty type, which no task has):
/// while one is, every task starts under its lock ([`LIMITS`]'s `rest_candidates`).
/// Uncorrelated, so evaluated once per statement.
macro_rules! no_limit_across_types {
    () => {
        "AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '') "
    };
}

/// [`due!`] without its last condition: the tasks of a limited type are due too. A
/// limited type's claim selects from these ([`LIMITS`]); every other claim passes over
/// limited types (their tasks start only under their limits' lock), with the same
/// fenced probe as for paused types.
macro_rules! due_of_any_limit {
    () => {
        "FROM task_run t \
         WHERE status = 'queued' AND run_at <= statement_timestamp() \
         AND NOT EXISTS (SELECT 1 FROM task_dedup_paused p \
         WHERE p.task_type = t.task_type OFFSET 0) "
    };
}

/// The probing claim up to its selection's `ORDER BY` ([`claim_end!`] closes it):
/// `claim_any` and `claim_types` differ in which tasks they select.
///
/// One run per key: a task is due only if no task of its key runs ([`key_not_running!`]).
/// Blocked tasks are passed over in the scan, so a batch fills from unblocked keys
/// however many wait ahead of them.
macro_rules! claim_set {
    () => {
        concat!(
            claim_start!(),
            "DISTINCT ON (user_id, task_type, resource_key, \
             CASE WHEN concurrent THEN id END) id \
             FROM (SELECT * FROM (SELECT id, user_id, task_type, resource_key, concurrent, \
             priority, run_at, created_at ",
            due!(),
            key_not_running!()
        )
    };
}

/// A candidate `t` no task of whose key runs (a probe of `task_running_resource_uidx`,
/// whose predicate it repeats), unless it is `concurrent`. `OFFSET 0` keeps the probe
/// one index lookup per candidate: without it PostgreSQL turned the `EXISTS` into a
/// hashed subplan that read the whole index per claim, dead entries of every task that
/// ran since the last vacuum included (10,048 entries for 32 running tasks in a drain;
/// the drain of distinct keys was 23 % slower).
macro_rules! key_not_running {
    () => {
        concat!(
            "AND (concurrent OR NOT EXISTS (SELECT 1 FROM task_run r \
             WHERE r.user_id = t.user_id AND r.task_type = t.task_type \
             AND r.resource_key = t.resource_key AND ",
            runs_serially_sql!(),
            " OFFSET 0)) "
        )
    };
}

/// The end of every claim's locked selection: in claim order, at most `$bound` rows
/// locked as the outer `LIMIT $limit` pulls them (see [`bounded!`]), skipping rows
/// other claimers hold.
macro_rules! locked_in_claim_order {
    ($limit:literal, $bound:literal) => {
        concat!(
            "ORDER BY priority DESC, run_at, created_at, id LIMIT ",
            $bound,
            " FOR UPDATE SKIP LOCKED) AS bounded LIMIT ",
            $limit
        )
    };
}

/// The end of a probing claim, after its selection: the next `$limit` due tasks in
/// claim order, locked (SKIP LOCKED: concurrent claimers pass over each other's rows
/// instead of queueing behind them), then the first of each key among them (DISTINCT
/// ON; a `concurrent` task is a key of its own), so one claim never starts two tasks of
/// one key. `$bound`: see [`bounded!`].
macro_rules! claim_end {
    ($limit:literal, $bound:literal) => {
        concat!(
            locked_in_claim_order!($limit, $bound),
            ") AS due \
             ORDER BY user_id, task_type, resource_key, CASE WHEN concurrent THEN id END, \
             priority DESC, run_at, created_at, id)) \
             RETURNING ",
            columns!()
        )
    };
}

/// The optimistic claim: the next `$limit` due tasks in claim order, locked as above,
/// with neither the probe nor the one-per-key step. `task_running_resource_uidx` fails
/// it (`Kind::RunningKey`) when it picked a task whose key runs, or two of one key, and
/// then it took nothing. Its selection starts `id FROM (SELECT id `; `$bound`: see
/// [`bounded!`].
macro_rules! optimistic_end {
    ($limit:literal, $bound:literal) => {
        concat!(
            locked_in_claim_order!($limit, $bound),
            ")) RETURNING ",
            columns!()
        )
    };
}

/// The function `PoolerMode::NoPreparedStatements` calls for a hit or a create
/// (migration `m20261203_000009_task_dedup_pooler_function`), with its argument types:
/// what `to_regprocedure` looks up. A changed function comes under a new name.
macro_rules! insert_or_find_function {
    () => {
        "task_dedup_insert_or_find_v1(uuid, text, text, text, jsonb, timestamptz, \
         timestamptz, timestamptz, int2, text, int8, bool)"
    };
}

/// [`insert_or_find_function!`], for the warning while it is missing.
pub(crate) const INSERT_OR_FIND_FUNCTION: &str = insert_or_find_function!();

/// The migration that creates [`INSERT_OR_FIND_FUNCTION`].
pub(crate) const INSERT_OR_FIND_MIGRATION: &str = "m20261203_000009_task_dedup_pooler_function";

/// Whether the database has [`INSERT_OR_FIND_FUNCTION`] (in the search path).
pub(crate) const HAS_INSERT_OR_FIND: &str = concat!(
    "SELECT to_regprocedure('",
    insert_or_find_function!(),
    "') IS NOT NULL"
);

/// `insert_or_find` in `PoolerMode::NoPreparedStatements`: the function, with the
/// parameters of [`Statements::insert_or_find`] (each written in as a typed literal,
/// which picks the function by its argument types). Its answer is the statement's, except
/// that a holder that committed while the insert waited for it comes back too (the
/// function reads again, in a fresh snapshot); no row: the holder ended meanwhile.
pub(crate) const INSERT_OR_FIND_CALL: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM task_dedup_insert_or_find_v1($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
);

pub(crate) const STATEMENTS: Statements = Statements {
    // The conflict target repeats the index predicate as literals: with bound values
    // PostgreSQL fails with 42P10 once a cached statement switches to a generic plan.
    // `DO NOTHING`, not a caught unique violation: a failed INSERT would abort the
    // caller's transaction. A returned id means inserted.
    insert: concat!(insert_on_conflict!(), " DO NOTHING RETURNING id"),
    // A hit in one round trip: the row inserted, or else the task holding the key, read
    // from the statement's snapshot. That snapshot predates a holder that committed
    // while the insert waited for it (the conflict it then yields to), and then no row
    // comes back: the caller reads again with `find_occupant_after_conflict`. The second
    // arm runs only when `ins` is empty (an InitPlan, evaluated once); LIMIT 1 stops after
    // the first row either way.
    insert_or_find: Some(concat!(
        "WITH ins AS (",
        insert_on_conflict!(),
        " DO NOTHING RETURNING ",
        columns!(),
        ") SELECT ",
        columns!(),
        " FROM ins UNION ALL SELECT ",
        columns!(),
        " FROM task_run \
         WHERE user_id = $2 AND task_type = $3 AND resource_key = $4 \
         AND dedup_window_end = $11 AND ",
        occupies_key_sql!(),
        " AND NOT EXISTS (SELECT 1 FROM ins) LIMIT 1"
    )),
    find_occupant: concat!(
        "SELECT ",
        columns!(),
        " FROM task_run \
         WHERE user_id = $1 AND task_type = $2 AND resource_key = $3 \
         AND dedup_window_end = $4 AND ",
        occupies_key_sql!()
    ),
    // Under READ COMMITTED each statement reads a fresh snapshot, so the row `DO NOTHING`
    // yielded to is visible. (Under REPEATABLE READ the insert itself fails with 40001.)
    find_occupant_after_conflict: concat!(
        "SELECT ",
        columns!(),
        " FROM task_run \
         WHERE user_id = $1 AND task_type = $2 AND resource_key = $3 \
         AND dedup_window_end = $4 AND ",
        occupies_key_sql!()
    ),
    by_id: concat!("SELECT ", columns!(), " FROM task_run WHERE id = $1"),
    heartbeat: concat!(
        "UPDATE task_run SET lease_expires_at = statement_timestamp() + $1 * interval '1 microsecond', \
         updated_at = statement_timestamp() \
         WHERE id = $2 AND status = 'running' AND lease_owner = $3 RETURNING ",
        columns!()
    ),
    complete: concat!(complete!(), " RETURNING ", columns!()),
    fail: concat!(
        "UPDATE task_run SET status = 'failed', error = $1, lease_expires_at = NULL, \
         finished_at = statement_timestamp(), updated_at = statement_timestamp() \
         WHERE id = $2 AND status = 'running' AND lease_owner = $3 RETURNING ",
        columns!()
    ),
    // `lease_owner` stays, so a repeated call by the same worker can tell its own retry.
    retry: concat!(
        "UPDATE task_run SET status = 'queued', error = $1, lease_expires_at = NULL, \
         run_at = statement_timestamp() + $2 * interval '1 microsecond', \
         updated_at = statement_timestamp() \
         WHERE id = $3 AND status = 'running' AND lease_owner = $4 RETURNING ",
        columns!()
    ),
    cancel: concat!(
        "UPDATE task_run SET status = 'cancelled', error = $1, lease_expires_at = NULL, \
         finished_at = statement_timestamp(), updated_at = statement_timestamp() \
         WHERE id = $2 AND status IN ('queued', 'running') RETURNING ",
        columns!()
    ),
    // `lease_owner` stays, so a repeated call by the same worker can tell its own release.
    release: concat!(
        "UPDATE task_run SET status = 'queued', lease_expires_at = NULL, \
         attempts = attempts - 1, updated_at = statement_timestamp() \
         WHERE id = $1 AND status = 'running' AND lease_owner = $2 RETURNING ",
        columns!()
    ),
    // `lease_owner` stays, as in `release`.
    snooze: concat!(
        "UPDATE task_run SET status = 'queued', lease_expires_at = NULL, \
         attempts = attempts - 1, snoozes = snoozes + 1, \
         run_at = statement_timestamp() + $1 * interval '1 microsecond', \
         updated_at = statement_timestamp() \
         WHERE id = $2 AND status = 'running' AND lease_owner = $3 RETURNING ",
        columns!()
    ),
    expired: "SELECT id, attempts FROM task_run \
              WHERE status = 'running' AND lease_expires_at < statement_timestamp() \
              ORDER BY lease_expires_at LIMIT 100",
    // The expiry is checked again: a heartbeat that renewed the lease first wins.
    reap_fail: "UPDATE task_run SET status = 'failed', error = $1, lease_expires_at = NULL, \
                finished_at = statement_timestamp(), updated_at = statement_timestamp() \
                WHERE id = $2 AND status = 'running' AND lease_expires_at < statement_timestamp()",
    reap_requeue: "UPDATE task_run SET status = 'queued', lease_owner = NULL, \
                   lease_expires_at = NULL, \
                   run_at = statement_timestamp() + $1 * interval '1 microsecond', \
                   updated_at = statement_timestamp() \
                   WHERE id = $2 AND status = 'running' \
                   AND lease_expires_at < statement_timestamp()",
    // A period task keeps its window until the window is over, finished or not. The
    // oldest first, through `task_run_finished_idx`; SKIP LOCKED: pruners running at
    // once from several workers take different rows instead of queueing behind each
    // other. `id = ANY(ARRAY(...))`: the batch is chosen once, then one primary-key
    // lookup per row.
    prune: "DELETE FROM task_run WHERE id = ANY(ARRAY(SELECT id FROM task_run \
            WHERE status = $1 \
            AND finished_at < statement_timestamp() + $2 * interval '1 microsecond' \
            AND dedup_window_end <= extract(epoch FROM statement_timestamp()) \
            ORDER BY finished_at LIMIT $3 FOR UPDATE SKIP LOCKED))",
    pause: "INSERT INTO task_dedup_paused (task_type, paused_at) \
            VALUES ($1, statement_timestamp()) ON CONFLICT (task_type) DO NOTHING",
    resume: "DELETE FROM task_dedup_paused WHERE task_type = $1",
    paused: "SELECT task_type, paused_at FROM task_dedup_paused ORDER BY task_type",
    running_index: "SELECT 1 AS present FROM pg_index i \
                    JOIN pg_class c ON c.oid = i.indexrelid \
                    WHERE i.indrelid = to_regclass('task_run') \
                    AND c.relname = 'task_running_resource_uidx' \
                    AND i.indisunique AND i.indisvalid",
};

pub(crate) const RETURNING: Returning = Returning {
    replace: concat!(insert_on_conflict!(), replace_queued!()),
    // `task_run_claim_idx (status, priority DESC, run_at, created_at, id)` serves the
    // order. Two claimers may still pick follow-ups of one key at once (a task the other
    // has locked, not yet running): the index lets one of them through, and the other's
    // claim fails (`Kind::RunningKey`) and is run again.
    claim_any: |max| CLAIM_ANY[bound(max)],
    claim_types: |max| CLAIM_TYPES[bound(max)],
    optimistic_claim_any: |max| OPTIMISTIC_CLAIM_ANY[bound(max)],
    optimistic_claim_types: |max| OPTIMISTIC_CLAIM_TYPES[bound(max)],
};

/// The claims' texts for each bound ([`bounded!`]).
macro_rules! claim_any {
    ($bound:literal) => {
        concat!(claim_set!(), claim_end!("$3", $bound))
    };
}
macro_rules! claim_types {
    ($bound:literal) => {
        concat!(
            claim_set!(),
            "AND task_type = ANY($3) ",
            claim_end!("$4", $bound)
        )
    };
}
macro_rules! optimistic_claim_any {
    ($bound:literal) => {
        concat!(
            claim_start!(),
            "id FROM (SELECT id ",
            due!(),
            optimistic_end!("$3", $bound)
        )
    };
}
macro_rules! optimistic_claim_types {
    ($bound:literal) => {
        concat!(
            claim_start!(),
            "id FROM (SELECT id ",
            due!(),
            "AND task_type = ANY($3) ",
            optimistic_end!("$4", $bound)
        )
    };
}
const CLAIM_ANY: [&str; BOUNDS] = bounded!(claim_any);
const CLAIM_TYPES: [&str; BOUNDS] = bounded!(claim_types);
const OPTIMISTIC_CLAIM_ANY: [&str; BOUNDS] = bounded!(optimistic_claim_any);
const OPTIMISTIC_CLAIM_TYPES: [&str; BOUNDS] = bounded!(optimistic_claim_types);

/// The channel waiting workers LISTEN on.
macro_rules! channel {
    () => {
        "task_dedup_wakeup"
    };
}

/// The channel waiting workers LISTEN on, for the listener.
#[cfg_attr(not(feature = "worker"), allow(dead_code))]
pub(crate) const CHANNEL: &str = channel!();

/// Wakes the workers that LISTEN on [`CHANNEL`] (sent at most once per debounce
/// interval; see `crate::executor::notify`).
pub(crate) const NOTIFY: &str = concat!("SELECT pg_notify('", channel!(), "', '')");

/// The channel on which a cancel of a task that may be running is announced, so that
/// the worker running it fires its handler's cancellation at once instead of at its
/// next heartbeat.
macro_rules! cancel_channel {
    () => {
        "task_dedup_cancel"
    };
}

/// The cancel channel, for the listener.
#[cfg_attr(not(feature = "worker"), allow(dead_code))]
pub(crate) const CANCEL_CHANNEL: &str = cancel_channel!();

/// Tells the listening workers that a task that may be running was cancelled: each
/// looks up its running tasks (not debounced: cancels are rare, and a swallowed one
/// would wait for the next heartbeat).
pub(crate) const NOTIFY_CANCEL: &str = concat!("SELECT pg_notify('", cancel_channel!(), "', '')");

/// A worker's check that its listener's connection is a session of its own, from the
/// worker's pool: notifies `$2` on the listener's own probe channel `$1` if the
/// listener's server process (`$3`) has been idle for a while, as a session waiting for
/// notifications is. Behind a transaction pooler that process serves other clients
/// too: busy (this very statement, when the pooler lends it here) or busy a moment
/// ago, it is not notified, and so no other client of the pooler, which could borrow
/// it at any moment, receives a notification it did not ask for (its driver would
/// fail on it). Idle long enough, the pooler drops the notification, and the listener
/// does not hear it. Rows the role may not see have no state: notified then.
#[cfg_attr(not(feature = "worker"), allow(dead_code))]
pub(crate) const PROBE: &str = "SELECT pg_notify($1, $2) FROM pg_stat_activity \
    WHERE pid = $3 \
    AND (state = 'idle' AND state_change < clock_timestamp() - interval '100 milliseconds' \
    OR state IS NULL)";

/// Checks the guarantee without writing: planning an insert with the conflict target of
/// `insert` fails (42P10) unless a unique index matches it, predicate included. PostgreSQL
/// infers the arbiter index from the catalog when it plans, so this is exact; EXPLAIN
/// runs nothing.
pub(crate) const GUARD: &str = concat!(
    "EXPLAIN INSERT INTO task_run (user_id, task_type, resource_key, dedup_window_end) \
     SELECT user_id, task_type, resource_key, dedup_window_end FROM task_run WHERE false \
     ON CONFLICT (user_id, task_type, resource_key, dedup_window_end) WHERE ",
    occupies_key_sql!(),
    " DO NOTHING"
);

/// What [`GUARD`] failing with `e` means, if it is about the schema.
pub(crate) fn guard_failure(e: &PgDatabaseError) -> Option<Guarded> {
    match e.code() {
        UNDEFINED_TABLE => Some(Guarded::NoTable),
        INVALID_COLUMN_REFERENCE => Some(Guarded::No(format!(
            "no unique index matches the dedup key and its predicate ({ACTIVE_RESOURCE_UIDX} \
             is missing or is not the guarantee)"
        ))),
        UNDEFINED_COLUMN => Some(Guarded::No(format!(
            "the table predates task-dedup's schema: {}",
            e.message()
        ))),
        _ => None,
    }
}

/// The start of both bulk inserts: the rows from one array per column, up to the
/// conflict target (the unique index); they differ in what a conflict does.
macro_rules! bulk_insert_on_conflict {
    () => {
        concat!(
            "INSERT INTO task_run (",
            insert_columns!(),
            ") \
             SELECT id, user_id, task_type, resource_key, 'queued', \
             CASE WHEN has_payload THEN payload END, 0, $5, $5, run_at, priority, scope, \
             dedup_window_end, concurrent \
             FROM unnest($1::uuid[], $2::varchar[], $3::varchar[], $4::varchar[], \
             $6::jsonb[], $7::bool[], $8::timestamptz[], $9::int2[], $10::varchar[], $11::int8[], \
             $12::bool[]) \
             AS t(id, user_id, task_type, resource_key, payload, has_payload, run_at, priority, \
             scope, dedup_window_end, concurrent) \
             ON CONFLICT (user_id, task_type, resource_key, dedup_window_end) \
             WHERE ",
            occupies_key_sql!()
        )
    };
}

/// One array per column: the texts do not depend on the number of rows. `created_at`
/// and `updated_at` are one value for the whole chunk ($5). A task without a payload
/// has `has_payload` false: an array of SeaORM values cannot hold NULL elements.
pub(crate) const BULK: Bulk = Bulk {
    chunk: 5_000,
    insert: |_| {
        Cow::Borrowed(concat!(
            bulk_insert_on_conflict!(),
            " DO NOTHING RETURNING id"
        ))
    },
    replace: |_| Cow::Borrowed(concat!(bulk_insert_on_conflict!(), replace_queued!())),
    find_occupants,
    // No locks to avoid: the same read.
    find_occupants_after_own_insert: find_occupants,
    by_ids: |_| {
        Cow::Borrowed(concat!(
            "SELECT ",
            columns!(),
            " FROM task_run WHERE id = ANY($1)"
        ))
    },
};

/// A worker's batch endings: the rows from one array per column (the texts do not depend
/// on the number of rows), the worker's id last. A task ended without a result has
/// `has_result` false: an array of SeaORM values cannot hold NULL elements.
pub(crate) const ENDINGS: Endings = Endings {
    complete: |_| {
        Cow::Borrowed(
            "UPDATE task_run AS t SET status = 'succeeded', \
             result = CASE WHEN e.has_result THEN e.result END, lease_expires_at = NULL, \
             finished_at = statement_timestamp(), updated_at = statement_timestamp() \
             FROM unnest($1::uuid[], $2::jsonb[], $3::bool[]) AS e(id, result, has_result) \
             WHERE t.id = e.id AND t.status = 'running' AND t.lease_owner = $4 \
             RETURNING t.id",
        )
    },
    fail: |_| {
        Cow::Borrowed(
            "UPDATE task_run AS t SET status = 'failed', error = e.error, \
             lease_expires_at = NULL, finished_at = statement_timestamp(), \
             updated_at = statement_timestamp() \
             FROM unnest($1::uuid[], $2::text[]) AS e(id, error) \
             WHERE t.id = e.id AND t.status = 'running' AND t.lease_owner = $3 \
             RETURNING t.id",
        )
    },
    // `lease_owner` stays, as in `retry`.
    retry: |_| {
        Cow::Borrowed(
            "UPDATE task_run AS t SET status = 'queued', error = e.error, \
             lease_expires_at = NULL, \
             run_at = statement_timestamp() + e.delay * interval '1 microsecond', \
             updated_at = statement_timestamp() \
             FROM unnest($1::uuid[], $2::text[], $3::int8[]) AS e(id, error, delay) \
             WHERE t.id = e.id AND t.status = 'running' AND t.lease_owner = $4 \
             RETURNING t.id",
        )
    },
};

/// The tasks holding the given keys and windows: one lookup in the unique index per key
/// (at most one row each), written as a `LATERAL` subquery so that no plan can do
/// otherwise. As a plain join, the generic plan of the prepared statement on a table
/// not analyzed yet scanned every occupied row per call (measured: 1 s per batch of 100
/// at 50,000 occupied keys).
fn find_occupants(_rows: usize) -> Cow<'static, str> {
    Cow::Borrowed(concat!(
        "SELECT t.* \
         FROM unnest($1::varchar[], $2::varchar[], $3::varchar[], $4::int8[]) \
         AS k(k_user_id, k_task_type, k_resource_key, k_window_end) \
         CROSS JOIN LATERAL (SELECT ",
        columns!(),
        " FROM task_run \
         WHERE user_id = k_user_id AND task_type = k_task_type \
         AND resource_key = k_resource_key AND dedup_window_end = k_window_end \
         AND ",
        occupies_key_sql!(),
        " LIMIT 1) AS t"
    ))
}

/// SQLSTATE of a unique violation.
const UNIQUE_VIOLATION: &str = "23505";
/// SQLSTATE of a serialization failure (REPEATABLE READ / SERIALIZABLE).
const SERIALIZATION_FAILURE: &str = "40001";
/// SQLSTATE of a deadlock the server broke by aborting this statement.
const DEADLOCK_DETECTED: &str = "40P01";
/// SQLSTATE class of connection exceptions (08000, 08003, 08006, 08001, 08004, ...).
const CONNECTION_EXCEPTION_CLASS: &str = "08";
/// SQLSTATEs of a session the server ended: an administrator or a shutdown
/// (`pg_terminate_backend`, fast shutdown), a crash of another backend, a server still
/// starting up.
const ADMIN_SHUTDOWN: &str = "57P01";
const CRASH_SHUTDOWN: &str = "57P02";
const CANNOT_CONNECT_NOW: &str = "57P03";
/// SQLSTATE of a cancelled statement: `statement_timeout` (or `pg_cancel_backend`).
const QUERY_CANCELED: &str = "57014";
/// SQLSTATE of a lock not obtained within `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// SQLSTATE of a relation that does not exist.
const UNDEFINED_TABLE: &str = "42P01";
/// SQLSTATE of a column that does not exist.
const UNDEFINED_COLUMN: &str = "42703";
/// SQLSTATE of an `ON CONFLICT` target no unique index matches.
const INVALID_COLUMN_REFERENCE: &str = "42P10";

/// What a PostgreSQL error means. PostgreSQL names the violated constraint (here: the
/// index) in its own field.
pub(super) fn kind(e: &PgDatabaseError) -> Kind {
    match e.code() {
        UNIQUE_VIOLATION if e.constraint() == Some(ACTIVE_RESOURCE_UIDX) => Kind::HeldKey,
        UNIQUE_VIOLATION if e.constraint() == Some(RUNNING_RESOURCE_UIDX) => Kind::RunningKey,
        UNIQUE_VIOLATION if e.constraint() == Some(SLOT_UIDX) => Kind::SlotTaken,
        SERIALIZATION_FAILURE | DEADLOCK_DETECTED => Kind::TransactionConflict,
        ADMIN_SHUTDOWN | CRASH_SHUTDOWN | CANNOT_CONNECT_NOW => Kind::ConnectionLost,
        code if code.starts_with(CONNECTION_EXCEPTION_CLASS) => Kind::ConnectionLost,
        QUERY_CANCELED | LOCK_NOT_AVAILABLE => Kind::Timeout,
        _ => Kind::Other,
    }
}

/// The admin API's statements (`crate::admin`; lists are built in `dialect::admin`).
/// The database's clock in microseconds since the Unix epoch.
macro_rules! now_micros {
    () => {
        "(extract(epoch FROM statement_timestamp()) * 1000000)::int8"
    };
}

/// The one-statement claims' selection, from its `FROM` on (a `DISTINCT ON` per key
/// selects from it): the next `$4` due tasks of type `$3` whose key does not run
/// (unless `concurrent`), locked as they are taken (`$bound`: [`bounded!`]), ordered
/// by key for the `DISTINCT ON`.
macro_rules! one_per_key_of_type {
    ($bound:literal) => {
        concat!(
            "(SELECT * FROM (SELECT id, user_id, resource_key, concurrent, priority, run_at, \
             created_at ",
            due_of_any_limit!(),
            "AND task_type = $3 ",
            key_not_running!(),
            locked_in_claim_order!("$4", $bound),
            ") AS due \
             ORDER BY user_id, resource_key, CASE WHEN concurrent THEN id END, \
             priority DESC, run_at, created_at, id"
        )
    };
}

/// The window claims up to their selection of tasks (`unnest(ARRAY(`, closed by
/// [`window_end!`]): the limit `m` and a free range of slots from `off` (four random
/// tries), provided every running task of the type holds a slot below the limit; then
/// the tasks' start, each with the slot of its position.
macro_rules! window_start {
    () => {
        concat!(
            "WITH lim AS (SELECT l.max_running AS m, w.off FROM task_dedup_limits l \
             CROSS JOIN LATERAL (SELECT c.off FROM (SELECT floor(random() * \
             (l.max_running - least($4, l.max_running) + 1))::int8 AS off \
             FROM generate_series(1, 4)) AS c WHERE NOT EXISTS (SELECT 1 FROM task_run r \
             WHERE r.task_type = $3 AND r.status = 'running' \
             AND r.run_slot >= c.off AND r.run_slot < c.off + $4) LIMIT 1) AS w \
             WHERE l.task_type = $3 AND l.max_running IS NOT NULL \
             AND l.max_running_per_user IS NULL AND l.rate_starts IS NULL AND NOT l.fair \
             AND NOT EXISTS (SELECT 1 FROM task_run r WHERE r.task_type = $3 \
             AND r.status = 'running' AND (r.run_slot IS NULL OR r.run_slot >= l.max_running)) ",
            no_limit_across_types!(),
            ") ",
            start_tasks!(),
            "run_slot = lim.off + s.n - 1 \
             FROM lim, unnest(ARRAY("
        )
    };
}

/// The end of the window claims, after their selection of ids in claim order: each
/// task's slot is its position from `off`.
macro_rules! window_end {
    () => {
        concat!(
            ")) WITH ORDINALITY AS s (sid, n) \
             WHERE task_run.id = s.sid AND s.n <= lim.m \
             RETURNING ",
            columns!()
        )
    };
}

/// [`LIMITS`]'s one-statement claims, per bound ([`bounded!`]).
macro_rules! window_claim {
    ($bound:literal) => {
        concat!(
            window_start!(),
            "SELECT id FROM (SELECT DISTINCT ON \
             (user_id, resource_key, CASE WHEN concurrent THEN id END) \
             id, priority, run_at, created_at \
             FROM ",
            one_per_key_of_type!($bound),
            ") AS one_per_key \
             ORDER BY priority DESC, run_at, created_at, id",
            window_end!()
        )
    };
}
const WINDOW_CLAIM: [&str; BOUNDS] = bounded!(window_claim);

/// [`window_claim!`] with the optimistic claim's selection: no probe of the keys, no
/// `DISTINCT ON`.
macro_rules! optimistic_window_claim {
    ($bound:literal) => {
        concat!(
            window_start!(),
            "SELECT id FROM (SELECT id ",
            due_of_any_limit!(),
            "AND task_type = $3 ",
            locked_in_claim_order!("$4", $bound),
            window_end!()
        )
    };
}
const OPTIMISTIC_WINDOW_CLAIM: [&str; BOUNDS] = bounded!(optimistic_window_claim);

macro_rules! slot_claim {
    ($bound:literal) => {
        concat!(
            "WITH lim AS (SELECT max_running AS m, floor(random() * max_running)::int8 AS off \
             FROM task_dedup_limits \
             WHERE task_type = $3 AND max_running IS NOT NULL AND max_running_per_user IS NULL \
             AND rate_starts IS NULL AND NOT fair ",
            no_limit_across_types!(),
            "), \
             run AS (SELECT run_slot FROM task_run WHERE task_type = $3 AND status = 'running'), \
             free AS (SELECT (lim.off + i) % lim.m AS fslot, row_number() OVER (ORDER BY i) AS fn \
             FROM lim CROSS JOIN \
             generate_series(0, least(lim.m, $4 + (SELECT count(*) FROM run)) - 1) AS i \
             WHERE NOT EXISTS (SELECT 1 FROM run WHERE run.run_slot IS NULL OR run.run_slot >= lim.m) \
             AND NOT EXISTS (SELECT 1 FROM run WHERE run.run_slot = (lim.off + i) % lim.m)), \
             picked AS (SELECT pid, row_number() OVER (ORDER BY ppriority DESC, prun_at, pcreated_at, pid) AS pn \
             FROM (SELECT DISTINCT ON (user_id, resource_key, CASE WHEN concurrent THEN id END) \
             id AS pid, priority AS ppriority, run_at AS prun_at, created_at AS pcreated_at \
             FROM ",
            one_per_key_of_type!($bound),
            ") AS one_per_key) ",
            start_tasks!(),
            "run_slot = free.fslot \
             FROM picked JOIN free ON free.fn = picked.pn WHERE task_run.id = picked.pid \
             RETURNING ",
            columns!()
        )
    };
}
const SLOT_CLAIM: [&str; BOUNDS] = bounded!(slot_claim);

/// The end of the locked claims' candidate selections: none of a key that runs (unless
/// `concurrent`), in claim order, `$bound` locked at most and the claim's size (`$3`)
/// taken.
macro_rules! candidates_end {
    ($bound:literal) => {
        concat!(key_not_running!(), locked_in_claim_order!("$3", $bound))
    };
}

macro_rules! candidates {
    ($bound:literal) => {
        concat!(
            "SELECT * FROM (SELECT id, user_id, task_type, resource_key, concurrent ",
            due_of_any_limit!(),
            "AND task_type = $1 AND NOT (user_id = ANY($2)) ",
            candidates_end!($bound)
        )
    };
}
const CANDIDATES: [&str; BOUNDS] = bounded!(candidates);

macro_rules! rest_candidates {
    ($bound:literal) => {
        concat!(
            "SELECT * FROM (SELECT id, user_id, task_type, resource_key, concurrent ",
            due_of_any_limit!(),
            type_unlimited!(),
            "AND (cardinality($1::varchar[]) = 0 OR task_type = ANY($1)) \
             AND NOT (user_id = ANY($2)) ",
            candidates_end!($bound)
        )
    };
}
const REST_CANDIDATES: [&str; BOUNDS] = bounded!(rest_candidates);

pub(crate) const LIMITS: Limits = Limits {
    types: "SELECT task_type FROM task_dedup_limits",
    lock: concat!(
        "SELECT task_type, max_running, max_running_per_user, rate_starts, \
         rate_window_micros, window_start_micros, window_starts, fair, fair_cursor, ",
        now_micros!(),
        " AS now_micros FROM task_dedup_limits WHERE task_type IN ($1, '') \
         ORDER BY task_type FOR UPDATE"
    ),
    // `task_run_type_status_created_idx` leads with the type and the status.
    running: "SELECT user_id, run_slot FROM task_run WHERE task_type = $1 AND status = 'running'",
    // `task_run_claim_idx` leads with the status.
    running_users: "SELECT user_id FROM task_run WHERE status = 'running'",
    slots_and_candidates: None,
    // Slots `off .. off + $4` for a random `off` whose range no running task holds (a
    // range probe of `task_run_slot_uidx`; four tries): no read of the running tasks'
    // slots, and no join of tasks to free slots. Ids and slots are paired by position.
    window_claim: Some(|max| WINDOW_CLAIM[bound(max)]),
    optimistic_window_claim: Some(|max| OPTIMISTIC_WINDOW_CLAIM[bound(max)]),
    slot_claim: Some(|max| SLOT_CLAIM[bound(max)]),
    slots_and_optimistic_candidates: None,
    candidates: |_, max| Cow::Borrowed(CANDIDATES[bound(max)]),
    rest_candidates: |_, _, max| Cow::Borrowed(REST_CANDIDATES[bound(max)]),
    // `task_run_user_queue_idx (task_type, user_id, ...) WHERE status = 'queued'`
    // serves each step's `min` and the heads' order.
    fair_users: "WITH RECURSIVE walk (user_id, n) AS ( \
                 SELECT (SELECT min(user_id) FROM task_run \
                 WHERE task_type = $1 AND status = 'queued' AND user_id > $2), 1 \
                 UNION ALL \
                 SELECT (SELECT min(t.user_id) FROM task_run t \
                 WHERE t.task_type = $1 AND t.status = 'queued' AND t.user_id > walk.user_id), \
                 walk.n + 1 FROM walk WHERE walk.user_id IS NOT NULL AND walk.n < $3) \
                 SELECT user_id FROM walk WHERE user_id IS NOT NULL",
    fair_heads: concat!(
        "SELECT id, user_id, task_type, resource_key, concurrent ",
        due_of_any_limit!(),
        "AND task_type = $1 AND user_id = $2 ",
        key_not_running!(),
        "ORDER BY priority DESC, run_at, created_at, id LIMIT $3"
    ),
    fair_cursor: "UPDATE task_dedup_limits SET fair_cursor = $1 WHERE task_type = $2",
    claim_ids: |_| {
        Cow::Borrowed(concat!(
            start_tasks!(),
            "run_slot = NULLIF(v.vslot, -1) \
             FROM unnest($3::uuid[], $4::int8[]) AS v (vid, vslot) \
             WHERE task_run.id = v.vid AND task_run.status = 'queued' RETURNING ",
            columns!()
        ))
    },
    window: "UPDATE task_dedup_limits SET window_start_micros = $1, window_starts = $2 \
             WHERE task_type = $3",
    set: "INSERT INTO task_dedup_limits (task_type, max_running, max_running_per_user, \
          rate_starts, rate_window_micros, fair, updated_at) \
          VALUES ($1, $2, $3, $4, $5, $6, statement_timestamp()) \
          ON CONFLICT (task_type) DO UPDATE SET max_running = EXCLUDED.max_running, \
          max_running_per_user = EXCLUDED.max_running_per_user, \
          rate_starts = EXCLUDED.rate_starts, rate_window_micros = EXCLUDED.rate_window_micros, \
          fair = EXCLUDED.fair, updated_at = EXCLUDED.updated_at",
    clear: "DELETE FROM task_dedup_limits WHERE task_type = $1",
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
    now: "SELECT statement_timestamp() AS now",
    retry: concat!(
        "UPDATE task_run SET status = 'queued', attempts = 0, lease_owner = NULL, \
         lease_expires_at = NULL, finished_at = NULL, run_at = statement_timestamp(), \
         updated_at = statement_timestamp() \
         WHERE id = $1 AND status IN ('failed', 'cancelled') RETURNING ",
        columns!()
    ),
    delete: "DELETE FROM task_run WHERE id = $1 AND status IN ('succeeded', 'failed', 'cancelled')",
    counts: "SELECT task_type, status, COUNT(*) AS n FROM task_run \
             GROUP BY task_type, status ORDER BY task_type, status",
    // One index descent per type (the recursive skip of `oldest_queued`).
    task_types: "WITH RECURSIVE types(task_type) AS (SELECT MIN(task_type) FROM task_run \
                 UNION ALL SELECT (SELECT r.task_type FROM task_run r \
                 WHERE r.task_type > types.task_type ORDER BY r.task_type LIMIT 1) \
                 FROM types WHERE types.task_type IS NOT NULL) \
                 SELECT task_type FROM types WHERE task_type IS NOT NULL",
    // Each arm a walk of `task_run_type_status_created_idx` that stops at the limit: the
    // `ORDER BY` is the index's, so that the planner does not read every entry of a
    // status in a bitmap scan, or filter a sequential scan (both seen on a table not
    // vacuumed since it was filled). One statement per type, not one for all: a statement over every type costs
    // its subplans by the recursive CTE's guess of 100 types, and past `jit_above_cost`
    // PostgreSQL compiled it for seconds (12 s on 1,000,000 tasks before a VACUUM).
    counts_of_type: "SELECT 'cancelled' AS status, COUNT(*) AS n FROM (SELECT 1 FROM task_run \
                     WHERE task_type = $1 AND status = 'cancelled' \
                     ORDER BY created_at LIMIT $2) AS c \
                     UNION ALL SELECT 'failed' AS status, COUNT(*) AS n FROM (SELECT 1 FROM task_run \
                     WHERE task_type = $1 AND status = 'failed' \
                     ORDER BY created_at LIMIT $2) AS c \
                     UNION ALL SELECT 'queued' AS status, COUNT(*) AS n FROM (SELECT 1 FROM task_run \
                     WHERE task_type = $1 AND status = 'queued' \
                     ORDER BY created_at LIMIT $2) AS c \
                     UNION ALL SELECT 'running' AS status, COUNT(*) AS n FROM (SELECT 1 FROM task_run \
                     WHERE task_type = $1 AND status = 'running' \
                     ORDER BY created_at LIMIT $2) AS c \
                     UNION ALL SELECT 'succeeded' AS status, COUNT(*) AS n FROM (SELECT 1 FROM task_run \
                     WHERE task_type = $1 AND status = 'succeeded' \
                     ORDER BY created_at LIMIT $2) AS c",
    // Each arm reads one index: `task_run_created_idx` for the creations,
    // `task_run_finished_idx` for the endings. The window's start comes from the clock
    // here, not from a parameter: a generic plan of `created_at >= $1` assumed a third
    // of the table and scanned all of it (280 ms on 1,000,000 tasks).
    throughput: "SELECT 'created' AS what, floor(extract(epoch FROM created_at) / 60)::int8 AS minute, \
                 COUNT(*) AS n FROM task_run \
                 WHERE created_at >= date_trunc('minute', statement_timestamp()) - interval '59 minutes' \
                 GROUP BY 2 \
                 UNION ALL SELECT status, floor(extract(epoch FROM finished_at) / 60)::int8, \
                 COUNT(*) FROM task_run \
                 WHERE finished_at >= date_trunc('minute', statement_timestamp()) - interval '59 minutes' \
                 AND status IN ('succeeded', 'failed') GROUP BY 1, 2",
    // PostgreSQL has no loose index scan: `MIN(created_at) ... GROUP BY task_type` read
    // every queued task (316 ms for 50,000 of 1,000,000). Spelled out instead: the task
    // types one index descent each (a recursive skip over
    // `task_run_type_status_created_idx`), then one descent per type for its oldest
    // queued task (5 ms; BENCHMARKS.md).
    oldest_queued: "WITH RECURSIVE types(task_type) AS (SELECT MIN(task_type) FROM task_run \
                    UNION ALL SELECT (SELECT r.task_type FROM task_run r \
                    WHERE r.task_type > types.task_type ORDER BY r.task_type LIMIT 1) \
                    FROM types WHERE types.task_type IS NOT NULL) \
                    SELECT task_type, oldest FROM (SELECT task_type, \
                    (SELECT q.created_at FROM task_run q WHERE q.task_type = types.task_type \
                    AND q.status = 'queued' ORDER BY q.created_at LIMIT 1) AS oldest \
                    FROM types WHERE task_type IS NOT NULL) AS o \
                    WHERE oldest IS NOT NULL ORDER BY task_type",
    // One array of ids: the texts do not depend on the number of rows.
    cancel_many: |_| {
        Cow::Borrowed(
            "UPDATE task_run SET status = 'cancelled', error = $1, lease_expires_at = NULL, \
             finished_at = statement_timestamp(), updated_at = statement_timestamp() \
             WHERE id = ANY($2) AND status IN ('queued', 'running')",
        )
    },
    delete_many: |_| {
        Cow::Borrowed(
            "DELETE FROM task_run WHERE id = ANY($1) \
             AND status IN ('succeeded', 'failed', 'cancelled')",
        )
    },
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::tests::PINNED_MAX;

    /// Each claim size takes the smallest bound at least as large.
    #[test]
    fn a_claim_takes_the_smallest_bound_that_holds_it() {
        for (max, bound_) in [(1, 1), (2, 2), (3, 4), (8, 8), (9, 16), (513, 1024)] {
            assert_eq!(1 << bound(max), bound_, "{max}");
        }
        assert_eq!(bound(LARGEST_BOUND), BOUNDS - 1);
    }

    /// The snapshots pin one bound's texts; every other bound's text is that one with
    /// its number in place of 8, once.
    #[test]
    fn claims_differ_only_in_their_bound() {
        let pinned = bound(PINNED_MAX);
        for texts in [
            CLAIM_ANY,
            CLAIM_TYPES,
            OPTIMISTIC_CLAIM_ANY,
            OPTIMISTIC_CLAIM_TYPES,
            WINDOW_CLAIM,
            SLOT_CLAIM,
            CANDIDATES,
            REST_CANDIDATES,
        ] {
            let marker = "LIMIT 8 FOR UPDATE SKIP LOCKED) AS bounded";
            assert_eq!(
                texts[pinned].matches(marker).count(),
                1,
                "{}",
                texts[pinned]
            );
            for (i, text) in texts.iter().enumerate() {
                let expected = texts[pinned].replace(
                    marker,
                    &format!("LIMIT {} FOR UPDATE SKIP LOCKED) AS bounded", 1 << i),
                );
                assert_eq!(*text, expected);
            }
        }
    }
}
