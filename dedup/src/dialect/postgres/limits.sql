-- PostgreSQL: limits per task type (`task_dedup_limits`, migration 11): the claims of a
-- limited type and the settings behind `TaskAdmin::set_limits`. A limited type is claimed
-- in a transaction of its own that first locks the type's row (`lock`), so its claims run
-- one at a time across every process, and each counts the type's running tasks afresh
-- (`running`) after the previous one committed. A type whose only limit is `max_running`
-- is first tried without the lock, with run slots under the unique index
-- `task_run_slot_uidx` (`window_claim`, `slot_claim`). The database's clock in
-- microseconds since the Unix epoch is `(extract(epoch FROM statement_timestamp()) *
-- 1000000)::int8`.

-- name: types
-- The limited types.
SELECT task_type
FROM task_dedup_limits;

-- name: lock
-- One type's limits ($1) and the limit across all types (the row of the empty type), the
-- rows locked until the transaction ends, in that order (the empty type first: every claim
-- that locks both takes them in the same order), with the database's clock.
SELECT task_type, max_running, max_running_per_user, rate_starts, rate_window_micros,
    window_start_micros, window_starts, fair, fair_cursor,
    (extract(epoch FROM statement_timestamp()) * 1000000)::int8 AS now_micros
FROM task_dedup_limits
WHERE task_type IN ($1, '')
ORDER BY task_type
FOR UPDATE;

-- name: running
-- One type's running tasks ($1): `task_running_resource_uidx` holds every running task and
-- leads with the type.
SELECT user_id, run_slot
FROM task_run
WHERE task_type = $1
    AND status = 'running';

-- name: window_claim
-- The first try of a type whose only limit is `max_running`, one statement without the
-- type's lock: the next due tasks of type $3, one per key, as many as the limit leaves
-- ($4 at most), started under worker $1's lease of $2 microseconds, each with the run
-- slot of its position from `off`: a random range of slots that no running task holds
-- (a range probe of `task_run_slot_uidx`; four tries). No read of the running tasks'
-- slots, and no join of tasks to free slots; ids and slots are paired by position.
-- Starts nothing when the type has other limits, while one of its running tasks holds no
-- slot below the limit (started before the limit, or before it was lowered: the locked
-- claim counts those), or when no range it tried was free (then `slot_claim` runs). A
-- slot another claim took meanwhile fails it in `task_run_slot_uidx` (`Kind::SlotTaken`).
-- The selection is the probing claim's (`claim.sql`), of one type; its `DISTINCT ON` per
-- key then its order again, for the positions.
WITH lim AS (
    SELECT l.max_running AS m, w.off
    FROM task_dedup_limits l
    CROSS JOIN LATERAL (
        SELECT c.off
        FROM (
            SELECT floor(random() * (l.max_running - least($4, l.max_running) + 1))::int8 AS off
            FROM generate_series(1, 4)
        ) AS c
        WHERE NOT EXISTS (
            SELECT 1
            FROM task_run r
            WHERE r.task_type = $3
                AND r.status = 'running'
                AND r.run_slot >= c.off
                AND r.run_slot < c.off + $4
        )
        LIMIT 1
    ) AS w
    WHERE l.task_type = $3
        AND l.max_running IS NOT NULL
        AND l.max_running_per_user IS NULL
        AND l.rate_starts IS NULL
        AND NOT l.fair
        AND NOT EXISTS (
            SELECT 1
            FROM task_run r
            WHERE r.task_type = $3
                AND r.status = 'running'
                AND (r.run_slot IS NULL OR r.run_slot >= l.max_running)
        )
        AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '')
)
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = $1,
    lease_expires_at = statement_timestamp() + $2 * interval '1 microsecond',
    started_at = statement_timestamp(),
    updated_at = statement_timestamp(),
    run_slot = lim.off + s.n - 1
