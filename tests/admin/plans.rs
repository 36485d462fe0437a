//! The admin lists' query plans on a big table: a list by status and type, and the list
//! of every task, read an index (newest first, stopping after the page), and so does a
//! list by a key prefix that matches nothing (`task_run_key_prefix_idx`), on PostgreSQL
//! (1,000,000 tasks) and MariaDB (200,000), never the whole table; so do the overview's
//! oldest queued task per type, its throughput and its capped counts (PostgreSQL).
//!
//! The statements explained are the library's own: read from the snapshots that pin
//! them (`dedup/src/dialect/snapshots`), so a change to the text is a change here too.
//! Printed with `--nocapture` (PostgreSQL's with `EXPLAIN ANALYZE`, the time as run):
//! BENCHMARKS.md shows them.

use harness::{Dialect, TestDb, server_matrix};
use sea_orm::{ConnectionTrait, Statement, TransactionTrait};

server_matrix!(lists_by_status_and_type_read_an_index);

/// Ten task types; of every 100 tasks 90 succeeded, 5 failed, 5 queued; one a second,
/// the newest now.
const POSTGRES_SEED: &str = "INSERT INTO task_run (id, user_id, task_type, resource_key, \
    status, attempts, created_at, updated_at) \
    SELECT gen_random_uuid(), 'u' || (n % 1000), 't' || (n % 10), 'k' || n, \
    CASE WHEN n % 100 < 90 THEN 'succeeded' WHEN n % 100 < 95 THEN 'failed' ELSE 'queued' END, \
    1, now() - n * interval '1 second', now() - n * interval '1 second' \
    FROM generate_series(1, 1000000) AS n";

/// The same rows on MySQL/MariaDB from a cross join of digits (no generate_series, and
/// recursive CTEs are capped at 1,000 rows on MySQL by default).
const MYSQL_SEED: &str = "INSERT INTO task_run (id, user_id, task_type, resource_key, \
    status, attempts, created_at, updated_at) \
    SELECT UNHEX(REPLACE(UUID(), '-', '')), CONCAT('u', n % 1000), CONCAT('t', n % 10), \
    CONCAT('k', n), \
    CASE WHEN n % 100 < 90 THEN 'succeeded' WHEN n % 100 < 95 THEN 'failed' ELSE 'queued' END, \
    1, UTC_TIMESTAMP(6) - INTERVAL n SECOND, UTC_TIMESTAMP(6) - INTERVAL n SECOND \
    FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 100000 * g.d AS n \
    FROM (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL \
    SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 \
    UNION ALL SELECT 9) a, \
    (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL \
    SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 \
    UNION ALL SELECT 9) b, \
    (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL \
    SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 \
    UNION ALL SELECT 9) c, \
    (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL \
    SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 \
    UNION ALL SELECT 9) e, \
    (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL \
    SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 \
    UNION ALL SELECT 9) f, \
    (SELECT 0 AS d UNION ALL SELECT 1) g) AS s";

