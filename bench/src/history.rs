//! History: finished rows preloaded into `task_run` (`--history N`), the pruner running
//! beside the callers while there is history, and the `prune` workload, which times the
//! pruner alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sea_orm::{ConnectOptions, ConnectionTrait, DatabaseConnection, DbBackend};
use task_dedup::{Retention, TaskLifecycle};

use crate::args::Args;

/// Rows per INSERT ... SELECT while loading.
const CHUNK: u64 = 100_000;

/// How long ago the preloaded rows finished.
#[derive(Clone, Copy)]
pub enum Age {
    /// Within the last 23 hours, after the first: history the default retention keeps.
    Kept,
    /// Two days ago and more: history the default retention prunes.
    Expired,
}

/// Inserts `rows` succeeded tasks of distinct keys (type `history`) in chunks, straight
/// from SQL (generate_series, MariaDB's sequence tables, a recursive CTE), oldest first
/// with time-ordered ids, then has the database analyze the table as it would have by
/// the time a real history grew.
pub async fn preload(db: &DatabaseConnection, rows: u64, age: Age) -> Result<(), String> {
    let started = Instant::now();
    let backend = db.get_database_backend();
    // Seconds before now the newest row finished; the others spread over 22 hours before.
    let base = match age {
        Age::Kept => 3_600,
        Age::Expired => 2 * 86_400,
    };
    let mut from = 1;
    while from <= rows {
        let to = (from + CHUNK - 1).min(rows);
        let sql = insert_sql(backend, from, to, rows, base);
        db.execute_unprepared(&sql)
            .await
            .map_err(|e| format!("preload: {e}"))?;
        from = to + 1;
    }
    let analyze = match backend {
        DbBackend::Postgres => "ANALYZE task_run",
        DbBackend::MySql => "ANALYZE TABLE task_run",
        _ => "ANALYZE",
    };
    db.execute_unprepared(analyze)
        .await
        .map_err(|e| e.to_string())?;
    eprintln!(
        "# preloaded {rows} finished rows in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Rows `from..=to` of `rows`: row `n` finished `base` seconds plus a share of 22 hours
/// ago, later for a larger `n`, and its id is time-ordered like the library's UUIDv7
/// (older rows, smaller ids), so that deleting the oldest first walks the primary key in
/// order as it would in a real history.
fn insert_sql(backend: DbBackend, from: u64, to: u64, rows: u64, base: u64) -> String {
    const COLUMNS: &str = "id, user_id, task_type, resource_key, status, attempts, created_at, \
                           updated_at, started_at, finished_at, run_at, priority, scope, \
                           dedup_window_end, concurrent";
    const SPAN_MICROS: u64 = 22 * 3_600 * 1_000_000;
    let base_micros = base * 1_000_000;
    match backend {
        DbBackend::Postgres => format!(
            "INSERT INTO task_run ({COLUMNS}) \
             SELECT (lpad(to_hex(g), 12, '0') || '70008000' || lpad(to_hex(g), 12, '0'))::uuid, \
             'bench-user', 'history', 'h-' || g, 'succeeded', 1, \
             ts, ts, ts, ts, ts, 0, 'active', 0, false \
             FROM generate_series({from}, {to}) AS g, \
             LATERAL (SELECT now() - ({base_micros}::int8 + ({rows} - g)::int8 * {SPAN_MICROS} \
             / {rows}) * interval '1 microsecond' AS ts) AS t"
        ),
        DbBackend::MySql => format!(
            "INSERT INTO task_run ({COLUMNS}) \
             SELECT UNHEX(CONCAT(LPAD(HEX(seq), 12, '0'), '70008000', LPAD(HEX(seq), 12, '0'))), \
             'bench-user', 'history', CONCAT('h-', seq), 'succeeded', 1, ts, ts, ts, ts, ts, 0, \
             'active', 0, false \
             FROM (SELECT seq, UTC_TIMESTAMP(6) - INTERVAL ({base_micros} + ({rows} - seq) \
             * {SPAN_MICROS} DIV {rows}) MICROSECOND AS ts FROM seq_{from}_to_{to}) AS s"
        ),
        _ => format!(
            "WITH RECURSIVE g(n) AS (SELECT {from} UNION ALL SELECT n + 1 FROM g WHERE n < {to}) \
             INSERT INTO task_run ({COLUMNS}) \
             SELECT unhex(printf('%012x70008000%012x', n, n)), 'bench-user', 'history', \
             'h-' || n, 'succeeded', 1, ts, ts, ts, ts, ts, 0, 'active', 0, 0 \
             FROM (SELECT n, strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', \
             '-' || ({base} + ({rows} - n) * 79200.0 / {rows}) || ' seconds') AS ts FROM g)"
        ),
    }
}

/// The retention a bench pruner runs: the default ages, every second.
fn retention() -> Retention {
    Retention::default().every(Duration::from_secs(1))
}

/// A pruner on a pool of its own (as a worker's), pruning every second until `stop`;
/// its task returns how many rows it deleted and how many passes it made.
pub async fn start_pruner(
    args: &Args,
    stop: Arc<AtomicBool>,
) -> Result<tokio::task::JoinHandle<(u64, u64)>, String> {
    let mut options = ConnectOptions::new(args.url.clone());
    options.max_connections(2).sqlx_logging(false);
    let db = task_dedup::connect_with(options)
        .await
        .map_err(|e| e.to_string())?;
    Ok(tokio::spawn(async move {
        let (mut pruned, mut passes) = (0, 0);
        while !stop.load(Ordering::Relaxed) {
            match db.prune(&retention()).await {
                Ok(report) => pruned += report.total(),
                Err(e) => eprintln!("task-dedup-bench: prune: {e}"),
            }
            passes += 1;
            tokio::time::sleep(retention().every).await;
        }
        (pruned, passes)
    }))
}

/// The `prune` workload: `--history` expired rows, pruned by one pruner with the default
/// batches; prints the rows, the seconds, rows per second and the cost per 10,000 rows.
pub async fn run_prune(args: &Args) -> Result<(), String> {
    crate::run::prepare_schema(args).await?;
    let db = task_dedup::connect(&args.url)
        .await
        .map_err(|e| e.to_string())?;
    let rows = args.history.max(1);
    preload(&db, rows, Age::Expired).await?;
    let started = Instant::now();
    let report = db.prune(&retention()).await.map_err(|e| e.to_string())?;
    let seconds = started.elapsed().as_secs_f64();
    if report.total() != rows {
        return Err(format!("pruned {} of {rows} rows", report.total()));
    }
    println!(
        "prune {rows} {seconds:.3} {:.0} ms_per_10k={:.1}",
        rows as f64 / seconds,
        seconds * 1_000.0 * 10_000.0 / rows as f64
    );
    Ok(())
}
