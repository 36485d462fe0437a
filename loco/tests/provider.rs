//! The provider as a Loco application uses it, on SQLite, PostgreSQL and MySQL/MariaDB
//! (the workspace's dialect-matrix harness, `tests/harness`): workers registered through
//! Loco's `Queue::register`, jobs enqueued through `BackgroundWorker::perform_later`,
//! run by Loco's `Queue::run`, each outcome read back from `task_run`.
// A test file: a panic is how it fails.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use harness::{Dialect, TestDb, matrix, run};
use loco_rs::app::AppContext;
use loco_rs::bgworker::{BackgroundWorker, JobStatus, Queue, QueueProvider};
use loco_rs::config::{Config, WorkerMode};
use loco_rs::environment::Environment;
use sea_orm::{DatabaseConnection, EntityTrait, TransactionTrait};
use serde::{Deserialize, Serialize};
use serde_json::json;
use task_dedup::{TaskAdmin, TaskStatus, task_run};
use task_dedup_loco::{ARGS_KEY_PREFIX, Dedup, JobKey, QueueError, TaskDedupQueue};
use tokio::sync::Barrier;

matrix!(
    repeated_perform_later_is_one_job_that_runs_once,
    key_order_does_not_make_another_job,
    a_class_keyed_by_user_or_never_deduplicated,
    arguments_no_handler_decodes_fail_the_job,
    a_failing_job_is_retried_then_fails,
    a_job_enqueued_in_a_rolled_back_transaction_never_exists,
    loco_admin_calls_answer_from_task_run,
    a_jobs_command_process_reaches_every_class,
    a_missing_task_run_says_to_migrate,
    run_without_a_runnable_class_is_a_clear_error,
    foreground_blocking_is_kept_for_tests_that_run_jobs_inline,
    a_class_no_process_registered_waits_queued,
    a_killed_worker_process_jobs_come_back_and_run_once,
);

/// How many times each scope's jobs ran (tests run in parallel; each uses its own scope).
static RUNS: LazyLock<Mutex<HashMap<String, u32>>> = LazyLock::new(Mutex::default);

