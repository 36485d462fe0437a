//! Rate-limited work delivered at the rate, on every dialect: Workers whose claim found
//! the type's tasks due and its window full wake when the next window opens (by the
//! database's clock), not at their poll; no epoch-aligned window, as the stored
//! `started_at` values fall, ever holds more starts than the limit; a worker waiting for
//! a window stops at once when shut down, and one whose connections are killed at a
//! window's opening goes on without a panic or a busy loop.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::{TestDb, matrix, server_matrix};
use sea_orm::DatabaseConnection;
use task_dedup::{
    CancellationToken, NewTask, Retention, TaskAdmin, TaskDedup, TaskKey, TaskLifecycle,
    TypeLimits, Worker, WorkerReport, task_run,
};

matrix!(
    rate_limited_work_starts_as_each_window_opens,
    no_window_holds_more_starts_than_the_rate,
    a_worker_waiting_for_a_window_stops_at_once,
);

// Sessions to kill: the server dialects.
server_matrix!(killed_connections_at_a_windows_opening_delay_to_the_next_claim);

/// Far longer than any wait these tests allow: a worker that waits for its poll fails
/// them.
const POLL: Duration = Duration::from_secs(30);

async fn enqueue_many(db: &DatabaseConnection, task_type: &str, n: usize) {
    let tasks = (0..n).map(|i| {
        NewTask::new(TaskKey::new(format!("u{}", i % 7), task_type, i.to_string()).expect("key"))
    });
    let outcomes = db.find_or_enqueue_many(tasks).await.expect("enqueue");
    assert!(outcomes.iter().all(|o| o.is_created()));
}

/// A worker of `task_type` on `db` that polls only every [`POLL`]; its handler counts
/// its starts in `started`, and records the instant of each.
fn worker(
    db: DatabaseConnection,
    id: String,
    concurrency: usize,
    started: Arc<Mutex<Vec<Instant>>>,
) -> Worker {
    Worker::builder(db)
        .id(id)
        .task_types(["mail"])
        .concurrency(concurrency)
        .poll_interval(POLL, POLL)
        .fallback_poll(POLL)
        .retention(Retention::off())
        .handler(move |_: task_run::Model, _: CancellationToken| {
            let started = started.clone();
            async move {
                started.lock().expect("starts").push(Instant::now());
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(None)
            }
        })
        .build()
        .expect("worker")
}

/// The starts of `task_type` per epoch-aligned window of `window_micros`, as the
/// database recorded them (`started_at`).
async fn starts_per_window(
    db: &DatabaseConnection,
    task_type: &str,
    window_micros: i64,
) -> BTreeMap<i64, usize> {
    let mut windows = BTreeMap::new();
    for task in harness::rows::all(db).await {
        if task.task_type != task_type {
            continue;
        }
        if let Some(started) = task.started_at {
            let window = started.timestamp_micros().div_euclid(window_micros);
            *windows.entry(window).or_default() += 1;
        }
    }
    windows
}

