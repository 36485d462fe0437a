-- PostgreSQL: what the library checks of the schema before it relies on it.

-- name: running_index
-- One row when `task_run` has a valid unique index named `task_running_resource_uidx`:
-- whether an optimistic claim can rely on it (`lifecycle::claim_mode`).
SELECT 1 AS present
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = to_regclass('task_run')
    AND c.relname = 'task_running_resource_uidx'
    AND i.indisunique
    AND i.indisvalid;

-- name: guard
-- Checks the guarantee without writing: planning an insert with the conflict target of
-- `insert` fails (42P10) unless a unique index matches it, predicate included. PostgreSQL
-- infers the arbiter index from the catalog when it plans, so this is exact; EXPLAIN runs
-- nothing.
EXPLAIN INSERT INTO task_run (user_id, task_type, resource_key, dedup_window_end)
SELECT user_id, task_type, resource_key, dedup_window_end
FROM task_run
WHERE false
ON CONFLICT (user_id, task_type, resource_key, dedup_window_end)
WHERE {{occupies_key}}
DO NOTHING;