fn runs(scope: &str) -> u32 {
    RUNS.lock().unwrap().get(scope).copied().unwrap_or(0)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ExportArgs {
    scope: String,
    user: u64,
    #[serde(default)]
    fail: bool,
}

struct ExportWorker;

#[async_trait]
impl BackgroundWorker<ExportArgs> for ExportWorker {
    fn build(_ctx: &AppContext) -> Self {
        ExportWorker
    }

    async fn perform(&self, args: ExportArgs) -> loco_rs::Result<()> {
        *RUNS.lock().unwrap().entry(args.scope.clone()).or_default() += 1;
        if args.fail {
            return Err(loco_rs::Error::string("the export service said no"));
        }
        Ok(())
    }
}

/// Deduplicated per user (a key function), not per arguments.
struct ReportWorker;

#[async_trait]
impl BackgroundWorker<ExportArgs> for ReportWorker {
    fn build(_ctx: &AppContext) -> Self {
        ReportWorker
    }

    async fn perform(&self, args: ExportArgs) -> loco_rs::Result<()> {
        *RUNS.lock().unwrap().entry(args.scope).or_default() += 1;
        Ok(())
    }
}

/// Never deduplicated.
struct MailWorker;

#[async_trait]
impl BackgroundWorker<ExportArgs> for MailWorker {
    fn build(_ctx: &AppContext) -> Self {
        MailWorker
    }

    async fn perform(&self, _args: ExportArgs) -> loco_rs::Result<()> {
        Ok(())
    }
}

/// Set in the worker process that [`a_killed_worker_process_jobs_come_back_and_run_once`]
/// kills: its jobs say they started, then never end.
const HANG: &str = "TASK_DEDUP_LOCO_CHILD_HANG";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StepArgs {
    scope: String,
    step: u32,
}

/// A job that, in the doomed process, starts and never ends.
struct StepWorker;

#[async_trait]
impl BackgroundWorker<StepArgs> for StepWorker {
    fn build(_ctx: &AppContext) -> Self {
        StepWorker
    }

    async fn perform(&self, args: StepArgs) -> loco_rs::Result<()> {
        if std::env::var_os(HANG).is_some() {
            println!("started {}", args.step);
            std::future::pending::<()>().await;
        }
        let run = format!("{}-{}", args.scope, args.step);
        *RUNS.lock().unwrap().entry(run).or_default() += 1;
        Ok(())
    }
}

fn args(scope: &str) -> ExportArgs {
    ExportArgs {
        scope: scope.to_owned(),
        user: 7,
        fail: false,
    }
}

fn config() -> Config {
    Config::from_folder(
        &Environment::Test,
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/config"),
    )
    .expect("tests/config/test.yaml")
}

/// A Loco context on `db` with the queue installed and the four workers registered.
async fn app(db: &DatabaseConnection) -> (AppContext, TaskDedupQueue) {
    let queue = TaskDedupQueue::builder(db.clone())
        .class::<ReportWorker, ExportArgs>(Dedup::by_key(|a: &ExportArgs| {
            JobKey::new("monthly-report").user(a.user.to_string())
        }))
        .class::<MailWorker, ExportArgs>(Dedup::Never)
        // A lease of 2 s: a killed process's jobs come back within the tests' wait.
        .retry_budget(Duration::from_secs(30))
        .worker(|w| {
            w.poll_interval(Duration::from_millis(10), Duration::from_millis(50))
                .lease(Duration::from_secs(2))
                .reap_every(Duration::from_millis(200))
                .retry_policy(task_dedup::RetryPolicy {
                    max_attempts: 2,
                    base_delay: Duration::from_millis(10),
                    max_delay: Duration::from_millis(10),
                    jitter: 0.0,
                })
        })
        .build();
    let mut config = config();
    // What a `loco new --bg async` application's config says.
    config.workers.mode = WorkerMode::BackgroundAsync;
    let ctx = AppContext::builder(Environment::Test, db.clone(), config).build();
    let ctx = queue.install(ctx);
    assert_eq!(ctx.config.workers.mode, WorkerMode::BackgroundQueue);
    let provider = ctx.queue_provider.clone().expect("installed");
    provider.register(ExportWorker).await.unwrap();
    provider.register(ReportWorker).await.unwrap();
    provider.register(MailWorker).await.unwrap();
    provider.register(StepWorker).await.unwrap();
    (ctx, queue)
}

fn provider(ctx: &AppContext) -> Arc<Queue> {
    ctx.queue_provider.clone().expect("installed")
}

/// Runs the queue's worker until every task of the database is finished.
async fn drain(ctx: &AppContext, db: &DatabaseConnection) {
    let queue = provider(ctx);
    let runner = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.run(Vec::new()).await })
    };
    for _ in 0..500 {
        let active = task_run::Entity::find()
            .all(db)
            .await
            .unwrap()
            .iter()
            .filter(|t| t.status.is_active())
            .count();
        if active == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    queue.shutdown().unwrap();
    runner.await.unwrap().unwrap();
}

async fn tasks(db: &DatabaseConnection) -> Vec<task_run::Model> {
    task_run::Entity::find().all(db).await.unwrap()
}

fn scope(db: &TestDb, test: &str) -> String {
    format!("{test}-{}", db.dialect.name())
}

