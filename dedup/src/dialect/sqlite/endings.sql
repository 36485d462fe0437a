-- SQLite: a worker's batch of task endings of one shape: the rows as a `VALUES` list
-- joined to the table by id (`UPDATE ... FROM`, SQLite 3.33+), the worker's id last; each
-- a compare-and-set on `status = 'running'` and the worker's lease. Returns the ids of the
-- rows changed.

-- name: complete
WITH e(id, result) AS (VALUES {{rows, (?, ?)}})
UPDATE task_run
SET status = 'succeeded',
    result = e.result,
    lease_expires_at = NULL,
    finished_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')
FROM e
WHERE task_run.id = e.id
    AND task_run.status = 'running'
    AND task_run.lease_owner = ?
RETURNING id;

-- name: fail
WITH e(id, error) AS (VALUES {{rows, (?, ?)}})
UPDATE task_run
SET status = 'failed',
    error = e.error,
    lease_expires_at = NULL,
    finished_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')
FROM e
WHERE task_run.id = e.id
    AND task_run.status = 'running'
    AND task_run.lease_owner = ?
RETURNING id;

-- name: retry
-- `lease_owner` stays, as in the single `retry`. The delay is a date-function modifier.
WITH e(id, error, delay) AS (VALUES {{rows, (?, ?, ?)}})
UPDATE task_run
SET status = 'queued',
    error = e.error,
    lease_expires_at = NULL,
    run_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', e.delay),
    updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')
FROM e
WHERE task_run.id = e.id
    AND task_run.status = 'running'
    AND task_run.lease_owner = ?
RETURNING id;

