-- The physical work of one phase, from the WAL records between two LSNs (psql variables
-- :'from' and :'to', pg_current_wal_flush_lsn() before and after the phase) that touch
-- this database's relations. Needs pg_walinspect (PostgreSQL 15+).
WITH db AS (
  SELECT '% ' || (SELECT dattablespace FROM pg_database WHERE datname = current_database())::text
         || '/' || (SELECT oid FROM pg_database WHERE datname = current_database())::text || '/%' AS pattern
), r AS (
  SELECT w.* FROM pg_get_wal_records_info(:'from', :'to') AS w, db
  WHERE w.block_ref LIKE db.pattern
)
SELECT
  coalesce(sum(record_length - fpi_length), 0)::int8 AS wal_bytes_no_fpi,
  coalesce(sum(fpi_length), 0)::int8 AS fpi_bytes,
  count(*) FILTER (WHERE resource_manager = 'Btree' AND record_type IN ('INSERT_LEAF', 'INSERT_POST'))::int8 AS btree_entries,
  count(*) FILTER (WHERE resource_manager IN ('Gin', 'Gist', 'Hash', 'SPGist', 'BRIN'))::int8 AS other_index_records,
  count(*) FILTER (WHERE resource_manager IN ('Heap', 'Heap2') AND record_type LIKE 'INSERT%')::int8 AS heap_inserts,
  count(*) FILTER (WHERE resource_manager = 'Heap' AND record_type LIKE 'UPDATE%')::int8 AS heap_updates,
  count(*) FILTER (WHERE resource_manager = 'Heap' AND record_type LIKE 'HOT_UPDATE%')::int8 AS heap_hot_updates,
  count(*) FILTER (WHERE resource_manager = 'Heap' AND record_type LIKE 'DELETE%')::int8 AS heap_deletes,
  count(*) FILTER (WHERE resource_manager = 'Heap' AND record_type LIKE 'LOCK%')::int8 AS heap_locks,
  count(*)::int8 AS records
FROM r;