/// 64 callers `perform_later` the same arguments at once, each on its own connection:
/// one job, every caller gets its id, and it runs once.
async fn repeated_perform_later_is_one_job_that_runs_once(db: &TestDb) {
    db.migrate().await;
    let pool = db.pool(16).await;
    let (ctx, _queue) = app(&pool.db).await;
    let scope = scope(db, "storm");
    let barrier = Arc::new(Barrier::new(64));
    let mut callers = Vec::new();
    for _ in 0..64 {
        let (ctx, barrier, args) = (ctx.clone(), barrier.clone(), args(&scope));
        callers.push(tokio::spawn(async move {
            barrier.wait().await;
            ExportWorker::perform_later(&ctx, args).await.unwrap()
        }));
    }
    let mut ids = Vec::new();
    for caller in callers {
        ids.push(caller.await.unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "every caller got the one job's id");
    let rows = tasks(&db.db).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].id.to_string(), ids[0]);
    assert_eq!(rows[0].task_type, "ExportWorker");
    assert!(rows[0].resource_key.starts_with(ARGS_KEY_PREFIX));
    drain(&ctx, &db.db).await;
    assert_eq!(runs(&scope), 1);
    let rows = tasks(&db.db).await;
    assert_eq!(rows[0].status, TaskStatus::Succeeded);
    // Finished: the same arguments make a new job.
    let again = ExportWorker::perform_later(&ctx, args(&scope))
        .await
        .unwrap();
    assert_ne!(again, ids[0]);
}

/// The same arguments with their JSON keys in another order are the same job; other
/// arguments another; `perform_all_later` goes through the same keys.
async fn key_order_does_not_make_another_job(db: &TestDb) {
    db.migrate().await;
    let (ctx, _queue) = app(&db.db).await;
    let queue = provider(&ctx);
    let scope = scope(db, "order");
    let a = queue
        .enqueue(
            "ExportWorker".into(),
            None,
            json!({"scope": scope, "user": 7, "fail": false}),
            None,
            None,
        )
        .await
        .unwrap();
    let b = queue
        .enqueue(
            "ExportWorker".into(),
            None,
            serde_json::from_str::<serde_json::Value>(&format!(
                r#"{{"fail": false, "user": 7, "scope": "{scope}"}}"#
            ))
            .unwrap(),
            None,
            Some(5),
        )
        .await
        .unwrap();
    assert_eq!(a, b);
    let mut other = args(&scope);
    other.user = 8;
    let batch = ExportWorker::perform_all_later(&ctx, vec![args(&scope), other.clone(), other])
        .await
        .unwrap();
    assert_eq!(batch[0], a.clone().unwrap());
    assert_eq!(batch[1], batch[2]);
    assert_ne!(batch[1], batch[0]);
    assert_eq!(tasks(&db.db).await.len(), 2);
}

/// A class keyed by user: other arguments of the same user are the same job, and the
/// row carries the user; a class never deduplicated: one job per call.
async fn a_class_keyed_by_user_or_never_deduplicated(db: &TestDb) {
    db.migrate().await;
    let (ctx, _queue) = app(&db.db).await;
    let scope = scope(db, "keyed");
    let first = ReportWorker::perform_later(&ctx, args(&scope))
        .await
        .unwrap();
    let mut same_user = args(&scope);
    same_user.fail = true;
    assert_eq!(
        ReportWorker::perform_later(&ctx, same_user).await.unwrap(),
        first
    );
    let report = task_run::Entity::find_by_id(first.parse::<uuid::Uuid>().unwrap())
        .one(&db.db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (report.user_id.as_str(), report.resource_key.as_str()),
        ("7", "monthly-report")
    );
    let a = MailWorker::perform_later(&ctx, args(&scope)).await.unwrap();
    let b = MailWorker::perform_later(&ctx, args(&scope)).await.unwrap();
    assert_ne!(a, b);
    assert_eq!(tasks(&db.db).await.len(), 3);
}

/// Arguments the worker's type cannot decode: the job fails at once (one attempt) with
/// the decoding error; the worker goes on with the next job.
async fn arguments_no_handler_decodes_fail_the_job(db: &TestDb) {
    db.migrate().await;
    let (ctx, _queue) = app(&db.db).await;
    let scope = scope(db, "decode");
    let queue = provider(&ctx);
    let bad = queue
        .enqueue(
            "ExportWorker".into(),
            None,
            json!({"user": "not a number"}),
            None,
            None,
        )
        .await
        .unwrap()
        .unwrap();
    ExportWorker::perform_later(&ctx, args(&scope))
        .await
        .unwrap();
    drain(&ctx, &db.db).await;
    let bad = db.db.get_task(bad.parse().unwrap()).await.unwrap().unwrap();
    assert_eq!(bad.status, TaskStatus::Failed);
    assert_eq!(bad.attempts, 1);
    let error = bad.error.unwrap_or_default();
    assert!(
        error.contains("decode") && error.contains("ExportWorker"),
        "{error}"
    );
    assert_eq!(runs(&scope), 1, "the good job ran");
}

