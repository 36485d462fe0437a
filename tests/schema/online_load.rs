//! An upgrade under load, measured (ignored by default; `bench/online_upgrade.sh` runs it
//! and BENCHMARKS.md has its figures).
//!
//! `task_run` as the first migration leaves it, filled with `TASK_DEDUP_LOAD_ROWS` rows
//! (default 5,000,000: 97 % finished, 2 % queued, 1 % running), then 16 clients enqueue
//! and a worker drains throughout, and `migrate up` runs from the second migration to the
//! last: online (`up_online`) or, with `TASK_DEDUP_LOAD_MODE=blocking`, as the migrations
//! are (the baseline). Per phase (before, during, after the upgrade): calls, failures,
//! throughput and latency p50/p99/max. Afterwards, keys with more than one active task.
//!
//! The clients are an older release's statements (read the key's active task, insert
//! when there is none, and on the unique index's refusal read the holder; the worker claims with `SKIP LOCKED` and
//! finishes), because the library of this commit needs the schema of the last migration.
//! What they wait for is what any writer of `task_run` waits for.
//!
//! ```text
//! TASK_DEDUP_LOAD_DIALECT=postgres|mysql TASK_DEDUP_LOAD_ROWS=5000000 \
//!   TASK_DEDUP_LOAD_MODE=online|blocking \
//!   cargo test --release --test schema online_load:: -- --ignored --nocapture
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use harness::{Dialect, TestDb};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement, Value};
use task_dedup_migration::online::{OnlineOptions, ensure_schema_online, up_online};
use task_dedup_migration::{Migrator, MigratorTrait};
use tokio::sync::Barrier;

