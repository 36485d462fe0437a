//! The `Worker` runtime on every dialect: a thousand tasks through in-process workers and
//! worker processes, retries with backoff, shutdown that releases, cancellation, panics,
//! wake-ups.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::{Dialect, TestDb, matrix, server_matrix};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement, TransactionTrait};
use task_dedup::{
    DedupError, HandlerError, NewTask, RetryPolicy, TaskDedup, TaskKey, TaskLifecycle, TaskStatus,
    Wakeups, Worker, WorkerReport, task_run,
};
use tokio_util::sync::CancellationToken;

matrix!(
    a_thousand_tasks_each_run_exactly_once,
    failing_twice_then_succeeding_takes_three_attempts_with_backoff,
    shutdown_releases_a_running_task_for_another_worker,
    a_cancelled_tasks_handler_sees_it_within_a_heartbeat,
    a_handler_deaf_to_its_cancellation_is_dropped_after_the_cancel_grace,
    a_panicking_handler_leaves_the_worker_running,
    a_new_task_starts_without_waiting_for_the_poll,
    a_task_enqueued_in_a_transaction_starts_without_waiting_for_the_poll,
    a_killed_worker_processs_tasks_are_run_by_another_worker,
    a_bad_listen_url_is_refused_by_the_builder,
);

// Sessions to kill: the server dialects.
server_matrix!(a_worker_survives_its_connections_being_killed);

fn key(resource: &str) -> TaskKey {
    TaskKey::new("user-1", "job", resource).expect("valid key")
}

/// Enqueues a task on `resource`; its id.
async fn enqueued(db: &DatabaseConnection, resource: &str) -> uuid::Uuid {
    db.find_or_enqueue(NewTask::new(key(resource)))
        .await
        .expect("enqueue")
        .task()
        .id
}

/// Polls `seen` every 10 ms until it gives a value; fails with `what` after 5 s.
async fn within_5s<T>(what: &str, mut seen: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = seen() {
            return value;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Retries at once, up to five attempts.
fn quick_retries() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 5,
        base_delay: Duration::ZERO,
        max_delay: Duration::ZERO,
        jitter: 0.0,
    }
}

/// Records a run of `task` by `worker` in `runs`: a second run of one task breaks the
/// primary key.
async fn record_run(
    db: &DatabaseConnection,
    task: &task_run::Model,
    worker: &str,
) -> Result<(), HandlerError> {
    let sql = match db.get_database_backend() {
        sea_orm::DbBackend::Postgres => "INSERT INTO runs (task_id, worker) VALUES ($1, $2)",
        _ => "INSERT INTO runs (task_id, worker) VALUES (?, ?)",
    };
    db.execute_raw(Statement::from_sql_and_values(
        db.get_database_backend(),
        sql,
        [task.id.to_string().into(), worker.into()],
    ))
    .await
    .map(drop)
    .map_err(|e| HandlerError::fail(format!("second run of {}: {e}", task.id)))
}

/// A worker whose handler records each run and takes a moment.
fn recording_worker(db: &DatabaseConnection, id: &str) -> Worker {
    let recorder = db.clone();
    let worker_id = id.to_owned();
    Worker::builder(db.clone())
        .id(id)
        .concurrency(8)
        .lease(Duration::from_secs(10))
        .retry_policy(quick_retries())
        .poll_interval(Duration::from_millis(20), Duration::from_millis(200))
        .handler(move |task: task_run::Model, _cancel: CancellationToken| {
            let (db, worker_id) = (recorder.clone(), worker_id.clone());
            async move {
                record_run(&db, &task, &worker_id).await?;
                tokio::time::sleep(Duration::from_millis(2)).await;
                Ok(None)
            }
        })
        .build()
        .expect("worker")
}

