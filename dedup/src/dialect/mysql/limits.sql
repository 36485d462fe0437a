-- MySQL/MariaDB: limits per task type (`task_dedup_limits`, migration 11). A limited type
-- is claimed in a transaction of its own that first locks the type's row (`lock`); a type
-- whose only limit is `max_running` is first tried without that lock, with run slots under
-- the unique index `task_run_slot_uidx` (`slots_and_candidates`).

-- name: types
-- The limited types.
SELECT task_type
FROM task_dedup_limits;

-- name: lock
-- One type's limits and the limit across all types (the row of the empty type), locked,
-- with the database's clock in microseconds since the Unix epoch (`UNIX_TIMESTAMP` of
-- `NOW(6)` reads it in the session's zone, whatever that is): the type.
SELECT task_type, max_running, max_running_per_user, rate_starts, rate_window_micros,
    window_start_micros, window_starts, fair, fair_cursor,
    CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED) AS now_micros
FROM task_dedup_limits
WHERE task_type IN (?, '')
ORDER BY task_type
FOR UPDATE;

-- name: running
-- One type's running tasks: the type. A locking read, which sees the latest commits
-- whatever snapshot the transaction holds (a plain read could miss the previous claim's
-- tasks).
SELECT user_id, run_slot
FROM task_run
WHERE task_type = ?
    AND status = 'running'
LOCK IN SHARE MODE;

-- name: slots_and_candidates
-- The first try for a type whose only limit is `max_running`, in one statement of two
-- parts, each planned as it would be alone: the next due tasks of the type as `candidates`
-- selects them (locked, skipping rows other claimers hold; rows with an `id`), and the
-- limit `m` with each running task's `slot` (`NULL`: none), one row per running task or
-- one with `status` `NULL` when none runs (rows without an `id`; none when the type has
-- other limits). The claim picks free slots from it and starts the tasks with them in the
-- same transaction, without the type's lock (`executor::mysql`). The slots are a plain
-- read, so a slot taken by a claim it does not see fails that claim's update in
-- `task_run_slot_uidx`. Parameters: the type, how many, the type.
(
    SELECT id, user_id, task_type, resource_key, concurrent,
        NULL AS m, NULL AS status, NULL AS slot
    FROM task_run t
    WHERE status = 'queued'
        AND run_at <= UTC_TIMESTAMP(6)
        AND task_type NOT IN (SELECT task_type FROM task_dedup_paused)
        AND task_type = ?
        AND (
            concurrent
            OR NOT EXISTS (
                SELECT 1
                FROM task_run r
                WHERE r.user_id = t.user_id
                    AND r.task_type = t.task_type
                    AND r.resource_key = t.resource_key
                    AND r.running_slot = 1
            )
        )
    ORDER BY priority DESC, run_at, created_at, id
    LIMIT ?
    FOR UPDATE SKIP LOCKED
)
UNION ALL (
    SELECT NULL, NULL, NULL, NULL, NULL, l.max_running, r.status, r.run_slot
    FROM task_dedup_limits l
    LEFT JOIN task_run r ON r.task_type = l.task_type AND r.status = 'running'
    WHERE l.task_type = ?
        AND l.max_running IS NOT NULL
        AND l.max_running_per_user IS NULL
        AND l.rate_starts IS NULL
        AND NOT l.fair
        AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '')
);

-- name: slots_and_optimistic_candidates
-- `slots_and_candidates` in the optimistic form: without the probe for running tasks of
-- the keys; a picked task whose key runs fails the claim's update in
-- `task_running_resource_uidx` (`Kind::RunningKey`), and the probing form runs.
(
    SELECT id, user_id, task_type, resource_key, concurrent,
        NULL AS m, NULL AS status, NULL AS slot
    FROM task_run t
    WHERE status = 'queued'
        AND run_at <= UTC_TIMESTAMP(6)
        AND task_type NOT IN (SELECT task_type FROM task_dedup_paused)
        AND task_type = ?
    ORDER BY priority DESC, run_at, created_at, id
    LIMIT ?
    FOR UPDATE SKIP LOCKED
)
UNION ALL (
    SELECT NULL, NULL, NULL, NULL, NULL, l.max_running, r.status, r.run_slot
    FROM task_dedup_limits l
    LEFT JOIN task_run r ON r.task_type = l.task_type AND r.status = 'running'
    WHERE l.task_type = ?
        AND l.max_running IS NOT NULL
        AND l.max_running_per_user IS NULL
        AND l.rate_starts IS NULL
        AND NOT l.fair
        AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '')
);

