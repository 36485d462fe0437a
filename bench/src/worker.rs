//! The worker workloads.
//!
//! - `worker`: `--ops` no-op tasks enqueued up front (untimed), then drained; timed from
//!   the start of the drain to the last task recorded `succeeded`. `find-or-enqueue`:
//!   `--workers` library [`Worker`]s of `--concurrency` each; `raw-dedup`: as many
//!   hand-written claim/complete loops on sqlx (`UPDATE ... RETURNING` over `FOR UPDATE
//!   SKIP LOCKED`, or `SELECT ... FOR UPDATE SKIP LOCKED` and `UPDATE` in a transaction
//!   on MySQL), which stop when the queue is empty. Same pool.
//! - `worker-latency`: `--ops` tasks enqueued at `--rate` per second by `--clients`
//!   callers while the workers run; each handler measures from just before the
//!   `find_or_enqueue` that created its task to its own start.
//! - `worker-idle`: the workers on an empty queue for `--idle-secs`; every statement the
//!   process sends is counted (sqlx's statement log, counted by a tracing layer).
//! - `worker-blocked`: `--blocked` keys each with a running task and a queued follow-up
//!   (one run per key: the follow-ups are not due), then `--ops` free tasks behind them in
//!   claim order; each `claim_many` of `--concurrency` tasks is timed until every free
//!   task is claimed. The same free tasks alone are the baseline. Statistics are fresh
//!   (`ANALYZE`) in both.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sea_orm::sqlx::{self, Row};
use sea_orm::{
    ConnectOptions, ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait,
};
use task_dedup::{
    HandlerError, Job, NewTask, Scope, Task, TaskDedup, TaskKey, TaskLifecycle, Wakeups, Worker,
    task_run,
};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::args::{Args, Strategy, WakeupMode, Workload, name};

/// Runs one worker workload and prints its line.
pub async fn run(args: &Args) -> Result<(), String> {
    crate::run::prepare_schema(args).await?;
    match args.workload {
        Workload::Worker => throughput(args).await,
        Workload::WorkerLatency => latency(args).await,
        Workload::WorkerIdle => idle(args).await,
        Workload::WorkerBlocked => blocked(args).await,
        _ => Err("not a worker workload".into()),
    }
}

pub(crate) async fn open(args: &Args, log_statements: bool) -> Result<DatabaseConnection, String> {
    let mut options = ConnectOptions::new(args.url.clone());
    options
        .max_connections(args.pool)
        .min_connections(args.pool)
        .sqlx_logging(log_statements)
        .test_before_acquire_if_idle_for(Duration::from_secs(30));
    task_dedup::connect_with_pooler(options, crate::args::pooler_mode(args))
        .await
        .map_err(|e| e.to_string())
}

fn dialect(db: &DatabaseConnection) -> &'static str {
    match db.get_database_backend() {
        DbBackend::Postgres => "postgres",
        DbBackend::MySql => "mysql",
        _ => "sqlite",
    }
}

/// `n` tasks with keys of their own, enqueued in batches.
async fn prefill(db: &DatabaseConnection, phase: &str, n: usize) -> Result<(), String> {
    prefill_scoped(db, phase, n, Scope::Active, false).await
}

