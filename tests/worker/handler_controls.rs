//! The handler's controls on every dialect: snooze (back later, the attempt not
//! counted, the key held), timeouts (cancelled at the deadline, recorded and retried by
//! the policy), and a cancel from outside that reaches the running handler at once, not
//! at its next heartbeat; each with its connections killed in the middle.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::{Dialect, TestDb, matrix, server_matrix};
use sea_orm::{DatabaseConnection, EntityTrait};
use serde::{Deserialize, Serialize};
use task_dedup::{
    DedupError, HandlerError, Job, NewTask, RetryPolicy, Task, TaskAdmin, TaskDedup, TaskFilter,
    TaskKey, TaskLifecycle, TaskOptions, TaskStatus, Worker, WorkerBuilder, task_run,
};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

matrix!(
    a_snoozed_task_comes_back_later_holding_its_key,
    snoozes_beyond_the_bound_fail_the_task,
    a_typed_handler_snoozes,
    a_snooze_needs_the_lease_and_is_not_repeated,
    a_handler_past_its_timeout_is_dropped_and_retried,
    a_timeout_from_task_options_fails_the_last_attempt,
    a_handler_that_finishes_within_the_grace_keeps_its_result,
    a_cancel_reaches_the_running_handler_before_its_heartbeat,
    a_bulk_cancel_reaches_every_running_handler,
);

// Sessions to kill: the server dialects.
server_matrix!(handler_controls_ride_out_killed_connections);

/// A heartbeat far longer than any wait below: what reaches a handler sooner did not
/// come through it.
const SLOW_HEARTBEAT: Duration = Duration::from_secs(10);

fn key(resource: &str) -> TaskKey {
    TaskKey::new("user-1", "job", resource).expect("valid key")
}

async fn enqueued(db: &DatabaseConnection, resource: &str) -> Uuid {
    db.find_or_enqueue(NewTask::new(key(resource)))
        .await
        .expect("enqueue")
        .task()
        .id
}

async fn load(db: &DatabaseConnection, id: Uuid) -> task_run::Model {
    task_run::Entity::find_by_id(id)
        .one(db)
        .await
        .expect("read")
        .expect("exists")
}