const CLIENTS: usize = 16;
/// Keys the clients draw from: most calls create, some hit.
const KEYS: u64 = 20_000;
/// How long the load runs before and after the upgrade.
const STEADY: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "minutes; run by bench/online_upgrade.sh"]
async fn upgrade_under_load() {
    let dialect = match std::env::var("TASK_DEDUP_LOAD_DIALECT").as_deref() {
        Ok("mysql") => Dialect::MySql,
        _ => Dialect::Postgres,
    };
    harness::run(dialect, "online_load", body).await;
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn body(db: &TestDb) {
    let rows = env_u64("TASK_DEDUP_LOAD_ROWS", 5_000_000);
    let online = std::env::var("TASK_DEDUP_LOAD_MODE").as_deref() != Ok("blocking");
    // `legacy`: a table made by hand before the migrations, brought up by the compat
    // patch (`ensure_schema_online`, or `ensure_schema` when blocking).
    let legacy = std::env::var("TASK_DEDUP_LOAD_START").as_deref() == Ok("legacy");
    if legacy {
        harness::schema::create_legacy_table(db).await;
        // The index a read-then-insert application has on its key: without it each of
        // its reads scans the table (12-16 s on MariaDB at 5,000,000 rows), and on
        // MySQL/MariaDB no `ALTER TABLE`, online or not, gets its metadata lock while
        // 16 such scans overlap.
        db.exec("CREATE INDEX legacy_key_idx ON task_run (user_id, task_type, resource_key)")
            .await;
    } else {
        Migrator::up(&db.db, Some(1)).await.expect("first step");
    }
    let started = Instant::now();
    fill(db, rows, legacy).await;
    eprintln!(
        "[load] {} rows in {:.1} s",
        rows,
        started.elapsed().as_secs_f64()
    );

    let pool = db.pool(CLIENTS as u32 + 2).await;
    // 9: warming up (connections, statement caches), not counted.
    let phase = Arc::new(AtomicU8::new(9));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(CLIENTS + 2));
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let (pool, phase, stop, start) =
            (pool.db.clone(), phase.clone(), stop.clone(), start.clone());
        let dialect = db.dialect;
        clients.push(tokio::spawn(async move {
            start.wait().await;
            let mut calls = Vec::new();
            let mut n = c as u64;
            while !stop.load(Ordering::Acquire) {
                let key = format!("k{}", (n * 7919) % KEYS);
                // A call counts in the phase it started in.
                let in_phase = phase.load(Ordering::Acquire);
                let began = Instant::now();
                let ok = enqueue(&pool, dialect, &key).await.is_ok();
                calls.push((in_phase, began.elapsed(), ok, began));
                n += CLIENTS as u64;
            }
            calls
        }));
    }
    // MySQL/MariaDB, during the upgrade: who writers wait behind. Every 200 ms, when a
    // statement has run longer than half a second, the four longest are printed (the
    // DDL they queue behind among them), at most once a second.
    let monitor = (db.dialect == Dialect::MySql).then(|| {
        let (pool, stop, phase) = (pool.db.clone(), stop.clone(), phase.clone());
        tokio::spawn(async move {
            let mut started = None::<Instant>;
            let mut last = None::<u64>;
            while !stop.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if phase.load(Ordering::Acquire) != 1 {
                    continue;
                }
                let started = *started.get_or_insert_with(Instant::now);
                let Ok(rows) = pool
                    .query_all_raw(Statement::from_string(
                        sea_orm::DbBackend::MySql,
                        "SELECT CAST(COALESCE(STATE, '') AS CHAR) AS state, \
                         CAST(LEFT(COALESCE(INFO, ''), 90) AS CHAR) AS info, \
                         CAST(TIME_MS AS SIGNED) AS ms FROM information_schema.PROCESSLIST \
                         WHERE COMMAND <> 'Sleep' AND INFO NOT LIKE '%PROCESSLIST%' \
                         ORDER BY TIME_MS DESC LIMIT 4",
                    ))
                    .await
                else {
                    continue;
                };
                let waits = rows.iter().any(|r| {
                    r.try_get::<i64>("", "ms").unwrap_or(0) > 500
                        && !r
                            .try_get::<String>("", "info")
                            .unwrap_or_default()
                            .starts_with("ALTER")
                });
                let second = started.elapsed().as_secs();
                if waits && last != Some(second) {
                    last = Some(second);
                    for r in &rows {
                        eprintln!(
                            "[load] wait at {:+.1} s from the upgrade's start: {} ms {:?} {:?}",
                            started.elapsed().as_secs_f64(),
                            r.try_get::<i64>("", "ms").unwrap_or(0),
                            r.try_get::<String>("", "state").unwrap_or_default(),
                            r.try_get::<String>("", "info").unwrap_or_default(),
                        );
                    }
                }
            }
        })
    });
    let worker = {
        let (pool, stop, start) = (pool.db.clone(), stop.clone(), start.clone());
        tokio::spawn(async move {
            start.wait().await;
            let mut drained = 0u64;
            while !stop.load(Ordering::Acquire) {
                match drain_one(&pool).await {
                    Ok(true) => drained += 1,
                    Ok(false) => tokio::time::sleep(Duration::from_millis(5)).await,
                    Err(_) => {}
                }
            }
            drained
        })
    };
    start.wait().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    phase.store(0, Ordering::Release);
    tokio::time::sleep(STEADY).await;
    phase.store(1, Ordering::Release);
    let upgrade = Instant::now();
    let upgrade_started = upgrade;
    eprintln!("[load] upgrade starts");
    if legacy && online {
        let report = ensure_schema_online(&db.db, &OnlineOptions::default())
            .await
            .expect("online compat patch");
        eprintln!("[load] {report}");
        for change in &report.online {
            eprintln!("[load] {change}");
        }
    } else if legacy {
        let report = task_dedup_migration::ensure_schema(&db.db)
            .await
            .expect("compat patch");
        eprintln!("[load] {report}");
    } else if online {
        let report = up_online(&db.db, None, &OnlineOptions::default())
            .await
            .expect("online upgrade");
        for change in &report.changes {
            eprintln!("[load] {change}");
        }
    } else {
        Migrator::up(&db.db, None).await.expect("blocking upgrade");
    }
    let upgrade = upgrade.elapsed();
    phase.store(2, Ordering::Release);
    tokio::time::sleep(STEADY).await;
    stop.store(true, Ordering::Release);
    let mut calls = Vec::new();
    for client in clients {
        calls.extend(client.await.expect("client"));
    }
    let drained = worker.await.expect("worker");
    if let Some(monitor) = monitor {
        monitor.await.expect("monitor");
    }

    let mode = if online { "online" } else { "blocking" };
    eprintln!(
        "[load] {} {mode}: upgrade {:.1} s, worker finished {drained} tasks",
        db.dialect.name(),
        upgrade.as_secs_f64()
    );
    eprintln!("[load] phase   calls  failed   ops/s   p50_ms   p99_ms   max_ms");
    for (p, name, secs) in [
        (0, "before", STEADY.as_secs_f64()),
        (1, "during", upgrade.as_secs_f64()),
        (2, "after", STEADY.as_secs_f64()),
    ] {
        let mut times: Vec<Duration> = calls.iter().filter(|c| c.0 == p).map(|c| c.1).collect();
        let failed = calls.iter().filter(|c| c.0 == p && !c.2).count();
        times.sort();
        let at = |q: f64| {
            times
                .get(((times.len() as f64 * q) as usize).min(times.len().saturating_sub(1)))
                .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
        };
        eprintln!(
            "[load] {name:<7} {:>6} {failed:>7} {:>7.0} {:>8.2} {:>8.2} {:>8.1}",
            times.len(),
            times.len() as f64 / secs,
            at(0.5),
            at(0.99),
            times.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0)
        );
    }
    // Where the slowest calls fall (seconds from the upgrade's start), to match them with
    // the changes' durations above.
    let mut slowest: Vec<_> = calls.iter().filter(|c| c.0 != 9).collect();
    slowest.sort_by_key(|c| std::cmp::Reverse(c.1));
    for c in slowest.iter().take(5) {
        let offset = c.3.saturating_duration_since(upgrade_started).as_secs_f64()
            - upgrade_started.saturating_duration_since(c.3).as_secs_f64();
        eprintln!(
            "[load] slow call: {:.1} ms, phase {}, began at {offset:+.1} s from the upgrade's start",
            c.1.as_secs_f64() * 1000.0,
            ["before", "during", "after"][usize::from(c.0)]
        );
    }
    let doubled = harness::keys_with_two_active(&db.db).await;
    eprintln!("[load] keys with more than one active task afterwards: {doubled}");
    let failed = calls.iter().filter(|c| !c.2).count();
    assert_eq!(failed, 0, "no call fails");
    assert_eq!(doubled, 0, "at most one active task per key");
}

