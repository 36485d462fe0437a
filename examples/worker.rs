//! Run with `cargo run --example worker`.
//!
//! A worker for the tasks the `http_api` example enqueues, on the same database: the
//! embedded SQLite file `http_api.db` unless `DATABASE_URL` says otherwise. It enqueues
//! nothing itself. Run several to share the queue: each task goes to exactly one.
//!
//! - Claims the oldest queued task under a lease (`TaskWorker::claim`), one at a time.
//! - Works on it (simulated: it takes the payload's `work_ms`, default 200 ms, and fails
//!   when the payload says `"fail": true`) while a heartbeat task extends the lease every
//!   `heartbeat_interval`.
//! - Completes or fails it. If the task was cancelled (or reaped and taken by another
//!   worker) meanwhile, the heartbeat notices, the work stops and its result is dropped.
//! - Every `reap_interval`, returns the tasks of crashed workers (lease expired) to the
//!   queue, or fails them after `max_attempts`.
//! - Ctrl-C: stops claiming, lets the current task finish, exits. A second Ctrl-C quits
//!   at once; the task's lease then runs out and a reaper requeues it.
//!
//! Environment: `WORKER_ID`, `WORKER_TASK_TYPES` (comma-separated; default: every type),
//! `WORKER_LEASE_SECS`, `WORKER_HEARTBEAT_SECS` (default: a third of the lease),
//! and `WORKER_EXIT_WHEN_IDLE=1` to stop once the queue is empty instead of polling.
//!
//! ```text
//! cargo run --example http_api &
//! curl -X POST localhost:3000/users/alice/tasks -H 'content-type: application/json' \
//!      -d '{"task_type": "export", "resource_key": "report/1", "payload": {"work_ms": 3000}}'
//! curl -X POST localhost:3000/users/alice/tasks -H 'content-type: application/json' \
//!      -d '{"task_type": "export", "resource_key": "report/2", "payload": {"fail": true}}'
//! WORKER_EXIT_WHEN_IDLE=1 WORKER_LEASE_SECS=3 cargo run --example worker
//! ```

use std::fmt;
use std::time::Duration;

use sea_orm::DatabaseConnection;
use serde_json::{Value, json};
use task_dedup::{
    DedupError, MAX_LEASE, ReapReport, Retry, RetryPolicy, TaskStatus, TaskWorker, task_run,
};
use tokio::sync::{oneshot, watch};
use tokio::time::MissedTickBehavior;

const DEFAULT_DATABASE_URL: &str = "sqlite://http_api.db?mode=rwc";
/// Simulated work per task when the payload does not say.
const DEFAULT_WORK_MS: u64 = 200;
/// A payload cannot keep the demo busy for longer than this.
const MAX_WORK_MS: u64 = 60_000;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let config = WorkerConfig::from_env()?;
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    let db = task_dedup::connect(&url).await?;
    // Idempotent and recorded nowhere, so it is safe whichever of the two examples runs
    // first; the `http_api` example's migrator owns `seaql_migrations`.
    let schema = task_dedup_migration::ensure_schema(&db).await?;
    if !schema.is_unchanged() {
        tracing::info!(%schema, "schema prepared");
    }
    tracing::info!(worker_id = %config.worker_id, backend = ?db.get_database_backend(), "worker started");

    let stats = run(&db, &config, ctrl_c()).await;
    tracing::info!(
        claimed = stats.claimed,
        succeeded = stats.succeeded,
        failed = stats.failed,
        lost = stats.lost,
        "worker stopped"
    );
    db.close().await?;
    Ok(())
}

/// The worker's knobs. [`Default`] suits the examples; [`validate`](Self::validate)
/// before use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Recorded as the lease owner; unique per running worker.
    pub worker_id: String,
    /// The task types to claim; empty for every type.
    pub task_types: Vec<String>,
    /// How long a claimed task stays ours without a heartbeat.
    pub lease: Duration,
    /// How often a running task's lease is extended: at most half the lease, so that a
    /// late heartbeat does not lose it.
    pub heartbeat_interval: Duration,
    /// How often expired leases are reaped.
    pub reap_interval: Duration,
    /// The reaper fails (instead of requeuing) a task with this many claims behind it.
    pub max_attempts: i32,
    /// How long to wait before claiming again when the queue is empty.
    pub poll_interval: Duration,
    /// Stop once the queue is empty instead of polling.
    pub exit_when_idle: bool,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            worker_id: format!("worker-{}", std::process::id()),
            task_types: Vec::new(),
            lease: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(10),
            reap_interval: Duration::from_secs(15),
            max_attempts: 3,
            poll_interval: Duration::from_secs(1),
            exit_when_idle: false,
        }
    }
}

/// A [`WorkerConfig`] field out of range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: &'static str,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid worker {}: {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field,
        reason: reason.into(),
    }
}

