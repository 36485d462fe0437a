-- PostgreSQL: the pruner's batch and pausing a task type.

-- name: prune
-- Deletes a batch of the oldest finished tasks of one status: $1 status, $2 minus the age
-- (an offset from now, in microseconds), $3 how many at most. A period task keeps its
-- window until the window is over, finished or not. The oldest first, through
-- `task_run_retention_idx`, which holds finished tasks only: the literal statuses let the
-- planner use it whatever $1 is (a generic plan cannot prove a partial index's predicate
-- from a parameter). SKIP LOCKED: pruners running at once from several workers take
-- different rows instead of queueing behind each other. `id = ANY(ARRAY(...))`: the batch
-- is chosen once, then one primary-key lookup per row.
DELETE FROM task_run
WHERE id = ANY(ARRAY(
    SELECT id
    FROM task_run
    WHERE status = $1
        AND status IN ('succeeded', 'failed', 'cancelled')
        AND finished_at < statement_timestamp() + $2 * interval '1 microsecond'
        AND dedup_window_end <= extract(epoch FROM statement_timestamp())
    ORDER BY finished_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
));

-- name: pause
-- Pauses a task type unless it is paused (one row affected when it was not): $1 type.
-- Every claim reads `task_dedup_paused`, so no worker keeps state about it.
INSERT INTO task_dedup_paused (task_type, paused_at)
VALUES ($1, statement_timestamp())
ON CONFLICT (task_type)
DO NOTHING;

-- name: resume
DELETE FROM task_dedup_paused
WHERE task_type = $1;

-- name: paused
SELECT task_type, paused_at
FROM task_dedup_paused
ORDER BY task_type;
