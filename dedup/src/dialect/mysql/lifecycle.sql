-- MySQL/MariaDB: a task's transitions after its claim, compare-and-set on its status (and
-- the worker's lease where a worker makes them), and the reaper's. No `RETURNING`: the row
-- is read by id in the same transaction (`executor::mysql::transition`). A lease or a delay
-- is a number of microseconds.

-- name: heartbeat
-- Extends the lease: lease, id, worker_id.
UPDATE task_run
SET lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, updated_at = UTC_TIMESTAMP(6)
WHERE id = ?
    AND status = 'running'
    AND lease_owner = ?;

-- name: complete
-- running → succeeded: result, id, worker_id.
UPDATE task_run
SET status = 'succeeded',
    result = ?,
    lease_expires_at = NULL,
    finished_at = UTC_TIMESTAMP(6),
    updated_at = UTC_TIMESTAMP(6)
WHERE id = ?
    AND status = 'running'
    AND lease_owner = ?;

-- name: fail
-- running → failed: error, id, worker_id.
UPDATE task_run
SET status = 'failed',
    error = ?,
    lease_expires_at = NULL,
    finished_at = UTC_TIMESTAMP(6),
    updated_at = UTC_TIMESTAMP(6)
WHERE id = ?
    AND status = 'running'
    AND lease_owner = ?;

-- name: retry
-- running → queued after a backoff, the key still held: error, delay, id, worker_id.
-- `lease_owner` stays, so a repeated call by the same worker can tell its own retry.
UPDATE task_run
SET status = 'queued',
    error = ?,
    lease_expires_at = NULL,
    run_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    updated_at = UTC_TIMESTAMP(6)
WHERE id = ?
    AND status = 'running'
    AND lease_owner = ?;

-- name: cancel
-- queued or running → cancelled: reason, id.
UPDATE task_run
SET status = 'cancelled',
    error = ?,
    lease_expires_at = NULL,
    finished_at = UTC_TIMESTAMP(6),
    updated_at = UTC_TIMESTAMP(6)
WHERE id = ?
    AND status IN ('queued', 'running');

-- name: release
-- running → queued, the attempt not counted: id, worker_id. `lease_owner` stays, so a
-- repeated call by the same worker can tell its own release.
UPDATE task_run
SET status = 'queued',
    lease_expires_at = NULL,
    attempts = attempts - 1,
    updated_at = UTC_TIMESTAMP(6)
WHERE id = ?
    AND status = 'running'
    AND lease_owner = ?;

-- name: snooze
-- running → queued after a delay, the attempt not counted and the snooze counted: delay,
-- id, worker_id. `lease_owner` stays, as in `release`.
UPDATE task_run
SET status = 'queued',
    lease_expires_at = NULL,
    attempts = attempts - 1,
    snoozes = snoozes + 1,
    run_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    updated_at = UTC_TIMESTAMP(6)
WHERE id = ?
    AND status = 'running'
    AND lease_owner = ?;

-- name: expired
-- Running tasks whose lease expired, at most 100.
SELECT id, attempts
FROM task_run
WHERE status = 'running'
    AND lease_expires_at < UTC_TIMESTAMP(6)
ORDER BY lease_expires_at
LIMIT 100;

-- name: reap_fail
-- An expired task → failed: error, id. The expiry is checked again: a heartbeat that
-- renewed the lease first wins.
UPDATE task_run
SET status = 'failed',
    error = ?,
    lease_expires_at = NULL,
    finished_at = UTC_TIMESTAMP(6),
    updated_at = UTC_TIMESTAMP(6)
WHERE id = ?
    AND status = 'running'
    AND lease_expires_at < UTC_TIMESTAMP(6);

-- name: reap_requeue
-- An expired task → queued after a backoff, lease cleared: delay, id.
UPDATE task_run
SET status = 'queued',
    lease_owner = NULL,
    lease_expires_at = NULL,
    run_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    updated_at = UTC_TIMESTAMP(6)
WHERE id = ?
    AND status = 'running'
    AND lease_expires_at < UTC_TIMESTAMP(6);

