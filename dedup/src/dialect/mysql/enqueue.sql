-- MySQL/MariaDB: enqueue. A plain INSERT against the unique index over the generated
-- `occupied` column (1 while the row holds its key, NULL otherwise: MariaDB and MySQL
-- have no partial indexes). No `RETURNING` (MariaDB has one, MySQL 8 does not): a write
-- and the read of its row run in one short transaction (`executor::mysql`). No statement
-- inserts and returns the holder at once: MySQL 8 has no RETURNING; MariaDB has no INSERT
-- inside WITH, and its `ON DUPLICATE KEY UPDATE ... RETURNING` returns the holder only by
-- writing it (an exclusive lock per hit; BENCHMARKS.md). Times are `UTC_TIMESTAMP(6)`:
-- `datetime(6)` columns hold UTC whatever the session's time zone.

-- name: insert
-- A plain INSERT, and the duplicate-key error on our index means "held". Not
-- `INSERT IGNORE` (it also turns other errors into warnings) nor `ON DUPLICATE KEY UPDATE`
-- (a write on the hit path, and with CLIENT_FOUND_ROWS the affected-row count cannot tell
-- a no-op from an insert). A failed statement does not abort an InnoDB transaction.
INSERT INTO task_run ({{insert_columns}})
VALUES (?, ?, ?, ?, 'queued', ?, 0, ?, ?, ?, ?, ?, ?, ?);

-- name: replace
-- `ReplaceIfQueued`, run after the INSERT's duplicate-key error: payload, run_at,
-- priority, updated_at, then the key and window. Only a queued task is updated.
UPDATE task_run
SET payload = ?,
    run_at = ?,
    priority = ?,
    updated_at = ?
WHERE user_id = ?
    AND task_type = ?
    AND resource_key = ?
    AND dedup_window_end = ?
    AND occupied = 1
    AND status = 'queued';

-- name: find_occupant
-- The task holding a key: user_id, task_type, resource_key, dedup_window_end.
SELECT {{columns}}
FROM task_run
WHERE user_id = ?
    AND task_type = ?
    AND resource_key = ?
    AND dedup_window_end = ?
    AND occupied = 1;

-- name: find_occupant_after_conflict
-- The same right after a conflict: a locking read returns the latest committed row even
-- inside a REPEATABLE READ transaction whose snapshot predates it. The failed insert
-- already holds a shared lock on that index entry, so this takes no lock the caller did
-- not have.
SELECT {{columns}}
FROM task_run
WHERE user_id = ?
    AND task_type = ?
    AND resource_key = ?
    AND dedup_window_end = ?
    AND occupied = 1
LOCK IN SHARE MODE;

-- name: by_id
SELECT {{columns}}
FROM task_run
WHERE id = ?;

