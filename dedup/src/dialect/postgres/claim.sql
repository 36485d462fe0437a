-- PostgreSQL: the claims of the types without limits of their own. Each moves the next
-- due queued tasks to `running` under worker $1's lease of $2 microseconds, one more
-- attempt, no run slot (a type without limits has none: one left from a run under a
-- limit would otherwise meet another's in `task_run_slot_uidx`).
--
-- `id = ANY(ARRAY(...))`: the selection runs once, then one primary-key lookup per task.
-- `task_run_queue_idx (priority DESC, run_at, created_at, id) WHERE status = 'queued'`
-- serves the order.
--
-- Due: queued, `run_at` passed, the type not paused, no limits of its own, and no limit
-- across all types set (the row of the empty type, which no task has: while one is, every
-- task starts under its lock, `limits.sql`'s `rest_candidates`; uncorrelated, evaluated
-- once per statement). A paused or limited type is one primary-key probe per candidate,
-- fenced by `OFFSET 0`. Not `NOT (task_type = ANY(ARRAY(SELECT ... FROM
-- task_dedup_paused)))`: PostgreSQL estimates `task_type = <unknown>` as
-- 1 / (distinct types), so on a table of one task type it expected no due task at all,
-- planned a scan of every queued task and a sort instead of the claim index in order, and
-- a drain of 10,000 tasks ran at a sixth of its speed once the table had statistics. A
-- fenced probe is estimated at one half.
--
-- The locked selection ends `LIMIT {{bound}} FOR UPDATE SKIP LOCKED) AS bounded LIMIT $n`:
-- concurrent claimers pass over each other's rows instead of queueing behind them; the
-- rows are locked as the outer `LIMIT` (the claim's size) pulls them, so a claim locks no
-- more than it takes, and they come in the selection's order (nothing above it sorts).
-- Why a literal bound: `render::bound`.
--
-- Two forms of each claim (`dialect::Claim`). The probing one passes over tasks whose key
-- runs (one run per key) and keeps the first task of each key (DISTINCT ON; a `concurrent`
-- task is a key of its own), so its batch fills from free keys however many wait ahead.
-- The optimistic one does neither: `task_running_resource_uidx` fails it
-- (`Kind::RunningKey`) when it picked a task whose key runs, or two of one key, and then
-- it took nothing. Two claimers may also pick follow-ups of one key at once (a task the
-- other has locked, not yet running): the index lets one of them through, and the
-- other's claim fails and is run again.

-- name: claim_any
-- $3: how many.
--
-- The key's probe repeats the predicate of `task_running_resource_uidx`. `OFFSET 0` keeps
-- it one index lookup per candidate: without it PostgreSQL turned the `EXISTS` into a
-- hashed subplan that read the whole index per claim, dead entries of every task that ran
-- since the last vacuum included (10,048 entries for 32 running tasks in a drain; the
-- drain of distinct keys was 23 % slower).
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = $1,
    lease_expires_at = statement_timestamp() + $2 * interval '1 microsecond',
    started_at = statement_timestamp(),
    updated_at = statement_timestamp(),
    run_slot = NULL
WHERE id = ANY(ARRAY(
    SELECT DISTINCT ON (user_id, task_type, resource_key, CASE WHEN concurrent THEN id END) id
    FROM (
        SELECT *
        FROM (
            SELECT id, user_id, task_type, resource_key, concurrent, priority, run_at, created_at
            FROM task_run t
            WHERE status = 'queued'
                AND run_at <= statement_timestamp()
                AND NOT EXISTS (
                    SELECT 1 FROM task_dedup_paused p WHERE p.task_type = t.task_type OFFSET 0
                )
                AND NOT EXISTS (
                    SELECT 1 FROM task_dedup_limits l WHERE l.task_type = t.task_type OFFSET 0
                )
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
                        OFFSET 0
                    )
                )
            ORDER BY priority DESC, run_at, created_at, id
            LIMIT {{bound}}
            FOR UPDATE SKIP LOCKED
        ) AS bounded
        LIMIT $3
    ) AS due
    ORDER BY user_id, task_type, resource_key, CASE WHEN concurrent THEN id END,
        priority DESC, run_at, created_at, id
))
RETURNING {{columns}};

-- name: claim_types
-- `claim_any` for some task types: $3 the types (an array), $4 how many.
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = $1,
    lease_expires_at = statement_timestamp() + $2 * interval '1 microsecond',
    started_at = statement_timestamp(),
    updated_at = statement_timestamp(),
    run_slot = NULL
WHERE id = ANY(ARRAY(
    SELECT DISTINCT ON (user_id, task_type, resource_key, CASE WHEN concurrent THEN id END) id
    FROM (
        SELECT *
        FROM (
            SELECT id, user_id, task_type, resource_key, concurrent, priority, run_at, created_at
            FROM task_run t
            WHERE status = 'queued'
                AND run_at <= statement_timestamp()
                AND NOT EXISTS (
                    SELECT 1 FROM task_dedup_paused p WHERE p.task_type = t.task_type OFFSET 0
                )
                AND NOT EXISTS (
                    SELECT 1 FROM task_dedup_limits l WHERE l.task_type = t.task_type OFFSET 0
                )
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
                        OFFSET 0
                    )
                )
                AND task_type = ANY($3)
            ORDER BY priority DESC, run_at, created_at, id
            LIMIT {{bound}}
            FOR UPDATE SKIP LOCKED
        ) AS bounded
        LIMIT $4
    ) AS due
    ORDER BY user_id, task_type, resource_key, CASE WHEN concurrent THEN id END,
        priority DESC, run_at, created_at, id
))
RETURNING {{columns}};

-- name: optimistic_claim_any
-- $3: how many.
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = $1,
    lease_expires_at = statement_timestamp() + $2 * interval '1 microsecond',
    started_at = statement_timestamp(),
    updated_at = statement_timestamp(),
    run_slot = NULL
WHERE id = ANY(ARRAY(
    SELECT id
    FROM (
        SELECT id
        FROM task_run t
        WHERE status = 'queued'
            AND run_at <= statement_timestamp()
            AND NOT EXISTS (
                SELECT 1 FROM task_dedup_paused p WHERE p.task_type = t.task_type OFFSET 0
            )
            AND NOT EXISTS (
                SELECT 1 FROM task_dedup_limits l WHERE l.task_type = t.task_type OFFSET 0
            )
            AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '')
        ORDER BY priority DESC, run_at, created_at, id
        LIMIT {{bound}}
        FOR UPDATE SKIP LOCKED
    ) AS bounded
    LIMIT $3
))
RETURNING {{columns}};

-- name: optimistic_claim_types
-- $3 the types (an array), $4 how many.
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = $1,
    lease_expires_at = statement_timestamp() + $2 * interval '1 microsecond',
    started_at = statement_timestamp(),
    updated_at = statement_timestamp(),
    run_slot = NULL
WHERE id = ANY(ARRAY(
    SELECT id
    FROM (
        SELECT id
        FROM task_run t
        WHERE status = 'queued'
            AND run_at <= statement_timestamp()
            AND NOT EXISTS (
                SELECT 1 FROM task_dedup_paused p WHERE p.task_type = t.task_type OFFSET 0
            )
            AND NOT EXISTS (
                SELECT 1 FROM task_dedup_limits l WHERE l.task_type = t.task_type OFFSET 0
            )
            AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '')
            AND task_type = ANY($3)
        ORDER BY priority DESC, run_at, created_at, id
        LIMIT {{bound}}
        FOR UPDATE SKIP LOCKED
    ) AS bounded
    LIMIT $4
))
RETURNING {{columns}};
