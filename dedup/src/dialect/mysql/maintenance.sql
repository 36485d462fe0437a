-- MySQL/MariaDB: the pruner's batch and pausing a task type.

-- name: prune_ids
-- Deletes the batch `prune` locked: the ids. Their row locks are the transaction's, so
-- nothing else changed them in between. The multi-table form only for its index hint: a
-- single-table DELETE takes none, and on a small table the optimizer scans it whole
-- instead of looking the ids up, waiting for (and locking) rows other pruners hold.
DELETE task_run FROM task_run FORCE INDEX (PRIMARY)
WHERE id IN ({{ids, ?}});

-- name: prune
-- Selects and locks a batch of the oldest finished tasks of one status: status, minus the
-- age (microseconds), how many at most. A period task keeps its window until the window is
-- over, finished or not. The oldest first, through `task_run_finished_idx` (whose entries
-- end in the primary key: `finished_at, id` is its order, no filesort). MySQL's DELETE
-- takes no SKIP LOCKED (and cannot read the table it writes in a subquery): this SELECT
-- locks a batch, skipping rows another pruner (or a worker) holds, and `prune_ids` deletes
-- it in the same short transaction (`executor::mysql::prune`). A DELETE with
-- `ORDER BY ... LIMIT` instead waits for every locked row it meets. FORCE INDEX: a locking
-- read locks every row it reads, so a scan and filesort (the optimizer's choice on a small
-- table) would lock the whole table for one batch.
SELECT id
FROM task_run FORCE INDEX (task_run_finished_idx)
WHERE status = ?
    AND finished_at < UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
    AND dedup_window_end <= UNIX_TIMESTAMP()
ORDER BY finished_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED;

-- name: pause
-- `INSERT IGNORE` reports 0 rows for a type already paused (an upsert's count cannot tell,
-- CLIENT_FOUND_ROWS being set). What else it would turn into a warning cannot happen here:
-- the name is validated and the time is the server's.
INSERT IGNORE INTO task_dedup_paused (task_type, paused_at)
VALUES (?, UTC_TIMESTAMP(6));

-- name: resume
DELETE FROM task_dedup_paused
WHERE task_type = ?;

-- name: paused
SELECT task_type, paused_at
FROM task_dedup_paused
ORDER BY task_type;

