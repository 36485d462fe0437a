-- The statements two or more dialects run word for word, read by each of them as from its
-- own files (a dialect whose text must differ has its own in its folder, and the others'
-- stay here). Each says which dialects run it.

-- name: fair_users
-- SQLite, MySQL/MariaDB (PostgreSQL's numbers its parameters). A fair claim's walk over
-- the users with queued tasks of one type, from the one after a cursor: the type, the
-- cursor, the type again, how many users at most. One index lookup per user:
-- `task_run_user_queue_idx` serves each step's `min` and the heads' order.
WITH RECURSIVE walk (user_id, n) AS (
    SELECT (
        SELECT min(user_id)
        FROM task_run
        WHERE task_type = ?
            AND status = 'queued'
            AND user_id > ?
    ), 1
    UNION ALL
    SELECT (
        SELECT min(t.user_id)
        FROM task_run t
        WHERE t.task_type = ?
            AND t.status = 'queued'
            AND t.user_id > walk.user_id
    ), walk.n + 1
    FROM walk
    WHERE walk.user_id IS NOT NULL
        AND walk.n < ?
)
SELECT user_id
FROM walk
WHERE user_id IS NOT NULL;
