//! task-dedup-loco against Loco's own PostgreSQL and SQLite queues, same run, same
//! machine, through Loco's `Queue` (what `perform_later` calls):
//!
//! - `creates`: 16 clients enqueue distinct arguments (enqueues/s);
//! - `repeats`: 16 clients enqueue the same arguments again and again (enqueues/s, and
//!   the rows the table gained);
//! - `drain`: 20,000 no-op jobs enqueued in batches, the table analyzed (PostgreSQL),
//!   then 4 workers run them (jobs/s);
//! - `latency`: a waiting worker, one job at a time: enqueue to start, p50 and p90.
//!
//! Each queue gets a pool of 20 connections and 4 workers (Loco's `num_workers`, our
//! Worker's concurrency); Loco's poll interval is 1 s, its default.
//!
//! ```sh
//! BENCH_PG_URL=postgres://postgres@127.0.0.1:5432/loco_bench \
//!   cargo run --release --example queue_bench
//! ```
//! (BENCH_JOBS, BENCH_CALLS, BENCH_LATENCY_JOBS change the sizes, BENCH_REPEAT the rounds,
//! whose medians it prints.) bench/loco.sh runs it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use loco_rs::app::AppContext;
use loco_rs::bgworker::{BackgroundWorker, Queue};
use loco_rs::config::{PostgresQueueConfig, SqliteQueueConfig};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use serde::{Deserialize, Serialize};
use task_dedup_loco::TaskDedupQueue;

static DONE: AtomicU64 = AtomicU64::new(0);
static STARTED: LazyLock<Mutex<HashMap<(u64, u64), Instant>>> = LazyLock::new(Mutex::default);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct NoopArgs {
    n: u64,
    run: u64,
}

struct NoopWorker;