/// A `perform` that returns an error is retried by the worker's policy (2 attempts
/// here), then fails with the worker's message.
async fn a_failing_job_is_retried_then_fails(db: &TestDb) {
    db.migrate().await;
    let (ctx, _queue) = app(&db.db).await;
    let scope = scope(db, "retry");
    let mut failing = args(&scope);
    failing.fail = true;
    let id = ExportWorker::perform_later(&ctx, failing).await.unwrap();
    drain(&ctx, &db.db).await;
    let task = db.db.get_task(id.parse().unwrap()).await.unwrap().unwrap();
    assert_eq!((task.status, task.attempts), (TaskStatus::Failed, 2));
    assert!(
        task.error
            .unwrap_or_default()
            .contains("the export service said no")
    );
    assert_eq!(runs(&scope), 2);
}

/// `TaskDedupQueue::enqueue` in the request's transaction: it says created; rolled
/// back, the job is gone and nothing runs; committed, it is there.
async fn a_job_enqueued_in_a_rolled_back_transaction_never_exists(db: &TestDb) {
    db.migrate().await;
    let (ctx, queue) = app(&db.db).await;
    let scope = scope(db, "txn");
    let txn = db.db.begin().await.unwrap();
    let outcome = queue
        .enqueue::<ExportWorker, _, _>(&txn, &args(&scope))
        .await
        .unwrap();
    assert!(outcome.is_created());
    txn.rollback().await.unwrap();
    assert!(tasks(&db.db).await.is_empty());
    let txn = db.db.begin().await.unwrap();
    let kept = queue
        .enqueue::<ExportWorker, _, _>(&txn, &args(&scope))
        .await
        .unwrap();
    txn.commit().await.unwrap();
    let hit = queue
        .enqueue::<ExportWorker, _, _>(&db.db, &args(&scope))
        .await
        .unwrap();
    assert!(!hit.is_created());
    assert_eq!(hit.task().id, kept.task().id);
    drain(&ctx, &db.db).await;
    assert_eq!(runs(&scope), 1);
}

/// `get_jobs`, `cancel_jobs`, `retry_failed`, `clear_by_status`, `clear`: Loco's admin
/// calls, answered from `task_run`.
async fn loco_admin_calls_answer_from_task_run(db: &TestDb) {
    db.migrate().await;
    let (ctx, direct) = app(&db.db).await;
    let queue = provider(&ctx);
    let scope = scope(db, "admin");
    // Loco's `Queue::get_jobs` is private to it (its `jobs dump` command uses it): the
    // provider's own, through the trait.
    let get_jobs = async |status: Option<Vec<JobStatus>>| {
        QueueProvider::get_jobs(&direct, status.as_ref(), None)
            .await
            .unwrap()
    };
    let mut failing = args(&scope);
    failing.fail = true;
    failing.user = 1;
    ExportWorker::perform_later(&ctx, failing).await.unwrap();
    drain(&ctx, &db.db).await;
    let queued = MailWorker::perform_later(&ctx, args(&scope)).await.unwrap();

    let failed = get_jobs(Some(vec![JobStatus::Failed])).await;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].name, "ExportWorker");
    assert_eq!(failed[0].data["user"], 1);
    let all = get_jobs(None).await;
    assert_eq!(all.len(), 2);

    queue.cancel_jobs("MailWorker").await.unwrap();
    let mail = db
        .db
        .get_task(queued.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(mail.status, TaskStatus::Cancelled);

    assert_eq!(queue.retry_failed(None).await.unwrap(), 1);
    let retried = get_jobs(Some(vec![JobStatus::Queued])).await;
    assert_eq!(retried.len(), 1);
    assert!(matches!(
        queue.retry_failed(Some("not-a-uuid")).await,
        Err(loco_rs::Error::Any(err)) if err.downcast_ref::<QueueError>().is_some()
    ));

    queue
        .clear_by_status(vec![JobStatus::Cancelled])
        .await
        .unwrap();
    assert_eq!(tasks(&db.db).await.len(), 1);
    queue.clear().await.unwrap();
    assert!(tasks(&db.db).await.is_empty());
    queue.ping().await.unwrap();
    queue.setup().await.unwrap();
}