/// `rows` rows of history in one statement: 97 % finished, 2 % queued, 1 % running,
/// each of its own key (the active ones are not duplicates). A legacy table has no
/// `finished_at`.
async fn fill(db: &TestDb, rows: u64, legacy: bool) {
    let (column, pg_finished, my_finished) = if legacy {
        ("", "", "")
    } else {
        (
            ", finished_at",
            ", CASE WHEN n % 100 >= 3 THEN now() END",
            ", CASE WHEN seq % 100 >= 3 THEN NOW(6) END",
        )
    };
    let sql = match db.dialect {
        Dialect::Postgres => format!(
            "INSERT INTO task_run (id, user_id, task_type, resource_key, status, attempts, \
             created_at, updated_at{column}) \
             SELECT gen_random_uuid(), 'user' || (n % 1000), 'render', 'doc-' || n, \
             CASE WHEN n % 100 < 2 THEN 'queued' WHEN n % 100 < 3 THEN 'running' \
             ELSE 'succeeded' END, 1, now() - interval '1 second' * n, now(){pg_finished} \
             FROM generate_series(1, {rows}) n"
        ),
        _ => format!(
            "INSERT INTO task_run (id, user_id, task_type, resource_key, status, attempts, \
             created_at, updated_at{column}) \
             SELECT UNHEX(REPLACE(UUID(), '-', '')), CONCAT('user', seq % 1000), 'render', \
             CONCAT('doc-', seq), \
             CASE WHEN seq % 100 < 2 THEN 'queued' WHEN seq % 100 < 3 THEN 'running' \
             ELSE 'succeeded' END, 1, NOW(6) - INTERVAL seq SECOND, NOW(6){my_finished} \
             FROM seq_1_to_{rows}"
        ),
    };
    db.exec(&sql).await;
    // Settled, as a table with history is: no autovacuum of the fresh rows during the
    // first phase.
    match db.dialect {
        Dialect::Postgres => db.exec("VACUUM ANALYZE task_run").await,
        _ => db.exec("ANALYZE TABLE task_run").await,
    }
}

/// An older release's enqueue: read the key's active task; insert when there is none; on
/// the unique index's refusal (once it exists), read the holder again.
async fn enqueue(
    db: &DatabaseConnection,
    dialect: Dialect,
    key: &str,
) -> Result<(), sea_orm::DbErr> {
    let id = uuid::Uuid::now_v7();
    let now = chrono::Utc::now();
    let (insert, select) = match dialect {
        Dialect::Postgres => (
            "INSERT INTO task_run (id, user_id, task_type, resource_key, status, attempts, \
             created_at, updated_at) VALUES ($1, 'load', 'render', $2, 'queued', 0, $3, $3)",
            "SELECT id FROM task_run WHERE user_id = 'load' AND task_type = 'render' \
             AND resource_key = $1 AND status IN ('queued', 'running')",
        ),
        _ => (
            "INSERT INTO task_run (id, user_id, task_type, resource_key, status, attempts, \
             created_at, updated_at) VALUES (?, 'load', 'render', ?, 'queued', 0, ?, ?)",
            "SELECT id FROM task_run WHERE user_id = 'load' AND task_type = 'render' \
             AND resource_key = ? AND status IN ('queued', 'running')",
        ),
    };
    let mut values: Vec<Value> = vec![id.into(), key.into(), now.into()];
    if dialect == Dialect::MySql {
        values.push(now.into());
    }
    let backend = db.get_database_backend();
    let holder = db
        .query_one_raw(Statement::from_sql_and_values(
            backend,
            select,
            [key.into()],
        ))
        .await?;
    if holder.is_some() {
        return Ok(());
    }
    match db
        .execute_raw(Statement::from_sql_and_values(backend, insert, values))
        .await
    {
        Ok(_) => Ok(()),
        Err(err)
            if matches!(
                err.sql_err(),
                Some(sea_orm::SqlErr::UniqueConstraintViolation(_))
            ) =>
        {
            db.query_one_raw(Statement::from_sql_and_values(
                backend,
                select,
                [key.into()],
            ))
            .await
            .map(|_| ())
        }
        Err(err) => Err(err),
    }
}

