-- SQLite: the claims of the types without limits of their own, each in one UPDATE with
-- the selection as a subquery: SQLite drops `FOR UPDATE SKIP LOCKED`, and one statement is
-- atomic under the database's write lock, so no two workers get one task. Each moves the
-- next due queued tasks to `running` under the worker's lease (worker_id, then the lease
-- as a date-function modifier), one more attempt, no run slot (as on PostgreSQL).
--
-- Due: queued, `run_at` passed, the type not paused (`task_dedup_paused`, read once per
-- claim), no limits of its own, no limit across all types set (the row of the empty type,
-- which no task has: while one is, every task starts under the limited claims' write lock,
-- `limits.sql`'s `rest_candidates`). SQLite's clock has millisecond resolution and
-- `run_at` microseconds: a task is due within the millisecond of its `run_at` (else a task
-- enqueued in the same millisecond as the claim would wait for the next one).
--
-- `+run_at`: the unary plus keeps `run_at` out of the index's search, so the claim index
-- is read in order from `status = 'queued'` and the scan stops at the limit. With
-- statistics (`ANALYZE`, or `PRAGMA optimize` as SQLite advises), SQLite 3.40 (Debian 12's,
-- which `sqlx`'s `sqlite-unbundled` links) planned a skip-scan over `status` and `priority`
-- with `run_at` as a range instead, and sorted every due task for each claim. The bundled
-- SQLite (3.50) reads the index in order either way.
--
-- Two forms of each claim (`dialect::Claim`). The probing one passes over tasks whose key
-- runs (a probe of `task_running_resource_uidx`, whose predicate it repeats so that SQLite
-- uses it), unless `concurrent`, so its batch fills from free keys however many wait
-- ahead, and keeps the first task of each key (a `concurrent` task is a key of its own).
-- The optimistic one does neither: `task_running_resource_uidx` fails it
-- (`Kind::RunningKey`) when it picked a task whose key runs, or two of one key, and then
-- it took nothing.

-- name: claim_any
-- How many: the last parameter.
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = ?,
    lease_expires_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?),
    started_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    run_slot = NULL
WHERE id IN (
    SELECT id
    FROM (
        SELECT id, row_number() OVER (
            PARTITION BY user_id, task_type, resource_key, CASE WHEN concurrent THEN id END
            ORDER BY priority DESC, run_at, created_at, id
        ) AS nth
        FROM (
            SELECT id, user_id, task_type, resource_key, concurrent, priority, run_at, created_at
            FROM task_run t
            WHERE status = 'queued'
                AND +run_at <= strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', '+0.001 seconds')
                AND task_type NOT IN (SELECT task_type FROM task_dedup_paused)
                AND task_type NOT IN (SELECT task_type FROM task_dedup_limits)
                AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '')
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
            LIMIT ?
        )
    )
    WHERE nth = 1
)
RETURNING {{columns}};

-- name: claim_types
-- `claim_any` for some task types: a JSON array of them, then how many.
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = ?,
    lease_expires_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?),
    started_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    run_slot = NULL
WHERE id IN (
    SELECT id
    FROM (
        SELECT id, row_number() OVER (
            PARTITION BY user_id, task_type, resource_key, CASE WHEN concurrent THEN id END
            ORDER BY priority DESC, run_at, created_at, id
        ) AS nth
        FROM (
            SELECT id, user_id, task_type, resource_key, concurrent, priority, run_at, created_at
            FROM task_run t
            WHERE status = 'queued'
                AND +run_at <= strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', '+0.001 seconds')
                AND task_type NOT IN (SELECT task_type FROM task_dedup_paused)
                AND task_type NOT IN (SELECT task_type FROM task_dedup_limits)
                AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '')
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
                AND task_type IN (SELECT value FROM json_each(?))
            ORDER BY priority DESC, run_at, created_at, id
            LIMIT ?
        )
    )
    WHERE nth = 1
)
RETURNING {{columns}};

-- name: optimistic_claim_any
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = ?,
    lease_expires_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?),
    started_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    run_slot = NULL
WHERE id IN (
    SELECT id
    FROM task_run t
    WHERE status = 'queued'
        AND +run_at <= strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', '+0.001 seconds')
        AND task_type NOT IN (SELECT task_type FROM task_dedup_paused)
        AND task_type NOT IN (SELECT task_type FROM task_dedup_limits)
        AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '')
    ORDER BY priority DESC, run_at, created_at, id
    LIMIT ?
)
RETURNING {{columns}};

-- name: optimistic_claim_types
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = ?,
    lease_expires_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?),
    started_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    run_slot = NULL
WHERE id IN (
    SELECT id
    FROM task_run t
    WHERE status = 'queued'
        AND +run_at <= strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', '+0.001 seconds')
        AND task_type NOT IN (SELECT task_type FROM task_dedup_paused)
        AND task_type NOT IN (SELECT task_type FROM task_dedup_limits)
        AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '')
        AND task_type IN (SELECT value FROM json_each(?))
    ORDER BY priority DESC, run_at, created_at, id
    LIMIT ?
)
RETURNING {{columns}};

