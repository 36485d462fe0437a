-- SQLite: limits per task type (`task_dedup_limits`, migration 11). The limited claim runs
-- in an IMMEDIATE transaction: its write lock is the type's lock, so `lock` and the
-- candidates need no locking clause. A type whose only limit is `max_running` is first
-- tried in one statement that counts its running tasks (`window_claim`).

-- name: types
-- The limited types.
SELECT task_type
FROM task_dedup_limits;

-- name: lock
-- One type's limits and the limit across all types (the row of the empty type), with the
-- database's clock in microseconds since the Unix epoch, to the millisecond (as every time
-- SQLite writes here; `unixepoch('subsec')` needs SQLite 3.42). No locking clause: the
-- claim's IMMEDIATE transaction holds the write lock.
SELECT task_type, max_running, max_running_per_user, rate_starts, rate_window_micros,
    window_start_micros, window_starts, fair, fair_cursor,
    (
        CAST(strftime('%s', 'now') AS INTEGER) * 1000000
        + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER) * 1000
    ) AS now_micros
FROM task_dedup_limits
WHERE task_type IN (?, '')
ORDER BY task_type;

-- name: running
-- One type's running tasks: each one's user and run slot.
SELECT user_id, run_slot
FROM task_run
WHERE task_type = ?
    AND status = 'running';

-- name: window_claim
-- The first try of a type whose only limit is `max_running`, in one statement: the next
-- due tasks of type ?3, one per key, as many as the room leaves (?4 at most), started
-- under worker ?1's lease ?2, without run slots. The room is the limit less the type's
-- running tasks, counted in the claim's own statement: writers take turns on SQLite, so no
-- other claim starts a task between the count and the start, and no run slot is needed. No
-- room (no row) for a type with other limits, or while a limit across all types is set;
-- such a type at its limit has no other lock-free try.
WITH lim AS (
    SELECT l.max_running - (
        SELECT count(*) FROM task_run x WHERE x.task_type = ?3 AND x.status = 'running'
    ) AS room
    FROM task_dedup_limits l
    WHERE l.task_type = ?3
        AND l.max_running IS NOT NULL
        AND l.max_running_per_user IS NULL
        AND l.rate_starts IS NULL
        AND NOT l.fair
        AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '')
), picked AS (
    SELECT id AS pid, row_number() OVER (ORDER BY priority DESC, run_at, created_at, id) AS pn
    FROM (
        SELECT id, priority, run_at, created_at, row_number() OVER (
            PARTITION BY user_id, resource_key, CASE WHEN concurrent THEN id END
            ORDER BY priority DESC, run_at, created_at, id
        ) AS nth
        FROM (
            SELECT id, user_id, resource_key, concurrent, priority, run_at, created_at
            FROM task_run t
            WHERE status = 'queued'
                AND +run_at <= strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', '+0.001 seconds')
                AND task_type NOT IN (SELECT task_type FROM task_dedup_paused)
                AND task_type = ?3
                AND (
                    concurrent
                    OR NOT EXISTS (
                        SELECT 1
                        FROM task_run r
                        WHERE r.user_id = t.user_id
                            AND r.task_type = t.task_type
                            AND r.resource_key = t.resource_key
                            AND {{runs_serially}}
                    )
                )
            ORDER BY priority DESC, run_at, created_at, id
            LIMIT ?4
        )
    )
    WHERE nth = 1
)
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = ?1,
    lease_expires_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?2),
    started_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    run_slot = NULL
WHERE id IN (SELECT pid FROM picked, lim WHERE pn <= lim.room)
RETURNING {{columns}};

-- name: optimistic_window_claim
-- `window_claim` without the probe for running tasks of the keys and without the
-- one-per-key step, as the main claim's optimistic form: `task_running_resource_uidx`
-- fails it (`Kind::RunningKey`) when it picked a task whose key runs, or two of one key,
-- and then it took nothing and the probing form runs. The next due tasks of the type, as
-- many as the room leaves (none without a room: a negative `LIMIT` would be none at all).
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = ?1,
    lease_expires_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?2),
    started_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    run_slot = NULL
