-- SQLite: a task's transitions after its claim, compare-and-set on its status (and the
-- worker's lease where a worker makes them), each returning the row it changed, and the
-- reaper's. A lease or a delay is a date-function modifier such as `+30.000000 seconds`
-- (`sqlite::seconds_modifier`).

-- name: heartbeat
-- Extends the lease: lease, id, worker_id.
UPDATE task_run
SET lease_expires_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')
WHERE id = ?
    AND status = 'running'
    AND lease_owner = ?
RETURNING {{columns}};

-- name: complete
-- running → succeeded: result, id, worker_id.
UPDATE task_run
SET status = 'succeeded',
    result = ?,
    lease_expires_at = NULL,
    finished_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')
WHERE id = ?
    AND status = 'running'
    AND lease_owner = ?
RETURNING {{columns}};

-- name: fail
-- running → failed: error, id, worker_id.
UPDATE task_run
SET status = 'failed',
    error = ?,
    lease_expires_at = NULL,
    finished_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')
WHERE id = ?
    AND status = 'running'
    AND lease_owner = ?
RETURNING {{columns}};

-- name: retry
-- running → queued after a backoff, the key still held: error, delay, id, worker_id.
-- `lease_owner` stays, so a repeated call by the same worker can tell its own retry.
UPDATE task_run
SET status = 'queued',
    error = ?,
    lease_expires_at = NULL,
    run_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')
WHERE id = ?
    AND status = 'running'
    AND lease_owner = ?
RETURNING {{columns}};

-- name: cancel
-- queued or running → cancelled: reason, id.
UPDATE task_run
SET status = 'cancelled',
    error = ?,
    lease_expires_at = NULL,
    finished_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')
WHERE id = ?
    AND status IN ('queued', 'running')
RETURNING {{columns}};

-- name: release
-- running → queued, the attempt not counted: id, worker_id. `lease_owner` stays, so a
-- repeated call by the same worker can tell its own release.
UPDATE task_run
SET status = 'queued',
    lease_expires_at = NULL,
    attempts = attempts - 1,
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')
WHERE id = ?
    AND status = 'running'
    AND lease_owner = ?
RETURNING {{columns}};

-- name: snooze
-- running → queued after a delay, the attempt not counted and the snooze counted: delay,
-- id, worker_id. `lease_owner` stays, as in `release`.
UPDATE task_run
SET status = 'queued',
    lease_expires_at = NULL,
    attempts = attempts - 1,
    snoozes = snoozes + 1,
    run_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')
WHERE id = ?
    AND status = 'running'
    AND lease_owner = ?
RETURNING {{columns}};

-- name: expired
-- Running tasks whose lease expired, at most 100.
SELECT id, attempts
FROM task_run
WHERE status = 'running'
    AND lease_expires_at < strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')
ORDER BY lease_expires_at
LIMIT 100;

-- name: reap_fail
-- An expired task → failed: error, id. The expiry is checked again: a heartbeat that
-- renewed the lease first wins.
UPDATE task_run
SET status = 'failed',
    error = ?,
    lease_expires_at = NULL,
    finished_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')
WHERE id = ?
    AND status = 'running'
    AND lease_expires_at < strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now');

-- name: reap_requeue
-- An expired task → queued after a backoff, lease cleared: delay, id.
UPDATE task_run
SET status = 'queued',
    lease_owner = NULL,
    lease_expires_at = NULL,
    run_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')
WHERE id = ?
    AND status = 'running'
    AND lease_expires_at < strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now');