/// Reads task `id` every 10 ms until `done`; fails after 20 s.
async fn wait_for(
    db: &DatabaseConnection,
    id: Uuid,
    done: impl Fn(&task_run::Model) -> bool,
) -> task_run::Model {
    let started = Instant::now();
    loop {
        let task = load(db, id).await;
        if done(&task) {
            return task;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still {task:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Retries at once, up to `max_attempts`.
fn retries(max_attempts: i32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        base_delay: Duration::ZERO,
        max_delay: Duration::ZERO,
        jitter: 0.0,
    }
}

/// Enqueues a typed `task`; its id.
async fn enqueued_task(db: &DatabaseConnection, task: &impl Task) -> Uuid {
    db.enqueue(task).await.expect("enqueue").task().id
}

/// A worker that polls often, with a slow heartbeat and a long lease.
fn quick(db: &DatabaseConnection) -> WorkerBuilder {
    Worker::builder(db.clone())
        .lease(Duration::from_secs(30))
        .heartbeat_every(SLOW_HEARTBEAT)
        .poll_interval(Duration::from_millis(10), Duration::from_millis(50))
        .fallback_poll(Duration::from_millis(200))
        .batch_endings(100, Duration::ZERO)
}

/// Runs `worker` until `done` (checked every 10 ms, 20 s at most), then stops it.
async fn run_until(worker: Worker, done: impl AsyncFn() -> bool) -> task_dedup::WorkerReport {
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let started = Instant::now();
    while !done().await {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "not done in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    running.await.expect("worker task").expect("worker")
}

/// The first run snoozes for 1 s: meanwhile the task is queued, its attempt given back,
/// its snooze counted, and its key still held (an enqueue of the key finds it); the
/// second run, no sooner than the snooze, succeeds.
async fn a_snoozed_task_comes_back_later_holding_its_key(db: &TestDb) {
    db.migrate().await;
    let snooze = Duration::from_secs(1);
    let starts = Arc::new(Mutex::new(Vec::new()));
    let seen = starts.clone();
    let worker = quick(&db.db)
        .handler(move |task: task_run::Model, _| {
            let seen = seen.clone();
            async move {
                seen.lock().expect("lock").push(Instant::now());
                if task.snoozes == 0 {
                    return Err(HandlerError::snooze(snooze));
                }
                Ok(Some(serde_json::json!({ "attempts": task.attempts })))
            }
        })
        .build()
        .expect("worker");
    let id = enqueued(&db.db, "later").await;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));

    let snoozed = wait_for(&db.db, id, |t| t.snoozes == 1).await;
    assert_eq!(snoozed.status, TaskStatus::Queued);
    assert_eq!(snoozed.attempts, 0, "a snooze is not an attempt");
    assert_eq!(snoozed.lease_expires_at, None);
    let run_at = snoozed.run_at;
    let started_at = snoozed.started_at.expect("it ran");
    assert!(
        run_at - started_at >= chrono::Duration::milliseconds(900),
        "run_at {run_at} is the snooze after the start {started_at}"
    );
    let again = db
        .db
        .find_or_enqueue(NewTask::new(key("later")))
        .await
        .expect("enqueue");
    assert!(!again.is_created(), "the snoozed task holds its key");
    assert_eq!(again.task().id, id);

    let done = wait_for(&db.db, id, |t| t.status == TaskStatus::Succeeded).await;
    shutdown.cancel();
    let report = running.await.expect("task").expect("run");
    assert_eq!((done.attempts, done.snoozes), (1, 1));
    assert_eq!(done.result, Some(serde_json::json!({ "attempts": 1 })));
    let starts = starts.lock().expect("lock").clone();
    assert_eq!(starts.len(), 2);
    assert!(starts[1] - starts[0] >= snooze - Duration::from_millis(100));
    assert_eq!(
        (
            report.snoozed,
            report.completed,
            report.retried,
            report.failed
        ),
        (1, 1, 0, 0),
        "{report:?}"
    );
}

/// A handler that always snoozes (for zero: at once) is failed at its third snooze when
/// the bound is two, saying why.
async fn snoozes_beyond_the_bound_fail_the_task(db: &TestDb) {
    db.migrate().await;
    let runs = Arc::new(AtomicU32::new(0));
    let counted = runs.clone();
    let worker = quick(&db.db)
        .max_snoozes(2)
        .handler(move |_: task_run::Model, _| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Err(HandlerError::snooze(Duration::ZERO)) }
        })
        .build()
        .expect("worker");
    let id = enqueued(&db.db, "forever").await;
    let conn = db.db.clone();
    let report = run_until(worker, async || {
        load(&conn, id).await.status == TaskStatus::Failed
    })
    .await;
    let task = load(&db.db, id).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!((task.snoozes, task.attempts), (2, 1));
    let error = task.error.expect("an error");
    assert!(error.contains("snooze"), "{error}");
    assert_eq!((report.snoozed, report.failed), (2, 1), "{report:?}");
    // The key is free again.
    assert!(
        db.db
            .find_or_enqueue(NewTask::new(key("forever")))
            .await
            .expect("enqueue")
            .is_created()
    );
}

#[derive(Debug, Serialize, Deserialize)]
struct Poll {
    resource: String,
}

impl Task for Poll {
    const TASK_TYPE: &'static str = "poll";

    fn resource_key(&self) -> String {
        self.resource.clone()
    }
}

/// A typed handler snoozes through the same error; its payload comes back with it.
async fn a_typed_handler_snoozes(db: &TestDb) {
    db.migrate().await;
    let worker = quick(&db.db)
        .register::<Poll>(|job: Job<Poll>| async move {
            if job.task().snoozes < 2 {
                return Err(HandlerError::snooze(Duration::from_millis(50)));
            }
            Ok(job.args.resource.len())
        })
        .build()
        .expect("worker");
    let poll = Poll {
        resource: "feed/7".into(),
    };
    let id = enqueued_task(&db.db, &poll).await;
    let conn = db.db.clone();
    let report = run_until(worker, async || {
        load(&conn, id).await.status == TaskStatus::Succeeded
    })
    .await;
    let task = load(&db.db, id).await;
    assert_eq!((task.attempts, task.snoozes), (1, 2));
    assert_eq!(task.result, Some(serde_json::json!(6)));
    assert_eq!((report.snoozed, report.completed), (2, 1), "{report:?}");
}