async fn lists_by_status_and_type_read_an_index(db: &TestDb) {
    db.migrate().await;
    let status_type = harness::pinned::statement(db.dialect, "list_status_type_newest_after");
    let all = harness::pinned::statement(db.dialect, "list_all_newest");
    let prefix = harness::pinned::statement(db.dialect, "list_key_prefix_oldest");
    match db.dialect {
        Dialect::Postgres => {
            db.exec(POSTGRES_SEED).await;
            db.exec("ANALYZE task_run").await;
            // One connection: a prepared statement is the session's. Both plans the
            // server may pick for it: custom (its first five executions) and generic.
            let txn = db.db.begin().await.expect("begin");
            txn.execute_unprepared(&format!(
                "PREPARE by_status_type(text, timestamptz, uuid, int8) AS {status_type}"
            ))
            .await
            .expect("prepare");
            txn.execute_unprepared(&format!("PREPARE every(int8) AS {all}"))
                .await
                .expect("prepare");
            for mode in ["force_custom_plan", "force_generic_plan"] {
                txn.execute_unprepared(&format!("SET LOCAL plan_cache_mode = {mode}"))
                    .await
                    .expect("plan mode");
                for (name, execute, index) in [
                    (
                        "failed tasks of t3, newest first",
                        "EXECUTE by_status_type('t3', now() + interval '1 day', \
                         'ffffffff-ffff-ffff-ffff-ffffffffffff', 51)",
                        "task_run_type_status_idx",
                    ),
                    (
                        "every task, newest first",
                        "EXECUTE every(51)",
                        "task_run_type_status_idx",
                    ),
                ] {
                    let plan = postgres_plan(&txn, execute).await;
                    println!("PostgreSQL, 1,000,000 tasks, {mode}, {name}:\n{plan}\n");
                    assert!(!plan.contains("Seq Scan"), "{plan}");
                    assert!(
                        plan.contains(&format!("Scan Backward using {index}")),
                        "{plan}"
                    );
                }
            }
            // A key prefix alone (the dashboard's search), oldest first: one that matches
            // nothing reads `task_run_key_idx` under a custom plan (the pattern known);
            // one that matches every task walks `task_run_type_status_idx` per type and
            // status and stops after the page, under both plans (the generic plan cannot
            // read a pattern's range, and walks that index for any prefix).
            txn.execute_unprepared(&format!("PREPARE by_prefix(text, int8) AS {prefix}"))
                .await
                .expect("prepare");
            for (mode, name, execute, index) in [
                (
                    "force_custom_plan",
                    "a key prefix matching nothing",
                    "EXECUTE by_prefix('zz%', 51)",
                    "using task_run_key_idx",
                ),
                (
                    "force_custom_plan",
                    "a key prefix matching every task",
                    "EXECUTE by_prefix('k%', 51)",
                    "Scan using task_run_type_status_idx",
                ),
                (
                    "force_generic_plan",
                    "a key prefix matching every task",
                    "EXECUTE by_prefix('k%', 51)",
                    "Scan using task_run_type_status_idx",
                ),
            ] {
                txn.execute_unprepared(&format!("SET LOCAL plan_cache_mode = {mode}"))
                    .await
                    .expect("plan mode");
                let plan = postgres_plan(&txn, execute).await;
                println!("PostgreSQL, 1,000,000 tasks, {mode}, {name}:\n{plan}\n");
                assert!(!plan.contains("Seq Scan"), "{plan}");
                assert!(plan.contains(index), "{plan}");
            }
            // What a pool's prepared statement does (`plan_cache_mode = auto`): after
            // prefixes that match nothing, every task and some, it keeps custom plans
            // (the generic plan's guessed cost is above every custom plan's here), and a
            // prefix that matches nothing still reads the index.
            txn.execute_unprepared("SET LOCAL plan_cache_mode = auto")
                .await
                .expect("plan mode");
            for pattern in ["zz%", "k%", "k99%"].iter().cycle().take(12) {
                txn.execute_unprepared(&format!("EXECUTE by_prefix('{pattern}', 51)"))
                    .await
                    .expect("execute");
            }
            let plan = postgres_plan(&txn, "EXECUTE by_prefix('zz%', 51)").await;
            println!("PostgreSQL, 1,000,000 tasks, auto after 12 executions, nothing:\n{plan}\n");
            assert!(plan.contains("using task_run_key_idx"), "{plan}");
            // The overview: the oldest queued task per type and the throughput read
            // their indexes; the counts read every row (shown, not asserted).
            let oldest = harness::pinned::statement(db.dialect, "oldest_queued");
            // Still under `force_generic_plan`: the statements take no parameters, so the
            // plan is the same either way.
            for (name, sql, must_use) in [
                (
                    "oldest queued per type",
                    oldest,
                    Some("task_run_type_status_idx"),
                ),
                (
                    "throughput",
                    harness::pinned::statement(db.dialect, "throughput"),
                    Some("task_run_type_status_idx"),
                ),
                (
                    "counts",
                    harness::pinned::statement(db.dialect, "counts"),
                    None,
                ),
            ] {
                let plan = postgres_plan(&txn, &sql).await;
                println!("PostgreSQL, 1,000,000 tasks, {name}:\n{plan}\n");
                if let Some(index) = must_use {
                    // The throughput reads the last hour's tasks of each type: a bitmap
                    // of that range of the index is as good as a walk; never a scan.
                    assert!(!plan.contains("Seq Scan"), "{plan}");
                    assert!(name == "throughput" || !plan.contains("Bitmap"), "{plan}");
                    assert!(plan.contains(index), "{plan}");
                }
            }
            // The dashboard's counts (`counts_up_to`): the types, one index descent each,
            // then per type each status up to DEFAULT_COUNT_LIMIT + 1 tasks, an index
            // walk that stops there; under both plans, and never JIT-compiled (one
            // statement over every type passed `jit_above_cost`: 12 s here).
            let types = harness::pinned::statement(db.dialect, "task_types");
            let per_type = harness::pinned::statement(db.dialect, "counts_of_type");
            txn.execute_unprepared(&format!("PREPARE per_type(text, int8) AS {per_type}"))
                .await
                .expect("prepare");
            let execute = format!(
                "EXECUTE per_type('t3', {})",
                task_dedup::DEFAULT_COUNT_LIMIT + 1
            );
            for mode in ["force_custom_plan", "force_generic_plan"] {
                txn.execute_unprepared(&format!("SET LOCAL plan_cache_mode = {mode}"))
                    .await
                    .expect("plan mode");
                for (name, sql) in [("task types", &types), ("counts of t3", &execute)] {
                    let plan = postgres_plan(&txn, sql).await;
                    println!("PostgreSQL, 1,000,000 tasks, {mode}, {name}:\n{plan}\n");
                    assert!(
                        !plan.contains("Seq Scan") && !plan.contains("JIT"),
                        "{plan}"
                    );
                    assert!(
                        plan.contains("Only Scan using task_run_type_status_idx"),
                        "{plan}"
                    );
                }
            }
            txn.rollback().await.expect("rollback");
        }
        Dialect::MySql => {
            // 200,000 rows: the cross join above with its last factor cut to 0..1.
            db.exec(MYSQL_SEED).await;
            db.exec("ANALYZE TABLE task_run").await;
            let future = "UTC_TIMESTAMP(6) + INTERVAL 1 DAY";
            let values = [
                "'failed'",
                "'t3'",
                future,
                future,
                future,
                "UNHEX('ffffffffffffffffffffffffffffffff')",
                "51",
            ];
            for (name, sql, values, index) in [
                (
                    "failed tasks of t3, newest first",
                    &status_type,
                    &values[..],
                    "task_run_type_status_created_idx",
                ),
                (
                    "every task, newest first",
                    &all,
                    &["51"][..],
                    "task_run_created_idx",
                ),
                (
                    "a key prefix matching nothing, oldest first",
                    &prefix,
                    &["'zz'", "'z{'", "51"][..],
                    "task_run_key_prefix_idx",
                ),
            ] {
                let rows = mysql_plan(db, &with_literals(sql, values)).await;
                println!("MariaDB, 200,000 tasks, {name}:");
                for (table, access, key, extra) in &rows {
                    println!("  table {table} type {access} key {key:?} extra {extra:?}");
                }
                let (_, access, key, extra) = &rows[0];
                assert_ne!(access, "ALL", "a full scan: {rows:?}");
                assert_eq!(key.as_deref(), Some(index), "{rows:?}");
                // The prefix's few rows are sorted by creation; the others read in order.
                let sorts = index == "task_run_key_prefix_idx";
                assert_eq!(
                    extra.as_deref().unwrap_or("").contains("filesort"),
                    sorts,
                    "{rows:?}"
                );
            }
        }
        Dialect::Sqlite => panic!("a server dialect only"),
    }
}

