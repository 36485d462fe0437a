-- PostgreSQL: the admin API's statements (`crate::admin`), but its lists, whose clauses
-- `dialect::admin` puts together.

-- name: now
-- The database's clock.
SELECT statement_timestamp() AS now;

-- name: retry
-- failed or cancelled → queued, due now, attempts back to 0, the lease, the lease's expiry
-- and `finished_at` cleared (`error` stays: the last failure): $1 id. The unique index
-- refuses it when another task holds the key.
UPDATE task_run
SET status = 'queued',
    attempts = 0,
    lease_owner = NULL,
    lease_expires_at = NULL,
    finished_at = NULL,
    run_at = statement_timestamp(),
    updated_at = statement_timestamp()
WHERE id = $1
    AND status IN ('failed', 'cancelled')
RETURNING {{columns}};

-- name: delete
DELETE FROM task_run
WHERE id = $1
    AND status IN ('succeeded', 'failed', 'cancelled');

-- name: counts
SELECT task_type, status, COUNT(*) AS n
FROM task_run
GROUP BY task_type, status
ORDER BY task_type, status;

-- name: counts_of_type
-- The tasks of one type per status ($1), each count stopping at a limit ($2). The queued
-- and finished arms each a walk of `task_run_type_status_idx` that stops at the limit: the
-- `ORDER BY` is the index's, so that the planner does not read every entry of a status in
-- a bitmap scan, or filter a sequential scan (both seen on a table not vacuumed since it
-- was filled); the running arm reads the type's running tasks from
-- `task_running_resource_uidx` (as many as run) and sorts them. One statement per type,
-- not one for all: a statement over every type costs its subplans by the recursive CTE's
-- guess of 100 types, and past `jit_above_cost` PostgreSQL compiled it for seconds (12 s
-- on 1,000,000 tasks before a VACUUM).
SELECT 'cancelled' AS status, COUNT(*) AS n
FROM (
    SELECT 1
    FROM task_run
    WHERE task_type = $1
        AND status = 'cancelled'
    ORDER BY created_at
    LIMIT $2
) AS c
UNION ALL
SELECT 'failed' AS status, COUNT(*) AS n
FROM (
    SELECT 1
    FROM task_run
    WHERE task_type = $1
        AND status = 'failed'
    ORDER BY created_at
    LIMIT $2
) AS c
UNION ALL
SELECT 'queued' AS status, COUNT(*) AS n
FROM (
    SELECT 1
    FROM task_run
    WHERE task_type = $1
        AND status = 'queued'
    ORDER BY created_at
    LIMIT $2
) AS c
UNION ALL
SELECT 'running' AS status, COUNT(*) AS n
FROM (
    SELECT 1
    FROM task_run
    WHERE task_type = $1
        AND status = 'running'
    ORDER BY created_at
    LIMIT $2
) AS c
UNION ALL
SELECT 'succeeded' AS status, COUNT(*) AS n
FROM (
    SELECT 1
    FROM task_run
    WHERE task_type = $1
        AND status = 'succeeded'
    ORDER BY created_at
    LIMIT $2
) AS c;

-- name: task_types
-- Every task type there is: those of the tasks not running, one descent of
-- `task_run_type_status_idx` each (a recursive skip), and those of the running tasks
-- (`task_running_resource_uidx`; as many rows as tasks run). No index covers every row
-- (migration 13).
WITH RECURSIVE types(task_type) AS (
    SELECT MIN(task_type)
    FROM task_run
    WHERE status <> 'running'
    UNION ALL
    SELECT (
        SELECT r.task_type
        FROM task_run r
        WHERE r.task_type > types.task_type
            AND r.status <> 'running'
        ORDER BY r.task_type
        LIMIT 1
    )
    FROM types
    WHERE types.task_type IS NOT NULL
)
SELECT task_type
FROM types
WHERE task_type IS NOT NULL
UNION
SELECT task_type
FROM task_run
WHERE status = 'running'
ORDER BY task_type;

