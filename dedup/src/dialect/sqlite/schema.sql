-- SQLite: what the library checks of the schema before it relies on it.

-- name: running_index
-- One row when `task_run` has the unique index `task_running_resource_uidx`: whether an
-- optimistic claim can rely on it (`lifecycle::claim_mode`).
SELECT 1 AS present
FROM sqlite_master
WHERE type = 'index'
    AND tbl_name = 'task_run'
    AND name = 'task_running_resource_uidx'
    AND sql LIKE 'CREATE UNIQUE INDEX%';

-- name: guard
-- The table and the unique index as the schema has them (`type`, `sql` of `task_run` and
-- of `task_active_resource_uidx`; `sqlite::guarded` reads them). Read from
-- `sqlite_master`, which is always current: a statement with a targeted `ON CONFLICT`
-- would be checked against the schema a pooled connection cached when it opened.
SELECT type, sql
FROM sqlite_master
WHERE (type = 'table' AND name = 'task_run')
    OR (type = 'index' AND name = 'task_active_resource_uidx' AND tbl_name = 'task_run');