/// The child process of [`a_thousand_tasks_each_run_exactly_once`]: one recording worker
/// until its stdin closes. Does nothing unless the parent started it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of a_thousand_tasks_each_run_exactly_once"]
async fn child_worker_process() {
    let Ok(url) = std::env::var("TASK_DEDUP_WORKER_CHILD_URL") else {
        return;
    };
    let name = std::env::var("TASK_DEDUP_WORKER_CHILD_NAME").expect("name");
    let db = task_dedup::connect(&url).await.expect("connect");
    if std::env::var("TASK_DEDUP_WORKER_CHILD_HANG").is_ok() {
        return hanging_worker(db).await;
    }
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        stop.cancel();
    });
    let report = recording_worker(&db, &name)
        .run(shutdown)
        .await
        .expect("run");
    println!("child {name} done: {report:?}");
}

/// A worker whose handlers say which task they started on stdout, then never return:
/// the child of [`a_killed_worker_processs_tasks_are_run_by_another_worker`], killed
/// with its tasks running.
async fn hanging_worker(db: DatabaseConnection) {
    Worker::builder(db)
        .id("doomed")
        .concurrency(3)
        .lease(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(10), Duration::from_millis(50))
        .handler(|task: task_run::Model, _| async move {
            println!("started {}", task.id);
            std::future::pending::<()>().await;
            Ok(None)
        })
        .build()
        .expect("worker")
        .run(CancellationToken::new())
        .await
        .expect("run");
}

fn child_worker(url: &str, name: &str) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            &harness::children::test_name(module_path!(), "child_worker_process"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TASK_DEDUP_WORKER_CHILD_URL", url)
        .env("TASK_DEDUP_WORKER_CHILD_NAME", name)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn a worker process")
}

