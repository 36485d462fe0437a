-- MySQL/MariaDB: a worker's batch of task endings of one shape: per-row values picked by
-- `CASE id WHEN ? THEN ? ... END` over `id IN (...)` (one primary-key lookup each), the
-- worker's id last: a form MySQL 8 and MariaDB both take (MariaDB has no `VALUES` table
-- constructor MySQL takes, nor `UPDATE ... RETURNING`). Each a compare-and-set on
-- `status = 'running'` and the worker's lease. The count of rows matched tells whether
-- all of them changed (sqlx sets CLIENT_FOUND_ROWS); when it falls short, `ended_by` reads
-- which did (`executor::mysql::end_many`).

-- name: complete
UPDATE task_run
SET status = 'succeeded',
    result = CASE id {{rows WHEN ? THEN ?}} END,
    lease_expires_at = NULL,
    finished_at = UTC_TIMESTAMP(6),
    updated_at = UTC_TIMESTAMP(6)
WHERE id IN ({{rows, ?}})
    AND status = 'running'
    AND lease_owner = ?;

-- name: fail
UPDATE task_run
SET status = 'failed',
    error = CASE id {{rows WHEN ? THEN ?}} END,
    lease_expires_at = NULL,
    finished_at = UTC_TIMESTAMP(6),
    updated_at = UTC_TIMESTAMP(6)
WHERE id IN ({{rows, ?}})
    AND status = 'running'
    AND lease_owner = ?;

-- name: retry
-- `lease_owner` stays, as in the single `retry`.
UPDATE task_run
SET status = 'queued',
    error = CASE id {{rows WHEN ? THEN ?}} END,
    lease_expires_at = NULL,
    run_at = UTC_TIMESTAMP(6) + INTERVAL (CASE id {{rows WHEN ? THEN ?}} END) MICROSECOND,
    updated_at = UTC_TIMESTAMP(6)
WHERE id IN ({{rows, ?}})
    AND status = 'running'
    AND lease_owner = ?;

-- name: ended_by
-- Which of the given ids are in a status under a lease owner, after a batch ending changed
-- fewer rows than it was given: the ids, the status, the worker's id. Read in the ending's
-- transaction, whose row locks keep the rows it changed as it left them.
SELECT id
FROM task_run
WHERE id IN ({{rows, ?}})
    AND status = ?
    AND lease_owner = ?;

