//! Retention: the pruner's ages per status, its batches, period windows kept until they
//! end, pruners running at once, a pruner killed mid-prune, and a worker pruning by
//! default; on every dialect.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use harness::{TestDb, matrix, server_matrix};
use sea_orm::sea_query::{Expr, ExprTrait, Query};
use sea_orm::{ConnectionTrait, DatabaseConnection, EntityTrait, PaginatorTrait};
use task_dedup::task_run::{self, Column};
use task_dedup::{
    CancellationToken, DedupError, NewTask, PruneReport, Retention, Scope, TaskDedup, TaskKey,
    TaskLifecycle, TaskStatus, Worker,
};
use tokio::sync::Barrier;
use uuid::Uuid;

matrix!(
    default_retention_keeps_each_status_its_age,
    ages_are_per_status_and_off_keeps_everything,
    batches_run_until_one_comes_back_short,
    period_task_is_kept_until_its_window_ends,
    concurrent_pruners_delete_each_row_once,
    pruner_killed_mid_prune_leaves_every_row_whole,
    invalid_retention_is_rejected_before_sql,
    worker_prunes_by_default,
);

// Row locks another transaction holds: SQLite has one writer at a time (a pruner there
// waits for the database's write lock, by design), so only the servers.
server_matrix!(pruner_passes_rows_another_transaction_holds);

const HOUR: Duration = Duration::from_secs(3_600);
const DAY: Duration = Duration::from_secs(86_400);

fn ago(duration: Duration) -> DateTime<Utc> {
    task_run::now() - chrono::Duration::from_std(duration).expect("duration")
}

/// Enqueues `n` tasks of type `history` named `<prefix>-<i>`, then writes `status` and
/// `finished_at` straight into their rows (a history the library would take days to
/// produce). Returns their ids.
async fn seed(
    db: &DatabaseConnection,
    prefix: &str,
    n: usize,
    status: TaskStatus,
    finished_at: Option<DateTime<Utc>>,
) -> HashSet<Uuid> {
    let tasks = (0..n)
        .map(|i| NewTask::new(TaskKey::new("u", "history", format!("{prefix}-{i}")).expect("key")));
    let created = db.find_or_enqueue_many(tasks).await.expect("enqueue");
    let ids: HashSet<Uuid> = created.into_iter().map(|e| e.into_task().id).collect();
    assert_eq!(ids.len(), n);
    if status != TaskStatus::Queued {
        let update = Query::update()
            .table(task_run::Entity)
            .value(Column::Status, status.as_str())
            .value(Column::FinishedAt, finished_at)
            .and_where(Expr::col(Column::TaskType).eq("history"))
            .and_where(Expr::col(Column::ResourceKey).like(format!("{prefix}-%")))
            .to_owned();
        let changed = db.execute(&update).await.expect("update").rows_affected();
        assert_eq!(changed, n as u64);
    }
    ids
}

async fn ids(db: &DatabaseConnection) -> HashSet<Uuid> {
    harness::rows::all(db).await.iter().map(|t| t.id).collect()
}

async fn count(db: &DatabaseConnection) -> u64 {
    task_run::Entity::find().count(db).await.expect("count")
}

fn report(succeeded: u64, failed: u64, cancelled: u64) -> PruneReport {
    let mut report = PruneReport::default();
    report.succeeded = succeeded;
    report.failed = failed;
    report.cancelled = cancelled;
    report
}

async fn default_retention_keeps_each_status_its_age(db: &TestDb) {
    db.migrate().await;
    let old_ok = seed(
        &db.db,
        "old-ok",
        3,
        TaskStatus::Succeeded,
        Some(ago(2 * DAY)),
    )
    .await;
    let new_ok = seed(&db.db, "new-ok", 2, TaskStatus::Succeeded, Some(ago(HOUR))).await;
    let old_failed = seed(
        &db.db,
        "old-failed",
        2,
        TaskStatus::Failed,
        Some(ago(8 * DAY)),
    )
    .await;
    let new_failed = seed(
        &db.db,
        "new-failed",
        2,
        TaskStatus::Failed,
        Some(ago(2 * DAY)),
    )
    .await;
    let old_cancelled = seed(
        &db.db,
        "old-cancelled",
        1,
        TaskStatus::Cancelled,
        Some(ago(2 * DAY)),
    )
    .await;
    let queued = seed(&db.db, "queued", 2, TaskStatus::Queued, None).await;
    // Active rows with a finished_at long ago (a retry of a task that once finished
    // cannot have one, but nothing active may go whatever its timestamps say).
    let running = seed(
        &db.db,
        "running",
        2,
        TaskStatus::Running,
        Some(ago(30 * DAY)),
    )
    .await;

    let pruned = db.db.prune(&Retention::default()).await.expect("prune");
    assert_eq!(pruned, report(3, 2, 1));
    assert_eq!(pruned.total(), 6);
    let kept: HashSet<Uuid> = [new_ok, new_failed, queued, running]
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(ids(&db.db).await, kept);
    for gone in old_ok.iter().chain(&old_failed).chain(&old_cancelled) {
        assert!(!kept.contains(gone));
    }
    // Nothing left to prune.
    assert_eq!(
        db.db.prune(&Retention::default()).await.expect("prune"),
        PruneReport::default()
    );
}