/// `cargo loco jobs ...` runs in a process of its own that registers no worker (Loco
/// calls `connect_workers` only to start): its queue knows no class, yet `dump`,
/// `retry`, `tidy` and `purge` reach the jobs of every class, found by their envelope,
/// and leave the application's own task-dedup tasks alone.
async fn a_jobs_command_process_reaches_every_class(db: &TestDb) {
    db.migrate().await;
    let (ctx, _direct) = app(&db.db).await;
    let scope = scope(db, "jobs-process");
    let mut failing = args(&scope);
    failing.fail = true;
    ExportWorker::perform_later(&ctx, failing).await.unwrap();
    MailWorker::perform_later(&ctx, args(&scope)).await.unwrap();
    drain(&ctx, &db.db).await;
    // A task of the application's own, enqueued through task-dedup, beside Loco's jobs.
    let own = task_dedup::TaskKey::new("app", "reindex", "post/1").unwrap();
    let own = task_dedup::TaskDedup::find_or_enqueue(&db.db, task_dedup::NewTask::new(own))
        .await
        .unwrap()
        .task()
        .id;

    // The `jobs` process: the builder as the application's, nothing registered.
    let jobs = TaskDedupQueue::builder(db.db.clone()).build();
    let all = QueueProvider::get_jobs(&jobs, None, None).await.unwrap();
    let mut names: Vec<_> = all
        .iter()
        .map(|job| (job.name.as_str(), &job.status))
        .collect();
    names.sort_by_key(|(name, _)| *name);
    assert_eq!(
        names,
        [
            ("ExportWorker", &JobStatus::Failed),
            ("MailWorker", &JobStatus::Completed)
        ]
    );
    assert_eq!(
        QueueProvider::retry_failed(&jobs, None).await.unwrap(),
        1,
        "`jobs retry` retried the unregistered class's failed job"
    );
    QueueProvider::clear_by_status(&jobs, vec![JobStatus::Completed, JobStatus::Cancelled])
        .await
        .unwrap();
    let left: Vec<_> = tasks(&db.db)
        .await
        .into_iter()
        .map(|t| t.task_type)
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&"ExportWorker".to_owned()) && left.contains(&"reindex".to_owned()));
    QueueProvider::clear(&jobs).await.unwrap();
    let left = tasks(&db.db).await;
    assert_eq!(left.len(), 1);
    assert_eq!(
        left[0].id, own,
        "the application's own task is not a Loco job"
    );
}

/// task-dedup's migrations did not run: `perform_later`, Loco's `setup` and the worker's
/// start say which table is missing and to run `cargo loco db migrate`.
async fn a_missing_task_run_says_to_migrate(db: &TestDb) {
    let (ctx, _queue) = app(&db.db).await;
    let scope = scope(db, "unmigrated");
    let errors = [
        ExportWorker::perform_later(&ctx, args(&scope))
            .await
            .unwrap_err(),
        provider(&ctx).setup().await.unwrap_err(),
        provider(&ctx).run(Vec::new()).await.unwrap_err(),
    ];
    for err in errors {
        let loco_rs::Error::Any(inner) = &err else {
            panic!("not the provider's error: {err:?}");
        };
        assert!(
            matches!(
                inner.downcast_ref::<QueueError>(),
                Some(QueueError::MissingTable { table, .. }) if table == "task_run"
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("run `cargo loco db migrate`"),
            "{err}"
        );
    }
}

/// A worker process started with tags no class carries would claim nothing forever:
/// `run` says so instead.
async fn run_without_a_runnable_class_is_a_clear_error(db: &TestDb) {
    db.migrate().await;
    let (ctx, _queue) = app(&db.db).await;
    let err = provider(&ctx)
        .run(vec!["nobody-has-this-tag".into()])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("nobody-has-this-tag"), "{err}");
}