/// `n` tasks of `scope` with keys of their own, enqueued in batches.
pub(crate) async fn prefill_scoped(
    db: &DatabaseConnection,
    phase: &str,
    n: usize,
    scope: Scope,
    concurrent: bool,
) -> Result<(), String> {
    let keys: Vec<usize> = (0..n).collect();
    for chunk in keys.chunks(1_000) {
        let tasks = chunk
            .iter()
            .map(|i| {
                TaskKey::new("bench", "noop", format!("{phase}-{i}"))
                    .map(|key| NewTask::new(key).scope(scope).concurrent(concurrent))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        db.find_or_enqueue_many(tasks)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Gives the planner statistics of the prefilled queue, as autovacuum (PostgreSQL) and
/// InnoDB's persistent statistics do for a table in service. The bench recreates its
/// tables, and PostgreSQL plans a claim on a never-analyzed table from default
/// estimates: a near tie between the claim index in order and a bitmap scan of every
/// queued task with a sort, which reads (and probes the key of) all 10,000 per claim.
/// Which one won flipped from run to run and made drains 0.5-2 x apart.
pub(crate) async fn analyze(db: &DatabaseConnection) -> Result<(), String> {
    let sql = match db.get_database_backend() {
        DbBackend::Postgres => "ANALYZE task_run",
        DbBackend::MySql => "ANALYZE TABLE task_run",
        _ => "ANALYZE",
    };
    db.execute_unprepared(sql)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn wakeups(args: &Args) -> Wakeups {
    match args.wakeups {
        WakeupMode::Auto => Wakeups::Auto,
        WakeupMode::Poll => Wakeups::Poll,
    }
}

/// The prefilled tasks (type `noop`, no payload) as a typed task: a unit struct, which
/// decodes from the missing payload (`null`).
#[derive(serde::Serialize, serde::Deserialize)]
struct Noop;

impl Task for Noop {
    const TASK_TYPE: &'static str = "noop";

    fn resource_key(&self) -> String {
        "noop".to_owned()
    }
}

/// Starts `--workers` library workers (`typed`: with a registered typed handler) whose handler calls `on_task`, until `shutdown`.
fn start_workers<F>(
    args: &Args,
    db: &DatabaseConnection,
    shutdown: &CancellationToken,
    on_task: F,
) -> Result<
    Vec<tokio::task::JoinHandle<Result<task_dedup::WorkerReport, task_dedup::DedupError>>>,
    String,
>
where
    F: Fn(&task_run::Model) + Clone + Send + Sync + 'static,
{
    let mut running = Vec::new();
    for w in 0..args.workers {
        let on_task = on_task.clone();
        let builder = Worker::builder(db.clone())
            .id(format!("bench-{w}"))
            .concurrency(args.concurrency)
            .wakeups(wakeups(args));
        let builder = match &args.listen_url {
            Some(url) => builder.listen_url(url.clone()),
            None => builder,
        };
        let builder = if args.strategy == Strategy::Typed {
            builder.register::<Noop>(move |job: Job<Noop>| {
                on_task(job.task());
                async { Ok::<_, HandlerError>(()) }
            })
        } else {
            builder.handler(move |task: task_run::Model, _| {
                on_task(&task);
                async { Ok(None) }
            })
        };
        let worker = builder.build().map_err(|e| e.to_string())?;
        running.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    Ok(running)
}

async fn stop(
    running: Vec<tokio::task::JoinHandle<Result<task_dedup::WorkerReport, task_dedup::DedupError>>>,
) -> Result<(), String> {
    for worker in running {
        worker
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

async fn throughput(args: &Args) -> Result<(), String> {
    let statements = args.count_statements.then(count_statements).transpose()?;
    let db = open(args, statements.is_some()).await?;
    let mut seconds = 0.0;
    let mut sent = 0;
    for (phase, n) in [("warmup", args.warmup), ("run", args.ops)] {
        db.execute_unprepared("DELETE FROM task_run")
            .await
            .map_err(|e| e.to_string())?;
        prefill_scoped(&db, phase, n, Scope::Active, args.concurrent).await?;
        analyze(&db).await?;
        let started = Instant::now();
        let before = statements.as_ref().map_or(0, |s| s.load(Ordering::Relaxed));
        match args.strategy {
            Strategy::FindOrEnqueue | Strategy::Typed => drain_with_workers(args, &db, n).await?,
            Strategy::RawDedup => drain_by_hand(args, &db).await?,
            _ => {
                return Err("the worker workload runs find-or-enqueue, typed and raw-dedup".into());
            }
        }
        seconds = started.elapsed().as_secs_f64();
        sent = statements.as_ref().map_or(0, |s| s.load(Ordering::Relaxed)) - before;
    }
    let done = count(
        &db,
        "SELECT COUNT(*) AS n FROM task_run WHERE status = 'succeeded' AND attempts = 1",
    )
    .await?;
    if done != args.ops as i64 {
        return Err(format!("{done} of {} tasks succeeded once", args.ops));
    }
    println!(
        "{} worker {} {seconds:.3} {:.0} 0 0 0 0",
        name(&args.strategy),
        args.ops,
        args.ops as f64 / seconds
    );
    println!(
        "# dialect={} workers={} concurrency={} pool={} statements_per_task={}",
        dialect(&db),
        args.workers,
        args.concurrency,
        args.pool,
        if statements.is_some() {
            format!("{:.2}", sent as f64 / args.ops as f64)
        } else {
            "-".to_owned()
        }
    );
    Ok(())
}

pub(crate) async fn drain_with_workers(
    args: &Args,
    db: &DatabaseConnection,
    n: usize,
) -> Result<(), String> {
    let shutdown = CancellationToken::new();
    let started = Arc::new(AtomicUsize::new(0));
    let last = shutdown.clone();
    let running = start_workers(args, db, &shutdown, move |_| {
        if started.fetch_add(1, Ordering::Relaxed) + 1 == n {
            last.cancel();
        }
    })?;
    // The shutdown waits for the handlers that run, so the last task is complete when
    // every worker returned.
    stop(running).await
}

/// The hand-written loop: claim, complete, until the queue is empty.
async fn drain_by_hand(args: &Args, db: &DatabaseConnection) -> Result<(), String> {
    let loops = args.workers * args.concurrency;
    let mut running = Vec::new();
    for l in 0..loops {
        let db = db.clone();
        let worker = format!("raw-{l}");
        running.push(tokio::spawn(async move {
            while let Some(id) = claim_by_hand(&db, &worker).await? {
                complete_by_hand(&db, &worker, id).await?;
            }
            Ok::<(), sqlx::Error>(())
        }));
    }
    for looped in running {
        looped
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Claims the next task; returns its id (and reads its payload, as a handler would
/// need it).
async fn claim_by_hand(db: &DatabaseConnection, worker: &str) -> Result<Option<Uuid>, sqlx::Error> {
    match db.get_database_backend() {
        DbBackend::Postgres => {
            let row = sqlx::query(
                "UPDATE task_run SET status = 'running', attempts = attempts + 1, lease_owner = $1, \
                 lease_expires_at = statement_timestamp() + interval '30 seconds', \
                 started_at = statement_timestamp(), updated_at = statement_timestamp() \
                 WHERE id = (SELECT id FROM task_run WHERE status = 'queued' \
                 AND run_at <= statement_timestamp() \
                 ORDER BY priority DESC, run_at, created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED) \
                 RETURNING id, payload",
            )
            .bind(worker)
            .fetch_optional(db.get_postgres_connection_pool())
            .await?;
            row.map(|row| row.try_get(0)).transpose()
        }
        DbBackend::MySql => {
            let mut txn = db.get_mysql_connection_pool().begin().await?;
            let next = sqlx::query(
                "SELECT id, payload FROM task_run WHERE status = 'queued' \
                 AND run_at <= UTC_TIMESTAMP(6) \
                 ORDER BY priority DESC, run_at, created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED",
            )
            .fetch_optional(&mut *txn)
            .await?;
            let Some(next) = next else {
                txn.commit().await?;
                return Ok(None);
            };
            let id: Uuid = next.try_get(0)?;
            sqlx::query(
                "UPDATE task_run SET status = 'running', attempts = attempts + 1, lease_owner = ?, \
                 lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND, \
                 started_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6) WHERE id = ?",
            )
            .bind(worker)
            .bind(id)
            .execute(&mut *txn)
            .await?;
            txn.commit().await?;
            Ok(Some(id))
        }
        _ => {
            let row = sqlx::query(
                "UPDATE task_run SET status = 'running', attempts = attempts + 1, lease_owner = ?, \
                 lease_expires_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now', '+30 seconds'), \
                 started_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'), \
                 updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
                 WHERE id = (SELECT id FROM task_run WHERE status = 'queued' \
                 AND run_at <= strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
                 ORDER BY priority DESC, run_at, created_at, id LIMIT 1) \
                 RETURNING id, payload",
            )
            .bind(worker)
            .fetch_optional(db.get_sqlite_connection_pool())
            .await?;
            row.map(|row| row.try_get(0)).transpose()
        }
    }
}

async fn complete_by_hand(
    db: &DatabaseConnection,
    worker: &str,
    id: Uuid,
) -> Result<(), sqlx::Error> {
    match db.get_database_backend() {
        DbBackend::Postgres => {
            sqlx::query(
                "UPDATE task_run SET status = 'succeeded', lease_expires_at = NULL, \
                 finished_at = statement_timestamp(), updated_at = statement_timestamp() \
                 WHERE id = $1 AND status = 'running' AND lease_owner = $2",
            )
            .bind(id)
            .bind(worker)
            .execute(db.get_postgres_connection_pool())
            .await?;
        }
        DbBackend::MySql => {
            sqlx::query(
                "UPDATE task_run SET status = 'succeeded', lease_expires_at = NULL, \
                 finished_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6) \
                 WHERE id = ? AND status = 'running' AND lease_owner = ?",
            )
            .bind(id)
            .bind(worker)
            .execute(db.get_mysql_connection_pool())
            .await?;
        }
        _ => {
            sqlx::query(
                "UPDATE task_run SET status = 'succeeded', lease_expires_at = NULL, \
                 finished_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'), \
                 updated_at = strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') \
                 WHERE id = ? AND status = 'running' AND lease_owner = ?",
            )
            .bind(id)
            .bind(worker)
            .execute(db.get_sqlite_connection_pool())
            .await?;
        }
    }
    Ok(())
}

async fn latency(args: &Args) -> Result<(), String> {
    if args.strategy != Strategy::FindOrEnqueue || args.rate <= 0.0 {
        return Err("worker-latency runs find-or-enqueue at a --rate above 0".into());
    }
    let db = open(args, false).await?;
    let epoch = Instant::now();
    let n = args.ops;
    // The application's pool, which `--hog` requests keep busy; the workers share it
    // unless `--own-pool`. Tasks are then enqueued through `db`, a pool of their own.
    let app = if args.hog > 0 || args.own_pool {
        open(args, false).await?
    } else {
        db.clone()
    };
    let worker_db = if args.own_pool {
        open(args, false).await?
    } else {
        app.clone()
    };
    let hogging = CancellationToken::new();
    for _ in 0..args.hog {
        let (app, stop, hold) = (
            app.clone(),
            hogging.clone(),
            Duration::from_millis(args.hog_ms),
        );
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let Ok(txn) = app.begin().await else { continue };
                let _ = txn.execute_unprepared("SELECT 1").await;
                tokio::time::sleep(hold).await;
                let _ = txn.commit().await;
            }
        });
    }
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let shutdown = CancellationToken::new();
    let (seen, last) = (latencies.clone(), shutdown.clone());
    let running = start_workers(args, &worker_db, &shutdown, move |task| {
        let now = epoch.elapsed().as_micros() as u64;
        let enqueued = task
            .payload
            .as_ref()
            .and_then(|p| p["t"].as_u64())
            .unwrap_or(now);
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.push(now.saturating_sub(enqueued));
        if seen.len() == n {
            last.cancel();
        }
    })?;
    // Let the workers find the queue empty and settle into their idle wait.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let clients = args.clients.max(1);
    let period = Duration::from_secs_f64(clients as f64 / args.rate);
    let mut enqueuers = Vec::new();
    let in_transaction = args.in_transaction;
    for c in 0..clients {
        let db = db.clone();
        enqueuers.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(period);
            let mut i = c;
            while i < n {
                ticks.tick().await;
                let t = epoch.elapsed().as_micros() as u64;
                let task = TaskKey::new("bench", "noop", format!("lat-{i}"))
                    .map(|key| NewTask::new(key).with_payload(serde_json::json!({ "t": t })))
                    .map_err(|e| e.to_string())?;
                if in_transaction {
                    let txn = db.begin().await.map_err(|e| e.to_string())?;
                    txn.find_or_enqueue(task).await.map_err(|e| e.to_string())?;
                    txn.commit().await.map_err(|e| e.to_string())?;
                } else {
                    db.find_or_enqueue(task).await.map_err(|e| e.to_string())?;
                }
                i += clients;
            }
            Ok::<(), String>(())
        }));
    }
    for enqueuer in enqueuers {
        enqueuer.await.map_err(|e| e.to_string())??;
    }
    tokio::time::timeout(Duration::from_secs(args.deadline_secs), stop(running))
        .await
        .map_err(|_| "the workers did not start every task before the deadline")??;
    hogging.cancel();
    let mut latencies = latencies.lock().unwrap_or_else(|p| p.into_inner()).clone();
    latencies.sort_unstable();
    let at = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    println!(
        "{} worker-latency {n} rate={} wakeups={} listen_url={} in_transaction={} hog={} own_pool={} p50_us={} p99_us={} max_us={}",
        dialect(&db),
        args.rate,
        name(&args.wakeups),
        args.listen_url.is_some(),
        args.in_transaction,
        args.hog,
        args.own_pool,
        at(0.50),
        at(0.99),
        at(1.0)
    );
    Ok(())
}

async fn idle(args: &Args) -> Result<(), String> {
    let statements = count_statements()?;
    let db = open(args, true).await?;
    let shutdown = CancellationToken::new();
    let running = start_workers(args, &db, &shutdown, |_| {})?;
    // Past the start-up and the poll's back-off, then counted.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = statements.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let counted = statements.load(Ordering::Relaxed) - before;
    shutdown.cancel();
    stop(running).await?;
    println!(
        "{} worker-idle workers={} wakeups={} statements_per_sec={:.2} per_worker={:.2}",
        dialect(&db),
        args.workers,
        name(&args.wakeups),
        counted as f64 / args.idle_secs as f64,
        counted as f64 / args.idle_secs as f64 / args.workers as f64
    );
    Ok(())
}

/// Starts counting the statements sqlx logs (a pool must log them: `open(args, true)`).
fn count_statements() -> Result<Arc<AtomicU64>, String> {
    use tracing_subscriber::layer::SubscriberExt;

    let statements = Arc::new(AtomicU64::new(0));
    let subscriber = tracing_subscriber::registry().with(CountStatements(statements.clone()));
    tracing::subscriber::set_global_default(subscriber).map_err(|e| e.to_string())?;
    Ok(statements)
}

/// Counts sqlx's statement log events: one per statement sent.
struct CountStatements(Arc<AtomicU64>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountStatements {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "sqlx::query" {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn count(db: &DatabaseConnection, sql: &str) -> Result<i64, String> {
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no row")?;
    row.try_get("", "n").map_err(|e| e.to_string())
}

/// Head-of-line blocking: claim latency of `--ops` free tasks, alone and behind
/// `--blocked` follow-ups of running keys.
async fn blocked(args: &Args) -> Result<(), String> {
    let db = open(args, false).await?;
    let lease = Duration::from_secs(3_600);
    for blocked in [0, args.blocked] {
        db.execute_unprepared("DELETE FROM task_run")
            .await
            .map_err(|e| e.to_string())?;
        if blocked > 0 {
            prefill_scoped(&db, "blocked", blocked, Scope::Queued, false).await?;
            let mut running = 0;
            while running < blocked {
                let claimed = db
                    .claim_many("holder", &[], lease, 1_000)
                    .await
                    .map_err(|e| e.to_string())?;
                running += claimed.len();
            }
            // Their follow-ups: queued while the keys run.
            prefill_scoped(&db, "blocked", blocked, Scope::Queued, false).await?;
        }
        prefill(&db, "free", args.ops).await?;
        let analyze = match db.get_database_backend() {
            DbBackend::MySql => "ANALYZE TABLE task_run",
            DbBackend::Postgres => "ANALYZE task_run",
            _ => "ANALYZE",
        };
        db.execute_unprepared(analyze)
            .await
            .map_err(|e| e.to_string())?;
        let mut micros = Vec::new();
        let mut claimed = 0;
        while claimed < args.ops {
            let started = Instant::now();
            let batch = db
                .claim_many("bench", &[], lease, args.concurrency)
                .await
                .map_err(|e| e.to_string())?;
            micros.push(started.elapsed().as_micros() as u64);
            if batch.is_empty() {
                return Err(format!("{claimed} of {} free tasks claimed", args.ops));
            }
            if let Some(task) = batch.iter().find(|t| !t.resource_key.starts_with("free-")) {
                return Err(format!(
                    "a blocked follow-up was claimed: {}",
                    task.resource_key
                ));
            }
            claimed += batch.len();
        }
        micros.sort_unstable();
        let at = |q: f64| micros[((micros.len() - 1) as f64 * q).round() as usize];
        println!(
            "{} worker-blocked blocked={blocked} free={} batch={} claims={} median_us={} p90_us={} p99_us={}",
            dialect(&db),
            args.ops,
            args.concurrency,
            micros.len(),
            at(0.5),
            at(0.9),
            at(0.99)
        );
    }
    Ok(())
}