/// `TaskLifecycle::snooze` needs the lease; a repeat (a call retried after a lost
/// connection, whose first try committed) returns the row and changes nothing.
async fn a_snooze_needs_the_lease_and_is_not_repeated(db: &TestDb) {
    db.migrate().await;
    let id = enqueued(&db.db, "manual").await;
    let claimed = db
        .db
        .claim("w1", &[], Duration::from_secs(30))
        .await
        .expect("claim")
        .expect("a task");
    assert_eq!(claimed.id, id);
    match db.db.snooze(id, "w2", Duration::from_secs(5)).await {
        Err(DedupError::LeaseNotHeld { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(load(&db.db, id).await.status, TaskStatus::Running);
    let snoozed = db
        .db
        .snooze(id, "w1", Duration::from_secs(5))
        .await
        .expect("snooze");
    assert_eq!(
        (snoozed.status, snoozed.attempts, snoozed.snoozes),
        (TaskStatus::Queued, 0, 1)
    );
    // A repeat returns the row as the first call left it: not snoozed twice.
    let repeated = db
        .db
        .snooze(id, "w1", Duration::from_secs(60))
        .await
        .expect("a repeat");
    assert_eq!((repeated.snoozes, repeated.run_at), (1, snoozed.run_at));
    let after = load(&db.db, id).await;
    assert_eq!((after.snoozes, after.run_at), (1, snoozed.run_at));
    // Not due yet: nothing to claim.
    assert!(
        db.db
            .claim("w1", &[], Duration::from_secs(30))
            .await
            .expect("claim")
            .is_none()
    );
}

/// A handler deaf to its cancellation runs past its 200 ms timeout: it is dropped after
/// the cancel grace, the attempt recorded as a timeout and retried; the retry succeeds.
async fn a_handler_past_its_timeout_is_dropped_and_retried(db: &TestDb) {
    db.migrate().await;
    let worker = quick(&db.db)
        .task_types(["job"])
        .retry_policy(retries(3))
        .task_type_timeout("job", Duration::from_millis(200))
        .cancel_grace(Duration::from_millis(100))
        .handler(|task: task_run::Model, _cancel| async move {
            if task.attempts == 1 {
                std::future::pending::<()>().await;
            }
            Ok(Some(serde_json::json!("second")))
        })
        .build()
        .expect("worker");
    let id = enqueued(&db.db, "slow").await;
    let conn = db.db.clone();
    let started = Instant::now();
    let report = run_until(worker, async || {
        load(&conn, id).await.status == TaskStatus::Succeeded
    })
    .await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    let task = load(&db.db, id).await;
    assert_eq!(task.attempts, 2);
    assert_eq!(task.result, Some(serde_json::json!("second")));
    assert_eq!(
        (report.timed_out, report.retried, report.completed),
        (1, 1, 1),
        "{report:?}"
    );
}

#[derive(Debug, Serialize, Deserialize)]
struct Export {
    id: u32,
}

impl Task for Export {
    const TASK_TYPE: &'static str = "export";

    fn resource_key(&self) -> String {
        format!("export/{}", self.id)
    }

    fn options() -> TaskOptions {
        TaskOptions::default().timeout(Duration::from_millis(150))
    }
}

/// A type's timeout from its `TaskOptions`; on the last attempt the task fails with the
/// timeout as its error. The handler watches its cancellation: it sees the deadline.
async fn a_timeout_from_task_options_fails_the_last_attempt(db: &TestDb) {
    db.migrate().await;
    let saw_cancel = Arc::new(AtomicU32::new(0));
    let seen = saw_cancel.clone();
    let worker = quick(&db.db)
        .retry_policy(retries(1))
        .register::<Export>(move |job: Job<Export>| {
            let seen = seen.clone();
            async move {
                job.cancellation().cancelled().await;
                seen.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(HandlerError::retry("interrupted"))
            }
        })
        .build()
        .expect("worker");
    let id = enqueued_task(&db.db, &Export { id: 1 }).await;
    let conn = db.db.clone();
    let report = run_until(worker, async || {
        load(&conn, id).await.status == TaskStatus::Failed
    })
    .await;
    let task = load(&db.db, id).await;
    assert_eq!(task.attempts, 1);
    let error = task.error.expect("error");
    assert!(error.contains("timed out after 150ms"), "{error}");
    assert_eq!(saw_cancel.load(Ordering::SeqCst), 1);
    assert_eq!((report.timed_out, report.failed), (1, 1), "{report:?}");
}

/// A handler whose work completes within the cancel grace after its deadline keeps its
/// result: the work was done.
async fn a_handler_that_finishes_within_the_grace_keeps_its_result(db: &TestDb) {
    db.migrate().await;
    let worker = quick(&db.db)
        .timeout(Duration::from_millis(100))
        .cancel_grace(Duration::from_secs(2))
        .handler(|_: task_run::Model, cancel: CancellationToken| async move {
            cancel.cancelled().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(Some(serde_json::json!("finished")))
        })
        .build()
        .expect("worker");
    let id = enqueued(&db.db, "nearly").await;
    let conn = db.db.clone();
    let report = run_until(worker, async || {
        load(&conn, id).await.status == TaskStatus::Succeeded
    })
    .await;
    assert_eq!(
        load(&db.db, id).await.result,
        Some(serde_json::json!("finished"))
    );
    assert_eq!((report.timed_out, report.completed), (0, 1), "{report:?}");
}

/// A worker whose handler waits for its cancellation, notes when it saw it, and then
/// returns a result that must be discarded. `cancel_poll`: how often it looks up its
/// running tasks.
fn cancellable(
    db: &DatabaseConnection,
    cancel_poll: Duration,
    started: Arc<tokio::sync::Notify>,
    seen: Arc<Mutex<Vec<Instant>>>,
) -> Worker {
    quick(db)
        .concurrency(4)
        .cancel_poll(cancel_poll)
        .handler(move |_: task_run::Model, cancel: CancellationToken| {
            let (started, seen) = (started.clone(), seen.clone());
            async move {
                started.notify_one();
                cancel.cancelled().await;
                seen.lock().expect("lock").push(Instant::now());
                Ok(Some(serde_json::json!("late")))
            }
        })
        .build()
        .expect("worker")
}

/// Where a cancel is announced (PostgreSQL's NOTIFY, SQLite's bell in this process) the
/// worker looks up its running tasks only every 30 s otherwise; on MySQL/MariaDB every
/// 200 ms. Either way far sooner than the 10 s heartbeat.
fn cancel_poll_for(dialect: Dialect) -> (Duration, Duration) {
    match dialect {
        // The bounds leave room for a loaded CI machine (the whole suite in parallel);
        // PostgreSQL's and SQLite's stay well under their 30 s poll, so a cancel that
        // waited for the poll still fails them.
        Dialect::MySql => (Duration::from_millis(200), Duration::from_secs(5)),
        Dialect::Postgres | Dialect::Sqlite => (Duration::from_secs(30), Duration::from_secs(8)),
    }
}

/// Five cancels, each through another pool than the worker's, of a task whose handler
/// runs: each handler sees its cancellation within the bound (PostgreSQL, SQLite: with
/// no poll to find it), and its late result does not overwrite `cancelled`.
async fn a_cancel_reaches_the_running_handler_before_its_heartbeat(db: &TestDb) {
    db.migrate().await;
    let (cancel_poll, bound) = cancel_poll_for(db.dialect);
    let (started, seen) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(Mutex::new(Vec::new())),
    );
    let worker = cancellable(&db.db, cancel_poll, started.clone(), seen.clone());
    let admin = db.pool(2).await;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    // The listener is up once a task enqueued now starts.
    let mut delays = Vec::new();
    for i in 0..5 {
        let id = enqueued(&db.db, &format!("doomed-{i}")).await;
        started.notified().await;
        let cancelled_at = Instant::now();
        admin
            .db
            .cancel_task(id, "no longer needed")
            .await
            .expect("cancel");
        let started_wait = Instant::now();
        let delay = loop {
            if let Some(at) = seen.lock().expect("lock").get(i).copied() {
                break at - cancelled_at;
            }
            assert!(
                started_wait.elapsed() < Duration::from_secs(15),
                "the handler never saw its cancel"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        assert!(delay < bound, "cancel {i} seen after {delay:?}");
        delays.push(delay);
        let task = wait_for(&db.db, id, |_| true).await;
        assert_eq!(task.status, TaskStatus::Cancelled);
        assert_eq!(task.result, None);
    }
    shutdown.cancel();
    let report = running.await.expect("task").expect("run");
    assert_eq!(
        (report.cancelled, report.lost, report.completed),
        (5, 0, 0),
        "{report:?}"
    );
    delays.sort();
    println!(
        "{}: cancel to handler, p50 {:?}, max {:?}",
        db.dialect.name(),
        delays[2],
        delays[4]
    );
    for i in 0..5 {
        let id = load_by_key(&db.db, &format!("doomed-{i}")).await;
        assert_eq!(load(&db.db, id).await.result, None, "no late result");
    }
}

async fn load_by_key(db: &DatabaseConnection, resource: &str) -> Uuid {
    use sea_orm::{ColumnTrait, QueryFilter};
    task_run::Entity::find()
        .filter(task_run::Column::ResourceKey.eq(resource))
        .one(db)
        .await
        .expect("read")
        .expect("exists")
        .id
}

/// `TaskAdmin::cancel_tasks` of three running tasks: each handler sees it.
async fn a_bulk_cancel_reaches_every_running_handler(db: &TestDb) {
    db.migrate().await;
    let (cancel_poll, bound) = cancel_poll_for(db.dialect);
    let (started, seen) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(Mutex::new(Vec::new())),
    );
    let worker = cancellable(&db.db, cancel_poll, started.clone(), seen.clone());
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(enqueued(&db.db, &format!("bulk-{i}")).await);
    }
    for id in &ids {
        wait_for(&db.db, *id, |t| t.status == TaskStatus::Running).await;
    }
    let cancelled_at = Instant::now();
    let outcome = db
        .db
        .cancel_tasks(&TaskFilter::default(), 10, "bulk")
        .await
        .expect("cancel");
    assert_eq!(outcome.applied, 3);
    let started_wait = Instant::now();
    while seen.lock().expect("lock").len() < 3 {
        assert!(
            started_wait.elapsed() < Duration::from_secs(15),
            "not every handler saw its cancel"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let last = *seen.lock().expect("lock").iter().max().expect("three");
    assert!(last - cancelled_at < bound, "{:?}", last - cancelled_at);
    shutdown.cancel();
    let report = running.await.expect("task").expect("run");
    assert_eq!(
        (report.cancelled, report.lost, report.completed),
        (3, 0, 0),
        "{report:?}"
    );
}

/// Every session of the database killed while the handlers run (the worker's pool, its
/// listener): a snooze, a timeout and a cancel afterwards each still land, within the
/// retry budget, and the cancel reaches its handler before the heartbeat (the listener
/// listens again, and looks up the running tasks then; or the poll finds it).
async fn handler_controls_ride_out_killed_connections(db: &TestDb) {
    db.migrate().await;
    let gate = Arc::new(tokio::sync::Notify::new());
    let (started, seen) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(Mutex::new(Vec::new())),
    );
    let (open, signal, saw) = (gate.clone(), started.clone(), seen.clone());
    let worker = quick(&db.db)
        .concurrency(3)
        .retry_policy(retries(1))
        .timeout(Duration::from_secs(4))
        .cancel_grace(Duration::from_millis(100))
        .cancel_poll(Duration::from_secs(2))
        .handler(move |task: task_run::Model, cancel: CancellationToken| {
            let (open, signal, saw) = (open.clone(), signal.clone(), saw.clone());
            async move {
                signal.notify_one();
                match task.resource_key.as_str() {
                    "snooze" if task.snoozes == 0 => {
                        open.notified().await;
                        Err(HandlerError::snooze(Duration::from_secs(60)))
                    }
                    "timeout" => std::future::pending().await,
                    _ => {
                        cancel.cancelled().await;
                        saw.lock().expect("lock").push(Instant::now());
                        Ok(None)
                    }
                }
            }
        })
        .build()
        .expect("worker");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let snooze = enqueued(&db.db, "snooze").await;
    let timeout = enqueued(&db.db, "timeout").await;
    let cancel = enqueued(&db.db, "cancel").await;
    for id in [snooze, timeout, cancel] {
        wait_for(&db.db, id, |t| t.status == TaskStatus::Running).await;
    }
    let killed = db.kill_all_sessions().await;
    assert!(killed > 0);
    gate.notify_one();
    let cancelled_at = Instant::now();
    db.db.cancel_task(cancel, "stop").await.expect("cancel");

    let snoozed = wait_for(&db.db, snooze, |t| t.snoozes == 1).await;
    assert_eq!((snoozed.status, snoozed.attempts), (TaskStatus::Queued, 0));
    let timed_out = wait_for(&db.db, timeout, |t| t.status == TaskStatus::Failed).await;
    assert!(
        timed_out
            .error
            .as_deref()
            .unwrap_or("")
            .contains("timed out"),
        "{timed_out:?}"
    );
    let seen_at = loop {
        if let Some(at) = seen.lock().expect("lock").first().copied() {
            break at;
        }
        assert!(
            cancelled_at.elapsed() < SLOW_HEARTBEAT,
            "the cancel waited for the heartbeat"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(seen_at - cancelled_at < Duration::from_secs(3));
    assert_eq!(load(&db.db, cancel).await.status, TaskStatus::Cancelled);
    shutdown.cancel();
    let report = running.await.expect("task").expect("run");
    assert_eq!(
        (
            report.snoozed,
            report.timed_out,
            report.failed,
            report.cancelled,
            report.lost
        ),
        (1, 1, 1, 1, 0),
        "{report:?}"
    );
}
