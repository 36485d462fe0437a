//! `TaskLifecycle`'s primitives, the lifecycle under the `Worker` runtime: claims, leases,
//! transitions, the reaper and pruning, on every dialect.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use harness::{TestDb, matrix};
use sea_orm::sea_query::{Expr, ExprTrait, Query};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter,
    QueryOrder,
};
use task_dedup::task_run::{self, Column};
use task_dedup::{
    DedupError, InvalidReason, NewTask, ReapReport, Retry, RetryPolicy, TaskDedup, TaskKey,
    TaskLifecycle, TaskStatus, Transition,
};
use tokio::sync::Barrier;
use uuid::Uuid;

matrix!(
    eight_workers_claim_each_task_exactly_once,
    claim_storm_catches_read_then_update,
    claim_takes_the_oldest_of_the_requested_types,
    lease_comes_from_one_database_clock,
    invalid_transitions_change_nothing,
    invalid_arguments_are_rejected_before_sql,
    longest_error_text_fits_every_dialect,
    expired_leases_are_requeued_then_failed,
    heartbeat_racing_the_reaper_is_never_requeued,
    finishing_releases_the_key,
    prune_keeps_active_and_recent_tasks,
);

const LEASE: Duration = Duration::from_secs(60);

/// Requeues at once, and fails for good at `max_attempts`.
fn reap_policy(max_attempts: i32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        base_delay: Duration::ZERO,
        max_delay: Duration::ZERO,
        jitter: 0.0,
    }
}

fn key(resource: &str) -> TaskKey {
    TaskKey::new("user-1", "render", resource).expect("valid key")
}

async fn enqueue(db: &TestDb, key: TaskKey) -> task_run::Model {
    let outcome = db
        .db
        .find_or_enqueue(NewTask::new(key))
        .await
        .expect("enqueue");
    assert!(outcome.is_created());
    outcome.into_task()
}

/// Claims the oldest queued task for `worker`, which must exist.
async fn claim(db: &TestDb, worker: &str) -> task_run::Model {
    db.db
        .claim(worker, &[], LEASE)
        .await
        .expect("claim")
        .expect("a queued task")
}

async fn load(db: &TestDb, id: Uuid) -> task_run::Model {
    task_run::Entity::find_by_id(id)
        .one(&db.db)
        .await
        .expect("load")
        .expect("row exists")
}

/// Moves a running task's lease into the past, as if its worker had died.
async fn expire_lease(db: &TestDb, id: Uuid) {
    let past = task_run::now() - chrono::Duration::minutes(5);
    set(db, id, Column::LeaseExpiresAt, past).await;
}

async fn set(db: &TestDb, id: Uuid, column: Column, value: chrono::DateTime<chrono::Utc>) {
    let update = Query::update()
        .table(task_run::Entity)
        .value(column, value)
        .and_where(Expr::col(Column::Id).eq(id))
        .to_owned();
    assert_eq!(
        db.db
            .execute(&update)
            .await
            .expect("update")
            .rows_affected(),
        1
    );
}

const WORKERS: usize = 8;
const QUEUED: usize = 200;

/// How the claim storm takes a task.
enum Claimer {
    /// `claim`, then `complete`.
    Library,
    /// Test code only: read the oldest queued task, then update it by id without
    /// checking that it is still queued: the bug `claim` guards against. Every worker
    /// waits at the barrier between its first read and its first write, so all of them
    /// read the same task.
    ReadThenUpdate(Barrier),
}

impl Claimer {
    /// Claims and finishes one task for `worker`; `None` when nothing is queued.
    async fn take(&self, db: &DatabaseConnection, worker: &str, first: bool) -> Option<Uuid> {
        match self {
            Claimer::Library => {
                let task = db.claim(worker, &[], LEASE).await.expect("claim")?;
                assert_eq!(task.status, TaskStatus::Running);
                assert_eq!(task.lease_owner.as_deref(), Some(worker));
                db.complete(task.id, worker, None).await.expect("complete");
                Some(task.id)
            }
            Claimer::ReadThenUpdate(all_read) => {
                let oldest = task_run::Entity::find()
                    .filter(Column::Status.eq(TaskStatus::Queued.as_str()))
                    .order_by_asc(Column::CreatedAt)
                    .order_by_asc(Column::Id)
                    .one(db)
                    .await
                    .expect("read")?;
                if first {
                    all_read.wait().await;
                }
                let finish = Query::update()
                    .table(task_run::Entity)
                    .value(Column::Status, TaskStatus::Succeeded.as_str())
                    .and_where(Expr::col(Column::Id).eq(oldest.id))
                    .to_owned();
                db.execute(&finish).await.expect("update");
                Some(oldest.id)
            }
        }
    }
}

