//! task-dedup through PgBouncer in transaction pooling (issue 24): every operation (on a
//! pool and in the caller's transaction, bulk, the lifecycle, the admin API), hostile
//! strings in every field, the 64-way race on one key, and a Worker draining 1,000 tasks
//! exactly once, polling and with a direct listener, its wake-up latency reported. Each
//! test runs through two poolers:
//!
//! - `pgbouncer_1_25`: `TASK_DEDUP_PGBOUNCER_URL`, a PgBouncer >= 1.21 with
//!   `max_prepared_statements` > 0, in task-dedup's default mode;
//! - `pgbouncer_1_18`: `TASK_DEDUP_PGBOUNCER_OLD_URL`, a PgBouncer without named prepared
//!   statements (Debian's 1.18), in [`PoolerMode::NoPreparedStatements`].
//!
//! Both in `pool_mode = transaction`, in front of the server of `TASK_DEDUP_POSTGRES_URL`,
//! with `* = host=... port=...` so that the databases the harness creates there are
//! reachable by the same name; `.ci/pgbouncer.sh start old` runs both. Unset, these tests
//! say so and pass, except under `CI=true`, where they fail. The checks' own reads and
//! the handler's writes go to the server directly or as simple-protocol statements: the
//! application's SeaORM statements are not task-dedup's to make work through 1.18.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use harness::{Dialect, TestDb};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement, TransactionTrait};
use task_dedup::task_run;
use task_dedup::{
    HandlerError, NewTask, PoolerMode, Retry, RetryPolicy, TaskDedup, TaskKey, TaskLifecycle,
    TaskStatus, Worker, WorkerReport,
};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::Layer;

/// Runs each named `async fn(&Pooled)` on a fresh PostgreSQL database, through each
/// pooler ([`Pooler`]).
macro_rules! through_pgbouncer {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn pgbouncer_1_25() {
                    super::run(stringify!($name), super::Pooler::Tracking, super::tests::$name).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn pgbouncer_1_18() {
                    super::run(stringify!($name), super::Pooler::Old, super::tests::$name).await;
                }
            }
        )*
    };
}

through_pgbouncer!(
    find_or_enqueue_on_a_pool_and_in_transactions,
    find_or_enqueue_many_in_batches,
    every_lifecycle_call,
    the_admin_api,
    hostile_strings_in_every_field_stay_text,
    sixty_four_callers_on_one_key_create_exactly_one,
    a_polling_worker_runs_a_thousand_tasks_exactly_once,
    a_worker_with_a_direct_listener_runs_a_thousand_tasks_exactly_once,
);

/// Which pooler a test goes through.
#[derive(Clone, Copy)]
enum Pooler {
    /// PgBouncer >= 1.21 following named prepared statements: the default mode.
    Tracking,
    /// PgBouncer 1.18: [`PoolerMode::NoPreparedStatements`].
    Old,
}

impl Pooler {
    fn variable(self) -> &'static str {
        match self {
            Pooler::Tracking => "TASK_DEDUP_PGBOUNCER_URL",
            Pooler::Old => "TASK_DEDUP_PGBOUNCER_OLD_URL",
        }
    }

    fn mode(self) -> PoolerMode {
        match self {
            Pooler::Tracking => PoolerMode::PreparedStatements,
            Pooler::Old => PoolerMode::NoPreparedStatements,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Pooler::Tracking => "PgBouncer 1.25",
            Pooler::Old => "PgBouncer 1.18 (NoPreparedStatements)",
        }
    }
}

/// A test database on the server, and the pooler's URL of the same database.
struct Pooled<'a> {
    db: &'a TestDb,
    /// `db` through the pooler.
    url: String,
    pooler: Pooler,
}

impl Pooled<'_> {
    /// A pool of `size` connections to the database through the pooler, in its mode.
    async fn pool(&self, size: u32) -> DatabaseConnection {
        let mut options = sea_orm::ConnectOptions::new(self.url.clone());
        options
            .max_connections(size)
            .min_connections(size)
            .sqlx_logging(false);
        task_dedup::connect_with_pooler(options, self.pooler.mode())
            .await
            .expect("a pool through the pooler")
    }

    /// The database directly, for the checks' reads.
    fn direct(&self) -> &DatabaseConnection {
        &self.db.db
    }
}

