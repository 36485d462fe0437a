-- MySQL/MariaDB: `find_or_enqueue_many`'s statements for a chunk of tasks: one multi-row
-- statement per chunk, with the values of the single insert per row (2,000 rows stay
-- within MySQL's 65,535 placeholders).

-- name: insert
-- Inserts the rows; `ON DUPLICATE KEY UPDATE id = id` skips a row whose key is held without
-- silencing any other error (unlike `INSERT IGNORE`); which rows went in is read back by
-- id (`ids_in`).
INSERT INTO task_run ({{insert_columns}})
VALUES {{rows, (?, ?, ?, ?, 'queued', ?, 0, ?, ?, ?, ?, ?, ?, ?)}}
ON DUPLICATE KEY UPDATE id = id;

-- name: replace
-- The same, replacing the payload, run_at and priority of a queued task holding the key
-- (`ReplaceIfQueued`): `status` is the held row's, so only a queued one takes the new
-- values. (`VALUES()`: MariaDB has no row alias for the new row.)
INSERT INTO task_run ({{insert_columns}})
VALUES {{rows, (?, ?, ?, ?, 'queued', ?, 0, ?, ?, ?, ?, ?, ?, ?)}}
ON DUPLICATE KEY UPDATE payload = IF(status = 'queued', VALUES(payload), payload),
    run_at = IF(status = 'queued', VALUES(run_at), run_at),
    priority = IF(status = 'queued', VALUES(priority), priority),
    updated_at = IF(status = 'queued', VALUES(updated_at), updated_at);

-- name: find_occupants
-- The tasks holding the given keys and windows, in the caller's transaction. A locking
-- read, as after a single conflict: it sees rows committed after the caller's REPEATABLE
-- READ snapshot.
SELECT {{columns}}
FROM task_run
WHERE (user_id, task_type, resource_key, dedup_window_end) IN ({{keys, (?, ?, ?, ?)}})
    AND occupied = 1
LOCK IN SHARE MODE;

-- name: find_occupants_after_own_insert
-- The same, in a transaction of the crate's own whose first read comes after its insert:
-- the snapshot already holds every row the insert conflicted with, and the insert's locks
-- keep them as they are. A plain read, because a locking read of a thousand keys waits on
-- rows other batches are inserting, and they on its locks (a deadlock in one storm out of
-- five of 16 overlapping batches).
SELECT {{columns}}
FROM task_run
WHERE (user_id, task_type, resource_key, dedup_window_end) IN ({{keys, (?, ?, ?, ?)}})
    AND occupied = 1;

-- name: by_ids
SELECT {{columns}}
FROM task_run
WHERE id IN ({{ids, ?}});

-- name: ids_in
-- Which of the given ids exist: which rows a bulk insert put in (no `RETURNING`).
SELECT id
FROM task_run
WHERE id IN ({{ids, ?}});