async fn ages_are_per_status_and_off_keeps_everything(db: &TestDb) {
    db.migrate().await;
    seed(&db.db, "ok", 4, TaskStatus::Succeeded, Some(ago(10 * DAY))).await;
    seed(&db.db, "failed", 3, TaskStatus::Failed, Some(ago(10 * DAY))).await;
    seed(
        &db.db,
        "cancelled",
        2,
        TaskStatus::Cancelled,
        Some(ago(10 * DAY)),
    )
    .await;

    assert_eq!(
        db.db.prune(&Retention::off()).await.expect("prune"),
        PruneReport::default()
    );
    assert_eq!(count(&db.db).await, 9);

    // Failed tasks kept forever, cancelled ones longer than they are old.
    let retention = Retention::default().failed(None).cancelled(Some(30 * DAY));
    assert_eq!(
        db.db.prune(&retention).await.expect("prune"),
        report(4, 0, 0)
    );
    assert_eq!(
        db.db
            .prune(&Retention::off().cancelled(Some(DAY)))
            .await
            .expect("prune"),
        report(0, 0, 2)
    );
    assert_eq!(
        db.db
            .prune(&Retention::all(Duration::ZERO))
            .await
            .expect("prune"),
        report(0, 3, 0)
    );
    assert_eq!(count(&db.db).await, 0);
}

async fn batches_run_until_one_comes_back_short(db: &TestDb) {
    db.migrate().await;
    seed(&db.db, "ok", 25, TaskStatus::Succeeded, Some(ago(2 * DAY))).await;
    seed(&db.db, "failed", 20, TaskStatus::Failed, Some(ago(8 * DAY))).await;
    let recent = seed(&db.db, "recent", 5, TaskStatus::Succeeded, Some(ago(HOUR))).await;
    // 25 = 10 + 10 + 5; 20 = 10 + 10 + an empty batch.
    let pruned = db
        .db
        .prune(&Retention::default().batch_size(10))
        .await
        .expect("prune");
    assert_eq!(pruned, report(25, 20, 0));
    assert_eq!(ids(&db.db).await, recent);
    // Batches of one, the oldest first: the old rows go, the recent ones stay.
    seed(
        &db.db,
        "older",
        3,
        TaskStatus::Cancelled,
        Some(ago(3 * DAY)),
    )
    .await;
    let pruned = db
        .db
        .prune(&Retention::default().batch_size(1))
        .await
        .expect("prune");
    assert_eq!(pruned, report(0, 0, 3));
    assert_eq!(ids(&db.db).await, recent);
}

/// A period task holds its window's key whatever its status: pruned early, it would let
/// a second task into the window.
async fn period_task_is_kept_until_its_window_ends(db: &TestDb) {
    db.migrate().await;
    let daily = || {
        NewTask::new(TaskKey::new("u", "digest", "daily").expect("key")).scope(Scope::Period(DAY))
    };
    let first = db.db.find_or_enqueue(daily()).await.expect("enqueue");
    assert!(first.is_created());
    let first = first.into_task();
    let claimed = db
        .db
        .claim("w", &["digest"], HOUR)
        .await
        .expect("claim")
        .expect("the digest");
    db.db
        .complete(claimed.id, "w", None)
        .await
        .expect("complete");
    // It finished a long time ago, as far as its row says; its window is still open.
    let update = Query::update()
        .table(task_run::Entity)
        .value(Column::FinishedAt, ago(30 * DAY))
        .and_where(Expr::col(Column::Id).eq(first.id))
        .to_owned();
    db.db.execute(&update).await.expect("update");

    let pruned = db
        .db
        .prune(&Retention::all(Duration::ZERO))
        .await
        .expect("prune");
    assert_eq!(pruned, PruneReport::default());
    let again = db.db.find_or_enqueue(daily()).await.expect("enqueue");
    assert!(!again.is_created(), "a second task entered the window");
    assert_eq!(again.task().id, first.id);

    // Once the window is over (moved into the past here), the row goes.
    let update = Query::update()
        .table(task_run::Entity)
        .value(Column::DedupWindowEnd, Utc::now().timestamp() - 1)
        .and_where(Expr::col(Column::Id).eq(first.id))
        .to_owned();
    db.db.execute(&update).await.expect("update");
    let pruned = db
        .db
        .prune(&Retention::all(Duration::ZERO))
        .await
        .expect("prune");
    assert_eq!(pruned, report(1, 0, 0));
    assert_eq!(count(&db.db).await, 0);
}

