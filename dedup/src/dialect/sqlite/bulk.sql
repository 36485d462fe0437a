-- SQLite: `find_or_enqueue_many`'s statements for a chunk of tasks: one multi-row
-- statement per chunk, with the values of the single insert per row (2,000 rows stay
-- within SQLite's 32,766 placeholders).

-- name: insert
-- Inserts the rows, skipping those whose key is held; returns the ids that went in.
INSERT INTO task_run ({{insert_columns}})
VALUES {{rows, (?, ?, ?, ?, 'queued', ?, 0, ?, ?, ?, ?, ?, ?, ?)}}
ON CONFLICT
DO NOTHING
RETURNING id;

-- name: replace
-- The same, replacing the payload, run_at and priority of a queued task holding the key
-- (`ReplaceIfQueued`); returns the rows inserted or updated.
INSERT INTO task_run ({{insert_columns}})
VALUES {{rows, (?, ?, ?, ?, 'queued', ?, 0, ?, ?, ?, ?, ?, ?, ?)}}
ON CONFLICT
DO UPDATE SET payload = excluded.payload,
    run_at = excluded.run_at,
    priority = excluded.priority,
    updated_at = excluded.updated_at
WHERE status = 'queued'
RETURNING {{columns}};

-- name: find_occupants
-- The tasks holding the given keys and windows: a join, so that each key is looked up in
-- the unique index. The same read after the crate's own insert: no locks to avoid.
WITH k(k_user_id, k_task_type, k_resource_key, k_window_end) AS (
    VALUES {{keys, (?, ?, ?, ?)}}
)
SELECT {{columns}}
FROM k
JOIN task_run ON user_id = k_user_id
    AND task_type = k_task_type
    AND resource_key = k_resource_key
    AND dedup_window_end = k_window_end
WHERE {{occupies_key}};

-- name: by_ids
SELECT {{columns}}
FROM task_run
WHERE id IN ({{ids, ?}});

