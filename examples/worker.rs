//! Run with `cargo run --example worker`.
//!
//! A worker for the tasks the `http_api` example enqueues, on the same database: the
//! embedded SQLite file `http_api.db` unless `DATABASE_URL` says otherwise. It enqueues
//! nothing itself. Run several to share the queue: each task goes to exactly one.
//!
//! Everything but the work is the library's [`Worker`]: claiming up to the concurrency,
//! heartbeats, retries with backoff, reaping crashed workers' tasks, shutdown. Typed
//! tasks ([`tasks::Export`]) go to their registered handler, which receives the payload
//! decoded; the other types the worker runs (`WORKER_TASK_TYPES`: tasks another service
//! enqueues untyped) go to an untyped handler, which reads the JSON itself. The work is simulated: it takes `work_ms`
//! (default 200 ms), fails for good on `fail`, and fails retryably on `flaky`.
//! Once a minute a periodic task ([`QueueReport`]) logs the size of the queue: one per
//! minute however many workers run, with no leader among them.
//! Ctrl-C stops claiming, waits up to 10 s for running tasks, then hands the rest back to
//! the queue; a second Ctrl-C quits at once (their leases then run out and a reaper
//! requeues them).
//!
//! Environment: `WORKER_TASK_TYPES` (comma-separated untyped types; default `reindex`),
//! `WORKER_CONCURRENCY` (default 4), `WORKER_LEASE_SECS` (default 30), and
//! `WORKER_EXIT_WHEN_IDLE=1` to stop once no task is queued or running.
//!
//! ```text
//! cargo run --example http_api &
//! curl -X POST localhost:3000/users/alice/exports -H 'content-type: application/json' \
//!      -d '{"report": "1", "work_ms": 3000}'
//! curl -X POST localhost:3000/users/alice/exports -H 'content-type: application/json' \
//!      -d '{"report": "2", "fail": true}'
//! WORKER_EXIT_WHEN_IDLE=1 WORKER_LEASE_SECS=3 cargo run --example worker
//! ```

#[path = "shared/tasks.rs"]
mod tasks;

use std::time::Duration;

use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter};
use serde::{Deserialize, Serialize};
use task_dedup::{
    CancellationToken, HandlerError, Job, Schedule, Task, TaskStatus, Worker, task_run,
};
use tasks::Export;

const DEFAULT_DATABASE_URL: &str = "sqlite://http_api.db?mode=rwc";
/// A payload cannot keep the demo busy for longer than this.
const MAX_WORK_MS: u64 = 60_000;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    let db = task_dedup::connect(&url).await?;
    // Idempotent and recorded nowhere, so it is safe whichever of the two examples runs
    // first; the `http_api` example's migrator owns `seaql_migrations`.
    task_dedup_migration::ensure_schema(&db).await?;

    let types: Vec<String> = env("WORKER_TASK_TYPES")
        .map(|types| types.split(',').map(|t| t.trim().to_owned()).collect())
        .unwrap_or_else(|| vec!["reindex".to_owned()]);
    let worker = Worker::builder(db.clone())
        .task_types(types)
        .concurrency(env("WORKER_CONCURRENCY").map_or(Ok(4), |n| n.parse())?)
        .lease(Duration::from_secs(
            env("WORKER_LEASE_SECS").map_or(Ok(30), |n| n.parse())?,
        ))
        .shutdown_grace(Duration::from_secs(10))
        .register::<Export>(export)
        .register::<QueueReport>({
            let db = db.clone();
            move |job: Job<QueueReport>| queue_report(db.clone(), job)
        })
        // Every worker declares it; the database keeps one task per minute.
        .periodic(Schedule::cron("* * * * *"), |tick| QueueReport {
            minute: tick.to_rfc3339(),
        })
        .handler(work)
        .build()?;

    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_ctrl_c(shutdown.clone()));
    if env("WORKER_EXIT_WHEN_IDLE").is_some_and(|v| v == "1") {
        tokio::spawn(stop_when_idle(db.clone(), shutdown.clone()));
    }
    // It logs what it did when it stops.
    worker.run(shutdown).await?;
    db.close().await?;
    Ok(())
}

/// The typed handler: the payload arrives decoded, and what it returns is stored as the
/// task's `result`.
async fn export(job: Job<Export>) -> Result<serde_json::Value, HandlerError> {
    let Export {
        work_ms,
        fail,
        flaky,
        ..
    } = job.args;
    simulate(work_ms, fail, flaky, job.cancellation()).await
}

/// The periodic task: the minute it stands for.
#[derive(Debug, Serialize, Deserialize)]
struct QueueReport {
    minute: String,
}

impl Task for QueueReport {
    const TASK_TYPE: &'static str = "queue-report";

    fn resource_key(&self) -> String {
        "queue".to_owned()
    }
}

/// Logs how many tasks are queued, and stores it as the report's result.
async fn queue_report(
    db: DatabaseConnection,
    job: Job<QueueReport>,
) -> Result<serde_json::Value, HandlerError> {
    let queued = task_run::Entity::find()
        .filter(task_run::Column::Status.eq(TaskStatus::Queued))
        .count(&db)
        .await
        .map_err(|err| HandlerError::retry(err.to_string()))?;
    tracing::info!(minute = %job.args.minute, queued, "queue report");
    Ok(serde_json::json!({ "queued": queued }))
}

/// The untyped handler, for the other types: the task as stored, its payload as JSON.
async fn work(
    task: task_run::Model,
    cancel: CancellationToken,
) -> Result<Option<serde_json::Value>, HandlerError> {
    let payload = task.payload.unwrap_or_default();
    let (fail, flaky) = (payload["fail"] == true, payload["flaky"] == true);
    simulate(payload["work_ms"].as_u64(), fail, flaky, &cancel)
        .await
        .map(Some)
}

/// Waits `work_ms` (or until the task is cancelled or the worker shuts down), then fails
/// as asked.
async fn simulate(
    work_ms: Option<u64>,
    fail: bool,
    flaky: bool,
    cancel: &CancellationToken,
) -> Result<serde_json::Value, HandlerError> {
    let work_ms = work_ms.unwrap_or(200).min(MAX_WORK_MS);
    tokio::select! {
        () = tokio::time::sleep(Duration::from_millis(work_ms)) => {}
        () = cancel.cancelled() => return Err(HandlerError::retry("interrupted")),
    }
    if fail {
        return Err(HandlerError::fail("the payload asked to fail"));
    }
    if flaky {
        return Err(HandlerError::retry("the payload asked to fail, retryably"));
    }
    Ok(serde_json::json!({ "worked_ms": work_ms }))
}

/// A variable that is set and not empty.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// First Ctrl-C: a graceful shutdown. Second: quit now.
async fn stop_on_ctrl_c(shutdown: CancellationToken) {
    if tokio::signal::ctrl_c().await.is_ok() {
        tracing::info!("shutting down; Ctrl-C again to quit at once");
        shutdown.cancel();
    }
    if tokio::signal::ctrl_c().await.is_ok() {
        std::process::exit(130);
    }
}

/// Stops the worker once no task is queued or running.
async fn stop_when_idle(db: sea_orm::DatabaseConnection, shutdown: CancellationToken) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let active = task_run::Entity::find()
            .filter(task_run::Column::Status.is_in([TaskStatus::Queued, TaskStatus::Running]))
            .count(&db)
            .await;
        match active {
            Ok(0) => return shutdown.cancel(),
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "could not count the active tasks"),
        }
    }
}
