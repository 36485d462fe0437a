//! One run: schema, warm-up, timed phase, check, report.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sea_orm::{ConnectOptions, ConnectionTrait, DatabaseConnection, DbBackend};
use task_dedup::TaskKey;
use task_dedup_migration::{Migrator, MigratorTrait};
use tokio::sync::Barrier;

use crate::args::{Args, Strategy, Workload, name};
use crate::check::{TableCheck, check};
use crate::strategy::{Outcome, Runner};
use crate::workload::{XorShift, hot_key, key};

/// The result of a run.
#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub strategy: Strategy,
    pub workload: Workload,
    pub dialect: &'static str,
    pub clients: usize,
    pub pool: u32,
    pub ops: usize,
    pub seconds: f64,
    pub ops_per_sec: f64,
    pub created: usize,
    pub errors: usize,
    pub p50_us: u64,
    pub p99_us: u64,
    pub cpu_us_per_call: f64,
    /// Active tasks the churn finisher completed during the run.
    pub finished_by_churn: u64,
    /// Keys the churn finisher found with more than one active task (a duplicate it
    /// would otherwise hide from the check afterwards), one per extra task.
    pub churn_duplicates: u64,
    /// Calls still running at the deadline, abandoned (counted neither as ops nor errors).
    pub abandoned: usize,
    pub deadline_hit: bool,
    /// Finished rows preloaded (`--history`).
    pub history: u64,
    /// Rows the pruner beside the callers deleted, and its passes.
    pub pruned: u64,
    pub prune_passes: u64,
    #[serde(flatten)]
    pub table: TableCheck,
}

impl Report {
    pub fn print(&self, args: &Args) {
        if args.json {
            match serde_json::to_string(self) {
                Ok(json) => println!("{json}"),
                Err(e) => eprintln!("task-dedup-bench: {e}"),
            }
            return;
        }
        println!(
            "{} {} {} {:.3} {:.0} {} {} {} {}",
            name(&self.strategy),
            name(&self.workload),
            self.ops,
            self.seconds,
            self.ops_per_sec,
            self.table.duplicates_active,
            self.table.active_jobs,
            self.created,
            self.errors
        );
        println!(
            "# dialect={} clients={} pool={} p50_us={} p99_us={} cpu_us_per_call={:.1} rows={} finished_by_churn={} abandoned={} deadline_hit={} churn_duplicates={} history={} pruned={} prune_passes={}",
            self.dialect,
            self.clients,
            self.pool,
            self.p50_us,
            self.p99_us,
            self.cpu_us_per_call,
            self.table.rows,
            self.finished_by_churn,
            self.abandoned,
            self.deadline_hit,
            self.churn_duplicates,
            self.history,
            self.pruned,
            self.prune_passes
        );
    }
}

/// What one phase's callers did.
#[derive(Default)]
struct Tally {
    ops: usize,
    created: usize,
    errors: usize,
    latencies_us: Vec<u64>,
    first_error: Option<String>,
    abandoned: usize,
}