#[async_trait]
impl BackgroundWorker<NoopArgs> for NoopWorker {
    fn build(_ctx: &AppContext) -> Self {
        NoopWorker
    }
    async fn perform(&self, args: NoopArgs) -> loco_rs::Result<()> {
        STARTED
            .lock()
            .unwrap()
            .insert((args.run, args.n), Instant::now());
        DONE.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Subject {
    name: &'static str,
    queue: Arc<Queue>,
    /// Counts the rows of the subject's table.
    db: DatabaseConnection,
    table: &'static str,
}

async fn rows(subject: &Subject) -> i64 {
    let row = subject
        .db
        .query_one_raw(sea_orm::Statement::from_string(
            subject.db.get_database_backend(),
            format!("SELECT COUNT(*) AS n FROM {}", subject.table),
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get::<i64>("", "n").unwrap()
}

/// `calls` enqueues from 16 clients: successful enqueues per second, and the calls that
/// failed (Loco's SQLite queue answers some with "database is locked").
async fn enqueue_storm(subject: &Subject, calls: u64, distinct: bool, run: u64) -> (f64, u64) {
    let clients = 16;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let queue = subject.queue.clone();
        tasks.push(tokio::spawn(async move {
            let mut failed = 0;
            for i in 0..calls / clients {
                let n = if distinct { c * 1_000_000 + i } else { 0 };
                let args = NoopArgs { n, run };
                if queue
                    .enqueue("NoopWorker".into(), None, args, None, None)
                    .await
                    .is_err()
                {
                    failed += 1;
                }
            }
            failed
        }));
    }
    let mut failed = 0;
    for t in tasks {
        failed += t.await.unwrap();
    }
    let done = (calls / clients * clients - failed) as f64;
    (done / started.elapsed().as_secs_f64(), failed)
}

async fn drain(subject: &Subject, jobs: u64, run: u64) -> f64 {
    let mut n = 10_000_000;
    for _ in 0..jobs / 500 {
        let batch: Vec<(NoopArgs, Option<i32>)> = (0..500)
            .map(|_| {
                n += 1;
                (NoopArgs { n, run }, None)
            })
            .collect();
        subject
            .queue
            .enqueue_batch("NoopWorker".into(), None, batch, None)
            .await
            .unwrap();
    }
    // Statistics, as autovacuum gathers them within its minute: on a table that has
    // none yet, PostgreSQL expects a handful of queued rows and plans each claim (ours
    // and Loco's) as a scan and sort of the whole backlog.
    if subject.db.get_database_backend() == sea_orm::DbBackend::Postgres {
        subject
            .db
            .execute_unprepared(&format!("ANALYZE {}", subject.table))
            .await
            .unwrap();
    }
    DONE.store(0, Ordering::Relaxed);
    let started = Instant::now();
    let runner = {
        let queue = subject.queue.clone();
        tokio::spawn(async move { queue.run(Vec::new()).await })
    };
    while DONE.load(Ordering::Relaxed) < jobs {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    subject.queue.shutdown().unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), runner).await;
    rate
}

/// Enqueue-to-start of `count` jobs, one at a time, into a waiting worker.
async fn latency(subject: &Subject, count: u64, run: u64) -> (f64, f64) {
    let runner = {
        let queue = subject.queue.clone();
        tokio::spawn(async move { queue.run(Vec::new()).await })
    };
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut waits = Vec::new();
    for i in 0..count {
        let n = 20_000_000 + i;
        let enqueued = Instant::now();
        subject
            .queue
            .enqueue("NoopWorker".into(), None, NoopArgs { n, run }, None, None)
            .await
            .unwrap();
        let started = loop {
            if let Some(at) = STARTED.lock().unwrap().get(&(run, n)).copied() {
                break at;
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        };
        waits.push(started.duration_since(enqueued).as_secs_f64() * 1_000.0);
        // A pause, so that each job meets an idle worker.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    subject.queue.shutdown().unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), runner).await;
    waits.sort_by(f64::total_cmp);
    let at = |q: f64| waits[((waits.len() as f64 - 1.0) * q) as usize];
    (at(0.5), at(0.9))
}

/// task-dedup-loco on a pool of 20 connections, as Loco's queues are given below.
async fn ours(url: &str) -> Subject {
    use migration::MigratorTrait;
    let mut options = sea_orm::ConnectOptions::new(url);
    options.max_connections(20).sqlx_logging(false);
    let table_db = task_dedup::connect_with(options).await.unwrap();
    migration::Migrator::fresh(&table_db).await.unwrap();
    let queue = TaskDedupQueue::builder(table_db.clone())
        .worker(|w| w.concurrency(4))
        .build();
    let queue = Arc::new(Queue::from_provider(Arc::new(queue)));
    queue.register(NoopWorker).await.unwrap();
    Subject {
        name: "",
        queue,
        db: table_db,
        table: "task_run",
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let pg = std::env::var("BENCH_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/loco_bench".into());
    let jobs = env("BENCH_JOBS", 20_000);
    let calls = env("BENCH_CALLS", 8_000);
    let dir = std::env::temp_dir().join(format!("loco-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite = |name: &str| format!("sqlite://{}?mode=rwc", dir.join(name).display());

    let repeat = env("BENCH_REPEAT", 3);
    let latency_jobs = env("BENCH_LATENCY_JOBS", 50);
    let names = [
        "task-dedup-loco (PostgreSQL)",
        "Loco PgQueue",
        "task-dedup-loco (SQLite)",
        "Loco SqliteQueue",
    ];
    // [subject][round] = (creates, repeats, rows grown, drain, p50, p90, failed calls)
    let mut results: Vec<Vec<[f64; 7]>> = vec![Vec::new(); names.len()];
    for round in 0..repeat {
        // Rounds alternate the subjects, so that a slow minute of the machine falls on
        // all of them.
        for (subject_no, name) in names.into_iter().enumerate() {
            let run = round * 10 + subject_no as u64;
            let make = || async {
                let mut subject = match subject_no {
                    0 => ours(&pg).await,
                    2 => ours(&sqlite("ours.sqlite")).await,
                    1 => {
                        let config: PostgresQueueConfig = serde_json::from_value(serde_json::json!({
                            "uri": pg, "max_connections": 20, "num_workers": 4, "poll_interval_sec": 1,
                        }))
                        .unwrap();
                        let queue = Arc::new(
                            loco_rs::bgworker::pg::create_provider(&config)
                                .await
                                .unwrap(),
                        );
                        queue.setup().await.unwrap();
                        queue.clear().await.unwrap();
                        queue.register(NoopWorker).await.unwrap();
                        Subject {
                            name: "",
                            queue,
                            db: sea_orm::Database::connect(&pg).await.unwrap(),
                            table: "pg_loco_queue",
                        }
                    }
                    _ => {
                        let url = sqlite("loco.sqlite");
                        let config: SqliteQueueConfig = serde_json::from_value(serde_json::json!({
                            "uri": url, "max_connections": 20, "num_workers": 4, "poll_interval_sec": 1,
                        }))
                        .unwrap();
                        let queue = Arc::new(
                            loco_rs::bgworker::sqlt::create_provider(&config)
                                .await
                                .unwrap(),
                        );
                        queue.setup().await.unwrap();
                        queue.clear().await.unwrap();
                        queue.register(NoopWorker).await.unwrap();
                        Subject {
                            name: "",
                            queue,
                            db: sea_orm::Database::connect(&url).await.unwrap(),
                            table: "sqlt_loco_queue",
                        }
                    }
                };
                subject.name = name;
                subject
            };
            // A fresh subject per phase: each `run` ends with its queue's shutdown.
            let subject = make().await;
            let (creates, creates_failed) = enqueue_storm(&subject, calls, true, run).await;
            let before = rows(&subject).await;
            let (repeats, repeats_failed) = enqueue_storm(&subject, calls, false, run).await;
            let grew = rows(&subject).await - before;
            let drained = drain(&make().await, jobs, run).await;
            let (p50, p90) = latency(&make().await, latency_jobs, run).await;
            println!(
                "round {round}, {name}: creates {creates:.0}/s ({creates_failed} failed), repeats {repeats:.0}/s ({repeats_failed} failed, +{grew} rows), drain {drained:.0} jobs/s, enqueue-to-start p50 {p50:.1} ms p90 {p90:.1} ms"
            );
            results[subject_no].push([
                creates,
                repeats,
                grew as f64,
                drained,
                p50,
                p90,
                (creates_failed + repeats_failed) as f64,
            ]);
        }
    }
    let median = |subject: usize, field: usize| {
        let mut values: Vec<f64> = results[subject].iter().map(|r| r[field]).collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    println!("\nmedians of {repeat} rounds ({jobs} jobs drained, {calls} calls per storm, {latency_jobs} latency jobs):");
    for (subject, name) in names.iter().enumerate() {
        println!(
            "{name}: creates {:.0}/s, repeats {:.0}/s (+{:.0} rows), drain {:.0} jobs/s, enqueue-to-start p50 {:.1} ms p90 {:.1} ms, failed calls {:.0}",
            median(subject, 0),
            median(subject, 1),
            median(subject, 2),
            median(subject, 3),
            median(subject, 4),
            median(subject, 5),
            median(subject, 6)
        );
    }
    // Ratios of the medians, task-dedup-loco over Loco's queue on the same database.
    for (ours, loco, db) in [(0, 1, "PostgreSQL"), (2, 3, "SQLite")] {
        println!(
            "ratios on {db}, task-dedup-loco / Loco: creates {:.2}, repeats {:.2}, drain {:.2}, p50 latency {:.3}",
            median(ours, 0) / median(loco, 0),
            median(ours, 1) / median(loco, 1),
            median(ours, 3) / median(loco, 3),
            median(ours, 4) / median(loco, 4)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