/// Eight pruners, each on a pool of its own, released together: every eligible row is
/// deleted exactly once (the reports add up to the rows), nothing else is touched.
async fn concurrent_pruners_delete_each_row_once(db: &TestDb) {
    db.migrate().await;
    const OLD: usize = 1_200;
    seed(
        &db.db,
        "old",
        OLD,
        TaskStatus::Succeeded,
        Some(ago(2 * DAY)),
    )
    .await;
    seed(
        &db.db,
        "old-failed",
        300,
        TaskStatus::Failed,
        Some(ago(8 * DAY)),
    )
    .await;
    let mut kept = seed(
        &db.db,
        "recent",
        100,
        TaskStatus::Succeeded,
        Some(ago(HOUR)),
    )
    .await;
    kept.extend(seed(&db.db, "queued", 100, TaskStatus::Queued, None).await);
    kept.extend(
        seed(
            &db.db,
            "running",
            50,
            TaskStatus::Running,
            Some(ago(8 * DAY)),
        )
        .await,
    );

    const PRUNERS: usize = 8;
    let barrier = Arc::new(Barrier::new(PRUNERS));
    let mut pruners = Vec::new();
    for _ in 0..PRUNERS {
        let pool = db.pool(2).await;
        let barrier = barrier.clone();
        pruners.push(tokio::spawn(async move {
            barrier.wait().await;
            pool.prune(&Retention::default().batch_size(25)).await
        }));
    }
    let mut total = PruneReport::default();
    for pruner in pruners {
        let report = pruner.await.expect("pruner").expect("prune");
        total.succeeded += report.succeeded;
        total.failed += report.failed;
        total.cancelled += report.cancelled;
    }
    assert_eq!(total, report(OLD as u64, 300, 0));
    assert_eq!(ids(&db.db).await, kept);
}

/// A transaction holds row locks on part of the backlog (a worker, an admin action, a
/// pruner mid-batch in a caller's transaction): a pruner on the pool deletes the rest
/// without waiting for it (MariaDB's `DELETE ... ORDER BY ... LIMIT` waited, up to
/// `innodb_lock_wait_timeout`, for the first locked row it met), then the holder prunes
/// its own rows in its transaction. Every eligible row deleted once, nothing else.
async fn pruner_passes_rows_another_transaction_holds(db: &TestDb) {
    use sea_orm::TransactionTrait;

    db.migrate().await;
    const OLD: usize = 300;
    const HELD: usize = 100;
    let eligible = seed(
        &db.db,
        "old",
        OLD,
        TaskStatus::Succeeded,
        Some(ago(2 * DAY)),
    )
    .await;
    let mut kept = seed(&db.db, "queued", 50, TaskStatus::Queued, None).await;
    kept.extend(
        seed(
            &db.db,
            "running",
            20,
            TaskStatus::Running,
            Some(ago(8 * DAY)),
        )
        .await,
    );
    let held: Vec<Uuid> = eligible.iter().copied().take(HELD).collect();

    // Both start together: the holder locks its rows by primary key (exactly those
    // rows, whatever plan), then lets the pruner go.
    let barrier = Arc::new(Barrier::new(2));
    let locked = Arc::new(Barrier::new(2));
    let txn = db.db.begin().await.expect("begin");
    let pruner = {
        let pool = db.pool(2).await;
        let (barrier, locked) = (barrier.clone(), locked.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            locked.wait().await;
            tokio::time::timeout(
                Duration::from_secs(10),
                pool.prune(&Retention::default().batch_size(50)),
            )
            .await
        })
    };
    barrier.wait().await;
    // One row a statement: an `IN` list over a small table is read by a scan, which
    // would lock every row.
    for id in &held {
        let lock = db.stmt(
            match db.dialect {
                harness::Dialect::Postgres => "SELECT id FROM task_run WHERE id = $1 FOR UPDATE",
                harness::Dialect::MySql => "SELECT id FROM task_run WHERE id = ? FOR UPDATE",
                harness::Dialect::Sqlite => panic!("a server dialect only"),
            },
            vec![(*id).into()],
        );
        let rows = txn.query_all_raw(lock).await.expect("lock a held row");
        assert_eq!(rows.len(), 1);
    }
    locked.wait().await;

    let passed = pruner
        .await
        .expect("pruner")
        .expect("the pruner waited for the held rows")
        .expect("prune");
    assert_eq!(
        passed,
        report((OLD - HELD) as u64, 0, 0),
        "the rows not held"
    );
    let own = txn
        .prune(&Retention::default())
        .await
        .expect("prune in the holder's transaction");
    assert_eq!(own, report(HELD as u64, 0, 0), "the holder's own rows");
    txn.commit().await.expect("commit");
    assert_eq!(ids(&db.db).await, kept);
}

