-- SQLite: enqueue. `ON CONFLICT` against the partial unique index
-- `task_active_resource_uidx`, `RETURNING`. Timestamps are RFC 3339 text in UTC, the shape
-- sqlx writes for `DateTime<Utc>`, so values the database writes
-- (`strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')`, millisecond resolution) and values the
-- library writes compare correctly as text. No statement inserts and returns the holder at
-- once (no INSERT inside WITH, and a DO NOTHING upsert returns nothing on a conflict): in
-- process, the read after a conflict costs no round trip either (BENCHMARKS.md). A new
-- task's values, in order: id, user_id, task_type, resource_key, payload, created_at,
-- updated_at, run_at, priority, scope, dedup_window_end, concurrent.

-- name: insert
-- No conflict target: it covers the partial unique index (and the primary key) and,
-- unlike a targeted clause, is not matched against the schema when the statement is
-- prepared. A pooled connection opened before the index existed keeps the old schema in
-- memory, and a targeted clause fails there ("ON CONFLICT clause does not match any
-- PRIMARY KEY or UNIQUE constraint") instead of being re-prepared. NOT NULL and CHECK
-- violations still fail, unlike with `INSERT OR IGNORE`.
INSERT INTO task_run ({{insert_columns}})
VALUES (?, ?, ?, ?, 'queued', ?, 0, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT
DO NOTHING
RETURNING id;

-- name: replace
-- `ReplaceIfQueued`: an untargeted `DO UPDATE` (SQLite 3.35+), for the reason above.
INSERT INTO task_run ({{insert_columns}})
VALUES (?, ?, ?, ?, 'queued', ?, 0, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT
DO UPDATE SET payload = excluded.payload,
    run_at = excluded.run_at,
    priority = excluded.priority,
    updated_at = excluded.updated_at
WHERE status = 'queued'
RETURNING {{columns}};

-- name: find_occupant
-- The task holding a key: user_id, task_type, resource_key, dedup_window_end. Also the
-- read after a conflict: writers are serialized, the conflicting row is committed and
-- visible.
SELECT {{columns}}
FROM task_run
WHERE user_id = ?
    AND task_type = ?
    AND resource_key = ?
    AND dedup_window_end = ?
    AND {{occupies_key}};

-- name: by_id
SELECT {{columns}}
FROM task_run
WHERE id = ?;

