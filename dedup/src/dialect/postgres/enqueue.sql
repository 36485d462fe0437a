-- PostgreSQL: enqueue. `ON CONFLICT` against the partial unique index
-- `task_active_resource_uidx`; times from `statement_timestamp()` (`now()` would be the
-- start of the caller's transaction, possibly long ago). Parameters of a new task's row,
-- in this order (`executor::args::row`): $1 id, $2 user_id, $3 task_type,
-- $4 resource_key, $5 payload, $6 created_at, $7 updated_at, $8 run_at, $9 priority,
-- $10 scope, $11 dedup_window_end, $12 concurrent.

-- name: insert
-- The conflict target repeats the index predicate as literals: with bound values
-- PostgreSQL fails with 42P10 once a cached statement switches to a generic plan.
-- `DO NOTHING`, not a caught unique violation: a failed INSERT would abort the caller's
-- transaction. A returned id means inserted.
INSERT INTO task_run ({{insert_columns}})
VALUES ($1, $2, $3, $4, 'queued', $5, 0, $6, $7, $8, $9, $10, $11, $12)
ON CONFLICT (user_id, task_type, resource_key, dedup_window_end)
WHERE {{occupies_key}}
DO NOTHING
RETURNING id;

-- name: insert_or_find
-- A hit in one round trip: the row inserted, or else the task holding the key, read from
-- the statement's snapshot. That snapshot predates a holder that committed while the
-- insert waited for it (the conflict it then yields to), and then no row comes back: the
-- caller reads again with `find_occupant`. The second arm runs only when `ins` is empty
-- (an InitPlan, evaluated once); LIMIT 1 stops after the first row either way.
WITH ins AS (
    INSERT INTO task_run ({{insert_columns}})
    VALUES ($1, $2, $3, $4, 'queued', $5, 0, $6, $7, $8, $9, $10, $11, $12)
    ON CONFLICT (user_id, task_type, resource_key, dedup_window_end)
    WHERE {{occupies_key}}
    DO NOTHING
    RETURNING {{columns}}
)
SELECT {{columns}}
FROM ins
UNION ALL
SELECT {{columns}}
FROM task_run
WHERE user_id = $2
    AND task_type = $3
    AND resource_key = $4
    AND dedup_window_end = $11
    AND {{occupies_key}}
    AND NOT EXISTS (SELECT 1 FROM ins)
LIMIT 1;

-- name: replace
-- `ReplaceIfQueued`: the queued row holding the key takes the new values in the same
-- atomic step; a running or finished one is left alone and nothing comes back.
INSERT INTO task_run ({{insert_columns}})
VALUES ($1, $2, $3, $4, 'queued', $5, 0, $6, $7, $8, $9, $10, $11, $12)
ON CONFLICT (user_id, task_type, resource_key, dedup_window_end)
WHERE {{occupies_key}}
DO UPDATE SET payload = EXCLUDED.payload,
    run_at = EXCLUDED.run_at,
    priority = EXCLUDED.priority,
    updated_at = EXCLUDED.updated_at
WHERE task_run.status = 'queued'
RETURNING {{columns}};

-- name: find_occupant
-- The task holding a key: $1 user_id, $2 task_type, $3 resource_key, $4 dedup_window_end.
-- Also the read right after a conflict: under READ COMMITTED each statement reads a fresh
-- snapshot, so the row `DO NOTHING` yielded to is visible. (Under REPEATABLE READ the
-- insert itself fails with 40001.)
SELECT {{columns}}
FROM task_run
WHERE user_id = $1
    AND task_type = $2
    AND resource_key = $3
    AND dedup_window_end = $4
    AND {{occupies_key}};

-- name: by_id
SELECT {{columns}}
FROM task_run
WHERE id = $1;

-- name: has_insert_or_find
-- Whether the database has the function `PoolerMode::NoPreparedStatements` calls for a
-- hit or a create (migration `m20261203_000009_task_dedup_pooler_function`), in the search
-- path, with its argument types: a changed function comes under a new name.
SELECT to_regprocedure('task_dedup_insert_or_find_v1(uuid, text, text, text, jsonb, timestamptz, timestamptz, timestamptz, int2, text, int8, bool)') IS NOT NULL;

-- name: insert_or_find_call
-- `insert_or_find` in `PoolerMode::NoPreparedStatements`: the function, with the
-- parameters of `insert_or_find` (each written in as a typed literal, which picks the
-- function by its argument types). Its answer is the statement's, except that a holder
-- that committed while the insert waited for it comes back too (the function reads again,
-- in a fresh snapshot); no row: the holder ended meanwhile.
SELECT {{columns}}
FROM task_dedup_insert_or_find_v1($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12);