/// The child process of [`pruner_killed_mid_prune_leaves_every_row_whole`]: prunes in
/// batches of one row until it is killed. Does nothing unless the parent started it.
#[tokio::test]
#[ignore = "a child process of pruner_killed_mid_prune_leaves_every_row_whole"]
async fn child_prunes_until_killed() {
    let Ok(url) = std::env::var("TASK_DEDUP_PRUNE_CHILD_URL") else {
        return;
    };
    let db = task_dedup::connect(&url).await.expect("connect");
    println!("pruning");
    loop {
        db.prune(&Retention::all(HOUR).batch_size(1))
            .await
            .expect("prune");
    }
}

/// Starts this test binary again, running only `test` (of this module) with `url` in its
/// environment.
fn child(test: &str, url: &str) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            &harness::children::test_name(module_path!(), test),
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TASK_DEDUP_PRUNE_CHILD_URL", url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child process")
}

/// Reads the child's stdout until a line with `prefix`. (libtest writes "test name ... "
/// before the test's own first line.)
fn read_until(child: &mut Child, prefix: &str) {
    let stdout = child.stdout.as_mut().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let line = lines
            .next()
            .expect("the child printed its line")
            .expect("utf-8");
        if line.contains(prefix) {
            return;
        }
    }
}

/// A pruner process killed with SIGKILL in the middle of its batches: the rows it did
/// not delete are exactly as they were, the rows it deleted were all eligible, nothing
/// active or recent is gone, and the next pruner deletes exactly what is left.
async fn pruner_killed_mid_prune_leaves_every_row_whole(db: &TestDb) {
    db.migrate().await;
    const OLD: usize = 3_000;
    let eligible = seed(
        &db.db,
        "old",
        OLD,
        TaskStatus::Succeeded,
        Some(ago(2 * DAY)),
    )
    .await;
    seed(
        &db.db,
        "recent",
        100,
        TaskStatus::Succeeded,
        Some(ago(Duration::from_secs(60))),
    )
    .await;
    seed(&db.db, "queued", 100, TaskStatus::Queued, None).await;
    seed(
        &db.db,
        "running",
        100,
        TaskStatus::Running,
        Some(ago(8 * DAY)),
    )
    .await;
    let before: HashMap<Uuid, task_run::Model> = harness::rows::all(&db.db)
        .await
        .into_iter()
        .map(|t| (t.id, t))
        .collect();
    let total = before.len() as u64;

    let mut pruner = child("child_prunes_until_killed", &db.url);
    read_until(&mut pruner, "pruning");
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(&db.db).await == total {
        assert!(Instant::now() < deadline, "the child never pruned");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    pruner.kill().expect("kill -9 the pruner");
    pruner.wait().expect("reaped");
    // The server finishes (and, autocommitted, commits) a statement the dead client had
    // sent: CI saw MariaDB delete a row after the rows below were read.
    wait_for_no_running_delete(db).await;

    let after = harness::rows::all(&db.db).await;
    let deleted = total - after.len() as u64;
    assert!(
        deleted > 0 && deleted < OLD as u64,
        "{deleted} deleted: not mid-prune"
    );
    for row in &after {
        assert_eq!(Some(row), before.get(&row.id), "a remaining row changed");
    }
    let left: HashSet<Uuid> = after.iter().map(|t| t.id).collect();
    for (id, row) in &before {
        assert!(
            left.contains(id) || eligible.contains(id),
            "a row that was not eligible is gone: {row:?}"
        );
    }
    let rest = db.db.prune(&Retention::all(HOUR)).await.expect("prune");
    assert_eq!(rest.total() + deleted, OLD as u64);
    assert_eq!(count(&db.db).await, total - OLD as u64);
}

/// Waits until no `DELETE` runs in this test's database (on a server; SQLite keeps no
/// statement of a dead process). Fails after 10 s.
async fn wait_for_no_running_delete(db: &TestDb) {
    let Some((_, database)) = db.server() else {
        return;
    };
    let sql = match db.dialect {
        harness::Dialect::Postgres => {
            "SELECT 1 AS running FROM pg_stat_activity WHERE datname = $1 \
             AND state <> 'idle' AND query ILIKE 'delete%' AND pid <> pg_backend_pid()"
        }
        _ => {
            "SELECT 1 AS running FROM information_schema.PROCESSLIST \
             WHERE DB = ? AND INFO LIKE 'DELETE%'"
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows = db
            .db
            .query_all_raw(sea_orm::Statement::from_sql_and_values(
                db.dialect.backend(),
                sql,
                [database.into()],
            ))
            .await
            .expect("sessions");
        if rows.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "a DELETE still runs after 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Checked before any SQL: the database has no `task_run` table here, so any statement
/// would fail with a database error instead.
async fn invalid_retention_is_rejected_before_sql(db: &TestDb) {
    let invalid = |outcome: Result<PruneReport, DedupError>, expected: &str| match outcome {
        Err(DedupError::InvalidArgument { name, .. }) => assert_eq!(name, expected),
        other => panic!("{expected}: {other:?}"),
    };
    invalid(
        db.db.prune(&Retention::default().batch_size(0)).await,
        "batch_size",
    );
    invalid(
        db.db
            .prune(&Retention::default().every(Duration::ZERO))
            .await,
        "every",
    );
    invalid(
        db.db.prune(&Retention::all(Duration::MAX)).await,
        "succeeded",
    );
    match db.db.prune_finished(Duration::MAX).await {
        Err(DedupError::InvalidArgument { name, .. }) => assert_eq!(name, "older_than"),
        other => panic!("{other:?}"),
    }
    let built = Worker::builder(db.db.clone())
        .retention(Retention::default().batch_size(0))
        .handler(|_: task_run::Model, _: CancellationToken| async { Ok(None) })
        .build();
    match built {
        Err(DedupError::InvalidArgument { name, .. }) => assert_eq!(name, "batch_size"),
        other => panic!("{other:?}"),
    }
}

/// A worker built without a word about retention prunes by the defaults, while it runs
/// tasks; what it pruned is in its report.
async fn worker_prunes_by_default(db: &TestDb) {
    db.migrate().await;
    seed(&db.db, "old", 40, TaskStatus::Succeeded, Some(ago(2 * DAY))).await;
    seed(
        &db.db,
        "old-cancelled",
        10,
        TaskStatus::Cancelled,
        Some(ago(2 * DAY)),
    )
    .await;
    let kept = seed(
        &db.db,
        "old-failed",
        5,
        TaskStatus::Failed,
        Some(ago(2 * DAY)),
    )
    .await;
    let work = db
        .db
        .find_or_enqueue(NewTask::new(TaskKey::new("u", "work", "now").expect("key")))
        .await
        .expect("enqueue")
        .into_task();

    let shutdown = CancellationToken::new();
    let worker = Worker::builder(db.db.clone())
        .task_types(["work"])
        .poll_interval(Duration::from_millis(10), Duration::from_millis(50))
        .retention(Retention::default().every(Duration::from_millis(20)))
        .handler(|_: task_run::Model, _: CancellationToken| async { Ok(None) })
        .build()
        .expect("worker");
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let expected: HashSet<Uuid> = kept.iter().copied().chain([work.id]).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = harness::rows::all(&db.db).await;
        let ids: HashSet<Uuid> = left.iter().map(|t| t.id).collect();
        let done = left
            .iter()
            .any(|t| t.id == work.id && t.status == TaskStatus::Succeeded);
        if ids == expected && done {
            break;
        }
        assert!(Instant::now() < deadline, "{} rows left", left.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let report = running.await.expect("worker task").expect("worker");
    assert_eq!(report.pruned, 50);
    assert_eq!(report.completed, 1);
}