FROM lim, unnest(ARRAY(
    SELECT id
    FROM (
        SELECT DISTINCT ON (user_id, resource_key, CASE WHEN concurrent THEN id END) id,
            priority, run_at, created_at
        FROM (
            SELECT *
            FROM (
                SELECT id, user_id, resource_key, concurrent, priority, run_at, created_at
                FROM task_run t
                WHERE status = 'queued'
                    AND run_at <= statement_timestamp()
                    AND NOT EXISTS (
                        SELECT 1 FROM task_dedup_paused p WHERE p.task_type = t.task_type OFFSET 0
                    )
                    AND task_type = $3
                    AND (
                        concurrent
                        OR NOT EXISTS (
                            SELECT 1
                            FROM task_run r
                            WHERE r.user_id = t.user_id
                                AND r.task_type = t.task_type
                                AND r.resource_key = t.resource_key
                                AND {{runs_serially}}
                            OFFSET 0
                        )
                    )
                ORDER BY priority DESC, run_at, created_at, id
                LIMIT {{bound}}
                FOR UPDATE SKIP LOCKED
            ) AS bounded
            LIMIT $4
        ) AS due
        ORDER BY user_id, resource_key, CASE WHEN concurrent THEN id END, priority DESC, run_at,
            created_at, id
    ) AS one_per_key
    ORDER BY priority DESC, run_at, created_at, id
)) WITH ORDINALITY AS s (sid, n)
WHERE task_run.id = s.sid
    AND s.n <= lim.m
RETURNING {{columns}};

-- name: optimistic_window_claim
-- `window_claim` with the optimistic claim's selection: no probe of the keys, no
-- `DISTINCT ON`. `task_running_resource_uidx` fails it (`Kind::RunningKey`) when it picked
-- a task whose key runs, or two of one key, and then it took nothing and the probing form
-- runs. Run when the main claim would run optimistically (`lifecycle::claim_mode`).
WITH lim AS (
    SELECT l.max_running AS m, w.off
    FROM task_dedup_limits l
    CROSS JOIN LATERAL (
        SELECT c.off
        FROM (
            SELECT floor(random() * (l.max_running - least($4, l.max_running) + 1))::int8 AS off
            FROM generate_series(1, 4)
        ) AS c
        WHERE NOT EXISTS (
            SELECT 1
            FROM task_run r
            WHERE r.task_type = $3
                AND r.status = 'running'
                AND r.run_slot >= c.off
                AND r.run_slot < c.off + $4
        )
        LIMIT 1
    ) AS w
    WHERE l.task_type = $3
        AND l.max_running IS NOT NULL
        AND l.max_running_per_user IS NULL
        AND l.rate_starts IS NULL
        AND NOT l.fair
        AND NOT EXISTS (
            SELECT 1
            FROM task_run r
            WHERE r.task_type = $3
                AND r.status = 'running'
                AND (r.run_slot IS NULL OR r.run_slot >= l.max_running)
        )
        AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '')
)
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = $1,
    lease_expires_at = statement_timestamp() + $2 * interval '1 microsecond',
    started_at = statement_timestamp(),
    updated_at = statement_timestamp(),
    run_slot = lim.off + s.n - 1
FROM lim, unnest(ARRAY(
    SELECT id
    FROM (
        SELECT id
        FROM task_run t
        WHERE status = 'queued'
            AND run_at <= statement_timestamp()
            AND NOT EXISTS (
                SELECT 1 FROM task_dedup_paused p WHERE p.task_type = t.task_type OFFSET 0
            )
            AND task_type = $3
        ORDER BY priority DESC, run_at, created_at, id
        LIMIT {{bound}}
        FOR UPDATE SKIP LOCKED
    ) AS bounded
    LIMIT $4
)) WITH ORDINALITY AS s (sid, n)
WHERE task_run.id = s.sid
    AND s.n <= lim.m
RETURNING {{columns}};

