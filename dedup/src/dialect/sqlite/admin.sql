-- SQLite: the admin API's statements (`crate::admin`), but its lists, whose clauses
-- `dialect::admin` puts together. Minutes come from `strftime('%s', ...)`, which reads the
-- stored RFC 3339 text.

-- name: now
SELECT strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') AS now;

-- name: retry
-- failed or cancelled → queued, due now, attempts back to 0 (`error` stays: the last
-- failure): id. The unique index refuses it when another task holds the key.
UPDATE task_run
SET status = 'queued',
    attempts = 0,
    lease_owner = NULL,
    lease_expires_at = NULL,
    finished_at = NULL,
    run_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')
WHERE id = ?
    AND status IN ('failed', 'cancelled')
RETURNING {{columns}};

-- name: delete
DELETE FROM task_run
WHERE id = ?
    AND status IN ('succeeded', 'failed', 'cancelled');

-- name: counts
SELECT task_type, status, COUNT(*) AS n
FROM task_run
GROUP BY task_type, status
ORDER BY task_type, status;

-- name: task_types
-- Every task type there is, one index descent per type (a recursive skip over
-- `task_run_type_status_created_idx`), then walks that stop at the limit
-- (`counts_of_type`).
WITH RECURSIVE types(task_type) AS (
    SELECT MIN(task_type)
    FROM task_run
    UNION ALL
    SELECT (
        SELECT r.task_type
        FROM task_run r
        WHERE r.task_type > types.task_type
        ORDER BY r.task_type
        LIMIT 1
    )
    FROM types
    WHERE types.task_type IS NOT NULL
)
SELECT task_type
FROM types
WHERE task_type IS NOT NULL;

-- name: counts_of_type
SELECT 'cancelled' AS status, COUNT(*) AS n
FROM (
    SELECT 1
    FROM task_run
    WHERE task_type = ?1
        AND status = 'cancelled'
    ORDER BY created_at
    LIMIT ?2
) AS c
UNION ALL
SELECT 'failed' AS status, COUNT(*) AS n
FROM (
    SELECT 1
    FROM task_run
    WHERE task_type = ?1
        AND status = 'failed'
    ORDER BY created_at
    LIMIT ?2
) AS c
UNION ALL
SELECT 'queued' AS status, COUNT(*) AS n
FROM (
    SELECT 1
    FROM task_run
    WHERE task_type = ?1
        AND status = 'queued'
    ORDER BY created_at
    LIMIT ?2
) AS c
UNION ALL
SELECT 'running' AS status, COUNT(*) AS n
FROM (
    SELECT 1
    FROM task_run
    WHERE task_type = ?1
        AND status = 'running'
    ORDER BY created_at
    LIMIT ?2
) AS c
UNION ALL
SELECT 'succeeded' AS status, COUNT(*) AS n
FROM (
    SELECT 1
    FROM task_run
    WHERE task_type = ?1
        AND status = 'succeeded'
    ORDER BY created_at
    LIMIT ?2
) AS c;

-- name: throughput
-- The window's start from the clock (the minute 59 minutes ago), compared as text with
-- the stored RFC 3339 values.
SELECT 'created' AS what, CAST(strftime('%s', created_at) AS INTEGER) / 60 AS minute,
    COUNT(*) AS n
FROM task_run
WHERE created_at >= strftime('%Y-%m-%dT%H:%M:00+00:00', 'now', '-59 minutes')
GROUP BY 2
UNION ALL
SELECT status, CAST(strftime('%s', finished_at) AS INTEGER) / 60, COUNT(*)
FROM task_run
WHERE finished_at >= strftime('%Y-%m-%dT%H:%M:00+00:00', 'now', '-59 minutes')
    AND status IN ('succeeded', 'failed')
GROUP BY 1, 2;

-- name: oldest_queued
SELECT task_type, MIN(created_at) AS oldest
FROM task_run
WHERE status = 'queued'
GROUP BY task_type
ORDER BY task_type;

-- name: cancel_many
-- queued or running → cancelled: the reason, then the ids. Counts the rows it changed.
UPDATE task_run
SET status = 'cancelled',
    error = ?,
    lease_expires_at = NULL,
    finished_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')
WHERE id IN ({{ids, ?}})
    AND status IN ('queued', 'running');

-- name: delete_many
DELETE FROM task_run
WHERE id IN ({{ids, ?}})
    AND status IN ('succeeded', 'failed', 'cancelled');