impl WorkerConfig {
    /// Checks every field, before any SQL runs.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first field out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_name(
            "worker_id",
            &self.worker_id,
            task_run::LEASE_OWNER_MAX_CHARS,
        )?;
        for task_type in &self.task_types {
            check_name("task_types", task_type, task_run::TASK_TYPE_MAX_CHARS)?;
        }
        if self.lease.is_zero() || self.lease > MAX_LEASE {
            return Err(invalid("lease", "more than zero and at most 7 days"));
        }
        if self.heartbeat_interval.is_zero() || self.heartbeat_interval > self.lease / 2 {
            return Err(invalid(
                "heartbeat_interval",
                format!(
                    "more than zero and at most half the lease ({:?})",
                    self.lease
                ),
            ));
        }
        if self.reap_interval.is_zero() {
            return Err(invalid("reap_interval", "more than zero"));
        }
        if self.max_attempts < 1 {
            return Err(invalid("max_attempts", "at least 1"));
        }
        if self.poll_interval.is_zero() {
            return Err(invalid("poll_interval", "more than zero"));
        }
        Ok(())
    }

    /// The defaults, overridden by the `WORKER_*` variables, validated.
    ///
    /// # Errors
    /// [`ConfigError`] for a value that does not parse or is out of range.
    pub fn from_env() -> Result<WorkerConfig, ConfigError> {
        let mut config = WorkerConfig::default();
        if let Ok(id) = std::env::var("WORKER_ID") {
            config.worker_id = id;
        }
        if let Ok(types) = std::env::var("WORKER_TASK_TYPES") {
            config.task_types = types
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect();
        }
        if let Some(lease) = env_secs("WORKER_LEASE_SECS", "lease")? {
            config.lease = lease;
            config.heartbeat_interval = lease / 3;
        }
        if let Some(every) = env_secs("WORKER_HEARTBEAT_SECS", "heartbeat_interval")? {
            config.heartbeat_interval = every;
        }
        config.exit_when_idle = std::env::var("WORKER_EXIT_WHEN_IDLE")
            .is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
        config.validate()?;
        Ok(config)
    }
}

/// Checks a name against its `task_run` column before anything connects (`claim` checks
/// too, but the loop would only log and retry).
fn check_name(field: &'static str, value: &str, max_chars: usize) -> Result<(), ConfigError> {
    if value.is_empty() || value.contains('\0') || value.chars().count() > max_chars {
        return Err(invalid(field, "1 to 64 characters, without NUL"));
    }
    Ok(())
}

fn env_secs(var: &str, field: &'static str) -> Result<Option<Duration>, ConfigError> {
    let Ok(text) = std::env::var(var) else {
        return Ok(None);
    };
    text.trim()
        .parse::<f64>()
        .ok()
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .map(Some)
        .ok_or_else(|| invalid(field, format!("{var}={text:?} is not a number of seconds")))
}

/// What a worker did before it stopped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub claimed: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// Tasks taken away while they ran (cancelled, or reaped and claimed elsewhere), or
    /// whose outcome could not be recorded.
    pub lost: u64,
}

/// Claims and works tasks until `shutdown` turns true (then finishes the current task
/// first) or, with `exit_when_idle`, until nothing is left to claim. `config` must be
/// valid.
pub async fn run(
    db: &DatabaseConnection,
    config: &WorkerConfig,
    mut shutdown: watch::Receiver<bool>,
) -> Stats {
    let task_types: Vec<&str> = config.task_types.iter().map(String::as_str).collect();
    let (stop_reaper, reaper_stopped) = oneshot::channel();
    let reaper = tokio::spawn(reap_periodically(
        db.clone(),
        config.reap_interval,
        config.max_attempts,
        reaper_stopped,
    ));
    let mut stats = Stats::default();
    while !*shutdown.borrow() {
        match db.claim(&config.worker_id, &task_types, config.lease).await {
            Ok(Some(task)) => {
                stats.claimed += 1;
                match work_on(db, config, task).await {
                    Some(TaskStatus::Succeeded) => stats.succeeded += 1,
                    Some(_) => stats.failed += 1,
                    None => stats.lost += 1,
                }
            }
            Ok(None) if config.exit_when_idle => {
                // A task whose worker died still looks taken until its lease is reaped.
                match db.reap_expired(&reap_policy(config.max_attempts)).await {
                    Ok(ReapReport { requeued: 0, .. }) => break,
                    Ok(_) => {}
                    Err(err) => tracing::warn!(error = %err, "reap failed; retrying"),
                }
            }
            Ok(None) => pause(config.poll_interval, &mut shutdown).await,
            // The database may be restarting: wait and claim again.
            Err(err) => {
                tracing::warn!(error = %err, "claim failed; retrying");
                pause(config.poll_interval, &mut shutdown).await;
            }
        }
    }
    let _ = stop_reaper.send(());
    let _ = reaper.await;
    stats
}

