//! task-dedup as this app's queue, on the database DATABASE_URL names (SQLite by
//! default; CI runs these on PostgreSQL and MariaDB too).
use std::{sync::Arc, time::Duration};

use loco_rs::{
    app::{AppContext, Hooks},
    bgworker::BackgroundWorker,
    config::WorkerMode,
    testing::prelude::*,
};
use sea_orm::{DatabaseBackend, EntityTrait};
use serial_test::serial;
use task_dedup::{task_run, TaskStatus};
use todo_app::{
    app::App,
    workers::report::{Worker, WorkerArgs},
};
use tokio::sync::Barrier;

fn args(user_id: i32) -> WorkerArgs {
    WorkerArgs {
        user_id,
        month: "2026-11".into(),
        render_ms: 0,
    }
}

/// The app's context as a server process has it: `perform_later` through the queue
/// (the test config says `ForegroundBlocking`), the app's workers registered.
async fn queued(boot: &loco_rs::boot::BootResult) -> AppContext {
    let mut ctx = boot.app_context.clone();
    ctx.config.workers.mode = WorkerMode::BackgroundQueue;
    let queue = ctx.queue_provider.clone().expect("the queue is installed");
    App::connect_workers(&ctx, &queue).await.unwrap();
    ctx
}

/// Runs the app's queue worker until every job is finished.
async fn drain(ctx: &AppContext) -> Vec<task_run::Model> {
    let queue = ctx.queue_provider.clone().expect("the queue is installed");
    let runner = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.run(Vec::new()).await })
    };
    let mut rows = Vec::new();
    for _ in 0..250 {
        rows = task_run::Entity::find().all(&ctx.db).await.unwrap();
        if rows.iter().all(|t| !t.status.is_active()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    queue.shutdown().unwrap();
    runner.await.unwrap().unwrap();
    rows
}

#[tokio::test]
#[serial]
async fn sixty_four_identical_perform_laters_run_one_job() {
    let boot = boot_test::<App>().await.unwrap();
    let ctx = queued(&boot).await;
    let barrier = Arc::new(Barrier::new(64));
    let callers: Vec<_> = (0..64)
        .map(|_| {
            let (ctx, barrier) = (ctx.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                Worker::perform_later(&ctx, args(1)).await.unwrap()
            })
        })
        .collect();
    let mut ids = Vec::new();
    for caller in callers {
        ids.push(caller.await.unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "every request got the job in flight");
    let rows = drain(&ctx).await;
    assert_eq!(rows.len(), 1, "one job was ever stored");
    assert_eq!(
        (rows[0].status, rows[0].attempts),
        (TaskStatus::Succeeded, 1)
    );
    assert_eq!(rows[0].id.to_string(), ids[0]);
}

/// With the worker waiting, a new job starts at once: woken by PostgreSQL's NOTIFY (or
/// SQLite's doorbell), not found by a poll (the fallback poll is 5 s; MySQL polls).
#[tokio::test]
#[serial]
async fn a_waiting_worker_starts_a_new_job_at_once() {
    let boot = boot_test::<App>().await.unwrap();
    let ctx = queued(&boot).await;
    if ctx.db.get_database_backend() == DatabaseBackend::MySql {
        return;
    }
    let queue = ctx.queue_provider.clone().unwrap();
    let runner = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.run(Vec::new()).await })
    };
    // Let the worker finish its first claim and wait.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let id = Worker::perform_later(&ctx, args(2)).await.unwrap();
    let mut started = None;
    for _ in 0..100 {
        let task = task_run::Entity::find_by_id(id.parse::<uuid::Uuid>().unwrap())
            .one(&ctx.db)
            .await
            .unwrap()
            .unwrap();
        if let Some(at) = task.started_at {
            started = Some(at - task.created_at);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    queue.shutdown().unwrap();
    runner.await.unwrap().unwrap();
    let started = started.expect("the job started");
    assert!(
        started < chrono::Duration::milliseconds(1_000),
        "started {started} after enqueue: no wake-up"
    );
}
