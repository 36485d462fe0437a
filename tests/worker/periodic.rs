//! Periodic tasks without a leader: every worker enqueues each tick, the database keeps
//! one task per tick, on every dialect: workers in one process, 4 processes of 2 workers,
//! a scheduler process killed at a tick, catch-up on start, and `build()` refusing bad
//! schedules.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use harness::{TestDb, matrix, server_matrix};
use sea_orm::DatabaseConnection;
use serde::{Deserialize, Serialize};
use task_dedup::task_run::{self, TaskScope, TaskStatus};
use task_dedup::{
    CancellationToken, DedupError, HandlerError, Job, Retention, Schedule, Task, TaskDedup, Worker,
    WorkerBuilder, WorkerReport,
};
use tokio::sync::mpsc;

matrix!(
    workers_in_one_process_enqueue_each_tick_once,
    catch_up_on_start_enqueues_the_latest_ticks,
    four_processes_of_two_workers_enqueue_each_tick_once,
    a_scheduler_killed_at_a_tick_leaves_it_to_another_process,
    retention_keeps_a_tick_until_its_window_ends,
);
server_matrix!(ticks_survive_their_connections_being_killed);

/// The periodic task of these tests. Its key is the same for every tick: only the
/// window pinned to the tick tells two ticks apart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Beat {
    second: i64,
}

impl Task for Beat {
    const TASK_TYPE: &'static str = "beat";

    fn resource_key(&self) -> String {
        "heart".to_owned()
    }
}

fn every_second() -> Schedule {
    Schedule::every(Duration::from_secs(1))
}

/// A worker that runs `Beat` and enqueues it on `schedule`; `make` sees each tick.
fn beat_worker(
    db: DatabaseConnection,
    schedule: Schedule,
    make: impl Fn(DateTime<Utc>) + Send + Sync + 'static,
) -> WorkerBuilder {
    Worker::builder(db)
        .poll_interval(Duration::from_millis(10), Duration::from_millis(100))
        .fallback_poll(Duration::from_millis(200))
        .batch_endings(100, Duration::ZERO)
        .register::<Beat>(|_job: Job<Beat>| async { Ok::<_, HandlerError>(()) })
        .periodic(schedule, move |tick| {
            make(tick);
            Beat {
                second: tick.timestamp(),
            }
        })
}

/// The `Beat` tasks, by tick (Unix seconds of `run_at`).
async fn beats(db: &DatabaseConnection) -> BTreeMap<i64, Vec<task_run::Model>> {
    let mut by_tick: BTreeMap<i64, Vec<task_run::Model>> = BTreeMap::new();
    for task in harness::rows::all(db).await {
        if task.task_type == Beat::TASK_TYPE {
            by_tick
                .entry(task.run_at.timestamp())
                .or_default()
                .push(task);
        }
    }
    by_tick
}

/// Every tick has exactly one task, the task of that tick, in its window.
fn assert_one_task_per_tick(by_tick: &BTreeMap<i64, Vec<task_run::Model>>, every: i64) {
    for (tick, tasks) in by_tick {
        assert_eq!(tasks.len(), 1, "tick {tick}: {tasks:#?}");
        let task = &tasks[0];
        assert_eq!(task.run_at.timestamp_subsec_micros(), 0, "{task:?}");
        assert_eq!(task.scope, TaskScope::Period);
        assert_eq!(task.dedup_window_end, tick + every, "{task:?}");
        let payload = task.payload.clone().expect("a payload");
        assert_eq!(payload, serde_json::json!({ "second": tick }));
    }
}

/// The ticks from `first` to `last` (seconds, a step of `every`) all have their task.
fn assert_no_tick_missed(
    by_tick: &BTreeMap<i64, Vec<task_run::Model>>,
    first: i64,
    last: i64,
    every: i64,
) {
    let missed: Vec<i64> = (first..=last)
        .step_by(every as usize)
        .filter(|tick| !by_tick.contains_key(tick))
        .collect();
    assert!(
        missed.is_empty(),
        "missed {missed:?}; have {:?}",
        by_tick.keys()
    );
}