/// Sleeps for `period`, or until shutdown is asked for.
async fn pause(period: Duration, shutdown: &mut watch::Receiver<bool>) {
    tokio::select! {
        () = tokio::time::sleep(period) => {}
        Ok(()) = shutdown.changed() => {}
    }
}

/// Works on a claimed task under heartbeats and records its outcome. Returns the status
/// it finished in, or `None` when it was taken away or could not be finished.
async fn work_on(
    db: &DatabaseConnection,
    config: &WorkerConfig,
    task: task_run::Model,
) -> Option<TaskStatus> {
    let (id, worker_id) = (task.id, config.worker_id.as_str());
    tracing::info!(task_id = %id, user_id = %task.user_id, task_type = %task.task_type, resource_key = %task.resource_key, attempt = task.attempts, "working");
    let (lease_lost, lost) = oneshot::channel();
    let heartbeat = tokio::spawn(heartbeat(
        db.clone(),
        id,
        worker_id.to_owned(),
        config.lease,
        config.heartbeat_interval,
        lease_lost,
    ));
    let outcome = tokio::select! {
        outcome = simulate(&task) => Some(outcome),
        Ok(err) = lost => {
            tracing::info!(task_id = %id, error = %err, "task taken away while it ran; work stopped");
            None
        }
    };
    heartbeat.abort();
    let finished = match outcome? {
        Ok(result) => db.complete(id, worker_id, Some(result)).await,
        Err(error) => db.fail(id, worker_id, &error, Retry::Never).await,
    };
    match finished {
        Ok(task) => {
            tracing::info!(task_id = %id, status = %task.status, "finished");
            Some(task.status)
        }
        Err(err) => {
            // Cancelled or reaped just before the end; or the database is gone, and then
            // the lease runs out and a reaper requeues the task.
            tracing::warn!(task_id = %id, error = %err, "could not record the outcome; dropped");
            None
        }
    }
}

/// Extends the lease every `every` until aborted. Reports through `lost` when the task
/// is no longer ours (cancelled, finished, or reaped and claimed by another worker); a
/// database error is retried at the next tick, while the lease still runs.
async fn heartbeat(
    db: DatabaseConnection,
    id: uuid::Uuid,
    worker_id: String,
    lease: Duration,
    every: Duration,
    lost: oneshot::Sender<DedupError>,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ticks.tick().await; // The first tick is immediate, and the claim just set the lease.
    loop {
        ticks.tick().await;
        match db.heartbeat(id, &worker_id, lease).await {
            Ok(task) => {
                tracing::debug!(task_id = %id, lease_expires_at = ?task.lease_expires_at, "heartbeat");
            }
            Err(
                err @ (DedupError::NotFound { .. }
                | DedupError::InvalidTransition { .. }
                | DedupError::LeaseNotHeld { .. }),
            ) => {
                let _ = lost.send(err);
                return;
            }
            Err(err) => tracing::warn!(task_id = %id, error = %err, "heartbeat failed; retrying"),
        }
    }
}

/// Stands in for real work: takes the payload's `work_ms` and fails when it says
/// `"fail": true`.
async fn simulate(task: &task_run::Model) -> Result<Value, String> {
    let field = |name: &str| task.payload.as_ref().and_then(|p| p.get(name));
    let work_ms = field("work_ms")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_WORK_MS)
        .min(MAX_WORK_MS);
    tokio::time::sleep(Duration::from_millis(work_ms)).await;
    if field("fail").and_then(Value::as_bool) == Some(true) {
        return Err(format!(
            "simulated failure (the payload asked for it), attempt {}",
            task.attempts
        ));
    }
    Ok(json!({ "processed": task.resource_key, "work_ms": work_ms }))
}

/// Reaps expired leases every `every` until `stop` fires.
async fn reap_periodically(
    db: DatabaseConnection,
    every: Duration,
    max_attempts: i32,
    mut stop: oneshot::Receiver<()>,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = &mut stop => return,
        }
        // `reap_expired` logs what it changed.
        if let Err(err) = db.reap_expired(&reap_policy(max_attempts)).await {
            tracing::warn!(error = %err, "reap failed; retrying at the next tick");
        }
    }
}

/// Requeues expired tasks at once; fails them for good at `max_attempts`.
fn reap_policy(max_attempts: i32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        base_delay: Duration::ZERO,
        max_delay: Duration::ZERO,
        jitter: 0.0,
    }
}

/// Turns true on the first Ctrl-C; a second one quits at once.
fn ctrl_c() -> watch::Receiver<bool> {
    let (shutdown, receiver) = watch::channel(false);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        tracing::info!(
            "Ctrl-C: no more claims; finishing the current task (Ctrl-C again quits now)"
        );
        let _ = shutdown.send(true);
        if tokio::signal::ctrl_c().await.is_ok() {
            tracing::warn!("quitting now: the current task's lease will expire and be reaped");
            std::process::exit(130);
        }
    });
    receiver
}