pub async fn run(args: &Args) -> Result<Report, String> {
    if args.clients == 0 || args.pool == 0 || args.keys == 0 {
        return Err("--clients, --pool and --keys must be at least 1".into());
    }
    prepare_schema(args).await?;
    let db = open_pool(args).await?;
    let dialect = match db.get_database_backend() {
        DbBackend::Postgres => "postgres",
        DbBackend::MySql => "mysql",
        _ => "sqlite",
    };
    if matches!(
        args.strategy,
        Strategy::AdvisoryLock | Strategy::RawOneStatement
    ) && dialect != "postgres"
    {
        return Err(format!("{} runs on PostgreSQL only", name(&args.strategy)));
    }
    let runner = Arc::new(Runner::new(args.strategy, db.clone()));

    let warmup_deadline = Instant::now() + Duration::from_secs(args.deadline_secs);
    phase(args, &runner, &db, "warmup", args.warmup, warmup_deadline).await;
    db.execute_unprepared("DELETE FROM task_run")
        .await
        .map_err(|e| e.to_string())?;
    let stop_pruner = Arc::new(AtomicBool::new(false));
    let pruner = if args.history > 0 {
        crate::history::preload(&db, args.history, crate::history::Age::Kept).await?;
        Some(crate::history::start_pruner(args, stop_pruner.clone()).await?)
    } else {
        None
    };

    let deadline = Instant::now() + Duration::from_secs(args.deadline_secs);
    let cpu_before = process_cpu_us();
    let started = Instant::now();
    let (mut tally, churn) = phase(args, &runner, &db, "run", args.ops, deadline).await;
    let seconds = started.elapsed().as_secs_f64();
    let deadline_hit = Instant::now() > deadline;
    let cpu_us = process_cpu_us().saturating_sub(cpu_before);
    stop_pruner.store(true, Ordering::Relaxed);
    let (pruned, prune_passes) = match pruner {
        Some(pruner) => pruner.await.map_err(|e| e.to_string())?,
        None => (0, 0),
    };

    if let Some(error) = &tally.first_error {
        eprintln!("task-dedup-bench: first error: {error}");
    }
    let table = match &args.direct_url {
        Some(url) => {
            let direct = task_dedup::connect(url).await.map_err(|e| e.to_string())?;
            check(&direct).await
        }
        None => check(&db).await,
    };
    let table = table.map_err(|e| e.to_string())?;
    tally.latencies_us.sort_unstable();
    let percentile = |p: f64| {
        let n = tally.latencies_us.len();
        if n == 0 {
            0
        } else {
            tally.latencies_us[((n as f64 * p) as usize).min(n - 1)]
        }
    };
    Ok(Report {
        strategy: args.strategy,
        workload: args.workload,
        dialect,
        clients: args.clients,
        pool: args.pool,
        ops: tally.ops,
        seconds,
        ops_per_sec: tally.ops as f64 / seconds.max(f64::EPSILON),
        created: tally.created,
        errors: tally.errors,
        p50_us: percentile(0.50),
        p99_us: percentile(0.99),
        cpu_us_per_call: cpu_us as f64 / tally.ops.max(1) as f64,
        finished_by_churn: churn.finished,
        churn_duplicates: churn.duplicates,
        abandoned: tally.abandoned,
        deadline_hit,
        history: args.history,
        pruned,
        prune_passes,
        table,
    })
}

/// Recreates task-dedup's tables with its migrations, on a connection of its own: a
/// pooled SQLite connection opened before a schema change would keep the old schema for
/// `ON CONFLICT` targets. Strategies that do not rely on the unique index get a table
/// without it, so their own correctness is what the check measures.
pub async fn prepare_schema(args: &Args) -> Result<(), String> {
    remove_sqlite_file(&args.url);
    let db = task_dedup::connect(args.direct_url.as_ref().unwrap_or(&args.url))
        .await
        .map_err(|e| e.to_string())?;
    // Dropped rather than migrated down: an unsafe strategy's run left the table without
    // its unique index, which the down migrations expect.
    for table in [
        "task_run",
        "task_dedup_paused",
        "task_dedup_limits",
        task_dedup_migration::MIGRATION_TABLE,
    ] {
        // CASCADE on PostgreSQL: the pooler mode's function returns task_run's rows.
        let cascade = match db.get_database_backend() {
            sea_orm::DbBackend::Postgres => " CASCADE",
            _ => "",
        };
        db.execute_unprepared(&format!("DROP TABLE IF EXISTS {table}{cascade}"))
            .await
            .map_err(|e| e.to_string())?;
    }
    // BENCH_MIGRATIONS=<n>: only the first n migrations, the schema as an earlier release
    // left it (e.g. 12: the indexes before the lean set), run by the same statements.
    let steps = match std::env::var("BENCH_MIGRATIONS") {
        Ok(n) => Some(
            n.parse::<u32>()
                .map_err(|e| format!("BENCH_MIGRATIONS: {e}"))?,
        ),
        Err(_) => None,
    };
    Migrator::up(&db, steps).await.map_err(|e| e.to_string())?;
    // An index's write cost: the same binary without it (bench/pairs.sh, BENCHMARKS.md
    // "Key-prefix lists and MariaDB pruners").
    if let Ok(index) = std::env::var("BENCH_DROP_INDEX") {
        let drop = match db.get_database_backend() {
            DbBackend::MySql => format!("ALTER TABLE task_run DROP INDEX {index}"),
            _ => format!("DROP INDEX {index}"),
        };
        db.execute_unprepared(&drop)
            .await
            .map_err(|e| e.to_string())?;
    }
    // A schema change tried before it becomes a migration (e.g. an index's write cost
    // on the drain, against the same binary without it): statements run after the
    // migrations, separated by `;`.
    if let Ok(sql) = std::env::var("BENCH_SQL") {
        for statement in sql.split(';').filter(|s| !s.trim().is_empty()) {
            db.execute_unprepared(statement)
                .await
                .map_err(|e| format!("BENCH_SQL: {e}"))?;
        }
    }
    // A limit on the bench's task type (`noop`), set high enough not to bind: what
    // limits cost a drain (bench/pairs.sh, BENCHMARKS.md "Limits per type").
    if let Ok(limit) = std::env::var("BENCH_LIMIT") {
        let limit = limit
            .parse::<u32>()
            .map_err(|e| format!("BENCH_LIMIT: {e}"))?;
        let mut limits = task_dedup::TypeLimits::new().max_running(limit);
        if std::env::var("BENCH_FAIR").is_ok() {
            limits = limits.fair_between_users();
        }
        task_dedup::TaskAdmin::set_limits(&db, "noop", &limits)
            .await
            .map_err(|e| e.to_string())?;
    }
    // A limit per user across all types, high enough not to bind: what it costs a drain
    // (every claim under its lock; BENCHMARKS.md "A limit per user across all types").
    if let Ok(limit) = std::env::var("BENCH_USER_LIMIT") {
        let limit = limit
            .parse::<u32>()
            .map_err(|e| format!("BENCH_USER_LIMIT: {e}"))?;
        task_dedup::TaskAdmin::set_user_limit(&db, limit)
            .await
            .map_err(|e| e.to_string())?;
    }
    if !args.strategy.uses_unique_index() {
        let drop = match db.get_database_backend() {
            DbBackend::MySql => "ALTER TABLE task_run DROP INDEX task_active_resource_uidx",
            _ => "DROP INDEX task_active_resource_uidx",
        };
        db.execute_unprepared(drop)
            .await
            .map_err(|e| e.to_string())?;
    }
    db.close().await.map_err(|e| e.to_string())
}

