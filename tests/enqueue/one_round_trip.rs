//! Hits in one round trip (PostgreSQL): a key seen recently is expected to be a hit and
//! goes through the statement that inserts or returns the holder; when that statement's
//! snapshot predates the holder, the read after a conflict still finds it. Run on every
//! dialect: the outcomes are the same everywhere, only the statements differ.
//!
//! A test binary of its own (`[[test]] one_round_trip` in Cargo.toml, not a module of
//! `enqueue/main.rs`): the keys it makes hot sit in the process's table of recent keys,
//! where other tests' keys would push them out, and it installs the binary's one global
//! tracing subscriber.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use harness::{Dialect, TestDb, matrix};
use sea_orm::{ConnectOptions, ConnectionTrait, DatabaseConnection, TransactionTrait};
use task_dedup::{Enqueued, NewTask, Scope, TaskDedup, TaskKey, TaskLifecycle, TaskStatus};
use tokio::sync::Barrier;
use tokio::task::JoinHandle;

matrix!(
    a_hit_is_one_statement_on_postgres_in_every_scope,
    holder_committed_after_the_statements_snapshot_is_found,
);

fn key(resource: &str) -> TaskKey {
    TaskKey::new("user-1", "one-round-trip", resource).expect("valid key")
}

tokio::task_local! {
    /// The statements of the call being [`counted`], if any.
    static STATEMENTS: Arc<AtomicU64>;
}

/// Counts sqlx's statement log events, one per statement sent, into the [`STATEMENTS`]
/// of the future being polled.
struct CountStatements;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountStatements {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "sqlx::query" {
            let _ = STATEMENTS.try_with(|n| n.fetch_add(1, Ordering::Relaxed));
        }
    }
}

/// What `call` returns, and how many statements it sent (tests running beside it are not
/// counted: the counter is task-local to `call`).
///
/// One global subscriber, not one per call (`with_subscriber`): tracing caches whether a
/// callsite is enabled across the dispatchers alive at the time, and with scoped
/// dispatchers coming and going in parallel tests sqlx's statement event was once found
/// disabled, and a call counted 0 statements (CI, MySQL).
async fn counted<T>(call: impl Future<Output = T>) -> (T, u64) {
    use tracing_subscriber::layer::SubscriberExt;
    static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(|| {
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(CountStatements),
        )
        .expect("the only global subscriber of this test binary");
    });
    let statements = Arc::new(AtomicU64::new(0));
    let value = STATEMENTS.scope(statements.clone(), call).await;
    (value, statements.load(Ordering::Relaxed))
}

/// A pool that logs every statement (the test pools do not), its connections opened up
/// front: a connection opened during a counted call would count its own set-up
/// statements (MySQL's `SET sql_mode ...`).
async fn logging_pool(db: &TestDb) -> DatabaseConnection {
    let mut options = ConnectOptions::new(db.url.clone());
    options
        .max_connections(2)
        .min_connections(2)
        .sqlx_logging(true);
    task_dedup::connect_with(options).await.expect("pool opens")
}

/// The first call on a key creates the task; the next ones are hits. On PostgreSQL a hit
/// is the one statement that inserts or returns the holder, on a pool and in the
/// caller's transaction, in every scope; elsewhere the insert and the read.
async fn a_hit_is_one_statement_on_postgres_in_every_scope(db: &TestDb) {
    db.migrate().await;
    let pool = logging_pool(db).await;
    let per_hit = match db.dialect {
        Dialect::Postgres => Some(1),
        // The insert that ran into the key (its duplicate-key error), the read.
        Dialect::MySql => Some(2),
        // sqlx runs SQLite's statements, and logs them, on a thread of its own, out of
        // the reach of `counted`. (In process: no round trip to save.)
        Dialect::Sqlite => None,
    };
    let per_hit = |statements: u64| per_hit.is_none_or(|n| n == statements);
    let scopes = [
        ("active", Scope::Active),
        ("queued", Scope::Queued),
        ("period", Scope::Period(Duration::from_secs(3600))),
    ];
    for (name, scope) in scopes {
        let task = || NewTask::new(key(&format!("hit-{name}"))).scope(scope);
        let created = pool.find_or_enqueue(task()).await.expect("create");
        assert!(created.is_created(), "{name}");
        for _ in 0..3 {
            let (hit, statements) = counted(pool.find_or_enqueue(task())).await;
            assert_eq!(
                hit.expect("hit"),
                Enqueued::Existing(created.task().clone()),
                "{name}"
            );
            assert!(
                per_hit(statements),
                "{name}: {statements} statements on a pool"
            );
        }

        // A task of the transaction's own first (the first call in a transaction may
        // check the schema), then a hit on it and one on the committed task; the
        // transaction goes on after each.
        let txn = pool.begin().await.expect("begin");
        let own = || NewTask::new(key(&format!("own-{name}"))).scope(scope);
        let created_in_txn = txn.find_or_enqueue(own()).await.expect("create in txn");
        assert!(created_in_txn.is_created(), "{name}");
        let (again, statements) = counted(txn.find_or_enqueue(own())).await;
        assert_eq!(
            again.expect("own row"),
            Enqueued::Existing(created_in_txn.task().clone())
        );
        assert!(
            per_hit(statements),
            "{name}: {statements} statements, own row"
        );
        let (hit, statements) = counted(txn.find_or_enqueue(task())).await;
        assert_eq!(
            hit.expect("hit in txn"),
            Enqueued::Existing(created.task().clone()),
            "{name}"
        );
        assert!(
            per_hit(statements),
            "{name}: {statements} statements in a transaction"
        );
        txn.commit().await.expect("commit after hits");
    }
}