async fn workers_in_one_process_enqueue_each_tick_once(db: &TestDb) {
    db.migrate().await;
    let shutdown = CancellationToken::new();
    let mut calls = Vec::new();
    let mut running = Vec::new();
    for _ in 0..3 {
        let made = Arc::new(Mutex::new(Vec::new()));
        let seen = made.clone();
        let worker = beat_worker(db.db.clone(), every_second().catch_up(2), move |tick| {
            seen.lock().expect("lock").push(tick.timestamp());
        })
        .build()
        .expect("worker");
        calls.push(made);
        running.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    // Each worker past its catch-up (2 ticks) and 3 ticks of its own.
    let started = Instant::now();
    while calls.iter().any(|c| c.lock().expect("lock").len() < 5) {
        assert!(started.elapsed() < Duration::from_secs(30), "too slow");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let mut reports = Vec::new();
    for worker in running {
        reports.push(worker.await.expect("worker task").expect("run"));
    }

    let by_tick = beats(&db.db).await;
    assert_one_task_per_tick(&by_tick, 1);
    // Every tick a worker saw has its task (an enqueue in flight at shutdown finishes).
    let made: HashSet<i64> = calls
        .iter()
        .flat_map(|c| c.lock().expect("lock").clone())
        .collect();
    let stored: HashSet<i64> = by_tick.keys().copied().collect();
    assert_eq!(made, stored);
    let (first, last) = (
        *by_tick.keys().next().expect("ticks"),
        *by_tick.keys().last().expect("ticks"),
    );
    assert_no_tick_missed(&by_tick, first, last, 1);
    // Exactly one worker created each; each tick a worker made was an outcome.
    let created: u64 = reports.iter().map(|r| r.ticks_created).sum();
    assert_eq!(created, by_tick.len() as u64, "{reports:?}");
    for (report, made) in reports.iter().zip(&calls) {
        let outcomes = report.ticks_created + report.ticks_existing + report.ticks_failed;
        assert_eq!(
            outcomes,
            made.lock().expect("lock").len() as u64,
            "{report:?}"
        );
    }
}

async fn catch_up_on_start_enqueues_the_latest_ticks(db: &TestDb) {
    db.migrate().await;
    for catch_up in [0_usize, 1, 3] {
        db.exec("DELETE FROM task_run").await;
        let made = Arc::new(Mutex::new(Vec::<(i64, DateTime<Utc>)>::new()));
        let seen = made.clone();
        let before = Utc::now();
        let worker = beat_worker(
            db.db.clone(),
            every_second().catch_up(catch_up as u32),
            move |tick| {
                seen.lock()
                    .expect("lock")
                    .push((tick.timestamp(), Utc::now()));
            },
        )
        .build()
        .expect("worker");
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(worker.run(shutdown.clone()));
        // The catch-up, then two ticks that fell due while it ran.
        let started = Instant::now();
        while made.lock().expect("lock").len() < catch_up + 2 {
            assert!(started.elapsed() < Duration::from_secs(30), "too slow");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shutdown.cancel();
        let report = running.await.expect("worker task").expect("run");
        let made = made.lock().expect("lock").clone();
        let ticks: Vec<i64> = made.iter().map(|(tick, _)| *tick).collect();
        // Consecutive seconds, oldest first: the catch-up ticks, then the live ones.
        for pair in ticks.windows(2) {
            assert_eq!(pair[1], pair[0] + 1, "catch_up {catch_up}: {ticks:?}");
        }
        // The first live tick is after the start; the catch-up ticks were already past
        // when they were made.
        assert!(
            ticks[catch_up] > before.timestamp(),
            "catch_up {catch_up}: {ticks:?} started {before}"
        );
        if catch_up > 0 {
            let (last_past, made_at) = made[catch_up - 1];
            assert!(last_past <= made_at.timestamp(), "{made:?}");
        }
        let by_tick = beats(&db.db).await;
        assert_one_task_per_tick(&by_tick, 1);
        assert_eq!(
            by_tick.keys().copied().collect::<Vec<_>>(),
            ticks,
            "catch_up {catch_up}"
        );
        assert_eq!(report.ticks_created, ticks.len() as u64, "{report:?}");
        assert_eq!(report.ticks_skipped, 0, "{report:?}");
    }
}

/// A yearly task: its window is this year.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct NewYear {
    year: i32,
}

impl Task for NewYear {
    const TASK_TYPE: &'static str = "new-year";

    fn resource_key(&self) -> String {
        "greeting".to_owned()
    }
}

/// Any other work, finished and pruned meanwhile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Chore;

impl Task for Chore {
    const TASK_TYPE: &'static str = "chore";

    fn resource_key(&self) -> String {
        "chore".to_owned()
    }
}

/// A worker that prunes every finished task at once (age 0, every 50 ms) and enqueues
/// `NewYear` yearly; `made` counts its ticks.
fn eager_pruner(db: &DatabaseConnection, made: Arc<AtomicUsize>) -> Worker {
    Worker::builder(db.clone())
        .poll_interval(Duration::from_millis(10), Duration::from_millis(100))
        .batch_endings(100, Duration::ZERO)
        .retention(Retention::all(Duration::ZERO).every(Duration::from_millis(50)))
        .register::<NewYear>(|_job: Job<NewYear>| async { Ok::<_, HandlerError>(()) })
        .register::<Chore>(|_job: Job<Chore>| async { Ok::<_, HandlerError>(()) })
        .periodic(Schedule::cron("0 0 1 1 *"), move |tick| {
            made.fetch_add(1, Ordering::SeqCst);
            NewYear {
                year: chrono::Datelike::year(&tick),
            }
        })
        .build()
        .expect("worker")
}

async fn retention_keeps_a_tick_until_its_window_ends(db: &TestDb) {
    db.migrate().await;
    let shutdown = CancellationToken::new();
    let first =
        tokio::spawn(eager_pruner(&db.db, Arc::new(AtomicUsize::new(0))).run(shutdown.clone()));
    let started = Instant::now();
    let this_year = loop {
        let tasks = harness::rows::all(&db.db).await;
        if let Some(task) = tasks.iter().find(|t| t.status == TaskStatus::Succeeded) {
            break task.clone();
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{tasks:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // A chore finishes after this year's task and is pruned: the pruner ran since.
    let chore = db.db.enqueue(&Chore).await.expect("enqueue").task().id;
    loop {
        let tasks = harness::rows::all(&db.db).await;
        if tasks.iter().all(|t| t.id != chore) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{tasks:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tasks = harness::rows::all(&db.db).await;
    assert_eq!(
        tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        [this_year.id],
        "the tick's task outlives a prune: its window is the year"
    );

    // Another worker starts and enqueues this year's tick again: it finds it.
    let made = Arc::new(AtomicUsize::new(0));
    let second = tokio::spawn(eager_pruner(&db.db, made.clone()).run(shutdown.clone()));
    while made.load(Ordering::SeqCst) < 1 {
        assert!(started.elapsed() < Duration::from_secs(20), "no tick");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    let first = first.await.expect("worker task").expect("run");
    let second = second.await.expect("worker task").expect("run");
    assert_eq!(
        (first.ticks_created, first.ticks_existing),
        (1, 0),
        "{first:?}"
    );
    assert_eq!(
        (second.ticks_created, second.ticks_existing),
        (0, 1),
        "{second:?}"
    );
    assert_eq!(first.pruned + second.pruned, 1, "the chore only");
    let tasks = harness::rows::all(&db.db).await;
    assert_eq!(tasks.len(), 1, "{tasks:#?}");
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// A child process of the tests below: `TASK_DEDUP_PERIODIC_WORKERS` workers, each
/// enqueuing `Beat` every `TASK_DEDUP_PERIODIC_EVERY` seconds with catch-up
/// `TASK_DEDUP_PERIODIC_CATCH_UP`. Says `ready` once they run, `report <created>
/// <existing> <failed> <skipped>` per worker after its stdin closes. With
/// `TASK_DEDUP_PERIODIC_DOOMED`, its (one) worker says `making <tick>` at its first live
/// tick and blocks there before enqueuing it, to be killed. Does nothing unless a test
/// started it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of the periodic tests"]
async fn periodic_child_process() {
    let Ok(url) = std::env::var("TASK_DEDUP_PERIODIC_URL") else {
        return;
    };
    let var = |name: &str| -> u64 {
        std::env::var(name)
            .expect("set by the parent")
            .parse()
            .expect("a number")
    };
    let workers = var("TASK_DEDUP_PERIODIC_WORKERS");
    let every = var("TASK_DEDUP_PERIODIC_EVERY");
    let catch_up = var("TASK_DEDUP_PERIODIC_CATCH_UP") as u32;
    let doomed = std::env::var("TASK_DEDUP_PERIODIC_DOOMED").is_ok();
    let db = task_dedup::connect(&url).await.expect("connect");
    let shutdown = CancellationToken::new();
    let mut running = Vec::new();
    for _ in 0..workers {
        let calls = AtomicUsize::new(0);
        let schedule = Schedule::every(Duration::from_secs(every)).catch_up(catch_up);
        let worker = beat_worker(db.clone(), schedule, move |tick| {
            // The first call is the start's catch-up (enqueued); the second a live tick.
            if doomed && calls.fetch_add(1, Ordering::SeqCst) == 1 {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "making {}", tick.timestamp());
                let _ = out.flush();
                std::thread::sleep(Duration::from_secs(3_600));
            }
        })
        .build()
        .expect("worker");
        running.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    println!("ready");
    let _ = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    })
    .await;
    shutdown.cancel();
    for worker in running {
        let r: WorkerReport = worker.await.expect("worker task").expect("run");
        println!(
            "report {} {} {} {}",
            r.ticks_created, r.ticks_existing, r.ticks_failed, r.ticks_skipped
        );
    }
}

/// A child process and the lines it prints.
struct Process {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Process {
    fn start(url: &str, workers: u32, every: u64, catch_up: u32, doomed: bool) -> Process {
        let mut command = Command::new(std::env::current_exe().expect("test binary"));
        command
            .args([
                "--ignored",
                "--exact",
                &harness::children::test_name(module_path!(), "periodic_child_process"),
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TASK_DEDUP_PERIODIC_URL", url)
            .env("TASK_DEDUP_PERIODIC_WORKERS", workers.to_string())
            .env("TASK_DEDUP_PERIODIC_EVERY", every.to_string())
            .env("TASK_DEDUP_PERIODIC_CATCH_UP", catch_up.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if doomed {
            command.env("TASK_DEDUP_PERIODIC_DOOMED", "1");
        }
        let mut child = command.spawn().expect("spawn a child process");
        let stdout = child.stdout.take().expect("stdout");
        let (send, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        Process { child, lines }
    }

    /// The rest of the first line that has `prefix`, within 60 s.
    async fn line(&mut self, prefix: &str) -> String {
        let wait = async {
            loop {
                let line = self.lines.recv().await.expect("the child ended early");
                // libtest's own `test periodic_child_process ... ` may precede it.
                if let Some((_, rest)) = line.split_once(prefix) {
                    return rest.to_owned();
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .unwrap_or_else(|_| panic!("no `{prefix}` line within 60 s"))
    }

    /// Closes its stdin (its workers shut down) and collects the reports of its
    /// workers: `[created, existing, failed, skipped]` each.
    async fn stop(mut self, workers: usize) -> Vec<[u64; 4]> {
        drop(self.child.stdin.take());
        let mut reports = Vec::new();
        for _ in 0..workers {
            let line = self.line("report ").await;
            let numbers: Vec<u64> = line
                .split(' ')
                .map(|n| n.parse().expect("a number"))
                .collect();
            reports.push([numbers[0], numbers[1], numbers[2], numbers[3]]);
        }
        let status = tokio::task::spawn_blocking(move || self.child.wait())
            .await
            .expect("join")
            .expect("the child exits");
        assert!(status.success(), "child: {status}");
        reports
    }
}

/// Polls until every tick from `first` to `last` (a step of `every`) has its task.
async fn wait_for_ticks(db: &DatabaseConnection, first: i64, last: i64, every: i64) {
    let started = Instant::now();
    loop {
        let by_tick = beats(db).await;
        if (first..=last)
            .step_by(every as usize)
            .all(|tick| by_tick.contains_key(&tick))
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "ticks {first}..={last} not all enqueued in 90 s: {:?}",
            by_tick.keys()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn four_processes_of_two_workers_enqueue_each_tick_once(db: &TestDb) {
    db.migrate().await;
    let mut processes: Vec<Process> = (0..4)
        .map(|_| Process::start(&db.url, 2, 1, 2, false))
        .collect();
    for process in &mut processes {
        process.line("ready").await;
    }
    // Ten ticks, from the second after the next, with all eight workers running.
    let first = Utc::now().timestamp() + 2;
    let last = first + 9;
    wait_for_ticks(&db.db, first, last, 1).await;
    let mut reports = Vec::new();
    for process in processes {
        reports.extend(process.stop(2).await);
    }

    let by_tick = beats(&db.db).await;
    assert_one_task_per_tick(&by_tick, 1);
    assert_no_tick_missed(&by_tick, first, last, 1);
    // Every tick from the first process's catch-up on, none missed, none doubled.
    let earliest = *by_tick.keys().next().expect("ticks");
    let latest = *by_tick.keys().last().expect("ticks");
    assert_no_tick_missed(&by_tick, earliest, latest, 1);
    let created: u64 = reports.iter().map(|r| r[0]).sum();
    assert_eq!(created, by_tick.len() as u64, "{reports:?}");
    // Each of the eight workers saw the ten ticks: one created, seven found it.
    let outcomes: u64 = reports.iter().map(|r| r[0] + r[1] + r[2]).sum();
    assert!(outcomes >= 8 * 10, "{reports:?}");
}

async fn a_scheduler_killed_at_a_tick_leaves_it_to_another_process(db: &TestDb) {
    db.migrate().await;
    let mut doomed = Process::start(&db.url, 1, 2, 1, true);
    let tick: i64 = doomed.line("making ").await.parse().expect("a tick");
    doomed.child.kill().expect("kill -9 the scheduler");
    doomed.child.wait().expect("reaped");
    // It enqueued its start's tick, and died making this one.
    let by_tick = beats(&db.db).await;
    assert_eq!(
        by_tick.keys().copied().collect::<Vec<_>>(),
        [tick - 2],
        "before the kill"
    );

    // Another process starts (catching up the three latest ticks, so that a slow start
    // does not pass over the killed one) and runs past the next tick.
    let mut rescuer = Process::start(&db.url, 1, 2, 3, false);
    rescuer.line("ready").await;
    let next = Utc::now().timestamp() / 2 * 2 + 2;
    wait_for_ticks(&db.db, tick, next, 2).await;
    let reports = rescuer.stop(1).await;

    let by_tick = beats(&db.db).await;
    assert_one_task_per_tick(&by_tick, 2);
    assert_no_tick_missed(&by_tick, tick - 2, next, 2);
    assert!(reports[0][0] >= 2, "{reports:?}");
    // The killed process's tick runs like any other: what the rescuer left queued is
    // run here.
    let worker = Worker::builder(db.db.clone())
        .register::<Beat>(|_job: Job<Beat>| async { Ok::<_, HandlerError>(()) })
        .build()
        .expect("worker");
    task_dedup::testing::drain(&worker).await.expect("drain");
    let by_tick = beats(&db.db).await;
    for tick in (tick - 2..=next).step_by(2) {
        assert_eq!(
            by_tick[&tick][0].status,
            TaskStatus::Succeeded,
            "{by_tick:#?}"
        );
    }
}

/// The server sessions of this test's database, killed from an admin connection.
/// Every session of the database killed every 300 ms for 4 s while two workers enqueue
/// a tick a second: the enqueues run again on fresh connections (or the next tick
/// catches up), and every tick has its one task.
async fn ticks_survive_their_connections_being_killed(db: &TestDb) {
    db.migrate().await;
    let pool = db.pool(4).await;
    let shutdown = CancellationToken::new();
    let mut running = Vec::new();
    for _ in 0..2 {
        // A catch-up beyond the retry budget (5 s): an enqueue that retried on fresh
        // connections for that long must not leave the ticks it waited through behind.
        let worker = beat_worker(pool.db.clone(), every_second().catch_up(10), |_| {})
            .build()
            .expect("worker");
        running.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    let first = Utc::now().timestamp() + 1;
    let mut killed = 0;
    let storm = Instant::now();
    while storm.elapsed() < Duration::from_secs(4) {
        killed += db.kill_all_sessions().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(killed > 0, "no session was killed");
    let last = Utc::now().timestamp() + 2;
    wait_for_ticks(&db.db, first, last, 1).await;
    shutdown.cancel();
    let mut reports = Vec::new();
    for worker in running {
        reports.push(worker.await.expect("worker task").expect("run"));
    }
    let by_tick = beats(&db.db).await;
    assert_one_task_per_tick(&by_tick, 1);
    assert_no_tick_missed(&by_tick, first, last, 1);
    // An attempt lost with its connection that had created the task is reported
    // `Existing` by the retry that finds it: `created` may fall short, never over.
    let created: u64 = reports.iter().map(|r| r.ticks_created).sum();
    let found: u64 = reports.iter().map(|r| r.ticks_existing).sum();
    assert!(created <= by_tick.len() as u64, "{reports:?}");
    assert!(created + found >= by_tick.len() as u64, "{reports:?}");
}

// ---------------------------------------------------------------------------
// build()
// ---------------------------------------------------------------------------

async fn memory() -> DatabaseConnection {
    task_dedup::connect("sqlite::memory:")
        .await
        .expect("sqlite")
}

#[tokio::test]
async fn build_refuses_bad_schedules_naming_them() {
    let db = memory().await;
    let cases = [
        (Schedule::cron("0 25 * * *"), "0 25 * * *"),
        (
            Schedule::cron("0 * * * *").in_tz("Europe/Atlantis"),
            "0 * * * * in Europe/Atlantis",
        ),
        (Schedule::every(Duration::ZERO), "every 0s"),
    ];
    for (schedule, expression) in cases {
        let err = beat_worker(db.clone(), schedule, |_| {})
            .build()
            .expect_err(expression);
        match &err {
            DedupError::InvalidSchedule {
                expression: named, ..
            } => assert_eq!(named, expression),
            other => panic!("{expression}: {other:?}"),
        }
        assert!(err.to_string().contains(expression), "{err}");
    }
    let err = beat_worker(
        db.clone(),
        Schedule::cron("0 * * * *").in_tz("Europe/Atlantis"),
        |_| {},
    )
    .build()
    .expect_err("unknown zone");
    assert!(
        err.to_string()
            .contains("unknown time zone `Europe/Atlantis`"),
        "{err}"
    );
}

#[tokio::test]
async fn build_refuses_a_periodic_type_the_worker_does_not_run() {
    let db = memory().await;
    let make = |tick: DateTime<Utc>| Beat {
        second: tick.timestamp(),
    };
    let err = Worker::builder(db.clone())
        .handler(|_task: task_run::Model, _| async { Ok(None) })
        .task_types(["other"])
        .periodic(every_second(), make)
        .build()
        .expect_err("beat is not run here");
    assert!(
        matches!(
            err,
            DedupError::InvalidArgument {
                name: "periodic",
                ..
            }
        ),
        "{err:?}"
    );
    // Run by the untyped handler: listed, or every type.
    for types in [vec!["beat"], vec![]] {
        Worker::builder(db.clone())
            .handler(|_task: task_run::Model, _| async { Ok(None) })
            .task_types(types)
            .periodic(every_second(), make)
            .build()
            .expect("beat is run here");
    }
}