/// The generated test config's `ForegroundBlocking`: `perform_later` runs the job in
/// the call, as the application's own tests expect; nothing is stored.
async fn foreground_blocking_is_kept_for_tests_that_run_jobs_inline(db: &TestDb) {
    db.migrate().await;
    let mut config = config();
    config.workers.mode = WorkerMode::ForegroundBlocking;
    let queue = TaskDedupQueue::builder(db.db.clone()).build();
    let ctx = queue.install(AppContext::builder(Environment::Test, db.db.clone(), config).build());
    assert_eq!(ctx.config.workers.mode, WorkerMode::ForegroundBlocking);
    let scope = scope(db, "inline");
    ExportWorker::perform_later(&ctx, args(&scope))
        .await
        .unwrap();
    assert_eq!(runs(&scope), 1);
    assert!(tasks(&db.db).await.is_empty());
}

/// A job of a class this process has no handler for: the worker does not claim it (no
/// attempt is spent, nothing fails); it waits, queued, for a process that has one.
async fn a_class_no_process_registered_waits_queued(db: &TestDb) {
    db.migrate().await;
    let (ctx, _queue) = app(&db.db).await;
    let queue = provider(&ctx);
    let id = queue
        .enqueue(
            "InvoiceWorker".into(),
            None,
            json!({"invoice": 1}),
            None,
            None,
        )
        .await
        .unwrap()
        .unwrap();
    let runner = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.run(Vec::new()).await })
    };
    // A claim comes within the 10-50 ms poll; give it several.
    tokio::time::sleep(Duration::from_millis(400)).await;
    queue.shutdown().unwrap();
    runner.await.unwrap().unwrap();
    let task = db.db.get_task(id.parse().unwrap()).await.unwrap().unwrap();
    assert_eq!((task.status, task.attempts), (TaskStatus::Queued, 0));
}