async fn run(test: &str, pooler: Pooler, body: impl AsyncFnOnce(&Pooled<'_>)) {
    listen_to_the_log();
    let Ok(url) = std::env::var(pooler.variable()) else {
        let variable = pooler.variable();
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "{variable} is required under CI=true (.ci/pgbouncer.sh start old)"
        );
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "\n[task-dedup tests] skipped {test}: {variable} is not set \
             (.ci/pgbouncer.sh start old runs both poolers)"
        );
        return;
    };
    harness::run(Dialect::Postgres, test, async |db: &TestDb| {
        // The harness created and migrated nothing through the pooler: DDL goes direct.
        db.migrate().await;
        let (_, name) = db.server().expect("a server database");
        let url = harness::with_database(&url, name);
        body(&Pooled { db, url, pooler }).await;
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

/// Strings that would break out of a badly made literal or comment, each with text
/// after the break, so that a truncated value would show.
const HOSTILE: &[&str] = &[
    "'",
    "''",
    "'; DELETE FROM task_run; --x",
    "\\",
    "\\'; DELETE FROM task_run; --x",
    "x\\",
    "\\x27 \\u0027 \\047",
    "E'\\'' || 'x",
    "$$; DELETE FROM task_run; $$x",
    "$1 $2 $12 $a$ $$",
    "-- x",
    "/* x",
    "*/ x",
    "; x",
    "\"x\"",
    "é ✓ 𝄞 \u{202e}x \u{feff}",
    "line\nbreak\r\ttab\u{1b}[0m",
    "%_!",
];

/// The task as stored, read directly.
async fn stored_task(pooled: &Pooled<'_>, id: uuid::Uuid) -> task_run::Model {
    use sea_orm::EntityTrait;
    task_run::Entity::find_by_id(id)
        .one(pooled.direct())
        .await
        .expect("read")
        .expect("the task")
}

fn key(resource: &str) -> TaskKey {
    TaskKey::new("user-1", "render", resource).expect("valid key")
}

/// Each caller takes a key no other takes (created) and then one key all take
/// (created once, existing for everyone after).
async fn callers(
    pool: &DatabaseConnection,
    mode: PoolerMode,
    calls: usize,
    in_transaction: bool,
) -> (u64, u64) {
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
                            .with_pooler_mode(mode)
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
            let (created, existing) =
                callers(&pool, pooled.pooler.mode(), calls, in_transaction).await;
            // Every caller's own keys, plus the 10 shared ones once each.
            assert_eq!(created, (CALLERS * calls + 10) as u64, "{in_transaction}");
            assert_eq!(existing, (CALLERS * calls - 10) as u64, "{in_transaction}");
        }
        assert_eq!(
            harness::count(pooled.direct(), "SELECT COUNT(*) AS n FROM task_run").await,
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
        let inside = txn
            .with_pooler_mode(pooled.pooler.mode())
            .find_or_enqueue_many(batch(200))
            .await
            .expect("bulk");
        txn.commit().await.expect("commit");
        assert!(inside.iter().all(|o| !o.is_created()));
        assert_eq!(
            harness::count(pooled.direct(), "SELECT COUNT(*) AS n FROM task_run").await,
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
        // In the caller's transaction: a claim (in a savepoint of its own), a heartbeat,
        // an ending, a pause.
        let txn = pool.begin().await.expect("begin");
        let inside = txn.with_pooler_mode(pooled.pooler.mode());
        let t = inside
            .claim(worker, &[], lease)
            .await
            .expect("claim in a transaction");
        let t = t.expect("a queued task");
        inside
            .heartbeat(t.id, worker, lease)
            .await
            .expect("heartbeat in a transaction");
        let done = inside.complete(t.id, worker, None).await;
        assert_eq!(done.expect("complete").status, TaskStatus::Succeeded);
        assert!(
            inside
                .pause("render")
                .await
                .expect("pause in a transaction")
        );
        assert!(
            inside
                .resume("render")
                .await
                .expect("resume in a transaction")
        );
        txn.commit().await.expect("commit");
        let stored = stored_task(pooled, t.id).await;
        assert_eq!(stored.status, TaskStatus::Succeeded);
    }

    /// Every admin call, on the pool and in a transaction.
    pub(super) async fn the_admin_api(pooled: &Pooled<'_>) {
        use task_dedup::{ListTasks, TaskAdmin, TaskFilter};
        let pool = pooled.pool(4).await;
        let worker = "admin-worker";
        let lease = Duration::from_secs(60);
        for doc in ["a", "b", "c", "d", "e", "f"] {
            pool.find_or_enqueue(NewTask::new(key(doc)))
                .await
                .expect("enqueue");
        }
        let failed = pool.claim(worker, &[], lease).await.expect("claim");
        let failed = failed.expect("a task");
        pool.fail(failed.id, worker, "boom", Retry::Never)
            .await
            .expect("fail");
        let filter = TaskFilter::new()
            .task_type("render")
            .user_id("user-1")
            .key_prefix("b")
            .status(TaskStatus::Queued);
        let page = pool
            .list_tasks(&ListTasks::new(filter))
            .await
            .expect("list");
        assert_eq!(page.tasks.len(), 1);
        let queued = ListTasks::new(TaskFilter::new().status(TaskStatus::Queued)).limit(2);
        let first = pool.list_tasks(&queued).await.expect("list");
        let second = pool.list_tasks(&queued.clone().after(first.next)).await;
        assert_eq!(second.expect("next page").tasks.len(), 2);
        let got = pool.get_task(failed.id).await.expect("get_task");
        assert_eq!(got.expect("the task").status, TaskStatus::Failed);
        let counts = pool.counts().await.expect("counts");
        assert_eq!(counts.iter().map(|c| c.count).sum::<u64>(), 6);
        let up_to = pool.counts_up_to(3).await.expect("counts_up_to");
        assert_eq!(up_to.iter().map(|c| c.count).sum::<u64>(), 4, "{up_to:?}");
        let throughput = pool.throughput().await.expect("throughput");
        assert_eq!(throughput.minutes.len(), 60);
        let oldest = pool.oldest_queued().await.expect("oldest_queued");
        assert_eq!(oldest.len(), 1);
        let retried = pool.retry_task(failed.id).await.expect("retry_task");
        assert_eq!(retried.status, TaskStatus::Queued);
        let cancelled = pool.cancel_task(failed.id, "operator").await;
        assert_eq!(
            cancelled.expect("cancel_task").status,
            TaskStatus::Cancelled
        );
        pool.delete_task(failed.id).await.expect("delete_task");
        let txn = pool.begin().await.expect("begin");
        let handle = txn.with_pooler_mode(pooled.pooler.mode());
        let inside = handle
            .list_tasks(&ListTasks::new(TaskFilter::new()))
            .await
            .expect("list in a transaction");
        assert_eq!(inside.tasks.len(), 5);
        let all = TaskFilter::new();
        let cancelled = handle
            .cancel_tasks(&all, 2, "bulk")
            .await
            .expect("cancel_tasks");
        assert_eq!(cancelled.applied, 2);
        txn.commit().await.expect("commit");
        let retried = pool.retry_tasks(&all, 10).await.expect("retry_tasks");
        assert_eq!(retried.applied, 2, "{retried:?}");
        let cancelled = pool.cancel_tasks(&all, 10, "all").await.expect("cancel");
        assert_eq!(cancelled.applied, 5);
        let deleted = pool.delete_tasks(&all, 10).await.expect("delete_tasks");
        assert_eq!(deleted.applied, 5);
        assert_eq!(
            harness::count(pooled.direct(), "SELECT COUNT(*) AS n FROM task_run").await,
            0
        );
    }

    /// Strings made to end a literal early, run a second statement, comment out the rest
    /// or change how a backslash reads, in every field task-dedup writes or filters by,
    /// on a pool and in a transaction, with `standard_conforming_strings` off: each is
    /// stored and read back as it was, and the table is still there. A NUL character is refused before any SQL (PostgreSQL text
    /// cannot hold one).
    pub(super) async fn hostile_strings_in_every_field_stay_text(pooled: &Pooled<'_>) {
        use task_dedup::{ListTasks, TaskAdmin, TaskFilter};
        // Backslashes in plain '...' literals escape here: the literals must not care.
        let (_, name) = pooled.db.server().expect("a server database");
        let off = format!("ALTER DATABASE \"{name}\" SET standard_conforming_strings = off");
        pooled.db.exec(&off).await;
        let pool = pooled.pool(4).await;
        pool.execute_unprepared(
            "DO $$ BEGIN IF current_setting('standard_conforming_strings') <> 'off' \
             THEN RAISE EXCEPTION 'standard_conforming_strings is on'; END IF; END $$",
        )
        .await
        .expect("standard_conforming_strings off through the pooler");
        let lease = Duration::from_secs(60);
        for (i, hostile) in HOSTILE.iter().enumerate() {
            let in_transaction = i % 2 == 1;
            let txn = pool.begin().await.expect("begin");
            let user = format!("u{i}{hostile}");
            let task_type = format!("t{i}{hostile}");
            let resource = format!("r{hostile}");
            let task_key = TaskKey::new(&user, &task_type, &resource).expect("a valid key");
            let payload = serde_json::json!({ *hostile: [hostile, {"k": hostile}] });
            let task = NewTask::new(task_key.clone()).with_payload(payload.clone());
            let created = if in_transaction {
                txn.with_pooler_mode(pooled.pooler.mode())
                    .find_or_enqueue(task)
                    .await
            } else {
                pool.find_or_enqueue(task).await
            };
            let created = created.expect("enqueue").task().clone();
            txn.commit().await.expect("commit");
            let again = pool.find_or_enqueue(NewTask::new(task_key.clone())).await;
            assert!(!again.expect("find").is_created(), "{hostile:?}");
            let stored = stored_task(pooled, created.id).await;
            assert_eq!(
                (stored.user_id.as_str(), stored.task_type.as_str()),
                (user.as_str(), task_type.as_str())
            );
            assert_eq!(stored.resource_key, resource);
            assert_eq!(stored.payload, Some(payload));

            // Filters of the admin API.
            let filter = TaskFilter::new()
                .task_type(task_type.clone())
                .user_id(user.clone())
                .key_prefix(format!("r{hostile}"));
            let page = pool
                .list_tasks(&ListTasks::new(filter))
                .await
                .expect("list");
            assert_eq!(page.tasks.len(), 1, "{hostile:?}");

            // A worker id, a result, an error, a retry's error, a reason.
            let worker = format!("w{hostile}");
            let types = [task_type.as_str()];
            let claimed = pool.claim(&worker, &types, lease).await.expect("claim");
            let claimed = claimed.expect("the task");
            assert_eq!(claimed.id, created.id);
            assert_eq!(
                claimed.lease_owner.as_deref(),
                Some(worker.as_str()),
                "{hostile:?}"
            );
            let result = serde_json::json!([hostile]);
            let error = format!("e{hostile}");
            let ended = match i % 3 {
                0 => {
                    pool.complete(created.id, &worker, Some(result.clone()))
                        .await
                }
                1 => pool.fail(created.id, &worker, &error, Retry::Never).await,
                _ => {
                    let retry = Retry::After(Duration::ZERO);
                    let queued = pool.fail(created.id, &worker, &error, retry).await;
                    assert_eq!(
                        queued.expect("retry").error.as_deref(),
                        Some(error.as_str())
                    );
                    pool.cancel(created.id, &error).await
                }
            };
            let ended = ended.expect("ended");
            let stored = stored_task(pooled, created.id).await;
            match i % 3 {
                0 => assert_eq!(stored.result, Some(result)),
                _ => assert_eq!(stored.error.as_deref(), Some(error.as_str())),
            }
            assert_eq!(ended.status, stored.status);
            let txn = pool.begin().await.expect("begin");
            let filter = TaskFilter::new().task_type(task_type.clone());
            let inside = txn.with_pooler_mode(pooled.pooler.mode());
            inside.retry_tasks(&filter, 10).await.expect("retry_tasks");
            let reason = format!("c{hostile}");
            inside
                .cancel_tasks(&filter, 10, &reason)
                .await
                .expect("cancel");
            txn.commit().await.expect("commit");
            if i % 3 != 0 {
                // Requeued by retry_tasks, then cancelled with the reason.
                let stored = stored_task(pooled, created.id).await;
                assert_eq!(
                    stored.error.as_deref(),
                    Some(reason.as_str()),
                    "{hostile:?}"
                );
            }
            assert!(pool.pause(&task_type).await.expect("pause"));
            let paused = pool.paused().await.expect("paused");
            assert!(
                paused.iter().any(|p| p.task_type == task_type),
                "{hostile:?}"
            );
            assert!(pool.resume(&task_type).await.expect("resume"));
        }
        assert_eq!(
            harness::count(pooled.direct(), "SELECT COUNT(*) AS n FROM task_run").await,
            HOSTILE.len() as i64
        );
        let nul = TaskKey::new("user", "render", "a\0b");
        assert!(nul.is_err(), "a NUL character is refused before any SQL");
        let nul = pool
            .fail(uuid::Uuid::nil(), "w", "a\0b", Retry::Never)
            .await;
        assert!(
            matches!(nul, Err(task_dedup::DedupError::InvalidArgument { .. })),
            "{nul:?}"
        );
    }

    pub(super) async fn sixty_four_callers_on_one_key_create_exactly_one(pooled: &Pooled<'_>) {
        let callers = 64;
        let pool = pooled.pool(callers as u32).await;
        harness::storm_one_key(&pool, pooled.pooler.mode(), callers).await;
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
                // A simple-protocol statement (a UUID's text needs no escaping): the
                // application's SeaORM statements fail through PgBouncer 1.18.
                let sql = format!("INSERT INTO runs (task_id) VALUES ('{}')", task.id);
                db.execute_unprepared(&sql)
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
        let ended = harness::count(
            pooled.direct(),
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
    let latencies = wake_up_latencies(pooled, &pool).await;
    shutdown.cancel();
    let report = running.await.expect("worker task").expect("worker");
    {
        use std::io::Write;
        let how = if unheard { "polling" } else { "listening" };
        let _ = writeln!(
            std::io::stderr(),
            "\n[task-dedup tests] wake-up latency through {}, worker {how}: {latencies:?} \
             (enqueue to the handler's run, three tasks, each after 300 ms idle)",
            pooled.pooler.name()
        );
    }
    let failed = harness::count(
        pooled.direct(),
        "SELECT COUNT(*) AS n FROM task_run WHERE status <> 'succeeded'",
    )
    .await;
    assert_eq!(failed, 0, "every task succeeded: {report:?}");
    assert_eq!(
        harness::count(pooled.direct(), "SELECT COUNT(*) AS n FROM runs").await,
        (TASKS + WAKE_UPS) as i64
    );
    assert_eq!(report.completed, (TASKS + WAKE_UPS) as u64, "{report:?}");
    assert_eq!(report.claimed, (TASKS + WAKE_UPS) as u64, "{report:?}");
    assert_eq!(
        report.failed + report.lost + report.retried,
        0,
        "{report:?}"
    );
    report
}

const WAKE_UPS: usize = 3;

/// Enqueues [`WAKE_UPS`] tasks one at a time, each after the worker sat idle, and times
/// each from its enqueue to its handler's run (the database's clock for both: `runs.at`
/// against the time just before the enqueue).
async fn wake_up_latencies(pooled: &Pooled<'_>, pool: &DatabaseConnection) -> Vec<Duration> {
    let mut latencies = Vec::new();
    for i in 0..WAKE_UPS {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = pooled
            .direct()
            .query_one_raw(Statement::from_string(
                sea_orm::DbBackend::Postgres,
                "SELECT clock_timestamp() AS t",
            ))
            .await
            .expect("the clock")
            .expect("a row")
            .try_get::<chrono::DateTime<chrono::Utc>>("", "t")
            .expect("t");
        let task = pool
            .find_or_enqueue(NewTask::new(key(&format!("wake-up-{i}"))))
            .await
            .expect("enqueue");
        let started = Instant::now();
        let ran = loop {
            let row = pooled
                .direct()
                .query_one_raw(Statement::from_sql_and_values(
                    sea_orm::DbBackend::Postgres,
                    "SELECT at FROM runs WHERE task_id = $1",
                    [task.task().id.into()],
                ))
                .await
                .expect("the run");
            if let Some(row) = row {
                break row
                    .try_get::<chrono::DateTime<chrono::Utc>>("", "at")
                    .expect("at");
            }
            assert!(started.elapsed() < Duration::from_secs(30), "never woken");
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        latencies.push((ran - before).to_std().unwrap_or_default());
    }
    latencies
}
