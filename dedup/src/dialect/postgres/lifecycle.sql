-- PostgreSQL: a task's transitions after its claim, compare-and-set on its status (and
-- the worker's lease where a worker makes them), each returning the row it changed, and
-- the reaper's. Times from `statement_timestamp()`; a delay or a lease is a number of
-- microseconds.

-- name: heartbeat
-- Extends the lease: $1 lease, $2 id, $3 worker_id.
UPDATE task_run
SET lease_expires_at = statement_timestamp() + $1 * interval '1 microsecond',
    updated_at = statement_timestamp()
WHERE id = $2
    AND status = 'running'
    AND lease_owner = $3
RETURNING {{columns}};

-- name: complete
-- running → succeeded: $1 result, $2 id, $3 worker_id.
UPDATE task_run
SET status = 'succeeded',
    result = $1,
    lease_expires_at = NULL,
    finished_at = statement_timestamp(),
    updated_at = statement_timestamp()
WHERE id = $2
    AND status = 'running'
    AND lease_owner = $3
RETURNING {{columns}};

-- name: fail
-- running → failed: $1 error, $2 id, $3 worker_id.
UPDATE task_run
SET status = 'failed',
    error = $1,
    lease_expires_at = NULL,
    finished_at = statement_timestamp(),
    updated_at = statement_timestamp()
WHERE id = $2
    AND status = 'running'
    AND lease_owner = $3
RETURNING {{columns}};

-- name: retry
-- running → queued after a backoff, the key still held: $1 error, $2 delay, $3 id,
-- $4 worker_id. `lease_owner` stays, so a repeated call by the same worker can tell its
-- own retry.
UPDATE task_run
SET status = 'queued',
    error = $1,
    lease_expires_at = NULL,
    run_at = statement_timestamp() + $2 * interval '1 microsecond',
    updated_at = statement_timestamp()
WHERE id = $3
    AND status = 'running'
    AND lease_owner = $4
RETURNING {{columns}};

-- name: cancel
-- queued or running → cancelled: $1 reason, $2 id.
UPDATE task_run
SET status = 'cancelled',
    error = $1,
    lease_expires_at = NULL,
    finished_at = statement_timestamp(),
    updated_at = statement_timestamp()
WHERE id = $2
    AND status IN ('queued', 'running')
RETURNING {{columns}};

-- name: release
-- running → queued, the attempt not counted (a worker shutting down hands the task
-- back): $1 id, $2 worker_id. `lease_owner` stays, so a repeated call by the same worker
-- can tell its own release.
UPDATE task_run
SET status = 'queued',
    lease_expires_at = NULL,
    attempts = attempts - 1,
    updated_at = statement_timestamp()
WHERE id = $1
    AND status = 'running'
    AND lease_owner = $2
RETURNING {{columns}};

-- name: snooze
-- running → queued after a delay, the attempt not counted and the snooze counted (a
-- handler's "run me again in d"), the key still held: $1 delay, $2 id, $3 worker_id.
-- `lease_owner` stays, as in `release`.
UPDATE task_run
SET status = 'queued',
    lease_expires_at = NULL,
    attempts = attempts - 1,
    snoozes = snoozes + 1,
    run_at = statement_timestamp() + $1 * interval '1 microsecond',
    updated_at = statement_timestamp()
WHERE id = $2
    AND status = 'running'
    AND lease_owner = $3
RETURNING {{columns}};

-- name: expired
-- Running tasks whose lease expired, at most 100.
SELECT id, attempts
FROM task_run
WHERE status = 'running'
    AND lease_expires_at < statement_timestamp()
ORDER BY lease_expires_at
LIMIT 100;

-- name: reap_fail
-- An expired task → failed: $1 error, $2 id. The expiry is checked again: a heartbeat
-- that renewed the lease first wins.
UPDATE task_run
SET status = 'failed',
    error = $1,
    lease_expires_at = NULL,
    finished_at = statement_timestamp(),
    updated_at = statement_timestamp()
WHERE id = $2
    AND status = 'running'
    AND lease_expires_at < statement_timestamp();

-- name: reap_requeue
-- An expired task → queued after a backoff, lease cleared: $1 delay, $2 id; unless its
-- lease was renewed meanwhile.
UPDATE task_run
SET status = 'queued',
    lease_owner = NULL,
    lease_expires_at = NULL,
    run_at = statement_timestamp() + $1 * interval '1 microsecond',
    updated_at = statement_timestamp()
WHERE id = $2
    AND status = 'running'
    AND lease_expires_at < statement_timestamp();

