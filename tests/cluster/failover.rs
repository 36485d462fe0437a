//! PostgreSQL under an HA manager (pg_auto_failover: a primary and a synchronous
//! standby): callers and a Worker on the formation's URL with both hosts
//! (`target_session_attrs=read-write`) through a switchover and through a primary
//! killed with `pg_ctl stop -m immediate`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::cluster::{Formation, control};

use crate::load::Load;
use sea_orm::DatabaseConnection;
use task_dedup::{NewTask, TaskDedup, TaskKey, Wakeups, Worker, task_run};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

fn key(task_type: &str, resource: &str) -> TaskKey {
    TaskKey::new("user-1", task_type, resource).expect("valid key")
}

/// A Worker of `task_type` that hears wake-ups only (its poll is a minute): each task
/// it starts, with when, goes into `started`.
fn listening_worker(
    db: &DatabaseConnection,
    task_type: &str,
    started: Arc<Mutex<HashMap<Uuid, Instant>>>,
) -> Worker {
    Worker::builder(db.clone())
        .id(format!("{task_type}-worker"))
        .task_types([task_type])
        .concurrency(8)
        .wakeups(Wakeups::Auto)
        .fallback_poll(Duration::from_secs(60))
        .retry_budget(Duration::from_secs(30))
        .handler(move |task: task_run::Model, _cancel: CancellationToken| {
            let started = started.clone();
            async move {
                started
                    .lock()
                    .expect("started")
                    .insert(task.id, Instant::now());
                Ok(None)
            }
        })
        .build()
        .expect("worker")
}

/// After the primary moved: how long until the Worker starts a task enqueued right
/// then, which only a wake-up can start (the Worker's poll is a minute): LISTEN is
/// back on the new primary by then.
async fn wake_up_after_the_move(
    db: &DatabaseConnection,
    started: &Mutex<HashMap<Uuid, Instant>>,
    probe: &str,
) -> Duration {
    let moved = Instant::now();
    let task = db
        .find_or_enqueue(NewTask::new(key("probe", probe)).retry_budget(Duration::from_secs(30)))
        .await
        .expect("probe task");
    let id = task.task().id;
    loop {
        if let Some(at) = started.lock().expect("started").get(&id) {
            return at.duration_since(moved);
        }
        assert!(
            moved.elapsed() < Duration::from_secs(20),
            "the probe task never started: no wake-up after the move"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sixteen callers create tasks, a Worker runs them, through a switchover and then a
/// killed primary: every create a caller was told of is stored (the standby was
/// synchronous), no key has two active tasks, at most 0.5 % of the calls failed, and
/// the Worker's LISTEN is back on the new primary within a second of it taking writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 6)]
async fn a_switchover_and_a_killed_primary_lose_no_acknowledged_create() {
    let _serial = crate::serial().await;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let Some(formation) = Formation::create("failover").await else {
        return;
    };
    // One Worker runs the callers' tasks; the other, idle but for the probes, shows
    // when its wake-ups are back after the primary moved.
    let (ran, started) = (
        Arc::new(Mutex::new(HashMap::new())),
        Arc::new(Mutex::new(HashMap::new())),
    );
    let shutdown = CancellationToken::new();
    let workers = [
        tokio::spawn(listening_worker(&formation.db, "render", ran.clone()).run(shutdown.clone())),
        tokio::spawn(
            listening_worker(&formation.db, "probe", started.clone()).run(shutdown.clone()),
        ),
    ];

    let load = Load::start(
        std::slice::from_ref(&formation.db),
        16,
        Duration::from_millis(2),
    );

    tokio::time::sleep(Duration::from_secs(3)).await;
    control(&formation.control, &["switchover"]).await;
    let after_switchover = wake_up_after_the_move(&formation.db, &started, "switchover").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    control(&formation.control, &["kill-primary"]).await;
    control(&formation.control, &["wait-primary"]).await;
    let after_failover = wake_up_after_the_move(&formation.db, &started, "failover").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let tally = load.finish().await;

    eprintln!(
        "[failover] {} calls, {} failed, {} acknowledged creates; a wake-up \
         {after_switchover:?} after the switchover, {after_failover:?} after the failover",
        tally.calls,
        tally.errors.len(),
        tally.acknowledged.len()
    );
    tally.assert_few_failed();
    let stored: HashSet<Uuid> = harness::rows::all(&formation.db)
        .await
        .into_iter()
        .map(|t| t.id)
        .collect();
    tally.assert_all_stored(&stored, "the new primary");
    assert_eq!(harness::keys_with_two_active(&formation.db).await, 0);
    for (what, took) in [
        ("switchover", after_switchover),
        ("failover", after_failover),
    ] {
        assert!(
            took <= Duration::from_secs(1),
            "wake-ups back {took:?} after the {what}"
        );
    }
    shutdown.cancel();
    for worker in workers {
        worker.await.expect("worker task").expect("worker");
    }
    assert!(
        !ran.lock().expect("ran").is_empty(),
        "the render Worker ran tasks"
    );
    formation.remove().await;
}