/// Starts SQLite runs from a fresh file: a file that earlier runs grew (free pages, a
/// long WAL) makes timings drift from run to run.
fn remove_sqlite_file(url: &str) {
    let Some(rest) = url.strip_prefix("sqlite://") else {
        return;
    };
    let path = rest.split('?').next().unwrap_or_default();
    if path.is_empty() || path.contains(":memory:") {
        return;
    }
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{path}{suffix}"));
    }
}

/// The pool every strategy runs on: the same settings whatever the strategy, opened up
/// front.
async fn open_pool(args: &Args) -> Result<DatabaseConnection, String> {
    let mut options = ConnectOptions::new(args.url.clone());
    options
        .max_connections(args.pool)
        .min_connections(args.pool)
        .sqlx_logging(false)
        .test_before_acquire_if_idle_for(Duration::from_secs(30));
    task_dedup::connect_with_pooler(options, crate::args::pooler_mode(args))
        .await
        .map_err(|e| e.to_string())
}

/// What the churn finisher did.
#[derive(Default)]
struct Churn {
    finished: u64,
    duplicates: u64,
}

/// Runs `ops` calls over `args.clients` callers; with a churn workload, a finisher
/// completes active tasks meanwhile. Returns the tally and what the finisher did.
async fn phase(
    args: &Args,
    runner: &Arc<Runner>,
    db: &DatabaseConnection,
    label: &'static str,
    ops: usize,
    deadline: Instant,
) -> (Tally, Churn) {
    let done = Arc::new(AtomicBool::new(false));
    let finisher = (args.workload == Workload::Churn)
        .then(|| tokio::spawn(churn_finisher(db.clone(), args.keys, done.clone())));

    let next = Arc::new(AtomicUsize::new(0));
    let rounds = ops.div_ceil(args.clients);
    let barriers = Arc::new((Barrier::new(args.clients), Barrier::new(args.clients)));
    let stop = Arc::new(AtomicBool::new(false));
    let mut callers = Vec::with_capacity(args.clients);
    for client in 0..args.clients {
        let (runner, next, barriers, stop) =
            (runner.clone(), next.clone(), barriers.clone(), stop.clone());
        let (workload, keys, batch) = (args.workload, args.keys, args.batch.max(1));
        callers.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut rng = XorShift::new(client as u64 + 1);
            let past_deadline = || Instant::now() > deadline;
            if workload == Workload::Race {
                for round in 0..rounds {
                    // The leader decides for everyone whether to go on, so no caller
                    // is left waiting at a barrier the others abandoned.
                    if barriers.0.wait().await.is_leader() && past_deadline() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    barriers.1.wait().await;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let key = key(workload, label, client, round, keys, &mut rng);
                    call(&runner, key, None, &mut tally, deadline).await;
                }
            } else if workload.is_bulk() {
                loop {
                    let first = next.fetch_add(batch, Ordering::Relaxed);
                    if first >= ops || past_deadline() {
                        break;
                    }
                    let keys: Vec<TaskKey> = (first..first + batch)
                        .map(|seq| key(workload, label, client, seq, keys, &mut rng))
                        .collect();
                    call_batch(&runner, keys, &mut tally, deadline).await;
                }
            } else {
                loop {
                    let seq = next.fetch_add(1, Ordering::Relaxed);
                    if seq >= ops || past_deadline() {
                        break;
                    }
                    let key = key(workload, label, client, seq, keys, &mut rng);
                    let replace = (workload == Workload::Replace).then_some(seq as u64);
                    call(&runner, key, replace, &mut tally, deadline).await;
                }
            }
            tally
        }));
    }
    let mut total = Tally::default();
    for caller in callers {
        match caller.await {
            Ok(tally) => {
                total.ops += tally.ops;
                total.created += tally.created;
                total.errors += tally.errors;
                total.abandoned += tally.abandoned;
                total.latencies_us.extend(tally.latencies_us);
                total.first_error = total.first_error.or(tally.first_error);
            }
            // A caller that panicked lost its calls: an error, not silence.
            Err(panicked) => {
                total.errors += 1;
                total.first_error.get_or_insert(panicked.to_string());
            }
        }
    }
    done.store(true, Ordering::Relaxed);
    let churn = match finisher {
        Some(handle) => handle.await.unwrap_or_default(),
        None => Churn::default(),
    };
    (total, churn)
}