/// Claims the oldest queued task of the load's keys and finishes it.
async fn drain_one(db: &DatabaseConnection) -> Result<bool, sea_orm::DbErr> {
    let backend = db.get_database_backend();
    // No ORDER BY: the first queued task of the load's keys in the lookup index. Ordered
    // by `created_at` it read past the history's 100,000 queued rows on every claim (no
    // index of the first step serves that order for one user), a transaction of up to a
    // second that each `ALTER TABLE`'s metadata lock, and every writer behind it, waited
    // for.
    //
    // From step 4 on, `scope = 'active'` lets PostgreSQL read the unique index of active
    // tasks (user and type first; its predicate then holds), which migration 13 leaves as
    // the only index with the user first: without it, on the lean set, each claim read the
    // table (seconds on 5,000,000 rows), and its row lock held every writer of that key
    // (and the drop of an index) as long.
    let claim = "SELECT id FROM task_run WHERE user_id = 'load' AND task_type = 'render' \
                 AND status = 'queued' LIMIT 1 FOR UPDATE SKIP LOCKED";
    let scoped = "SELECT id FROM task_run WHERE user_id = 'load' AND task_type = 'render' \
                  AND status = 'queued' AND scope = 'active' LIMIT 1 FOR UPDATE SKIP LOCKED";
    let txn = sea_orm::TransactionTrait::begin(db).await?;
    // Before step 4 there is no `scope`: a savepoint lets the claim fall back.
    let first = {
        let attempt = sea_orm::TransactionTrait::begin(&txn).await?;
        match attempt
            .query_one_raw(Statement::from_string(backend, scoped))
            .await
        {
            Ok(row) => {
                attempt.commit().await?;
                Some(row)
            }
            Err(_) => {
                attempt.rollback().await?;
                None
            }
        }
    };
    let row = match first {
        Some(row) => row,
        None => {
            txn.query_one_raw(Statement::from_string(backend, claim))
                .await?
        }
    };
    let Some(row) = row else {
        txn.commit().await?;
        return Ok(false);
    };
    let id: uuid::Uuid = row.try_get("", "id")?;
    let finish = match backend {
        sea_orm::DbBackend::Postgres => {
            "UPDATE task_run SET status = 'succeeded', updated_at = now() WHERE id = $1"
        }
        _ => "UPDATE task_run SET status = 'succeeded', updated_at = NOW(6) WHERE id = ?",
    };
    txn.execute_raw(Statement::from_sql_and_values(backend, finish, [id.into()]))
        .await?;
    txn.commit().await?;
    Ok(true)
}

/// SQLite: no concurrent writers to protect (one writer at a time, and the migrations
/// hold the write lock while they build), so the figure is how long each step takes on
/// `TASK_DEDUP_LOAD_ROWS` rows: writers of the file wait that long.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "minutes; run by bench/online_upgrade.sh"]
async fn sqlite_build_time() {
    harness::run(
        Dialect::Sqlite,
        "online_load_sqlite",
        async |db: &TestDb| {
            let rows = env_u64("TASK_DEDUP_LOAD_ROWS", 5_000_000);
            Migrator::up(&db.db, Some(1)).await.expect("first step");
            let started = Instant::now();
            db.exec(&format!(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows}) \
             INSERT INTO task_run (id, user_id, task_type, resource_key, status, attempts, \
             created_at, updated_at, finished_at) \
             SELECT randomblob(16), 'user' || (i % 1000), 'render', 'doc-' || i, \
             CASE WHEN i % 100 < 2 THEN 'queued' WHEN i % 100 < 3 THEN 'running' \
             ELSE 'succeeded' END, 1, '2026-01-01T00:00:00+00:00', \
             '2026-01-01T00:00:00+00:00', \
             CASE WHEN i % 100 >= 3 THEN '2026-01-01T00:00:00+00:00' END FROM n"
            ))
            .await;
            eprintln!(
                "[load] sqlite: {rows} rows in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            let started = Instant::now();
            let report = up_online(&db.db, None, &OnlineOptions::default())
                .await
                .expect("upgrade");
            for change in &report.changes {
                eprintln!("[load] {change}");
            }
            eprintln!(
                "[load] sqlite: upgrade {:.1} s",
                started.elapsed().as_secs_f64()
            );
        },
    )
    .await;
}
