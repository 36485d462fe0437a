-- The physical write cost of one measured phase, from the WAL between two LSNs.
--
--   psql -d DB -v from=0/1A2B3C4D -v to=0/1A2B9F00 -f bench/cost/phase.sql
--
-- `from` and `to` are pg_current_wal_insert_lsn() taken just before and just after the
-- phase, in the phase's database. Run it from that database: pg_walinspect's
-- pg_get_wal_records_info (PostgreSQL 15 contrib, `CREATE EXTENSION pg_walinspect`) reads
-- the records whose start LSN is in [from, to). On PostgreSQL 15 it refuses a `to` past
-- the flushed WAL, so the caller waits until pg_current_wal_flush_lsn() >= to. Records
-- written after a phase's last commit (prunes of a final empty poll) are not flushed while the
-- cluster is idle: after reading `to`, the caller commits a transaction that has an xid
-- (`SELECT pg_current_xact_id()`, its commit record lands after `to`, outside the window), and
-- the WAL writer flushes past it within wal_writer_delay.
--
-- Which records count: those with a block reference in this database
-- (PG15's block_ref reads `blkref #0: rel 1663/16384/16385 fork main blk 0`, the middle
-- number the database OID; the only slashes in block_ref are in those triples, so
-- `rel <spc>/<db>/` matches exactly), plus the Transaction records (COMMIT, ABORT) whose
-- xid is one of those records' xids: a commit record carries no block reference but its
-- xid is cluster-wide unique, so this attributes the commits to the phase's database
-- exactly, even while other databases of the cluster write. Commits ARE included in
-- wal_bytes_no_fpi and records, and shown apart in commit_records/commit_bytes.
-- Left out: other databases, shared catalogs, checkpoint and RUNNING_XACTS records.
--
-- Columns (one row):
--   wal_bytes_no_fpi     sum(record_length - fpi_length): the record bytes without full-page
--                        images (headline; excludes the 8-byte alignment padding and the
--                        WAL page headers, which total_wal_bytes includes)
--   fpi_bytes            sum(fpi_length): full-page image bytes (depend on checkpoint timing)
--   btree_entries        Btree INSERT_LEAF + INSERT_POST records: index entries written
--   other_index_records  every other index record (Btree splits, INSERT_UPPER, NEWROOT, DEDUP,
--                        DELETE...; any Gin, Gist, Hash, SPGist, BRIN record)
--   heap_inserts         Heap INSERT[+INIT], Heap2 MULTI_INSERT[+INIT]
--   heap_updates         Heap UPDATE[+INIT] (not HOT: new index entries follow)
--   heap_hot_updates     Heap HOT_UPDATE[+INIT]
--   heap_deletes         Heap DELETE
--   heap_locks           Heap LOCK, Heap2 LOCK_UPDATED (row locks: FOR UPDATE, FOR SHARE...)
--   records              all counted records, commits included
--   heap_other           other Heap/Heap2 records (PRUNE, VISIBLE, INPLACE, FREEZE_PAGE...)
--   commit_records       Transaction records of this database's xids
--   commit_bytes         their bytes (part of wal_bytes_no_fpi)
--   total_wal_bytes      to - from: all WAL of the cluster in the window, FPIs, padding and
--                        page headers included (a cross-check; other databases' writes too)
WITH db AS (
  SELECT oid::text AS oid FROM pg_database WHERE datname = current_database()
), w AS (
  SELECT * FROM pg_get_wal_records_info(:'from', :'to')
), mine AS (
  SELECT w.* FROM w, db WHERE w.block_ref LIKE '% rel %/' || db.oid || '/%'
), commits AS (
  SELECT w.* FROM w
  WHERE w.resource_manager = 'Transaction'
    AND w.xid IN (SELECT xid FROM mine)
), counted AS (
  SELECT * FROM mine UNION ALL SELECT * FROM commits
)
SELECT
  coalesce(sum(record_length - fpi_length), 0)::bigint AS wal_bytes_no_fpi,
  coalesce(sum(fpi_length), 0)::bigint AS fpi_bytes,
  count(*) FILTER (WHERE resource_manager = 'Btree'
                     AND record_type IN ('INSERT_LEAF', 'INSERT_POST')) AS btree_entries,
  count(*) FILTER (WHERE resource_manager IN ('Btree', 'Hash', 'Gin', 'Gist', 'SPGist', 'BRIN')
                     AND NOT (resource_manager = 'Btree'
                              AND record_type IN ('INSERT_LEAF', 'INSERT_POST'))) AS other_index_records,
  count(*) FILTER (WHERE (resource_manager = 'Heap' AND record_type IN ('INSERT', 'INSERT+INIT'))
                      OR (resource_manager = 'Heap2'
                          AND record_type IN ('MULTI_INSERT', 'MULTI_INSERT+INIT'))) AS heap_inserts,
  count(*) FILTER (WHERE resource_manager = 'Heap'
                     AND record_type IN ('UPDATE', 'UPDATE+INIT')) AS heap_updates,
  count(*) FILTER (WHERE resource_manager = 'Heap'
                     AND record_type IN ('HOT_UPDATE', 'HOT_UPDATE+INIT')) AS heap_hot_updates,
  count(*) FILTER (WHERE resource_manager = 'Heap' AND record_type = 'DELETE') AS heap_deletes,
  count(*) FILTER (WHERE (resource_manager = 'Heap' AND record_type = 'LOCK')
                      OR (resource_manager = 'Heap2' AND record_type = 'LOCK_UPDATED')) AS heap_locks,
  count(*) AS records,
  count(*) FILTER (WHERE resource_manager IN ('Heap', 'Heap2')
                     AND record_type NOT IN ('INSERT', 'INSERT+INIT', 'MULTI_INSERT',
                                             'MULTI_INSERT+INIT', 'UPDATE', 'UPDATE+INIT',
                                             'HOT_UPDATE', 'HOT_UPDATE+INIT', 'DELETE', 'LOCK',
                                             'LOCK_UPDATED')) AS heap_other,
  count(*) FILTER (WHERE resource_manager = 'Transaction') AS commit_records,
  coalesce(sum(record_length) FILTER (WHERE resource_manager = 'Transaction'), 0)::bigint
    AS commit_bytes,
  pg_wal_lsn_diff(:'to', :'from')::bigint AS total_wal_bytes
FROM counted;