-- name: throughput
-- Tasks created, succeeded and failed per minute over the current minute and the 59
-- before it. No index covers every row by creation (migration 13): the creations are
-- counted per type and status from `task_run_type_status_idx` (one range each; `OFFSET 0`
-- keeps the lateral subquery a loop over the types, which the planner otherwise made a
-- hash join over a scan of the whole table, 230 ms on 1,000,000 tasks), and those
-- of the running tasks from `task_running_resource_uidx`; the endings from
-- `task_run_retention_idx`. The window's start comes from the clock here, not from a
-- parameter: a generic plan of `created_at >= $1` assumed a third of the table and scanned
-- all of it (280 ms on 1,000,000 tasks).
WITH RECURSIVE types(task_type) AS (
    SELECT MIN(task_type)
    FROM task_run
    WHERE status <> 'running'
    UNION ALL
    SELECT (
        SELECT r.task_type
        FROM task_run r
        WHERE r.task_type > types.task_type
            AND r.status <> 'running'
        ORDER BY r.task_type
        LIMIT 1
    )
    FROM types
    WHERE types.task_type IS NOT NULL
),
created(created_at) AS (
    SELECT c.created_at
    FROM types
    CROSS JOIN LATERAL (
        SELECT created_at
        FROM task_run
        WHERE task_type = types.task_type
            AND status IN ('queued', 'succeeded', 'failed', 'cancelled')
            AND created_at >= date_trunc('minute', statement_timestamp()) - interval '59 minutes'
        OFFSET 0
    ) AS c
    WHERE types.task_type IS NOT NULL
    UNION ALL
    SELECT created_at
    FROM task_run
    WHERE status = 'running'
        AND created_at >= date_trunc('minute', statement_timestamp()) - interval '59 minutes'
)
SELECT 'created' AS what, floor(extract(epoch FROM created_at) / 60)::int8 AS minute,
    COUNT(*) AS n
FROM created
GROUP BY 2
UNION ALL
SELECT status, floor(extract(epoch FROM finished_at) / 60)::int8, COUNT(*)
FROM task_run
WHERE finished_at >= date_trunc('minute', statement_timestamp()) - interval '59 minutes'
    AND status IN ('succeeded', 'failed')
GROUP BY 1, 2;

-- name: oldest_queued
-- The oldest queued task of each type. PostgreSQL has no loose index scan:
-- `MIN(created_at) ... GROUP BY task_type` read every queued task (316 ms for 50,000 of
-- 1,000,000). Spelled out instead: the types of the tasks not running, one index descent
-- each (a recursive skip over `task_run_type_status_idx`), then one descent per type for
-- its oldest queued task (5 ms; BENCHMARKS.md).
WITH RECURSIVE types(task_type) AS (
    SELECT MIN(task_type)
    FROM task_run
    WHERE status <> 'running'
    UNION ALL
    SELECT (
        SELECT r.task_type
        FROM task_run r
        WHERE r.task_type > types.task_type
            AND r.status <> 'running'
        ORDER BY r.task_type
        LIMIT 1
    )
    FROM types
    WHERE types.task_type IS NOT NULL
)
SELECT task_type, oldest
FROM (
    SELECT task_type,
        (
            SELECT q.created_at
            FROM task_run q
            WHERE q.task_type = types.task_type
                AND q.status = 'queued'
            ORDER BY q.created_at
            LIMIT 1
        ) AS oldest
    FROM types
    WHERE task_type IS NOT NULL
) AS o
WHERE oldest IS NOT NULL
ORDER BY task_type;

-- name: cancel_many
-- queued or running → cancelled: $1 the reason, $2 the ids (one array: the text does not
-- depend on their number). Counts the rows it changed.
UPDATE task_run
SET status = 'cancelled',
    error = $1,
    lease_expires_at = NULL,
    finished_at = statement_timestamp(),
    updated_at = statement_timestamp()
WHERE id = ANY($2)
    AND status IN ('queued', 'running');

-- name: delete_many
DELETE FROM task_run
WHERE id = ANY($1)
    AND status IN ('succeeded', 'failed', 'cancelled');

-- name: without_jit
-- The admin API's reads on a pool run in a transaction of their own that starts with
-- this. Their plans walk indexes and stop after a page, but a plan's cost counts what it
-- could read (each arm of a list estimated at a tenth of its rows when the page's size
-- or a key pattern is a parameter): past `jit_above_cost` PostgreSQL spent 0.4 to 1.7 s
-- compiling a list that then ran in 2 ms (1,000,000 tasks, generic plans).
SET LOCAL jit = off;