-- name: slot_claim
-- The second try of such a type: the free slots read (only as many as it may need, from
-- a random one on, so that concurrent claims seldom pick the same), joined to the next due
-- tasks one per key in claim order. Same parameters and conditions as `window_claim`.
WITH lim AS (
    SELECT max_running AS m, floor(random() * max_running)::int8 AS off
    FROM task_dedup_limits
    WHERE task_type = $3
        AND max_running IS NOT NULL
        AND max_running_per_user IS NULL
        AND rate_starts IS NULL
        AND NOT fair
        AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '')
), run AS (
    SELECT run_slot
    FROM task_run
    WHERE task_type = $3
        AND status = 'running'
), free AS (
    SELECT (lim.off + i) % lim.m AS fslot, row_number() OVER (ORDER BY i) AS fn
    FROM lim
    CROSS JOIN generate_series(0, least(lim.m, $4 + (SELECT count(*) FROM run)) - 1) AS i
    WHERE NOT EXISTS (SELECT 1 FROM run WHERE run.run_slot IS NULL OR run.run_slot >= lim.m)
        AND NOT EXISTS (SELECT 1 FROM run WHERE run.run_slot = (lim.off + i) % lim.m)
), picked AS (
    SELECT pid, row_number() OVER (ORDER BY ppriority DESC, prun_at, pcreated_at, pid) AS pn
    FROM (
        SELECT DISTINCT ON (user_id, resource_key, CASE WHEN concurrent THEN id END) id AS pid,
            priority AS ppriority, run_at AS prun_at, created_at AS pcreated_at
        FROM (
            SELECT *
            FROM (
                SELECT id, user_id, resource_key, concurrent, priority, run_at, created_at
                FROM task_run t
                WHERE status = 'queued'
                    AND run_at <= statement_timestamp()
                    AND NOT EXISTS (
                        SELECT 1 FROM task_dedup_paused p WHERE p.task_type = t.task_type OFFSET 0
                    )
                    AND task_type = $3
                    AND (
                        concurrent
                        OR NOT EXISTS (
                            SELECT 1
                            FROM task_run r
                            WHERE r.user_id = t.user_id
                                AND r.task_type = t.task_type
                                AND r.resource_key = t.resource_key
                                AND {{runs_serially}}
                            OFFSET 0
                        )
                    )
                ORDER BY priority DESC, run_at, created_at, id
                LIMIT {{bound}}
                FOR UPDATE SKIP LOCKED
            ) AS bounded
            LIMIT $4
        ) AS due
        ORDER BY user_id, resource_key, CASE WHEN concurrent THEN id END, priority DESC, run_at,
            created_at, id
    ) AS one_per_key
)
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = $1,
    lease_expires_at = statement_timestamp() + $2 * interval '1 microsecond',
    started_at = statement_timestamp(),
    updated_at = statement_timestamp(),
    run_slot = free.fslot
FROM picked
JOIN free ON free.fn = picked.pn
WHERE task_run.id = picked.pid
RETURNING {{columns}};

-- name: candidates
-- The next due tasks of one type as the claims select them (not paused, none of a key with
-- a task running unless `concurrent`), in claim order, locked and skipping rows other
-- claimers hold: $1 the type, $2 the users to pass over (an array), $3 how many.
SELECT *
FROM (
    SELECT id, user_id, task_type, resource_key, concurrent
    FROM task_run t
    WHERE status = 'queued'
        AND run_at <= statement_timestamp()
        AND NOT EXISTS (
            SELECT 1 FROM task_dedup_paused p WHERE p.task_type = t.task_type OFFSET 0
        )
        AND task_type = $1
        AND NOT (user_id = ANY($2))
        AND (
            concurrent
            OR NOT EXISTS (
                SELECT 1
                FROM task_run r
                WHERE r.user_id = t.user_id
                    AND r.task_type = t.task_type
                    AND r.resource_key = t.resource_key
                    AND {{runs_serially}}
                OFFSET 0
            )
        )
    ORDER BY priority DESC, run_at, created_at, id
    LIMIT {{bound}}
    FOR UPDATE SKIP LOCKED
) AS bounded
LIMIT $3;

-- name: running_users
-- Every running task's user (the limit across all types counts them per user), from
-- `task_running_resource_uidx`, which holds every running task.
SELECT user_id
FROM task_run
WHERE status = 'running';

-- name: rest_candidates
-- `candidates` of every type without limits of its own, for the claim of those types
-- while a limit across all types is set: $1 the types to take (none: any), $2 the users to
-- pass over, $3 how many.
SELECT *
FROM (
    SELECT id, user_id, task_type, resource_key, concurrent
    FROM task_run t
    WHERE status = 'queued'
        AND run_at <= statement_timestamp()
        AND NOT EXISTS (
            SELECT 1 FROM task_dedup_paused p WHERE p.task_type = t.task_type OFFSET 0
        )
        AND NOT EXISTS (
            SELECT 1 FROM task_dedup_limits l WHERE l.task_type = t.task_type OFFSET 0
        )
        AND (cardinality($1::varchar[]) = 0 OR task_type = ANY($1))
        AND NOT (user_id = ANY($2))
        AND (
            concurrent
            OR NOT EXISTS (
                SELECT 1
                FROM task_run r
                WHERE r.user_id = t.user_id
                    AND r.task_type = t.task_type
                    AND r.resource_key = t.resource_key
                    AND {{runs_serially}}
                OFFSET 0
            )
        )
    ORDER BY priority DESC, run_at, created_at, id
    LIMIT {{bound}}
    FOR UPDATE SKIP LOCKED
) AS bounded
LIMIT $3;

