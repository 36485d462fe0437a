//! The `metrics` feature: a known run on every dialect, counted by a recorder.
//!
//! A test binary of its own (`[[test]] metrics` in Cargo.toml, not a module of
//! `worker/main.rs`): the recorder is the process's, and would count the runs of the
//! tests beside it.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use harness::{TestDb, matrix};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use sea_orm::{DatabaseConnection, EntityTrait};
use task_dedup::{
    HandlerError, Job, NewTask, OnConflict, RetryPolicy, Schedule, Task, TaskAdmin, TaskDedup,
    TaskKey, TaskLifecycle, TaskStatus, TypeLimits, Worker, task_run,
};
use tokio_util::sync::CancellationToken;

matrix!(
    a_known_run_is_counted,
    periodic_ticks_are_counted_per_outcome,
    limit_waits_are_counted_per_limit,
    workers_waiting_for_a_window_claim_once_per_opening
);

/// The process's recorder: metrics are global, so the dialects take turns.
fn recorder() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("the only recorder");
        snapshotter
    })
}

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What was recorded since the last call: counters by `name{label=value}`, and the
/// number of samples of each histogram.
fn recorded() -> BTreeMap<String, u64> {
    let mut seen = BTreeMap::new();
    for (key, _, _, value) in recorder().snapshot().into_vec() {
        let key = key.key();
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = if labels.is_empty() {
            key.name().to_owned()
        } else {
            format!("{}{{{}}}", key.name(), labels.join(","))
        };
        let n = match value {
            DebugValue::Counter(n) => n,
            DebugValue::Histogram(samples) => samples.len() as u64,
            DebugValue::Gauge(_) => continue,
        };
        if n > 0 {
            seen.insert(name, n);
        }
    }
    seen
}

fn task(resource: &str) -> NewTask {
    NewTask::new(TaskKey::new("user-1", "job", resource).expect("valid key"))
}