async fn call(
    runner: &Runner,
    key: TaskKey,
    replace: Option<u64>,
    tally: &mut Tally,
    deadline: Instant,
) {
    let started = Instant::now();
    // A call still running at the deadline is abandoned, neither an op nor an error.
    let call = runner.call(key, replace);
    let Ok(outcome) = tokio::time::timeout_at(deadline.into(), call).await else {
        tally.abandoned += 1;
        return;
    };
    tally
        .latencies_us
        .push(started.elapsed().as_micros().try_into().unwrap_or(u64::MAX));
    tally.ops += 1;
    match outcome {
        Ok(Outcome::Created) => tally.created += 1,
        Ok(Outcome::Existing) => {}
        Err(error) => {
            tally.errors += 1;
            tally.first_error.get_or_insert(error);
        }
    }
}

/// One batch: `keys.len()` ops, one latency.
async fn call_batch(runner: &Runner, keys: Vec<TaskKey>, tally: &mut Tally, deadline: Instant) {
    let started = Instant::now();
    let tasks = keys.len();
    let call = runner.call_batch(keys);
    let Ok(outcome) = tokio::time::timeout_at(deadline.into(), call).await else {
        tally.abandoned += tasks;
        return;
    };
    tally
        .latencies_us
        .push(started.elapsed().as_micros().try_into().unwrap_or(u64::MAX));
    tally.ops += tasks;
    match outcome {
        Ok(created) => tally.created += created,
        Err(error) => {
            tally.errors += 1;
            tally.first_error.get_or_insert(error);
        }
    }
}

/// Completes the active task of random hot keys until told to stop, with plain SQL
/// (the same for every strategy). Completing more than one task of a key means the
/// strategy let duplicates in: they are counted, since the check afterwards can no
/// longer see them.
async fn churn_finisher(db: DatabaseConnection, keys: usize, done: Arc<AtomicBool>) -> Churn {
    use sea_orm::sea_query::{Expr, ExprTrait, Query};
    use task_dedup::task_run::{self, Column};

    let mut rng = XorShift::new(u64::MAX / 3);
    let mut churn = Churn::default();
    while !done.load(Ordering::Relaxed) {
        let key = hot_key(rng.below(keys));
        let update = Query::update()
            .table(task_run::Entity)
            .value(Column::Status, "succeeded")
            .value(Column::FinishedAt, task_run::now())
            .value(Column::UpdatedAt, task_run::now())
            .and_where(Expr::col(Column::UserId).eq(key.user_id()))
            .and_where(Expr::col(Column::TaskType).eq(key.task_type()))
            .and_where(Expr::col(Column::ResourceKey).eq(key.resource_key()))
            .and_where(Expr::cust(task_dedup_entity::active_status_sql()))
            .to_owned();
        match db.execute(&update).await {
            Ok(result) => {
                churn.finished += result.rows_affected();
                churn.duplicates += result.rows_affected().saturating_sub(1);
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
    churn
}

/// This process's user + system CPU time, in microseconds, from /proc (0 elsewhere).
fn process_cpu_us() -> u64 {
    // Fields 14 and 15 of /proc/self/stat, in clock ticks of 1/100 s (USER_HZ).
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    let Some(after_name) = stat.rsplit_once(") ").map(|(_, rest)| rest) else {
        return 0;
    };
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // After the name, field 3 (state) is index 0, so utime (14) is 11 and stime (15) 12.
    (ticks(11) + ticks(12)) * 10_000
}