async fn a_thousand_tasks_each_run_exactly_once(db: &TestDb) {
    db.migrate().await;
    db.exec(
        "CREATE TABLE runs (task_id varchar(36) NOT NULL PRIMARY KEY, worker varchar(64) NOT NULL)",
    )
    .await;
    let pool = db.pool(24).await;
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    for w in 0..4 {
        let worker = recording_worker(&pool, &format!("in-process-{w}"));
        workers.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    let mut children = vec![
        child_worker(&db.url, "process-a"),
        child_worker(&db.url, "process-b"),
    ];

    // 1,000 tasks over 50 keys: a key takes a new task once its last one finished.
    let mut created = HashSet::new();
    let started = Instant::now();
    while created.len() < 1_000 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{} created",
            created.len()
        );
        for k in 0..50 {
            if created.len() == 1_000 {
                break;
            }
            let outcome = pool
                .find_or_enqueue(NewTask::new(key(&format!("doc-{k}"))))
                .await
                .expect("enqueue");
            if outcome.is_created() {
                created.insert(outcome.task().id);
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Until every one of them succeeded.
    loop {
        let done = harness::count(
            &pool.db,
            "SELECT COUNT(*) AS n FROM task_run WHERE status = 'succeeded'",
        )
        .await;
        if done >= 1_000 {
            break;
        }
        if started.elapsed() > Duration::from_secs(180) {
            let stuck: Vec<_> = harness::rows::all(&pool.db)
                .await
                .into_iter()
                .filter(|t| t.status != TaskStatus::Succeeded)
                .collect();
            panic!("{done} of 1,000 done; not done: {stuck:#?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    let mut reports = Vec::new();
    for worker in workers {
        reports.push(worker.await.expect("worker task").expect("worker"));
    }
    for child in &mut children {
        drop(child.stdin.take());
        let status = child.wait().expect("child exits");
        assert!(status.success(), "worker process: {status}");
    }

    assert_eq!(
        harness::count(&pool.db, "SELECT COUNT(*) AS n FROM runs").await,
        1_000,
        "each ran once"
    );
    let runs_by_process = harness::count(
        &pool.db,
        "SELECT COUNT(*) AS n FROM runs WHERE worker LIKE 'process-%'",
    )
    .await;
    let in_process: u64 = reports.iter().map(|r| r.completed).sum();
    assert_eq!(in_process + runs_by_process as u64, 1_000);
    assert!(
        reports.iter().all(|r| r.failed == 0 && r.lost == 0),
        "{reports:?}"
    );
    let stored = harness::rows::all(&pool.db).await;
    for id in &created {
        let task = stored.iter().find(|t| t.id == *id).expect("stored");
        assert_eq!((task.status, task.attempts), (TaskStatus::Succeeded, 1));
    }
    for k in 0..50 {
        assert_eq!(
            pool.find_active(&key(&format!("doc-{k}")))
                .await
                .expect("read"),
            None
        );
    }
    println!(
        "{}: in-process workers ran {in_process}, worker processes {runs_by_process}",
        db.dialect.name()
    );
}

async fn failing_twice_then_succeeding_takes_three_attempts_with_backoff(db: &TestDb) {
    db.migrate().await;
    let starts = Arc::new(Mutex::new(Vec::new()));
    let seen = starts.clone();
    let worker = Worker::builder(db.db.clone())
        .retry_policy(RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(300),
            max_delay: Duration::from_secs(5),
            jitter: 0.0,
        })
        .poll_interval(Duration::from_millis(10), Duration::from_millis(50))
        .handler(move |task: task_run::Model, _| {
            let seen = seen.clone();
            async move {
                seen.lock().expect("lock").push(Instant::now());
                if task.attempts < 3 {
                    Err(HandlerError::retry(format!(
                        "flaky, attempt {}",
                        task.attempts
                    )))
                } else {
                    Ok(Some(serde_json::json!("third time lucky")))
                }
            }
        })
        .build()
        .expect("worker");
    let id = enqueued(&db.db, "flaky").await;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let task = wait_for(&db.db, id, |t| t.status == TaskStatus::Succeeded).await;
    shutdown.cancel();
    let report = running.await.expect("task").expect("run");
    assert_eq!(task.attempts, 3);
    assert_eq!(task.result, Some(serde_json::json!("third time lucky")));
    assert_eq!((report.retried, report.completed, report.failed), (2, 1, 0));
    let starts = starts.lock().expect("lock").clone();
    assert_eq!(starts.len(), 3);
    // 300 ms after the first failure, 600 ms after the second (the database's clock
    // decides when a retry is due; the worker's poll adds up to 50 ms).
    let gaps = [starts[1] - starts[0], starts[2] - starts[1]];
    assert!(gaps[0] >= Duration::from_millis(280), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(580), "{gaps:?}");
    assert!(gaps[1] > gaps[0], "the backoff grows: {gaps:?}");
    // The worker claims its own retries when they fall due, not at its fallback poll
    // (5 s on PostgreSQL).
    assert!(gaps[1] < Duration::from_millis(1_500), "{gaps:?}");
}

/// Polls task `id` until `done` holds for it.
async fn wait_for(
    db: &DatabaseConnection,
    id: uuid::Uuid,
    done: impl Fn(&task_run::Model) -> bool,
) -> task_run::Model {
    use sea_orm::EntityTrait;
    let started = Instant::now();
    loop {
        let task = task_run::Entity::find_by_id(id)
            .one(db)
            .await
            .expect("read")
            .expect("exists");
        if done(&task) {
            return task;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still {task:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn shutdown_releases_a_running_task_for_another_worker(db: &TestDb) {
    db.migrate().await;
    let started = Arc::new(tokio::sync::Notify::new());
    let signal = started.clone();
    // A worker whose handler runs until it is cancelled, and a short grace.
    let stubborn = Worker::builder(db.db.clone())
        .id("stubborn")
        .shutdown_grace(Duration::from_millis(200))
        .poll_interval(Duration::from_millis(10), Duration::from_millis(50))
        .handler(move |_task: task_run::Model, cancel: CancellationToken| {
            let signal = signal.clone();
            async move {
                signal.notify_one();
                cancel.cancelled().await;
                Err(HandlerError::retry("interrupted"))
            }
        })
        .build()
        .expect("worker");
    let id = enqueued(&db.db, "long").await;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(stubborn.run(shutdown.clone()));
    started.notified().await;
    let before = Instant::now();
    shutdown.cancel();
    let report = running.await.expect("task").expect("run");
    assert!(
        before.elapsed() < Duration::from_secs(3),
        "the grace bounds the shutdown"
    );
    assert_eq!(
        (report.released, report.failed, report.retried),
        (1, 0, 0),
        "{report:?}"
    );
    let released = wait_for(&db.db, id, |t| t.status == TaskStatus::Queued).await;
    assert_eq!(
        released.attempts, 0,
        "the interrupted attempt does not count"
    );
    assert_eq!(released.lease_expires_at, None);

    // Another worker picks it up at once, without waiting for a lease.
    let done = Worker::builder(db.db.clone())
        .id("rescuer")
        .poll_interval(Duration::from_millis(10), Duration::from_millis(50))
        .handler(|_task: task_run::Model, _| async { Ok(None) })
        .build()
        .expect("worker");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(done.run(shutdown.clone()));
    let task = wait_for(&db.db, id, |t| t.status == TaskStatus::Succeeded).await;
    shutdown.cancel();
    running.await.expect("task").expect("run");
    assert_eq!(
        (task.attempts, task.lease_owner.as_deref()),
        (1, Some("rescuer"))
    );
}

async fn a_cancelled_tasks_handler_sees_it_within_a_heartbeat(db: &TestDb) {
    db.migrate().await;
    let heartbeat = Duration::from_millis(200);
    let (started, saw) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(Mutex::new(None)),
    );
    let (signal, record) = (started.clone(), saw.clone());
    let worker = Worker::builder(db.db.clone())
        .lease(Duration::from_secs(2))
        .heartbeat_every(heartbeat)
        .poll_interval(Duration::from_millis(10), Duration::from_millis(50))
        .handler(move |_task: task_run::Model, cancel: CancellationToken| {
            let (signal, record) = (signal.clone(), record.clone());
            async move {
                signal.notify_one();
                cancel.cancelled().await;
                *record.lock().expect("lock") = Some(Instant::now());
                Ok(Some(serde_json::json!("discarded")))
            }
        })
        .build()
        .expect("worker");
    let id = enqueued(&db.db, "doomed").await;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    started.notified().await;
    let cancelled_at = Instant::now();
    db.db.cancel(id, "no longer needed").await.expect("cancel");
    let seen = within_5s("the handler never saw it", || *saw.lock().expect("lock")).await;
    let delay = seen - cancelled_at;
    assert!(
        delay <= heartbeat + Duration::from_millis(150),
        "saw it after {delay:?}"
    );
    shutdown.cancel();
    let report = running.await.expect("task").expect("run");
    assert_eq!(
        (report.cancelled, report.lost, report.completed),
        (1, 0, 0),
        "{report:?}"
    );
    let task = wait_for(&db.db, id, |_| true).await;
    assert_eq!(task.status, TaskStatus::Cancelled);
    assert_eq!(task.result, None, "the handler's result was discarded");
}

async fn a_handler_deaf_to_its_cancellation_is_dropped_after_the_cancel_grace(db: &TestDb) {
    db.migrate().await;
    /// Marks the handler's future as dropped.
    struct Dropped(Arc<AtomicBool>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let (started, dropped) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(AtomicBool::new(false)),
    );
    let (signal, flag) = (started.clone(), dropped.clone());
    let worker = Worker::builder(db.db.clone())
        .lease(Duration::from_secs(2))
        .heartbeat_every(Duration::from_millis(100))
        .cancel_grace(Duration::from_millis(200))
        .shutdown_grace(Duration::from_secs(30))
        .poll_interval(Duration::from_millis(10), Duration::from_millis(50))
        .handler(move |_task: task_run::Model, _cancel: CancellationToken| {
            let (signal, guard) = (signal.clone(), Dropped(flag.clone()));
            async move {
                let _guard = guard;
                signal.notify_one();
                std::future::pending::<()>().await;
                Ok(None)
            }
        })
        .build()
        .expect("worker");
    let id = enqueued(&db.db, "deaf").await;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    started.notified().await;
    db.db.cancel(id, "no longer needed").await.expect("cancel");
    within_5s("the handler was never dropped", || {
        dropped.load(Ordering::SeqCst).then_some(())
    })
    .await;
    // Dropped: the shutdown has nothing to wait for, whatever its grace.
    let stopping = Instant::now();
    shutdown.cancel();
    let report = running.await.expect("task").expect("run");
    assert!(stopping.elapsed() < Duration::from_secs(2));
    assert_eq!(
        (report.cancelled, report.lost, report.released),
        (1, 0, 0),
        "{report:?}"
    );
    let task = wait_for(&db.db, id, |_| true).await;
    assert_eq!(task.status, TaskStatus::Cancelled);
}

async fn a_panicking_handler_leaves_the_worker_running(db: &TestDb) {
    db.migrate().await;
    let worker = Worker::builder(db.db.clone())
        .retry_policy(quick_retries())
        .poll_interval(Duration::from_millis(10), Duration::from_millis(50))
        .handler(|task: task_run::Model, _| async move {
            if task.resource_key == "bomb" && task.attempts == 1 {
                panic!("boom on the first attempt");
            }
            Ok(Some(serde_json::json!(task.resource_key)))
        })
        .build()
        .expect("worker");
    let bomb = enqueued(&db.db, "bomb").await;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let task = wait_for(&db.db, bomb, |t| t.status == TaskStatus::Succeeded).await;
    assert_eq!(task.attempts, 2, "the panic failed the first attempt");
    // The worker still runs: a new task is done too.
    let next = enqueued(&db.db, "after").await;
    wait_for(&db.db, next, |t| t.status == TaskStatus::Succeeded).await;
    shutdown.cancel();
    let report: WorkerReport = running.await.expect("task").expect("run");
    assert_eq!(
        (report.panicked, report.retried, report.completed),
        (1, 1, 2),
        "{report:?}"
    );
}

/// PostgreSQL (LISTEN) and SQLite (the in-process doorbell) start a new task at once
/// though the worker's poll is 30 s; MySQL/MariaDB polls, so its poll is short here.
async fn a_new_task_starts_without_waiting_for_the_poll(db: &TestDb) {
    starts_without_waiting_for_the_poll(db, false).await;
}

/// Committed by the caller's transaction: PostgreSQL's notification goes out at the
/// commit; SQLite's change watcher sees the commit (the doorbell cannot: it would ring
/// before it).
async fn a_task_enqueued_in_a_transaction_starts_without_waiting_for_the_poll(db: &TestDb) {
    starts_without_waiting_for_the_poll(db, true).await;
}

async fn starts_without_waiting_for_the_poll(db: &TestDb, in_transaction: bool) {
    db.migrate().await;
    let poll = match db.dialect {
        Dialect::Postgres | Dialect::Sqlite => (Duration::from_secs(30), Duration::from_secs(30)),
        Dialect::MySql => (Duration::from_millis(20), Duration::from_millis(100)),
    };
    let started = Arc::new(tokio::sync::Notify::new());
    let signal = started.clone();
    let worker = Worker::builder(db.db.clone())
        .wakeups(Wakeups::Auto)
        .poll_interval(poll.0, poll.1)
        .fallback_poll(Duration::from_secs(30))
        .handler(move |_task: task_run::Model, _| {
            let signal = signal.clone();
            async move {
                signal.notify_one();
                Ok(None)
            }
        })
        .build()
        .expect("worker");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    // Let it find nothing and go to sleep.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for round in 0..3 {
        let enqueued = Instant::now();
        let task = NewTask::new(key(&format!("ping-{round}")));
        if in_transaction {
            let txn = db.db.begin().await.expect("begin");
            txn.find_or_enqueue(task).await.expect("enqueue");
            txn.commit().await.expect("commit");
        } else {
            db.db.find_or_enqueue(task).await.expect("enqueue");
        }
        tokio::time::timeout(Duration::from_secs(3), started.notified())
            .await
            .unwrap_or_else(|_| panic!("round {round}: not started within 3 s"));
        let latency = enqueued.elapsed();
        assert!(
            latency < Duration::from_secs(1),
            "round {round}: {latency:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    shutdown.cancel();
    let report = running.await.expect("task").expect("run");
    // On a session of its own, the PostgreSQL listener hears its check.
    assert_eq!(report.unheard_listener_checks, 0, "{report:?}");
}

async fn a_killed_worker_processs_tasks_are_run_by_another_worker(db: &TestDb) {
    db.migrate().await;
    let mut all = HashSet::new();
    for i in 0..6 {
        let task = db
            .db
            .find_or_enqueue(NewTask::new(key(&format!("doc-{i}"))))
            .await
            .expect("enqueue");
        all.insert(task.task().id);
    }
    let mut doomed = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            &harness::children::test_name(module_path!(), "child_worker_process"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TASK_DEDUP_WORKER_CHILD_URL", &db.url)
        .env("TASK_DEDUP_WORKER_CHILD_NAME", "doomed")
        .env("TASK_DEDUP_WORKER_CHILD_HANG", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn a worker process");
    let mut lines = BufReader::new(doomed.stdout.take().expect("stdout")).lines();
    let mut started = HashSet::new();
    while started.len() < 3 {
        let line = lines.next().expect("a line").expect("utf-8");
        if let Some((_, id)) = line.split_once("started ") {
            started.insert(id.parse::<uuid::Uuid>().expect("uuid"));
        }
    }
    doomed.kill().expect("kill -9 the worker process");
    doomed.wait().expect("reaped");

    // Another worker reaps the three expired leases and runs everything once.
    let runs = Arc::new(Mutex::new(HashMap::<uuid::Uuid, u32>::new()));
    let seen = runs.clone();
    let rescuer = Worker::builder(db.db.clone())
        .id("rescuer")
        .lease(Duration::from_secs(2))
        .reap_every(Duration::from_millis(200))
        .retry_policy(quick_retries())
        .poll_interval(Duration::from_millis(10), Duration::from_millis(50))
        .handler(move |task: task_run::Model, _| {
            *seen.lock().expect("lock").entry(task.id).or_default() += 1;
            async { Ok(None) }
        })
        .build()
        .expect("worker");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(rescuer.run(shutdown.clone()));
    for id in &all {
        wait_for(&db.db, *id, |t| t.status == TaskStatus::Succeeded).await;
    }
    shutdown.cancel();
    let report = running.await.expect("task").expect("run");
    assert_eq!(report.reaped_requeued, 3, "{report:?}");
    let runs = runs.lock().expect("lock").clone();
    assert_eq!(runs.len(), 6);
    assert!(runs.values().all(|n| *n == 1), "{runs:?}");
    for task in harness::rows::all(&db.db).await {
        let attempts = if started.contains(&task.id) { 2 } else { 1 };
        assert_eq!(
            (task.attempts, task.lease_owner.as_deref()),
            (attempts, Some("rescuer"))
        );
    }
}

/// The server sessions of this test's database, killed from an admin connection.
/// Every session of the database killed every 300 ms for 3 s while a worker runs 300
/// tasks: each runs once and succeeds (a claim lost with its connection comes back
/// when its lease expires), and the worker keeps running.
async fn a_worker_survives_its_connections_being_killed(db: &TestDb) {
    db.migrate().await;
    let mut all = Vec::new();
    for i in 0..300 {
        let task = db
            .db
            .find_or_enqueue(NewTask::new(key(&format!("doc-{i}"))))
            .await
            .expect("enqueue");
        all.push(task.task().id);
    }
    let runs = Arc::new(Mutex::new(HashMap::<uuid::Uuid, u32>::new()));
    let seen = runs.clone();
    let worker = Worker::builder(db.db.clone())
        .lease(Duration::from_secs(2))
        .reap_every(Duration::from_millis(500))
        .retry_policy(quick_retries())
        .poll_interval(Duration::from_millis(10), Duration::from_millis(100))
        .handler(move |task: task_run::Model, _| {
            *seen.lock().expect("lock").entry(task.id).or_default() += 1;
            async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(None)
            }
        })
        .build()
        .expect("worker");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let mut killed = 0;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        killed += db.kill_all_sessions().await;
    }
    for id in &all {
        wait_for(&db.db, *id, |t| t.status == TaskStatus::Succeeded).await;
    }
    shutdown.cancel();
    let report = running.await.expect("task").expect("run");
    let runs = runs.lock().expect("lock").clone();
    assert_eq!(runs.len(), 300);
    assert!(runs.values().all(|n| *n == 1), "a task ran twice: {runs:?}");
    assert_eq!((report.failed, report.completed), (0, 300), "{report:?}");
    println!(
        "{}: {killed} sessions killed; {report:?}",
        db.dialect.name()
    );
}

#[tokio::test]
async fn the_builder_refuses_bad_settings_before_any_sql() {
    let db = task_dedup::connect("sqlite::memory:")
        .await
        .expect("connect");
    let ok = || Worker::builder(db.clone()).handler(|_: task_run::Model, _| async { Ok(None) });
    let refused = |built: Result<Worker, DedupError>| match built {
        Err(DedupError::InvalidArgument { name, .. }) => name,
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("built"),
    };
    assert_eq!(refused(Worker::builder(db.clone()).build()), "handler");
    assert_eq!(refused(ok().concurrency(0).build()), "concurrency");
    assert_eq!(refused(ok().lease(Duration::ZERO).build()), "lease");
    assert_eq!(
        refused(
            ok().lease(Duration::from_secs(1))
                .heartbeat_every(Duration::from_secs(1))
                .build()
        ),
        "heartbeat_every"
    );
    assert_eq!(
        refused(
            ok().poll_interval(Duration::from_secs(2), Duration::from_secs(1))
                .build()
        ),
        "poll_interval"
    );
    assert_eq!(
        refused(ok().fallback_poll(Duration::ZERO).build()),
        "fallback_poll"
    );
    assert_eq!(
        refused(ok().task_type_concurrency("pdf", 2).build()),
        "task_type_concurrency"
    );
    assert_eq!(refused(ok().id("x".repeat(65)).build()), "worker_id");
    assert_eq!(refused(ok().task_types([""]).build()), "task_types");
    // A listener of its own is PostgreSQL's.
    assert_eq!(
        refused(ok().listen_url("postgres://postgres@127.0.0.1/app").build()),
        "listen_url"
    );
    assert!(ok().build().is_ok());
}

/// A listener URL that is not PostgreSQL's is refused when the worker is built, naming
/// the setting; the error does not repeat the URL (it may hold a password).
async fn a_bad_listen_url_is_refused_by_the_builder(db: &TestDb) {
    let ok = || Worker::builder(db.db.clone()).handler(|_: task_run::Model, _| async { Ok(None) });
    for url in ["mysql://root:secret@127.0.0.1/app", "not a url secret"] {
        match ok().listen_url(url).build() {
            Err(
                err @ DedupError::InvalidArgument {
                    name: "listen_url", ..
                },
            ) => {
                assert!(!err.to_string().contains("secret"), "{err}");
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("built with {url}"),
        }
    }
    let direct = ok().listen_url(db.url.clone()).build();
    match db.dialect {
        Dialect::Postgres => assert!(direct.is_ok()),
        Dialect::Sqlite | Dialect::MySql => assert!(direct.is_err()),
    }
}