async fn wait_until(db: &DatabaseConnection, done: impl Fn(&[task_run::Model]) -> bool) {
    let started = Instant::now();
    loop {
        let tasks = task_run::Entity::find().all(db).await.expect("read");
        if done(&tasks) {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{tasks:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn status_of(tasks: &[task_run::Model], resource: &str) -> Vec<TaskStatus> {
    tasks
        .iter()
        .filter(|t| t.resource_key == resource)
        .map(|t| t.status)
        .collect()
}

async fn a_known_run_is_counted(db: &TestDb) {
    let _turn = TURN.lock().await;
    db.migrate().await;
    recorded();

    // Enqueues: 6 created, 2 existing, 1 replaced.
    let db = &db.db;
    for resource in ["a", "b", "a"] {
        db.find_or_enqueue(task(resource)).await.expect("enqueue");
    }
    let replaced = db
        .find_or_enqueue(
            task("b")
                .with_payload(serde_json::json!({"v": 2}))
                .on_conflict(OnConflict::ReplaceIfQueued),
        )
        .await
        .expect("replace");
    assert!(replaced.is_replaced());
    db.find_or_enqueue_many([task("c"), task("d"), task("a")])
        .await
        .expect("bulk");
    let orphan = NewTask::new(TaskKey::new("user-1", "orphan", "o").expect("valid key"));
    db.find_or_enqueue(orphan).await.expect("enqueue");
    db.find_or_enqueue(task("e")).await.expect("enqueue");

    // An abandoned claim, reaped: 1 claimed, 1 reaped (requeued).
    let claimed = db
        .claim("ghost", &["orphan"], Duration::from_millis(50))
        .await
        .expect("claim")
        .expect("the orphan");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let quick = RetryPolicy {
        max_attempts: 3,
        base_delay: Duration::ZERO,
        max_delay: Duration::ZERO,
        jitter: 0.0,
    };
    let reaped = db.reap_expired(&quick).await.expect("reap");
    assert_eq!((reaped.requeued, claimed.resource_key.as_str()), (1, "o"));

    // A worker: a completes; b fails for good; c fails once, d panics once, then both
    // complete; e runs until the shutdown releases it. 7 claims.
    let worker = Worker::builder(db.clone())
        .task_types(["job"])
        .retry_policy(quick)
        .shutdown_grace(Duration::from_millis(100))
        .poll_interval(Duration::from_millis(10), Duration::from_millis(50))
        .handler(
            |task: task_run::Model, cancel: CancellationToken| async move {
                match (task.resource_key.as_str(), task.attempts) {
                    ("b", _) => Err(HandlerError::fail("no such document")),
                    ("c", 1) => Err(HandlerError::retry("flaky")),
                    ("d", 1) => panic!("boom"),
                    ("e", _) => {
                        cancel.cancelled().await;
                        Err(HandlerError::retry("interrupted"))
                    }
                    _ => Ok(None),
                }
            },
        )
        .build()
        .expect("worker");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_until(db, |tasks| {
        ["a", "c", "d"]
            .iter()
            .all(|r| status_of(tasks, r) == [TaskStatus::Succeeded])
            && status_of(tasks, "b") == [TaskStatus::Failed]
            && status_of(tasks, "e") == [TaskStatus::Running]
    })
    .await;
    shutdown.cancel();
    let report = running.await.expect("worker task").expect("worker");
    assert_eq!(
        (report.claimed, report.released, report.panicked),
        (7, 1, 1)
    );

    let expected: BTreeMap<String, u64> = [
        ("task_dedup_enqueued_total{outcome=created}", 6),
        ("task_dedup_enqueued_total{outcome=existing}", 2),
        ("task_dedup_enqueued_total{outcome=replaced}", 1),
        ("task_dedup_claimed_total", 8),
        ("task_dedup_enqueue_to_start_seconds", 8),
        ("task_dedup_reaped_total{outcome=requeued}", 1),
        ("task_dedup_finished_total{outcome=completed}", 3),
        ("task_dedup_finished_total{outcome=failed}", 1),
        ("task_dedup_finished_total{outcome=retried}", 2),
        ("task_dedup_finished_total{outcome=released}", 1),
        ("task_dedup_claim_to_finish_seconds{outcome=completed}", 3),
        ("task_dedup_claim_to_finish_seconds{outcome=failed}", 1),
        ("task_dedup_claim_to_finish_seconds{outcome=retried}", 2),
        ("task_dedup_claim_to_finish_seconds{outcome=released}", 1),
    ]
    .into_iter()
    .map(|(name, n)| (name.to_owned(), n))
    .collect();
    assert_eq!(recorded(), expected);
}

#[derive(serde::Serialize, serde::Deserialize)]
struct NewYear {
    year: i32,
}

impl Task for NewYear {
    const TASK_TYPE: &'static str = "new-year";

    fn resource_key(&self) -> String {
        "greeting".to_owned()
    }
}

async fn periodic_ticks_are_counted_per_outcome(db: &TestDb) {
    let _turn = TURN.lock().await;
    db.migrate().await;
    recorded();

    // Two workers start on a yearly schedule: each enqueues this year's tick (the
    // latest past), one creates it, the other finds it.
    let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let shutdown = CancellationToken::new();
    let mut running = Vec::new();
    for _ in 0..2 {
        let made = made.clone();
        let worker = Worker::builder(db.db.clone())
            .register::<NewYear>(|_job: Job<NewYear>| async { Ok::<_, HandlerError>(()) })
            .periodic(Schedule::cron("0 0 1 1 *"), move |tick| {
                made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                NewYear {
                    year: chrono::Datelike::year(&tick),
                }
            })
            .build()
            .expect("worker");
        running.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    let started = Instant::now();
    while made.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        assert!(started.elapsed() < Duration::from_secs(20), "no ticks");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A shutdown lets an enqueue in flight finish.
    shutdown.cancel();
    for worker in running {
        worker.await.expect("worker task").expect("worker");
    }
    let periodic: BTreeMap<String, u64> = recorded()
        .into_iter()
        .filter(|(name, _)| name.starts_with("task_dedup_periodic"))
        .collect();
    let expected: BTreeMap<String, u64> = [
        (
            "task_dedup_periodic_ticks_total{task_type=new-year,outcome=created}",
            1,
        ),
        (
            "task_dedup_periodic_ticks_total{task_type=new-year,outcome=existing}",
            1,
        ),
    ]
    .into_iter()
    .map(|(name, n)| (name.to_owned(), n))
    .collect();
    assert_eq!(periodic, expected);
}

/// Claims of a limited type that left due tasks queued, counted per limit that did.
async fn limit_waits_are_counted_per_limit(db: &TestDb) {
    let _turn = TURN.lock().await;
    db.migrate().await;
    let lease = Duration::from_secs(60);
    db.db
        .set_limits("export", &TypeLimits::new().max_running(1))
        .await
        .expect("set");
    db.db
        .set_limits(
            "mail",
            &TypeLimits::new().rate(1, Duration::from_secs(30 * 24 * 3600)),
        )
        .await
        .expect("set");
    db.db
        .set_limits("sync", &TypeLimits::new().max_running_per_user(1))
        .await
        .expect("set");
    for task_type in ["export", "mail", "sync"] {
        for resource in ["a", "b"] {
            let key = TaskKey::new("u", task_type, resource).expect("key");
            db.db
                .find_or_enqueue(NewTask::new(key))
                .await
                .expect("enqueue");
        }
    }
    recorded();
    for task_type in ["export", "mail", "sync"] {
        let first = db
            .db
            .claim_many("w", &[task_type], lease, 2)
            .await
            .expect("claim");
        assert_eq!(first.len(), 1, "{task_type}");
        let second = db
            .db
            .claim_many("w", &[task_type], lease, 2)
            .await
            .expect("claim");
        assert!(second.is_empty(), "{task_type}");
    }
    let seen = recorded();
    for limit in ["max_running", "rate", "max_running_per_user"] {
        assert!(
            seen.get(&format!("task_dedup_limit_waits_total{{limit={limit}}}")) >= Some(&1),
            "{limit}: {seen:?}"
        );
    }
}

/// 2 starts per 500 ms, 10 tasks, 2 Workers of 4 slots polling every 30 s: they start
/// all 10 in about 5 windows, each claiming when a window opens (and when its tasks
/// end), never in a loop while the window is full: the claims that found the window
/// full (`task_dedup_limit_waits_total{limit=rate}`) stay a few per worker and window.
async fn workers_waiting_for_a_window_claim_once_per_opening(db: &TestDb) {
    let _turn = TURN.lock().await;
    db.migrate().await;
    db.db
        .set_limits(
            "mail",
            &TypeLimits::new().rate(2, Duration::from_millis(500)),
        )
        .await
        .expect("set");
    for resource in 0..10 {
        let key = TaskKey::new("u", "mail", resource.to_string()).expect("key");
        db.db
            .find_or_enqueue(NewTask::new(key))
            .await
            .expect("enqueue");
    }
    recorded();
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    for w in 0..2 {
        let worker = Worker::builder(db.db.clone())
            .id(format!("w{w}"))
            .task_types(["mail"])
            .concurrency(4)
            .poll_interval(Duration::from_secs(30), Duration::from_secs(30))
            .fallback_poll(Duration::from_secs(30))
            .handler(|_: task_run::Model, _: CancellationToken| async { Ok(None) })
            .build()
            .expect("worker");
        let shutdown = shutdown.clone();
        workers.push(tokio::spawn(async move { worker.run(shutdown).await }));
    }
    let began = Instant::now();
    let started = "SELECT count(*) AS n FROM task_run WHERE started_at IS NOT NULL";
    while harness::count(&db.db, started).await < 10 {
        assert!(
            began.elapsed() < Duration::from_secs(6),
            "not all started in 6 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = began.elapsed();
    shutdown.cancel();
    for worker in workers {
        worker.await.expect("worker").expect("run");
    }
    let waits = recorded()
        .get("task_dedup_limit_waits_total{limit=rate}")
        .copied()
        .unwrap_or(0);
    println!(
        "[rate] {:?}: 10 started in {took:?}, {waits} claims found the window full",
        db.dialect
    );
    // 2 workers, some 6 windows, a claim at each opening and after each batch of
    // endings: a loop would count thousands.
    assert!(
        waits <= 100,
        "{waits} claims found the window full in {took:?}"
    );
}
