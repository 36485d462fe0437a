//! Run with `cargo run --example worker`.
//!
//! A worker for the tasks the `http_api` example enqueues, on the same database: the
//! embedded SQLite file `http_api.db` unless `DATABASE_URL` says otherwise. It enqueues
//! nothing itself. Run several to share the queue: each task goes to exactly one.
//!
//! Everything but the work is the library's [`Worker`]: claiming up to the concurrency,
//! heartbeats, retries with backoff, reaping crashed workers' tasks, shutdown. The work
//! is simulated: it takes the payload's `work_ms` (default 200 ms), fails for good when
//! the payload says `"fail": true`, and fails retryably when it says `"flaky": true`.
//! Ctrl-C stops claiming, waits up to 10 s for running tasks, then hands the rest back to
//! the queue; a second Ctrl-C quits at once (their leases then run out and a reaper
//! requeues them).
//!
//! Environment: `WORKER_TASK_TYPES` (comma-separated; default: every type),
//! `WORKER_CONCURRENCY` (default 4), `WORKER_LEASE_SECS` (default 30), and
//! `WORKER_EXIT_WHEN_IDLE=1` to stop once no task is queued or running.
//!
//! ```text
//! cargo run --example http_api &
//! curl -X POST localhost:3000/users/alice/tasks -H 'content-type: application/json' \
//!      -d '{"task_type": "export", "resource_key": "report/1", "payload": {"work_ms": 3000}}'
//! curl -X POST localhost:3000/users/alice/tasks -H 'content-type: application/json' \
//!      -d '{"task_type": "export", "resource_key": "report/2", "payload": {"fail": true}}'
//! WORKER_EXIT_WHEN_IDLE=1 WORKER_LEASE_SECS=3 cargo run --example worker
//! ```

use std::time::Duration;

use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use task_dedup::{CancellationToken, HandlerError, TaskStatus, Worker, task_run};

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
        .unwrap_or_default();
    let worker = Worker::builder(db.clone())
        .task_types(types)
        .concurrency(env("WORKER_CONCURRENCY").map_or(Ok(4), |n| n.parse())?)
        .lease(Duration::from_secs(
            env("WORKER_LEASE_SECS").map_or(Ok(30), |n| n.parse())?,
        ))
        .shutdown_grace(Duration::from_secs(10))
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

/// The simulated work: waits `work_ms`, or until the task is cancelled or the worker
/// shuts down.
async fn work(
    task: task_run::Model,
    cancel: CancellationToken,
) -> Result<Option<serde_json::Value>, HandlerError> {
    let payload = task.payload.unwrap_or_default();
    let work_ms = payload["work_ms"].as_u64().unwrap_or(200).min(MAX_WORK_MS);
    tokio::select! {
        () = tokio::time::sleep(Duration::from_millis(work_ms)) => {}
        () = cancel.cancelled() => return Err(HandlerError::retry("interrupted")),
    }
    if payload["fail"] == true {
        return Err(HandlerError::fail("the payload asked to fail"));
    }
    if payload["flaky"] == true {
        return Err(HandlerError::retry("the payload asked to fail, retryably"));
    }
    Ok(Some(serde_json::json!({ "worked_ms": work_ms })))
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
