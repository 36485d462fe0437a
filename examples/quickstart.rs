//! Run with `cargo run --example quickstart`.
//!
//! task-dedup in one screen, on an embedded SQLite file (`quickstart.db`, recreated on
//! every run): 100 concurrent `find_or_enqueue` calls for each of three resources create
//! one task per resource; a worker claims and completes them; enqueuing again creates a
//! new task because the key was released; a batch of 1,000 tasks, a tenth of them
//! repeats, goes in with one call.
//!
//! `DATABASE_URL=postgres://... cargo run --example quickstart` (or `mysql://...`) runs
//! the same on a server; it then uses a fresh user id so earlier runs do not interfere.

use std::collections::BTreeSet;
use std::time::Duration;

use task_dedup::{NewTask, TaskDedup, TaskKey, TaskLifecycle};
use task_dedup_migration::{Migrator, MigratorTrait};

const CALLS: usize = 100;
const RESOURCES: [&str; 3] = ["invoice/2026-11", "report/q4", "avatar/42"];
const TASK_TYPE: &str = "quickstart-render";
const WORKER: &str = "quickstart-worker";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, user) = match std::env::var("DATABASE_URL") {
        Ok(url) => (url, format!("demo-{}", uuid::Uuid::now_v7().simple())),
        Err(_) => {
            for file in ["quickstart.db", "quickstart.db-wal", "quickstart.db-shm"] {
                let _ = std::fs::remove_file(file);
            }
            (
                "sqlite://quickstart.db?mode=rwc".to_owned(),
                "demo".to_owned(),
            )
        }
    };
    let db = task_dedup::connect(&url).await?;
    Migrator::up(&db, None).await?;
    println!("task-dedup quickstart on {:?}\n", db.get_database_backend());

    for resource in RESOURCES {
        let key = TaskKey::new(&*user, TASK_TYPE, resource)?;
        let calls: Vec<_> = (0..CALLS)
            .map(|_| {
                let (db, key) = (db.clone(), key.clone());
                tokio::spawn(async move { db.find_or_enqueue(NewTask::new(key)).await })
            })
            .collect();
        let (mut created, mut existing, mut ids) = (0, 0, BTreeSet::new());
        for call in calls {
            let outcome = call.await??;
            if outcome.is_created() {
                created += 1;
            } else {
                existing += 1;
            }
            ids.insert(outcome.task().id);
        }
        let id = ids.first().ok_or("no task")?;
        println!(
            "{resource:<16} {CALLS} concurrent calls -> {created} created, {existing} got the existing task {id} ({} distinct id)",
            ids.len()
        );
    }

    let mut completed = 0;
    while let Some(task) = db
        .claim(WORKER, &[TASK_TYPE], Duration::from_secs(30))
        .await?
    {
        let result = serde_json::json!({ "rendered": task.resource_key });
        db.complete(task.id, WORKER, Some(result)).await?;
        completed += 1;
    }
    println!("\nworker claimed and completed {completed} tasks");

    let key = TaskKey::new(&*user, TASK_TYPE, RESOURCES[0])?;
    let again = db.find_or_enqueue(NewTask::new(key)).await?;
    println!(
        "enqueue {} again -> {} task {}",
        RESOURCES[0],
        if again.is_created() {
            "created a new"
        } else {
            "found the existing"
        },
        again.task().id
    );
    db.cancel(again.task().id, "quickstart cleanup").await?;

    // A burst: 1,000 reindex tasks in one call, every tenth a repeat of the one before.
    let batch = (0..1_000)
        .map(|i| {
            let page = if i % 10 == 9 { i - 1 } else { i };
            Ok(NewTask::new(TaskKey::new(
                &*user,
                "reindex",
                format!("page/{page}"),
            )?))
        })
        .collect::<Result<Vec<_>, task_dedup::DedupError>>()?;
    let outcomes = db.find_or_enqueue_many(batch).await?;
    let created = outcomes.iter().filter(|o| o.is_created()).count();
    println!(
        "\nbatch of {} tasks -> {created} created, {} already there (repeats in the batch)",
        outcomes.len(),
        outcomes.len() - created
    );
    Ok(())
}
