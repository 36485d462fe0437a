-- PostgreSQL: a worker's batch of task endings of one shape. The rows from one array per
-- column (the texts do not depend on the number of rows), the worker's id last; each a
-- compare-and-set on `status = 'running'` and the worker's lease, as the single
-- transitions are. Returns the ids of the rows changed.

-- name: complete
-- A task ended without a result has `has_result` false: an array of SeaORM values cannot
-- hold NULL elements.
UPDATE task_run AS t
SET status = 'succeeded',
    result = CASE WHEN e.has_result THEN e.result END,
    lease_expires_at = NULL,
    finished_at = statement_timestamp(),
    updated_at = statement_timestamp()
FROM unnest($1::uuid[], $2::jsonb[], $3::bool[]) AS e(id, result, has_result)
WHERE t.id = e.id
    AND t.status = 'running'
    AND t.lease_owner = $4
RETURNING t.id;

-- name: fail
UPDATE task_run AS t
SET status = 'failed',
    error = e.error,
    lease_expires_at = NULL,
    finished_at = statement_timestamp(),
    updated_at = statement_timestamp()
FROM unnest($1::uuid[], $2::text[]) AS e(id, error)
WHERE t.id = e.id
    AND t.status = 'running'
    AND t.lease_owner = $3
RETURNING t.id;

-- name: retry
-- `lease_owner` stays, as in the single `retry`. A row whose key a queued follow-up took
-- fails the whole statement with a held-key error: the caller records those one by one.
UPDATE task_run AS t
SET status = 'queued',
    error = e.error,
    lease_expires_at = NULL,
    run_at = statement_timestamp() + e.delay * interval '1 microsecond',
    updated_at = statement_timestamp()
FROM unnest($1::uuid[], $2::text[], $3::int8[]) AS e(id, error, delay)
WHERE t.id = e.id
    AND t.status = 'running'
    AND t.lease_owner = $4
RETURNING t.id;
