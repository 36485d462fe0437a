-- The statements two or more dialects run word for word, read by each of them as from its
-- own files (a dialect whose text must differ has its own in its folder, and the others'
-- stay here). Each says which dialects run it.

-- name: task_types
-- PostgreSQL, SQLite. Every task type there is, one index descent per type (a recursive
-- skip over `task_run_type_status_created_idx`). MySQL/MariaDB reads the same with a loose
-- index scan of its own.
WITH RECURSIVE types(task_type) AS (
    SELECT MIN(task_type)
    FROM task_run
    UNION ALL
    SELECT (
        SELECT r.task_type
        FROM task_run r
        WHERE r.task_type > types.task_type
        ORDER BY r.task_type
        LIMIT 1
    )
    FROM types
    WHERE types.task_type IS NOT NULL
)
SELECT task_type
FROM types
WHERE task_type IS NOT NULL;

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
