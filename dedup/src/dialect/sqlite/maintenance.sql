-- SQLite: the pruner's batch and pausing a task type.

-- name: prune
-- Deletes a batch of the oldest finished tasks of one status: status, minus the age (a
-- date-function modifier), how many at most. A period task keeps its window until the
-- window is over, finished or not. The oldest first, through `task_run_finished_idx`. No
-- row locks to skip: the statement runs under the database's write lock.
DELETE FROM task_run
WHERE id IN (
    SELECT id
    FROM task_run
    WHERE status = ?
        AND finished_at < strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', ?)
        AND dedup_window_end <= CAST(strftime('%s', 'now') AS INTEGER)
    ORDER BY finished_at
    LIMIT ?
);

-- name: pause
-- Pauses a task type unless it is paused (one row affected when it was not).
INSERT INTO task_dedup_paused (task_type, paused_at)
VALUES (?, strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'))
ON CONFLICT
DO NOTHING;

-- name: resume
DELETE FROM task_dedup_paused
WHERE task_type = ?;

-- name: paused
SELECT task_type, paused_at
FROM task_dedup_paused
ORDER BY task_type;