/// [`QUEUED`] tasks, [`WORKERS`] workers on a pool of their own, started together behind
/// a barrier, each taking tasks until none is queued. Returns every id taken, with
/// repeats.
async fn claim_storm(db: &TestDb, claimer: Claimer) -> Vec<Uuid> {
    for n in 0..QUEUED {
        enqueue(db, key(&format!("doc-{n}"))).await;
    }
    let pool = db.pool(WORKERS as u32).await;
    let (start, claimer) = (Arc::new(Barrier::new(WORKERS)), Arc::new(claimer));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (pool, start, claimer) = (pool.db.clone(), start.clone(), claimer.clone());
        workers.push(tokio::spawn(async move {
            let worker_id = format!("worker-{w}");
            let mut taken = Vec::new();
            start.wait().await;
            while let Some(id) = claimer.take(&pool, &worker_id, taken.is_empty()).await {
                taken.push(id);
            }
            taken
        }));
    }
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.expect("worker"));
    }
    all
}

async fn eight_workers_claim_each_task_exactly_once(db: &TestDb) {
    db.migrate().await;
    let all = claim_storm(db, Claimer::Library).await;
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(all.len(), QUEUED, "no task claimed twice");
    assert_eq!(unique.len(), QUEUED, "no task lost");
    for row in harness::rows::all(&db.db).await {
        assert_eq!((row.status, row.attempts), (TaskStatus::Succeeded, 1));
    }
}

async fn claim_storm_catches_read_then_update(db: &TestDb) {
    db.migrate().await;
    let claimer = Claimer::ReadThenUpdate(Barrier::new(WORKERS));
    let all = claim_storm(db, claimer).await;
    let first = harness::rows::all(&db.db).await[0].id;
    assert_eq!(
        all.iter().filter(|&&id| id == first).count(),
        WORKERS,
        "every worker read the oldest task and took it"
    );
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(unique.len(), QUEUED);
    assert!(all.len() >= QUEUED + WORKERS - 1, "{} claims", all.len());
}

async fn claim_takes_the_oldest_of_the_requested_types(db: &TestDb) {
    db.migrate().await;
    assert_eq!(db.db.claim("w", &[], LEASE).await.expect("claim"), None);
    let t = |task_type, resource| TaskKey::new("u", task_type, resource).expect("key");
    let a1 = enqueue(db, t("a", "1")).await;
    let b1 = enqueue(db, t("b", "1")).await;
    let a2 = enqueue(db, t("a", "2")).await;
    let c1 = enqueue(db, t("c", "1")).await;
    for (id, seconds) in [(a1.id, 10), (b1.id, 20), (a2.id, 30), (c1.id, 40)] {
        set(db, id, Column::CreatedAt, harness::rows::at(seconds)).await;
    }

    let claim = async |types: &[&str]| db.db.claim("w", types, LEASE).await.expect("claim");
    assert_eq!(claim(&["b", "c"]).await.map(|t| t.id), Some(b1.id));
    assert_eq!(claim(&[]).await.map(|t| t.id), Some(a1.id));
    assert_eq!(claim(&["c"]).await.map(|t| t.id), Some(c1.id));
    assert_eq!(claim(&["b", "c"]).await, None);
    assert_eq!(claim(&["a"]).await.map(|t| t.id), Some(a2.id));
    assert_eq!(claim(&[]).await, None);
}

async fn lease_comes_from_one_database_clock(db: &TestDb) {
    db.migrate().await;
    let task = enqueue(db, key("doc")).await;
    let claimed = db
        .db
        .claim("w", &[], LEASE)
        .await
        .expect("claim")
        .expect("queued task");
    assert_eq!(claimed.id, task.id);
    assert_eq!(claimed.attempts, 1);
    let started = claimed.started_at.expect("started_at");
    let expires = claimed.lease_expires_at.expect("lease");
    assert_eq!(
        expires - started,
        chrono::Duration::from_std(LEASE).expect("lease")
    );
    assert_eq!(
        claimed,
        load(db, task.id).await,
        "claim returns the row as stored"
    );

    let beat = db
        .db
        .heartbeat(task.id, "w", Duration::from_secs(600))
        .await
        .expect("heartbeat");
    assert!(beat.lease_expires_at.expect("lease") >= started + chrono::Duration::seconds(600));
    assert_eq!(beat, load(db, task.id).await);
}