async fn postgres_plan(txn: &sea_orm::DatabaseTransaction, execute: &str) -> String {
    let rows = txn
        .query_all_raw(Statement::from_string(
            sea_orm::DbBackend::Postgres,
            // ANALYZE: the plan as run, with its server-side time (shown, not asserted).
            format!("EXPLAIN (ANALYZE, BUFFERS) {execute}"),
        ))
        .await
        .expect("explain");
    rows.iter()
        .map(|row| row.try_get_by_index::<String>(0).expect("plan line"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `sql` with its `?` replaced by `values` in order (EXPLAIN takes no parameters there).
fn with_literals(sql: &str, values: &[&str]) -> String {
    let mut parts = sql.split('?');
    let mut out = parts.next().unwrap_or_default().to_owned();
    for (part, value) in parts.zip(values.iter().chain(std::iter::repeat(&"NULL"))) {
        out.push_str(value);
        out.push_str(part);
    }
    assert_eq!(sql.matches('?').count(), values.len(), "{sql}");
    out
}

type PlanRow = (String, String, Option<String>, Option<String>);

async fn mysql_plan(db: &TestDb, sql: &str) -> Vec<PlanRow> {
    let rows = db
        .db
        .query_all_raw(Statement::from_string(
            sea_orm::DbBackend::MySql,
            format!("EXPLAIN {sql}"),
        ))
        .await
        .expect("explain");
    rows.iter()
        .map(|row| {
            (
                row.try_get("", "table").expect("table"),
                row.try_get("", "type").expect("type"),
                row.try_get("", "key").expect("key"),
                row.try_get("", "Extra").expect("Extra"),
            )
        })
        .collect()
}
