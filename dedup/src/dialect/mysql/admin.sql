-- MySQL/MariaDB: the admin API's statements (`crate::admin`), but its lists, whose clauses
-- `dialect::admin` puts together. Minutes are counted from the epoch with
-- `TIMESTAMPDIFF`, not `UNIX_TIMESTAMP`, which would read the UTC `datetime(6)` values in
-- the session's time zone.

-- name: now
SELECT UTC_TIMESTAMP(6) AS now;

-- name: retry
-- failed or cancelled → queued, due now, attempts back to 0 (`error` stays: the last
-- failure): id. No RETURNING: the row is read by id in the same transaction.
UPDATE task_run
SET status = 'queued',
    attempts = 0,
    lease_owner = NULL,
    lease_expires_at = NULL,
    finished_at = NULL,
    run_at = UTC_TIMESTAMP(6),
    updated_at = UTC_TIMESTAMP(6)
WHERE id = ?
    AND status IN ('failed', 'cancelled');

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
-- A loose index scan of `task_run_type_status_created_idx`: one entry per type.
SELECT DISTINCT task_type
FROM task_run
ORDER BY task_type;

-- name: counts_of_type
-- Positional parameters: the type and the limit, once per arm.
SELECT 'cancelled' AS status, COUNT(*) AS n
FROM (
    SELECT 1
    FROM task_run
    WHERE task_type = ?
        AND status = 'cancelled'
    ORDER BY created_at
    LIMIT ?
) AS c
UNION ALL
SELECT 'failed' AS status, COUNT(*) AS n
FROM (
    SELECT 1
    FROM task_run
    WHERE task_type = ?
        AND status = 'failed'
    ORDER BY created_at
    LIMIT ?
) AS c
UNION ALL
SELECT 'queued' AS status, COUNT(*) AS n
FROM (
    SELECT 1
    FROM task_run
    WHERE task_type = ?
        AND status = 'queued'
    ORDER BY created_at
    LIMIT ?
) AS c
UNION ALL
SELECT 'running' AS status, COUNT(*) AS n
FROM (
    SELECT 1
    FROM task_run
    WHERE task_type = ?
        AND status = 'running'
    ORDER BY created_at
    LIMIT ?
) AS c
UNION ALL
SELECT 'succeeded' AS status, COUNT(*) AS n
FROM (
    SELECT 1
    FROM task_run
    WHERE task_type = ?
        AND status = 'succeeded'
    ORDER BY created_at
    LIMIT ?
) AS c;

-- name: throughput
-- The window's start from the clock: the minute 59 minutes ago.
SELECT 'created' AS what, TIMESTAMPDIFF(MINUTE, '1970-01-01 00:00:00', created_at) AS minute,
    COUNT(*) AS n
FROM task_run
WHERE created_at >= DATE_FORMAT(UTC_TIMESTAMP(), '%Y-%m-%d %H:%i:00') - INTERVAL 59 MINUTE
GROUP BY 2
UNION ALL
SELECT status, TIMESTAMPDIFF(MINUTE, '1970-01-01 00:00:00', finished_at), COUNT(*)
FROM task_run
WHERE finished_at >= DATE_FORMAT(UTC_TIMESTAMP(), '%Y-%m-%d %H:%i:00') - INTERVAL 59 MINUTE
    AND status IN ('succeeded', 'failed')
GROUP BY 1, 2;

-- name: oldest_queued
-- MariaDB reads this with a loose index scan of `task_run_type_status_created_idx` ("Using
-- index for group-by"): one entry per type.
SELECT task_type, MIN(created_at) AS oldest
FROM task_run
WHERE status = 'queued'
GROUP BY task_type
ORDER BY task_type;

-- name: cancel_many
-- Counts the rows matched (sqlx sets CLIENT_FOUND_ROWS): with the status in the
-- condition, those are the rows changed.
UPDATE task_run
SET status = 'cancelled',
    error = ?,
    lease_expires_at = NULL,
    finished_at = UTC_TIMESTAMP(6),
    updated_at = UTC_TIMESTAMP(6)
WHERE id IN ({{ids, ?}})
    AND status IN ('queued', 'running');

-- name: delete_many
DELETE FROM task_run
WHERE id IN ({{ids, ?}})
    AND status IN ('succeeded', 'failed', 'cancelled');