async fn invalid_transitions_change_nothing(db: &TestDb) {
    db.migrate().await;
    let unknown = Uuid::now_v7();
    let not_found = |r: Result<task_run::Model, DedupError>| {
        assert!(
            matches!(r, Err(DedupError::NotFound { id }) if id == unknown),
            "{r:?}"
        );
    };
    not_found(db.db.heartbeat(unknown, "w", LEASE).await);
    not_found(db.db.complete(unknown, "w", None).await);
    not_found(db.db.fail(unknown, "w", "boom", Retry::Never).await);
    not_found(db.db.cancel(unknown, "no").await);

    // Completing a task nobody claimed.
    let queued = enqueue(db, key("queued")).await;
    let err = db
        .db
        .complete(queued.id, "w", None)
        .await
        .expect_err("not running");
    assert!(
        matches!(
            err,
            DedupError::InvalidTransition {
                transition: Transition::Complete,
                status: TaskStatus::Queued,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(load(db, queued.id).await, queued);

    // Another worker's task.
    let running = claim(db, "owner").await;
    for result in [
        db.db.complete(running.id, "intruder", None).await,
        db.db
            .fail(running.id, "intruder", "boom", Retry::Never)
            .await,
        db.db.heartbeat(running.id, "intruder", LEASE).await,
    ] {
        match result {
            Err(DedupError::LeaseNotHeld {
                worker_id, holder, ..
            }) => {
                assert_eq!(
                    (worker_id.as_str(), holder.as_deref()),
                    ("intruder", Some("owner"))
                );
            }
            other => panic!("expected LeaseNotHeld, got {other:?}"),
        }
    }
    assert_eq!(load(db, running.id).await, running);

    // Completing twice (a call repeated after a lost connection) returns the stored
    // outcome; failing or cancelling what already finished is refused.
    let done = db
        .db
        .complete(running.id, "owner", Some(serde_json::json!({"ok": true})))
        .await
        .expect("complete");
    assert_eq!(
        db.db
            .complete(running.id, "owner", None)
            .await
            .expect("again"),
        done,
        "the stored outcome, not the repeated call's"
    );
    assert!(matches!(
        db.db.complete(running.id, "intruder", None).await,
        Err(DedupError::InvalidTransition { .. })
    ));
    for (transition, result) in [
        (
            Transition::Fail,
            db.db.fail(running.id, "owner", "late", Retry::Never).await,
        ),
        (Transition::Cancel, db.db.cancel(running.id, "late").await),
    ] {
        match result {
            Err(DedupError::InvalidTransition {
                transition: t,
                status,
                ..
            }) => {
                assert_eq!((t, status), (transition, TaskStatus::Succeeded));
            }
            other => panic!("expected InvalidTransition, got {other:?}"),
        }
    }
    assert_eq!(load(db, running.id).await, done);

    // A heartbeat after the reaper took the lease back.
    let second = enqueue(db, key("second")).await;
    let claimed = claim(db, "slow").await;
    assert_eq!(claimed.id, second.id);
    expire_lease(db, claimed.id).await;
    assert_eq!(
        db.db
            .reap_expired(&reap_policy(3))
            .await
            .expect("reap")
            .requeued,
        1
    );
    let requeued = load(db, claimed.id).await;
    let err = db
        .db
        .heartbeat(claimed.id, "slow", LEASE)
        .await
        .expect_err("lease lost");
    assert!(
        matches!(
            err,
            DedupError::InvalidTransition {
                transition: Transition::Heartbeat,
                status: TaskStatus::Queued,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(load(db, claimed.id).await, requeued);
}

async fn invalid_arguments_are_rejected_before_sql(db: &TestDb) {
    db.migrate().await;
    let task = enqueue(db, key("doc")).await;
    let invalid = |r: Result<_, DedupError>, expected: &str| match r {
        Err(DedupError::InvalidArgument { name, .. }) => assert_eq!(name, expected),
        other => panic!("expected InvalidArgument({expected}), got {other:?}"),
    };
    invalid(db.db.claim("", &[], LEASE).await.map(|_| ()), "worker_id");
    invalid(
        db.db.claim(&"w".repeat(65), &[], LEASE).await.map(|_| ()),
        "worker_id",
    );
    invalid(
        db.db.claim("w", &[""], LEASE).await.map(|_| ()),
        "task_types",
    );
    invalid(
        db.db.claim("w", &[], Duration::ZERO).await.map(|_| ()),
        "lease",
    );
    invalid(
        db.db
            .claim("w", &[], Duration::from_secs(8 * 86_400))
            .await
            .map(|_| ()),
        "lease",
    );
    invalid(
        db.db.heartbeat(task.id, "w\0", LEASE).await.map(|_| ()),
        "worker_id",
    );
    invalid(
        db.db.reap_expired(&reap_policy(0)).await.map(|_| ()),
        "max_attempts",
    );
    invalid(
        db.db.prune_finished(Duration::MAX).await.map(|_| ()),
        "older_than",
    );
    invalid(db.db.cancel(task.id, "no\0").await.map(|_| ()), "reason");
    let too_long = "x".repeat(task_dedup::task_run::ERROR_MAX_CHARS + 1);
    invalid(db.db.cancel(task.id, &too_long).await.map(|_| ()), "reason");
    let nul_result = Some(serde_json::json!({"k\0": 1}));
    invalid(
        db.db.complete(task.id, "w", nul_result).await.map(|_| ()),
        "result",
    );
    invalid(
        db.db
            .fail(task.id, "w", &too_long, Retry::Never)
            .await
            .map(|_| ()),
        "error",
    );
    match db.db.claim("", &[], LEASE).await {
        Err(DedupError::InvalidArgument { reason, .. }) => assert_eq!(reason, InvalidReason::Empty),
        other => panic!("{other:?}"),
    }
    assert_eq!(load(db, task.id).await, task, "nothing was claimed");
}

async fn longest_error_text_fits_every_dialect(db: &TestDb) {
    db.migrate().await;
    let task = enqueue(db, key("doc")).await;
    claim(db, "w").await;
    // 4-byte characters up to the limit: MySQL's TEXT (65,535 bytes) still holds them.
    let longest = "🦀".repeat(task_dedup::task_run::ERROR_MAX_CHARS);
    let failed = db
        .db
        .fail(task.id, "w", &longest, Retry::Never)
        .await
        .expect("fail");
    assert_eq!(failed.error.as_deref(), Some(longest.as_str()));
    assert_eq!(load(db, task.id).await, failed);
}

async fn expired_leases_are_requeued_then_failed(db: &TestDb) {
    db.migrate().await;
    let task = enqueue(db, key("doc")).await;
    let live = enqueue(db, key("live")).await;

    let first = claim(db, "crashed").await;
    assert_eq!(first.id, task.id);
    let other = claim(db, "alive").await;
    assert_eq!(other.id, live.id);
    expire_lease(db, task.id).await;

    let report = db.db.reap_expired(&reap_policy(2)).await.expect("reap");
    assert_eq!((report.requeued, report.failed), (1, 0));
    let requeued = load(db, task.id).await;
    assert_eq!(requeued.status, TaskStatus::Queued);
    assert_eq!(
        (requeued.lease_owner, requeued.lease_expires_at),
        (None, None)
    );
    assert_eq!(load(db, live.id).await, other, "a live lease is left alone");

    let second = claim(db, "crashed-again").await;
    assert_eq!((second.id, second.attempts), (task.id, 2));
    expire_lease(db, task.id).await;
    let report = db.db.reap_expired(&reap_policy(2)).await.expect("reap");
    assert_eq!((report.requeued, report.failed), (0, 1));
    let failed = load(db, task.id).await;
    assert_eq!(failed.status, TaskStatus::Failed);
    assert!(failed.finished_at.is_some() && failed.lease_expires_at.is_none());
    assert!(
        failed
            .error
            .as_deref()
            .is_some_and(|e| e.contains("max_attempts = 2")),
        "{failed:?}"
    );

    assert_eq!(
        db.db.reap_expired(&reap_policy(2)).await.expect("reap"),
        ReapReport::default()
    );
}

async fn heartbeat_racing_the_reaper_is_never_requeued(db: &TestDb) {
    db.migrate().await;
    // Heartbeat first: the reaper sees the extended lease and leaves the task alone.
    let task = enqueue(db, key("doc")).await;
    claim(db, "w").await;
    expire_lease(db, task.id).await;
    db.db
        .heartbeat(task.id, "w", LEASE)
        .await
        .expect("heartbeat");
    assert_eq!(
        db.db.reap_expired(&reap_policy(3)).await.expect("reap"),
        ReapReport::default()
    );
    assert_eq!(load(db, task.id).await.status, TaskStatus::Running);
    db.db.complete(task.id, "w", None).await.expect("complete");

    // Both at once, many times: whichever wins, a successful heartbeat means the task
    // was not requeued, and a requeue means the heartbeat failed.
    let pool = db.pool(2).await;
    let mut heartbeats_won = 0;
    for round in 0..40 {
        let task = enqueue(db, key(&format!("race-{round}"))).await;
        claim(db, "w").await;
        expire_lease(db, task.id).await;
        let start = Arc::new(Barrier::new(2));
        let beat = {
            let (pool, start) = (pool.db.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                pool.heartbeat(task.id, "w", LEASE).await
            })
        };
        start.wait().await;
        let report = pool.reap_expired(&reap_policy(3)).await.expect("reap");
        let beat = beat.await.expect("heartbeat task");
        let row = load(db, task.id).await;
        match beat {
            Ok(_) => {
                heartbeats_won += 1;
                assert_eq!(
                    report.requeued, 0,
                    "round {round}: extended lease was requeued"
                );
                assert_eq!(row.status, TaskStatus::Running);
            }
            Err(DedupError::InvalidTransition {
                status: TaskStatus::Queued,
                ..
            }) => {
                assert_eq!(report.requeued, 1);
                assert_eq!(row.status, TaskStatus::Queued);
            }
            Err(other) => panic!("round {round}: {other:?}"),
        }
        db.db.cancel(task.id, "next round").await.expect("cancel");
    }
    eprintln!("heartbeat won {heartbeats_won} of 40 races");
}

async fn finishing_releases_the_key(db: &TestDb) {
    db.migrate().await;
    let doc = key("doc");
    let enqueue_doc = async || {
        db.db
            .find_or_enqueue(NewTask::new(doc.clone()))
            .await
            .expect("enqueue")
    };

    type Finish = fn(&TestDb, Uuid) -> futures_finish::BoxFuture<'_>;
    let finishes: [(&str, Finish); 4] = [
        ("complete", |db, id| {
            Box::pin(async move { db.db.complete(id, "w", None).await.map(drop) })
        }),
        ("fail", |db, id| {
            Box::pin(async move { db.db.fail(id, "w", "boom", Retry::Never).await.map(drop) })
        }),
        ("cancel", |db, id| {
            Box::pin(async move { db.db.cancel(id, "user asked").await.map(drop) })
        }),
        ("reap to failed", |db, id| {
            Box::pin(async move {
                expire_lease(db, id).await;
                assert_eq!(db.db.reap_expired(&reap_policy(1)).await?.failed, 1);
                Ok(())
            })
        }),
    ];
    for (name, finish) in finishes {
        let created = enqueue_doc().await;
        assert!(created.is_created(), "{name}: the key is free");
        let running = claim(db, "w").await;
        assert_eq!(running.id, created.task().id);
        let hit = enqueue_doc().await;
        assert!(!hit.is_created(), "{name}: a running task holds the key");
        assert_eq!(hit.task().id, running.id);
        finish(db, running.id)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let row = load(db, running.id).await;
        assert!(
            !row.status.is_active() && row.finished_at.is_some(),
            "{name}: {row:?}"
        );
    }
    // Cancelling a queued task releases the key too.
    let queued = enqueue_doc().await;
    db.db
        .cancel(queued.task().id, "not needed")
        .await
        .expect("cancel");
    assert!(enqueue_doc().await.is_created());
}

/// Boxed futures for the table of finishing transitions above.
mod futures_finish {
    pub type BoxFuture<'a> =
        std::pin::Pin<Box<dyn Future<Output = Result<(), task_dedup::DedupError>> + Send + 'a>>;
}

async fn prune_keeps_active_and_recent_tasks(db: &TestDb) {
    db.migrate().await;
    let old_done = enqueue(db, key("old-done")).await;
    let old_cancelled = enqueue(db, key("old-cancelled")).await;
    let recent_done = enqueue(db, key("recent-done")).await;
    let old_queued = enqueue(db, key("old-queued")).await;
    for task in [&old_done, &recent_done] {
        db.db.cancel(task.id, "done").await.expect("finish");
    }
    db.db
        .cancel(old_cancelled.id, "never mind")
        .await
        .expect("cancel");
    let two_days_ago = task_run::now() - chrono::Duration::days(2);
    for id in [old_done.id, old_cancelled.id] {
        set(db, id, Column::FinishedAt, two_days_ago).await;
    }
    set(db, old_queued.id, Column::CreatedAt, two_days_ago).await;

    let pruned = db
        .db
        .prune_finished(Duration::from_secs(86_400))
        .await
        .expect("prune");
    assert_eq!(pruned, 2);
    let left: HashSet<Uuid> = harness::rows::all(&db.db)
        .await
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(left, HashSet::from([recent_done.id, old_queued.id]));
    assert_eq!(
        db.db
            .prune_finished(Duration::from_secs(86_400))
            .await
            .expect("prune"),
        0
    );
    assert_eq!(
        task_run::Entity::find().count(&db.db).await.expect("count"),
        2
    );
}