/// A Loco worker process killed (SIGKILL) while three jobs run: their leases expire,
/// this process's worker takes them back, and each runs to success once here (its
/// second attempt).
async fn a_killed_worker_process_jobs_come_back_and_run_once(db: &TestDb) {
    db.migrate().await;
    let (ctx, _queue) = app(&db.db).await;
    let scope = scope(db, "killed");
    let mut ids = HashSet::new();
    for step in 0..3 {
        let args = StepArgs {
            scope: scope.clone(),
            step,
        };
        ids.insert(StepWorker::perform_later(&ctx, args).await.unwrap());
    }
    let mut doomed = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_loco_worker_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TASK_DEDUP_LOCO_CHILD_URL", &db.url)
        .env(HANG, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(doomed.stdout.take().unwrap()).lines();
    let mut started = HashSet::new();
    while started.len() < 3 {
        let line = lines.next().expect("a line").unwrap();
        if let Some((_, step)) = line.split_once("started ") {
            started.insert(step.to_owned());
        }
    }
    doomed.kill().unwrap();
    doomed.wait().unwrap();

    drain(&ctx, &db.db).await;
    for step in 0..3 {
        assert_eq!(runs(&format!("{scope}-{step}")), 1, "step {step}");
    }
    let rows = tasks(&db.db).await;
    assert_eq!(rows.len(), 3);
    for task in rows {
        assert!(ids.contains(&task.id.to_string()));
        assert_eq!((task.status, task.attempts), (TaskStatus::Succeeded, 2));
    }
}

/// The worker process that [`a_killed_worker_process_jobs_come_back_and_run_once`]
/// starts and kills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of a_killed_worker_process_jobs_come_back_and_run_once"]
async fn child_loco_worker_process() {
    let url = std::env::var("TASK_DEDUP_LOCO_CHILD_URL").expect("started by the parent test");
    let db = task_dedup::connect(&url).await.unwrap();
    let (ctx, _queue) = app(&db).await;
    provider(&ctx).run(Vec::new()).await.unwrap();
}

/// The database server restarted while 16 callers `perform_later` and the queue's
/// worker runs: no call fails (the queue's 30 s retry budget), every job enqueued runs
/// once and succeeds, and the worker is still running after.
async fn perform_later_rides_out_a_server_restart(db: &TestDb) {
    let Some(restart) = harness::restart_command(db.dialect) else {
        return;
    };
    db.migrate().await;
    let pool = db.pool(16).await;
    let (ctx, _queue) = app(&pool.db).await;
    let started_at = harness::server_started_at(&pool.db, db.dialect).await;
    let runner = {
        let queue = provider(&ctx);
        tokio::spawn(async move { queue.run(Vec::new()).await })
    };
    let scope = scope(db, "restart");
    let stop = Arc::new(AtomicBool::new(false));
    let mut callers = Vec::new();
    for c in 0..16 {
        let (ctx, stop, scope) = (ctx.clone(), stop.clone(), scope.clone());
        callers.push(tokio::spawn(async move {
            let (mut ids, mut errors) = (HashSet::new(), Vec::new());
            let mut step = c * 1_000_000;
            while !stop.load(Ordering::Relaxed) {
                step += 1;
                let args = StepArgs {
                    scope: scope.clone(),
                    step,
                };
                match StepWorker::perform_later(&ctx, args).await {
                    Ok(id) => {
                        ids.insert(id);
                    }
                    Err(err) => errors.push(err.to_string()),
                }
            }
            (ids, errors)
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    harness::restart_server(restart).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut ids, mut errors) = (HashSet::new(), Vec::new());
    for caller in callers {
        let (i, e) = caller.await.unwrap();
        ids.extend(i);
        errors.extend(e);
    }
    assert_ne!(
        harness::server_started_at(&pool.db, db.dialect).await,
        started_at,
        "the server really restarted"
    );
    println!(
        "{} restart: {} jobs enqueued, {} failed calls",
        db.dialect.name(),
        ids.len(),
        errors.len()
    );
    assert!(errors.is_empty(), "{errors:?}");
    // Every job enqueued before, during and after the restart runs, on the same worker.
    for _ in 0..1500 {
        let rows = tasks(&pool.db).await;
        if rows.iter().all(|t| t.status == TaskStatus::Succeeded) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rows = tasks(&pool.db).await;
    assert_eq!(rows.len(), ids.len());
    assert!(rows.iter().all(|t| t.status == TaskStatus::Succeeded));
    assert!(rows.iter().all(|t| ids.contains(&t.id.to_string())));
    let over: Vec<_> = RUNS
        .lock()
        .unwrap()
        .iter()
        .filter(|(run, n)| run.starts_with(&scope) && **n != 1)
        .map(|(run, n)| format!("{run}: {n}"))
        .collect();
    assert!(over.is_empty(), "each job ran once: {over:?}");
    assert!(!runner.is_finished(), "the worker is still running");
    provider(&ctx).shutdown().unwrap();
    runner.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "restarts the server: run alone, after the other tests (.ci/run does)"]
async fn server_restart_under_perform_later_postgres() {
    run(
        Dialect::Postgres,
        "loco_restart",
        perform_later_rides_out_a_server_restart,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "restarts the server: run alone, after the other tests (.ci/run does)"]
async fn server_restart_under_perform_later_mysql() {
    run(
        Dialect::MySql,
        "loco_restart",
        perform_later_rides_out_a_server_restart,
    )
    .await;
}