WHERE id IN (
    SELECT id
    FROM task_run t
    WHERE status = 'queued'
        AND +run_at <= strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', '+0.001 seconds')
        AND task_type NOT IN (SELECT task_type FROM task_dedup_paused)
        AND task_type = ?3
    ORDER BY priority DESC, run_at, created_at, id
    LIMIT max(0, min(?4, coalesce((
        SELECT l.max_running - (
            SELECT count(*) FROM task_run x WHERE x.task_type = ?3 AND x.status = 'running'
        ) AS room
        FROM task_dedup_limits l
        WHERE l.task_type = ?3
            AND l.max_running IS NOT NULL
            AND l.max_running_per_user IS NULL
            AND l.rate_starts IS NULL
            AND NOT l.fair
            AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '')
    ), 0)))
)
RETURNING {{columns}};

-- name: candidates
-- The next due tasks of one type as the claims select them, in claim order: the type, the
-- users to pass over (a JSON array), how many.
SELECT id, user_id, task_type, resource_key, concurrent
FROM task_run t
WHERE status = 'queued'
    AND +run_at <= strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', '+0.001 seconds')
    AND task_type NOT IN (SELECT task_type FROM task_dedup_paused)
    AND task_type = ?
    AND user_id NOT IN (SELECT value FROM json_each(?))
    AND (
        concurrent
        OR NOT EXISTS (
            SELECT 1
            FROM task_run r
            WHERE r.user_id = t.user_id
                AND r.task_type = t.task_type
                AND r.resource_key = t.resource_key
                AND {{runs_serially}}
        )
    )
ORDER BY priority DESC, run_at, created_at, id
LIMIT ?;

-- name: running_users
SELECT user_id
FROM task_run
WHERE status = 'running';

-- name: rest_candidates
-- `candidates` of every type without limits of its own, while a limit across all types is
-- set: the types to take (a JSON array; none: any), the users to pass over, how many.
SELECT id, user_id, task_type, resource_key, concurrent
FROM task_run t
WHERE status = 'queued'
    AND +run_at <= strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', '+0.001 seconds')
    AND task_type NOT IN (SELECT task_type FROM task_dedup_paused)
    AND task_type NOT IN (SELECT task_type FROM task_dedup_limits)
    AND (json_array_length(?1) = 0 OR task_type IN (SELECT value FROM json_each(?1)))
    AND user_id NOT IN (SELECT value FROM json_each(?2))
    AND (
        concurrent
        OR NOT EXISTS (
            SELECT 1
            FROM task_run r
            WHERE r.user_id = t.user_id
                AND r.task_type = t.task_type
                AND r.resource_key = t.resource_key
                AND {{runs_serially}}
        )
    )
ORDER BY priority DESC, run_at, created_at, id
LIMIT ?3;

-- name: fair_heads
-- One user's next due tasks of one type: the type, the user, how many.
SELECT id, user_id, task_type, resource_key, concurrent
FROM task_run t
WHERE status = 'queued'
    AND +run_at <= strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', '+0.001 seconds')
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
                AND {{runs_serially}}
        )
    )
ORDER BY priority DESC, run_at, created_at, id
LIMIT ?;

-- name: fair_cursor
UPDATE task_dedup_limits
SET fair_cursor = ?
WHERE task_type = ?;

-- name: claim_ids
-- Moves tasks that are still queued to `running` under a lease, as a claim does, each with
-- its run slot (NULL: none): worker_id, lease, an (id, slot) pair per task, the ids.
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = ?,
    lease_expires_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?),
    started_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    run_slot = CASE id {{slots WHEN ? THEN ?}} END
WHERE id IN ({{ids, ?}})
    AND status = 'queued'
RETURNING {{columns}};

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
VALUES (?, ?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'))
ON CONFLICT (task_type)
DO UPDATE SET max_running = excluded.max_running,
    max_running_per_user = excluded.max_running_per_user,
    rate_starts = excluded.rate_starts,
    rate_window_micros = excluded.rate_window_micros,
    fair = excluded.fair,
    updated_at = excluded.updated_at;

-- name: clear
DELETE FROM task_dedup_limits
WHERE task_type = ?;

-- name: list
SELECT task_type, max_running, max_running_per_user, rate_starts, rate_window_micros,
    window_start_micros, window_starts, fair, fair_cursor, updated_at,
    (
        SELECT count(*) FROM task_run r WHERE r.task_type = l.task_type AND r.status = 'running'
    ) AS running,
    (
        CAST(strftime('%s', 'now') AS INTEGER) * 1000000
        + CAST(substr(strftime('%f', 'now'), 4) AS INTEGER) * 1000
    ) AS now_micros
FROM task_dedup_limits l
ORDER BY task_type;