/// How many sessions of this test's database wait for a lock (PostgreSQL).
async fn lock_waiters(db: &TestDb) -> i64 {
    let sql = "SELECT count(*) AS n FROM pg_stat_activity \
               WHERE datname = current_database() AND wait_event_type = 'Lock'";
    let row = db
        .db
        .query_one_raw(db.stmt(sql, vec![]))
        .await
        .expect("lock view")
        .expect("a row");
    row.try_get("", "n").expect("count")
}

/// Waits until the caller's insert waits for the held transaction's row. PostgreSQL,
/// where the race path is: until `pg_stat_activity` shows the wait. SQLite (a writer
/// waiting for the write lock) and MySQL/MariaDB (whose `innodb_trx` view missed the
/// wait in some runs on the shared server): a pause stands in; their outcome is the same
/// either way. A caller that ended without waiting fails the test with what it returned.
async fn until_the_insert_waits<T: std::fmt::Debug>(db: &TestDb, caller: &mut JoinHandle<T>) {
    if db.dialect != Dialect::Postgres {
        tokio::time::sleep(Duration::from_millis(300)).await;
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while lock_waiters(db).await < 1 {
        if caller.is_finished() {
            panic!("the caller ended without waiting: {:?}", caller.await);
        }
        assert!(Instant::now() < deadline, "the insert never waited");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The race path: the key is hot (so PostgreSQL uses the one statement), a transaction
/// holds a new task on it uncommitted, the caller's statement starts (its snapshot
/// without that task) and its insert waits for the row; then the transaction commits.
/// The insert yields to a task its own statement cannot see, the statement returns
/// nothing, and the read after it finds the task. On a pool and in the caller's
/// transaction. Shown to catch the bug it guards against: with that "nothing" taken for
/// "created" (`Inserted::Created` instead of `Inserted::Held` in
/// `Executor::insert_or_find`), it fails on PostgreSQL.
async fn holder_committed_after_the_statements_snapshot_is_found(db: &TestDb) {
    db.migrate().await;
    for in_transaction in [false, true] {
        let key = key(&format!("race-path-{in_transaction}"));
        // Seen recently, then let go: the next call on the key is expected to be a hit.
        let first = db
            .db
            .find_or_enqueue(NewTask::new(key.clone()))
            .await
            .expect("first");
        assert!(first.is_created());
        db.db
            .cancel(first.task().id, "make room")
            .await
            .expect("cancel");

        let holder_txn = db.db.begin().await.expect("begin");
        let holder = holder_txn
            .find_or_enqueue(NewTask::new(key.clone()))
            .await
            .expect("holder");
        assert!(holder.is_created());

        let start = Arc::new(Barrier::new(2));
        let mut caller = {
            let (pool, start, key) = (db.db.clone(), start.clone(), key.clone());
            tokio::spawn(async move {
                if in_transaction {
                    let txn = pool.begin().await.expect("begin");
                    start.wait().await;
                    let outcome = txn.find_or_enqueue(NewTask::new(key)).await;
                    txn.commit().await.expect("commit");
                    outcome
                } else {
                    start.wait().await;
                    pool.find_or_enqueue(NewTask::new(key)).await
                }
            })
        };
        start.wait().await;
        until_the_insert_waits(db, &mut caller).await;
        holder_txn.commit().await.expect("holder commits");

        let outcome = caller.await.expect("caller").expect("find_or_enqueue");
        assert_eq!(
            outcome,
            Enqueued::Existing(holder.task().clone()),
            "in transaction: {in_transaction}"
        );
        let active = db
            .db
            .find_active(&key)
            .await
            .expect("read")
            .expect("active");
        assert_eq!(active.id, holder.task().id);
        assert_eq!(active.status, TaskStatus::Queued);
    }
}