-- name: candidates
-- The next due tasks of one type as the claims select them, in claim order, locked and
-- skipping rows other claimers hold: the type, the users to pass over (if any), how many.
SELECT id, user_id, task_type, resource_key, concurrent
FROM task_run t
WHERE status = 'queued'
    AND run_at <= UTC_TIMESTAMP(6)
    AND task_type NOT IN (SELECT task_type FROM task_dedup_paused)
    AND task_type = ?
    AND (
        concurrent
        OR NOT EXISTS (
            SELECT 1
            FROM task_run r
            WHERE r.user_id = t.user_id
                AND r.task_type = t.task_type
                AND r.resource_key = t.resource_key
                AND r.running_slot = 1
        )
    )
    [[AND user_id NOT IN ({{users, ?}})]]
ORDER BY priority DESC, run_at, created_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED;

-- name: running_users
-- Every running task's user: a locking read, as `running`.
SELECT user_id
FROM task_run
WHERE status = 'running'
LOCK IN SHARE MODE;

-- name: rest_candidates
-- `candidates` of every type without limits of its own, while a limit across all types is
-- set: the types to take (none: any), the users to pass over (if any), how many.
SELECT id, user_id, task_type, resource_key, concurrent
FROM task_run t
WHERE status = 'queued'
    AND run_at <= UTC_TIMESTAMP(6)
    AND task_type NOT IN (SELECT task_type FROM task_dedup_paused)
    AND task_type NOT IN (SELECT task_type FROM task_dedup_limits)
    AND (
        concurrent
        OR NOT EXISTS (
            SELECT 1
            FROM task_run r
            WHERE r.user_id = t.user_id
                AND r.task_type = t.task_type
                AND r.resource_key = t.resource_key
                AND r.running_slot = 1
        )
    )
    [[AND task_type IN ({{types, ?}})]]
    [[AND user_id NOT IN ({{users, ?}})]]
ORDER BY priority DESC, run_at, created_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED;

-- name: fair_heads
-- One user's next due tasks of one type, without locks: the type, the user, how many.
SELECT id, user_id, task_type, resource_key, concurrent
FROM task_run t
WHERE status = 'queued'
    AND run_at <= UTC_TIMESTAMP(6)
    AND task_type NOT IN (SELECT task_type FROM task_dedup_paused)
    AND task_type = ?
    AND user_id = ?
    AND (
        concurrent
        OR NOT EXISTS (
            SELECT 1
            FROM task_run r
            WHERE r.user_id = t.user_id
                AND r.task_type = t.task_type
                AND r.resource_key = t.resource_key
                AND r.running_slot = 1
        )
    )
ORDER BY priority DESC, run_at, created_at, id
LIMIT ?;

-- name: fair_cursor
UPDATE task_dedup_limits
SET fair_cursor = ?
WHERE task_type = ?;

-- name: claim_ids
-- Moves tasks that are still queued to `running` under a lease, each with its run slot
-- (NULL: none): worker_id, lease, an (id, slot) pair per task, the ids. The rows are read
-- by id afterwards (`bulk.sql`'s `by_ids`).
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = ?,
    lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    started_at = UTC_TIMESTAMP(6),
    updated_at = UTC_TIMESTAMP(6),
    run_slot = CASE id {{slots WHEN ? THEN ?}} END
WHERE id IN ({{ids, ?}})
    AND status = 'queued';

-- name: window
UPDATE task_dedup_limits
SET window_start_micros = ?, window_starts = ?
WHERE task_type = ?;

-- name: set
-- Inserts or replaces a type's limits, keeping the window's count and the fair cursor.
INSERT INTO task_dedup_limits (
    task_type, max_running, max_running_per_user, rate_starts, rate_window_micros, fair,
    updated_at
)
VALUES (?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE max_running = VALUES(max_running),
    max_running_per_user = VALUES(max_running_per_user),
    rate_starts = VALUES(rate_starts),
    rate_window_micros = VALUES(rate_window_micros),
    fair = VALUES(fair),
    updated_at = VALUES(updated_at);

-- name: clear
DELETE FROM task_dedup_limits
WHERE task_type = ?;

-- name: list
SELECT task_type, max_running, max_running_per_user, rate_starts, rate_window_micros,
    window_start_micros, window_starts, fair, fair_cursor, updated_at,
    (
        SELECT count(*) FROM task_run r WHERE r.task_type = l.task_type AND r.status = 'running'
    ) AS running,
    CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED) AS now_micros
FROM task_dedup_limits l
ORDER BY task_type;
