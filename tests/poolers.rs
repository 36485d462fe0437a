//! task-dedup through PgBouncer in transaction pooling (issue 24): every operation, the
//! 64-way race on one key, and a Worker draining 1,000 tasks exactly once, polling and
//! with a direct listener.
//!
//! `TASK_DEDUP_PGBOUNCER_URL` names a PgBouncer (>= 1.21, `max_prepared_statements` > 0,
//! `pool_mode = transaction`) in front of the server of `TASK_DEDUP_POSTGRES_URL`, with
//! `* = host=... port=...` so that the databases the harness creates there are reachable
//! by the same name; `.ci/pgbouncer.sh start` runs one. Unset, these tests say so and
//! pass, except under `CI=true`, where they fail.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Dialect, TestDb};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement, TransactionTrait};
use task_dedup::task_run;
use task_dedup::{
    HandlerError, NewTask, Retry, RetryPolicy, TaskDedup, TaskKey, TaskStatus, TaskWorker, Worker,
    WorkerReport,
};
use tokio::sync::Barrier;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::Layer;

/// Runs each named `async fn(&Pooled)` on a fresh PostgreSQL database, through the
/// pooler of `TASK_DEDUP_PGBOUNCER_URL`.
macro_rules! through_pgbouncer {
    ($($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                run(stringify!($name), tests::$name).await;
            }
        )*
    };
}

through_pgbouncer!(
    find_or_enqueue_on_a_pool_and_in_transactions,
    find_or_enqueue_many_in_batches,
    every_lifecycle_call,
    sixty_four_callers_on_one_key_create_exactly_one,
    a_polling_worker_runs_a_thousand_tasks_exactly_once,
    a_worker_with_a_direct_listener_runs_a_thousand_tasks_exactly_once,
);

/// A test database on the server, and the pooler's URL of the same database.
struct Pooled<'a> {
    db: &'a TestDb,
    /// `db` through the pooler.
    url: String,
}

impl Pooled<'_> {
    /// A pool of `size` connections to the database through the pooler.
    async fn pool(&self, size: u32) -> DatabaseConnection {
        let mut options = sea_orm::ConnectOptions::new(self.url.clone());
        options
            .max_connections(size)
            .min_connections(size)
            .sqlx_logging(false);
        task_dedup::connect_with(options)
            .await
            .expect("a pool through the pooler")
    }
}

async fn run(test: &str, body: impl AsyncFnOnce(&Pooled<'_>)) {
    listen_to_the_log();
    let Ok(pooler) = std::env::var("TASK_DEDUP_PGBOUNCER_URL") else {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "TASK_DEDUP_PGBOUNCER_URL is required under CI=true (.ci/pgbouncer.sh start)"
        );
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "\n[task-dedup tests] skipped {test}: TASK_DEDUP_PGBOUNCER_URL is not set \
             (.ci/pgbouncer.sh start runs one)"
        );
        return;
    };
    common::run(Dialect::Postgres, test, async |db: &TestDb| {
        // The harness created and migrated nothing through the pooler: DDL goes direct.
        db.migrate().await;
        let (_, name) = db.server().expect("a server database");
        let url = common::with_database(&pooler, name);
        body(&Pooled { db, url }).await;
    })
    .await;
}

/// The worker's warnings that its listener went unheard, in this process.
static UNHEARD_WARNINGS: AtomicU64 = AtomicU64::new(0);