/// The scenario of issue 52: 4 starts per 250 ms, 24 tasks, 4 Workers of 8 slots each
/// (pools of their own), polling every 30 s. The ideal is 6 windows, 1.5 s; a worker
/// that waits for its poll takes 30 s or more. Prints the time per dialect (the
/// measurement; run with `--nocapture`), asserts only a generous 6 s.
async fn rate_limited_work_starts_as_each_window_opens(db: &TestDb) {
    db.migrate().await;
    let window = Duration::from_millis(250);
    db.db
        .set_limits("mail", &TypeLimits::new().rate(4, window))
        .await
        .expect("limits");
    enqueue_many(&db.db, "mail", 24).await;
    let started = Arc::new(Mutex::new(Vec::new()));
    let shutdown = CancellationToken::new();
    let mut pools = Vec::new();
    let mut workers = Vec::new();
    for w in 0..4 {
        let pool = db.pool(4).await;
        let worker = worker(pool.db.clone(), format!("w{w}"), 8, started.clone());
        pools.push(pool);
        let shutdown = shutdown.clone();
        workers.push(tokio::spawn(async move { worker.run(shutdown).await }));
    }
    let began = Instant::now();
    let bound = Duration::from_secs(6);
    while started.lock().expect("starts").len() < 24 && began.elapsed() < bound {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let last = started.lock().expect("starts").iter().max().copied();
    let done = started.lock().expect("starts").len();
    shutdown.cancel();
    for worker in workers {
        worker.await.expect("worker").expect("run");
    }
    let took = match last {
        Some(last) if done == 24 => last - began,
        _ => began.elapsed(),
    };
    println!(
        "[rate] {:?}: 24 tasks at 4 per 250 ms through 4 Workers x 8: {done} started in {:.2} s \
         (ideal 1.50 s: {:.2} x)",
        db.dialect,
        took.as_secs_f64(),
        took.as_secs_f64() / 1.5
    );
    assert_eq!(done, 24, "only {done} of 24 started within {bound:?}");
    let windows = starts_per_window(&db.db, "mail", window.as_micros() as i64).await;
    assert!(windows.values().all(|n| *n <= 4), "{windows:?}");
}

/// 8 claimers on connections of their own under 4 starts per 50 ms window. For 3 s,
/// before the opening of every second window (the one before it left empty), each
/// sleeps to a moment within 4 ms of the opening (by this machine's clock, which is the
/// database's here) and claims up to 4; then for 1.5 s they claim as fast as they can,
/// queueing for the type's lock. No epoch-aligned window,
/// as the stored `started_at` values fall, may hold more than 4. A claim that counts the
/// empty window and stamps its tasks in the next one (two reads of the clock), or that
/// counts in a window older than the one recorded (a clock read before its wait for the
/// type's lock), lets the next window take up to 8.
async fn no_window_holds_more_starts_than_the_rate(db: &TestDb) {
    db.migrate().await;
    let window = Duration::from_millis(50);
    let window_micros = window.as_micros() as u64;
    db.db
        .set_limits("mail", &TypeLimits::new().rate(4, window))
        .await
        .expect("limits");
    enqueue_many(&db.db, "mail", 800).await;
    let claimers = 8;
    let pool = Arc::new(db.pool(claimers).await);
    let targeted = Instant::now() + Duration::from_secs(3);
    let until = targeted + Duration::from_millis(1_500);
    let claims = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for n in 0..claimers {
        let (pool, claims) = (pool.clone(), claims.clone());
        handles.push(tokio::spawn(async move {
            let mut round: u64 = 0;
            while Instant::now() < targeted {
                round += 1;
                let now = epoch_micros();
                let mut opening = (now / window_micros + 1) * window_micros;
                if (opening / window_micros) % 2 == 1 {
                    opening += window_micros;
                }
                // Up to 4 ms early, spread over the claimers and rounds: a claim reads the
                // clock a statement or two after it is called.
                let early = (u64::from(n) * 1_913 + round * 3_971) % 4_000;
                let target = opening - early;
                // The timer's grain is a millisecond: sleep to 3 ms before, then spin.
                let wait = target.saturating_sub(now + 3_000);
                tokio::time::sleep(Duration::from_micros(wait)).await;
                while epoch_micros() < target {
                    std::hint::spin_loop();
                }
                pool.claim_many(&format!("c{n}"), &["mail"], Duration::from_secs(60), 4)
                    .await
                    .expect("claim");
                claims.fetch_add(1, Ordering::Relaxed);
            }
            while Instant::now() < until {
                pool.claim_many(&format!("c{n}"), &["mail"], Duration::from_secs(60), 4)
                    .await
                    .expect("claim");
                claims.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for handle in handles {
        handle.await.expect("claimer");
    }
    let windows = starts_per_window(&db.db, "mail", window_micros as i64).await;
    let total: usize = windows.values().sum();
    let over: Vec<_> = windows.iter().filter(|(_, n)| **n > 4).collect();
    println!(
        "[rate] {:?}: {} claims, {total} starts in {} windows of 50 ms, {} over 4",
        db.dialect,
        claims.load(Ordering::Relaxed),
        windows.len(),
        over.len()
    );
    assert!(total > 40, "too few starts to mean anything: {total}");
    assert!(over.is_empty(), "windows over the rate of 4: {over:?}");
}

fn epoch_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros() as u64
}

/// A worker whose window is full for a long while (1 start per 10 s, taken) waits for
/// its opening, and stops within moments of its shutdown, long before the window opens.
async fn a_worker_waiting_for_a_window_stops_at_once(db: &TestDb) {
    db.migrate().await;
    db.db
        .set_limits("mail", &TypeLimits::new().rate(1, Duration::from_secs(10)))
        .await
        .expect("limits");
    enqueue_many(&db.db, "mail", 3).await;
    let started = Arc::new(Mutex::new(Vec::new()));
    let shutdown = CancellationToken::new();
    let worker = worker(db.db.clone(), "w".into(), 4, started.clone());
    let run = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { worker.run(shutdown).await }
    });
    let began = Instant::now();
    while started.lock().expect("starts").is_empty() {
        assert!(began.elapsed() < Duration::from_secs(5), "nothing started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Its task ended, it claimed again and found the window full: now it waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = Instant::now();
    shutdown.cancel();
    let report = run.await.expect("worker").expect("run");
    assert!(
        stopping.elapsed() < Duration::from_secs(2),
        "stopped after {:?}",
        stopping.elapsed()
    );
    assert_eq!(report.claimed, 1, "{report:?}");
}

/// 2 starts per 1 s window, 4 Workers: just before each of several window openings
/// every session of the test's database is killed. The workers log, wait and claim
/// again (no panic), start the tasks all the same, and never claim in a loop: each
/// start still fits its window, and the workers' reports add up.
async fn killed_connections_at_a_windows_opening_delay_to_the_next_claim(db: &TestDb) {
    db.migrate().await;
    let window = Duration::from_secs(1);
    db.db
        .set_limits("mail", &TypeLimits::new().rate(2, window))
        .await
        .expect("limits");
    enqueue_many(&db.db, "mail", 12).await;
    let started = Arc::new(Mutex::new(Vec::new()));
    let shutdown = CancellationToken::new();
    let mut pools = Vec::new();
    let mut workers = Vec::new();
    for w in 0..4 {
        let pool = db.pool(4).await;
        let worker = Worker::builder(pool.db.clone())
            .id(format!("w{w}"))
            .task_types(["mail"])
            .concurrency(4)
            .poll_interval(Duration::from_millis(500), Duration::from_secs(2))
            .fallback_poll(Duration::from_secs(2))
            .retry_budget(Duration::from_millis(500))
            .lease(Duration::from_secs(3))
            .reap_every(Duration::from_secs(1))
            .retention(Retention::off())
            .handler({
                let started = started.clone();
                move |_: task_run::Model, _: CancellationToken| {
                    let started = started.clone();
                    async move {
                        started.lock().expect("starts").push(Instant::now());
                        Ok(None)
                    }
                }
            })
            .build()
            .expect("worker");
        pools.push(pool);
        let shutdown = shutdown.clone();
        workers.push(tokio::spawn(async move { worker.run(shutdown).await }));
    }
    let began = Instant::now();
    for _ in 0..3 {
        // Just before the next opening by this machine's clock (the database's, here).
        let now = epoch_micros();
        let to_opening = 1_000_000 - now % 1_000_000;
        tokio::time::sleep(Duration::from_micros(to_opening.saturating_sub(2_000))).await;
        db.kill_all_sessions().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    while started.lock().expect("starts").len() < 12 {
        assert!(
            began.elapsed() < Duration::from_secs(25),
            "only {} of 12 started",
            started.lock().expect("starts").len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let mut claimed = 0;
    for worker in workers {
        let report: WorkerReport = worker.await.expect("worker").expect("run");
        claimed += report.claimed;
    }
    // A claim lost with its connection may have started its tasks (the reaper takes
    // them back after the lease, and they start again): at least the 12.
    assert!(claimed >= 12, "{claimed}");
    let windows = starts_per_window(&db.db, "mail", window.as_micros() as i64).await;
    assert!(windows.values().all(|n| *n <= 2), "{windows:?}");
}
