-- MySQL/MariaDB: the claims of the types without limits of their own. No UPDATE of a table
-- selected from in a subquery: the next rows are locked here (skipping rows other claimers
-- hold), then updated (`claim_update`) and read by their ids (`bulk.sql`'s `by_ids`), in one short
-- transaction (`executor::mysql::claim`). `task_run_claim_idx` serves the order, which also
-- keeps InnoDB from locking every row it scans.
--
-- Due: queued, `run_at` passed, the type not paused (`task_dedup_paused`, a plain read like
-- the probe below), no limits of its own and no limit across all types set (the row of the
-- empty type, which no task has; while one is set, every task starts under its lock,
-- `limits.sql`'s `rest_candidates`).
--
-- One run per key: the probing claims pass over a task one of whose key runs (a probe of
-- `task_running_resource_uidx` through its generated column `running_slot`, 1 while a task
-- runs and is not `concurrent`), unless it is `concurrent` itself, so a batch fills from
-- unblocked keys however many wait ahead of them. The subquery is a plain read (a locking
-- clause does not reach into it). The flow keeps the first task of each key among those
-- selected. The optimistic claims do not probe: the index refuses the `UPDATE`
-- (`Kind::RunningKey`) when one of them has a task of its key running, and the claim's
-- transaction then takes nothing.

-- name: claim_any
-- The next due queued tasks of any type, locked (id, key, `concurrent`): how many.
SELECT id, user_id, task_type, resource_key, concurrent
FROM task_run t
WHERE status = 'queued'
    AND run_at <= UTC_TIMESTAMP(6)
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
                AND r.running_slot = 1
        )
    )
ORDER BY priority DESC, run_at, created_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED;

-- name: claim_types
-- The same for some task types: the types, then how many. A list of placeholders, not a
-- JSON_TABLE of them: MariaDB joined the JSON_TABLE as a semi-join, sorted every due task
-- in a temporary table and so locked them all, and one worker at a time claimed (a typed
-- Worker drained at 0.2 x an untyped one).
SELECT id, user_id, task_type, resource_key, concurrent
FROM task_run t
WHERE status = 'queued'
    AND run_at <= UTC_TIMESTAMP(6)
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
                AND r.running_slot = 1
        )
    )
    AND task_type IN ({{types, ?}})
ORDER BY priority DESC, run_at, created_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED;

-- name: optimistic_claim_any
-- `claim_any` without the probe.
SELECT id, user_id, task_type, resource_key, concurrent
FROM task_run t
WHERE status = 'queued'
    AND run_at <= UTC_TIMESTAMP(6)
    AND task_type NOT IN (SELECT task_type FROM task_dedup_paused)
    AND task_type NOT IN (SELECT task_type FROM task_dedup_limits)
    AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '')
ORDER BY priority DESC, run_at, created_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED;

-- name: optimistic_claim_types
-- `claim_types` without the probe.
SELECT id, user_id, task_type, resource_key, concurrent
FROM task_run t
WHERE status = 'queued'
    AND run_at <= UTC_TIMESTAMP(6)
    AND task_type NOT IN (SELECT task_type FROM task_dedup_paused)
    AND task_type NOT IN (SELECT task_type FROM task_dedup_limits)
    AND NOT EXISTS (SELECT 1 FROM task_dedup_limits a WHERE a.task_type = '')
    AND task_type IN ({{types, ?}})
ORDER BY priority DESC, run_at, created_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED;

-- name: claim_update
-- Marks the locked tasks claimed, with no run slot (as on PostgreSQL): worker_id, lease,
-- the ids. One primary-key lookup each (a JSON_TABLE of ids made InnoDB scan and lock the
-- whole table). Only a task still queued: the UPDATE reads the latest committed row, and
-- on MariaDB Galera another node's claim of a selected task can have been applied here
-- since the SELECT (its `SKIP LOCKED` sees this node's locks only), so the rows the
-- UPDATE changed, not those selected, are the claim (`executor::mysql::claim`).
UPDATE task_run
SET status = 'running',
    attempts = attempts + 1,
    lease_owner = ?,
    lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    started_at = UTC_TIMESTAMP(6),
    updated_at = UTC_TIMESTAMP(6),
    run_slot = NULL
WHERE id IN ({{ids, ?}})
    AND status = 'queued';