/// Counts them.
struct CountUnheard;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountUnheard {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() == tracing::Level::WARN && meta.fields().field("why").is_some() {
            UNHEARD_WARNINGS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// task-dedup's warnings to the test's output, and [`UNHEARD_WARNINGS`] counted.
fn listen_to_the_log() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let _ = tracing_subscriber::registry()
        .with(CountUnheard)
        .with(
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(tracing_subscriber::EnvFilter::new("task_dedup=warn")),
        )
        .try_init();
}

const CALLERS: usize = 16;

fn key(resource: &str) -> TaskKey {
    TaskKey::new("user-1", "render", resource).expect("valid key")
}

async fn count(db: &DatabaseConnection, sql: &str) -> i64 {
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .expect("count")
        .expect("a row");
    row.try_get("", "n").expect("n")
}

/// Each caller takes a key no other takes (created) and then one key all take
/// (created once, existing for everyone after).
async fn callers(pool: &DatabaseConnection, calls: usize, in_transaction: bool) -> (u64, u64) {
    let created = Arc::new(AtomicU64::new(0));
    let existing = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for caller in 0..CALLERS {
        let (pool, created, existing) = (pool.clone(), created.clone(), existing.clone());
        handles.push(tokio::spawn(async move {
            for call in 0..calls {
                let own = key(&format!("{in_transaction}-{caller}-{call}"));
                let shared = key(&format!("{in_transaction}-shared-{}", call % 10));
                for task_key in [own, shared] {
                    let outcome = if in_transaction {
                        let txn = pool.begin().await.expect("begin");
                        let outcome = txn
                            .find_or_enqueue(NewTask::new(task_key))
                            .await
                            .expect("find_or_enqueue in a transaction");
                        txn.commit().await.expect("commit");
                        outcome
                    } else {
                        pool.find_or_enqueue(NewTask::new(task_key))
                            .await
                            .expect("find_or_enqueue")
                    };
                    let counter = if outcome.is_created() {
                        &created
                    } else {
                        &existing
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for handle in handles {
        handle.await.expect("caller");
    }
    (
        created.load(Ordering::Relaxed),
        existing.load(Ordering::Relaxed),
    )
}

mod tests {
    use super::*;

    pub(super) async fn find_or_enqueue_on_a_pool_and_in_transactions(pooled: &Pooled<'_>) {
        let pool = pooled.pool(CALLERS as u32).await;
        let calls = 50;
        for in_transaction in [false, true] {
            let (created, existing) = callers(&pool, calls, in_transaction).await;
            // Every caller's own keys, plus the 10 shared ones once each.
            assert_eq!(created, (CALLERS * calls + 10) as u64, "{in_transaction}");
            assert_eq!(existing, (CALLERS * calls - 10) as u64, "{in_transaction}");
        }
        assert_eq!(
            count(&pool, "SELECT COUNT(*) AS n FROM task_run").await,
            2 * (CALLERS * calls + 10) as i64
        );
    }

    pub(super) async fn find_or_enqueue_many_in_batches(pooled: &Pooled<'_>) {
        let pool = pooled.pool(4).await;
        let batch = |n: usize| {
            (0..n)
                .map(|i| NewTask::new(key(&format!("doc-{}", i % (n / 2)))))
                .collect::<Vec<_>>()
        };
        let first = pool.find_or_enqueue_many(batch(600)).await.expect("bulk");
        assert_eq!(first.iter().filter(|o| o.is_created()).count(), 300);
        let again = pool.find_or_enqueue_many(batch(600)).await.expect("bulk");
        assert!(again.iter().all(|o| !o.is_created()));
        let txn = pool.begin().await.expect("begin");
        let inside = txn.find_or_enqueue_many(batch(200)).await.expect("bulk");
        txn.commit().await.expect("commit");
        assert!(inside.iter().all(|o| !o.is_created()));
        assert_eq!(
            count(&pool, "SELECT COUNT(*) AS n FROM task_run").await,
            300
        );
    }

    pub(super) async fn every_lifecycle_call(pooled: &Pooled<'_>) {
        let pool = pooled.pool(4).await;
        let lease = Duration::from_secs(60);
        for doc in ["a", "b", "c", "d", "e", "f"] {
            pool.find_or_enqueue(NewTask::new(key(doc)))
                .await
                .expect("enqueue");
        }
        let worker = "pooled-worker";
        let a = pool.claim(worker, &[], lease).await.expect("claim");
        let a = a.expect("a task");
        pool.heartbeat(a.id, worker, lease)
            .await
            .expect("heartbeat");
        let done = pool.complete(a.id, worker, Some(serde_json::json!({"ok": 1})));
        assert_eq!(done.await.expect("complete").status, TaskStatus::Succeeded);
        let more = pool.claim_many(worker, &["render"], lease, 3).await;
        let more = more.expect("claim_many");
        assert_eq!(more.len(), 3);
        let failed = pool.fail(more[0].id, worker, "boom", Retry::Never).await;
        assert_eq!(failed.expect("fail").status, TaskStatus::Failed);
        let retried = pool.fail(more[1].id, worker, "again", Retry::After(Duration::ZERO));
        assert_eq!(retried.await.expect("retry").status, TaskStatus::Queued);
        let released = pool.release(more[2].id, worker).await.expect("release");
        assert_eq!(released.status, TaskStatus::Queued);
        let queued = pool.find_active(&key("f")).await.expect("find_active");
        let cancelled = pool.cancel(queued.expect("f").id, "not needed").await;
        assert_eq!(cancelled.expect("cancel").status, TaskStatus::Cancelled);
        // A lease run out: the reaper takes it back.
        let c = pool.claim(worker, &[], Duration::from_millis(1)).await;
        let c = c.expect("claim").expect("a task");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let policy = RetryPolicy::default();
        let reaped = pool.reap_expired(&policy).await.expect("reap");
        assert_eq!(
            reaped.requeued + reaped.failed,
            1,
            "{:?} of {}",
            reaped,
            c.id
        );
        let pruned = pool.prune_finished(Duration::ZERO).await.expect("prune");
        assert_eq!(pruned, 3, "succeeded, failed and cancelled");
    }

    pub(super) async fn sixty_four_callers_on_one_key_create_exactly_one(pooled: &Pooled<'_>) {
        let callers = 64;
        let pool = pooled.pool(callers as u32).await;
        for round in 0..5 {
            let start = Arc::new(Barrier::new(callers));
            let mut handles = Vec::new();
            for _ in 0..callers {
                let (pool, start) = (pool.clone(), start.clone());
                handles.push(tokio::spawn(async move {
                    start.wait().await;
                    let task = NewTask::new(key(&format!("contended-{round}")));
                    pool.find_or_enqueue(task).await.expect("find_or_enqueue")
                }));
            }
            let mut outcomes = Vec::new();
            for handle in handles {
                outcomes.push(handle.await.expect("caller"));
            }
            let created = outcomes.iter().filter(|o| o.is_created()).count();
            assert_eq!(created, 1, "round {round}: exactly one caller creates");
            let ids: HashSet<_> = outcomes.iter().map(|o| o.task().id).collect();
            assert_eq!(ids.len(), 1, "round {round}: everyone got the same task");
        }
    }

    /// Its listener, on a connection of the pool, cannot hear: the worker finds out,
    /// stops listening (no notification leaks to the pool's other clients, whose
    /// statements would fail on it) and polls.
    pub(super) async fn a_polling_worker_runs_a_thousand_tasks_exactly_once(pooled: &Pooled<'_>) {
        let report = drain_a_thousand(pooled, None, true).await;
        assert_eq!(report.unheard_listener_checks, 1, "{report:?}");
    }

    /// Its listener on a direct connection hears; the claims go through the pooler.
    pub(super) async fn a_worker_with_a_direct_listener_runs_a_thousand_tasks_exactly_once(
        pooled: &Pooled<'_>,
    ) {
        let report = drain_a_thousand(pooled, Some(pooled.db.url.clone()), false).await;
        assert_eq!(report.unheard_listener_checks, 0, "{report:?}");
    }
}

const TASKS: usize = 1_000;

/// A worker through the pooler (its listener on `listen_url` if given) runs 1,000 tasks
/// enqueued through the pooler while it runs, each exactly once: its handler records
/// each run in `runs`, whose primary key refuses a second run of one task.
///
/// `unheard`: the worker's listener is to go unheard, which this waits for (its check
/// may outlast the drain) before the worker stops.
async fn drain_a_thousand(
    pooled: &Pooled<'_>,
    listen_url: Option<String>,
    unheard: bool,
) -> WorkerReport {
    let unheard_before = UNHEARD_WARNINGS.load(Ordering::Relaxed);
    pooled
        .db
        .exec("CREATE TABLE runs (task_id uuid PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())")
        .await;
    let pool = pooled.pool(16).await;
    let recorder = pool.clone();
    let builder = Worker::builder(pool.clone())
        .concurrency(8)
        .retry_policy(RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        })
        .handler(move |task: task_run::Model, _cancel: CancellationToken| {
            let db = recorder.clone();
            async move {
                db.execute_raw(Statement::from_sql_and_values(
                    sea_orm::DbBackend::Postgres,
                    "INSERT INTO runs (task_id) VALUES ($1)",
                    [task.id.into()],
                ))
                .await
                .map_err(|e| HandlerError::fail(format!("recording the run: {e}")))?;
                Ok(None)
            }
        });
    let builder = match listen_url {
        Some(url) => builder.listen_url(url),
        None => builder,
    };
    let worker = builder.build().expect("worker");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));

    // In bursts, so that the worker waits for work in between: woken or polling.
    for burst in 0..TASKS / 50 {
        let batch = (0..50).map(|i| NewTask::new(key(&format!("doc-{burst}-{i}"))));
        let outcomes = pool.find_or_enqueue_many(batch).await.expect("enqueue");
        assert!(outcomes.iter().all(|o| o.is_created()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    loop {
        let ended = count(
            &pool,
            "SELECT COUNT(*) AS n FROM task_run WHERE status NOT IN ('queued', 'running')",
        )
        .await;
        if ended == TASKS as i64 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{ended} of {TASKS} ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    while unheard && UNHEARD_WARNINGS.load(Ordering::Relaxed) == unheard_before {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the listener's check never ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    let report = running.await.expect("worker task").expect("worker");
    let failed = count(
        &pool,
        "SELECT COUNT(*) AS n FROM task_run WHERE status <> 'succeeded'",
    )
    .await;
    assert_eq!(failed, 0, "every task succeeded: {report:?}");
    assert_eq!(
        count(&pool, "SELECT COUNT(*) AS n FROM runs").await,
        TASKS as i64
    );
    assert_eq!(report.completed, TASKS as u64, "{report:?}");
    assert_eq!(report.claimed, TASKS as u64, "{report:?}");
    assert_eq!(
        report.failed + report.lost + report.retried,
        0,
        "{report:?}"
    );
    report
}