-- name: fair_users
-- A fair claim's walk over the users with queued tasks of one type ($1), in order from the
-- one after a cursor ($2), $3 users at most. Each step reads `task_active_resource_uidx`
-- (user, type, key: every queued task holds its key, so the index has them all) from the
-- user after the last one: no index of queued tasks by user is kept for fairness alone,
-- which every task would pay for (migration 13). `{{occupies_key}}` is the index's
-- predicate, implied by `status = 'queued'` but spelled out for the planner.
WITH RECURSIVE walk (user_id, n) AS (
    SELECT (
        SELECT min(user_id)
        FROM task_run
        WHERE task_type = $1
            AND status = 'queued'
            AND user_id > $2
            AND {{occupies_key}}
    ), 1
    UNION ALL
    SELECT (
        SELECT min(t.user_id)
        FROM task_run t
        WHERE t.task_type = $1
            AND t.status = 'queued'
            AND t.user_id > walk.user_id
            AND {{occupies_key}}
    ), walk.n + 1
    FROM walk
    WHERE walk.user_id IS NOT NULL
        AND walk.n < $3
)
SELECT user_id
FROM walk
WHERE user_id IS NOT NULL;

-- name: fair_heads
-- One user's next due tasks of one type, as `candidates` selects them, without locks (the
-- type's lock keeps other claims of the type out, and `claim_ids` starts only what is
-- still queued): $1 the type, $2 the user, $3 how many. The user's tasks of the type are
-- read from `task_active_resource_uidx` (its predicate spelled out), then ordered.
SELECT id, user_id, task_type, resource_key, concurrent
FROM task_run t
WHERE status = 'queued'
    AND run_at <= statement_timestamp()
    AND NOT EXISTS (SELECT 1 FROM task_dedup_paused p WHERE p.task_type = t.task_type OFFSET 0)
    AND task_type = $1
    AND user_id = $2
    AND {{occupies_key}}
    AND (
        concurrent
        OR NOT EXISTS (
            SELECT 1
            FROM task_run r
            WHERE r.user_id = t.user_id
                AND r.task_type = t.task_type
                AND r.resource_key = t.resource_key
                AND {{runs_serially}}
            OFFSET 0
        )
    )
ORDER BY priority DESC, run_at, created_at, id
LIMIT $3;

-- name: fair_cursor
-- Records the last user a fair claim served: $1 the user, $2 the type.
UPDATE task_dedup_limits
SET fair_cursor = $1
WHERE task_type = $2;

-- name: claim_ids
-- Moves tasks that are still queued to `running` under a lease, as a claim does, each with
-- its run slot (-1: none): $1 worker_id, $2 lease, $3 the ids, $4 the slots.
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = $1,
    lease_expires_at = statement_timestamp() + $2 * interval '1 microsecond',
    started_at = statement_timestamp(),
    updated_at = statement_timestamp(),
    run_slot = NULLIF(v.vslot, -1)
FROM unnest($3::uuid[], $4::int8[]) AS v (vid, vslot)
WHERE task_run.id = v.vid
    AND task_run.status = 'queued'
RETURNING {{columns}};

-- name: window
-- Records the rate's current window: $1 its start, $2 the starts in it, $3 the type.
UPDATE task_dedup_limits
SET window_start_micros = $1, window_starts = $2
WHERE task_type = $3;

-- name: set
-- Inserts or replaces a type's limits, keeping the window's count and the fair cursor:
-- $1 the type, $2 max_running, $3 max_running_per_user, $4 rate_starts,
-- $5 rate_window_micros, $6 fair.
INSERT INTO task_dedup_limits (
    task_type, max_running, max_running_per_user, rate_starts, rate_window_micros, fair,
    updated_at
)
VALUES ($1, $2, $3, $4, $5, $6, statement_timestamp())
ON CONFLICT (task_type)
DO UPDATE SET max_running = EXCLUDED.max_running,
    max_running_per_user = EXCLUDED.max_running_per_user,
    rate_starts = EXCLUDED.rate_starts,
    rate_window_micros = EXCLUDED.rate_window_micros,
    fair = EXCLUDED.fair,
    updated_at = EXCLUDED.updated_at;

-- name: clear
-- Removes a type's limits; one row affected when it had any.
DELETE FROM task_dedup_limits
WHERE task_type = $1;

-- name: list
-- Every limited type by name, its limits, its running tasks now and the database's clock.
SELECT task_type, max_running, max_running_per_user, rate_starts, rate_window_micros,
    window_start_micros, window_starts, fair, fair_cursor, updated_at,
    (SELECT count(*) FROM task_run r WHERE r.task_type = l.task_type AND r.status = 'running') AS running,
    (extract(epoch FROM statement_timestamp()) * 1000000)::int8 AS now_micros
FROM task_dedup_limits l
ORDER BY task_type;

