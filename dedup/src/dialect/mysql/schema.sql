-- MySQL/MariaDB: what the library checks of the schema before it relies on it.

-- name: running_index
-- One row when `task_run` has the unique index `task_running_resource_uidx`: whether an
-- optimistic claim can rely on it (`lifecycle::claim_mode`).
SELECT 1 AS present
FROM information_schema.statistics
WHERE table_schema = DATABASE()
    AND table_name = 'task_run'
    AND index_name = 'task_running_resource_uidx'
    AND non_unique = 0
LIMIT 1;

-- name: guard
-- The table, the columns of the unique index in order, and the expression of the generated
-- column it reads (`mysql::guarded` reads them).
SELECT (
        SELECT COUNT(*)
        FROM information_schema.TABLES
        WHERE TABLE_SCHEMA = DATABASE()
            AND TABLE_NAME = 'task_run'
    ) AS has_table,
    (
        SELECT CAST(GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) AS CHAR)
        FROM information_schema.STATISTICS
        WHERE TABLE_SCHEMA = DATABASE()
            AND TABLE_NAME = 'task_run'
            AND INDEX_NAME = 'task_active_resource_uidx'
            AND NON_UNIQUE = 0
    ) AS key_columns,
    (
        SELECT CAST(GENERATION_EXPRESSION AS CHAR)
        FROM information_schema.COLUMNS
        WHERE TABLE_SCHEMA = DATABASE()
            AND TABLE_NAME = 'task_run'
            AND COLUMN_NAME = 'occupied'
    ) AS occupied;


-- name: galera
-- Whether the server is a node of a MariaDB Galera cluster: one row, `ON`, there; `OFF`
-- on a MariaDB built with wsrep but running alone; no row on MySQL.
SHOW VARIABLES LIKE 'wsrep_on';
