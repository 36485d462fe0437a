//! Limits per task type on every dialect (`TaskAdmin::set_limits`): running tasks
//! anywhere, running tasks per user and starts per window; and the limit per user
//! across all types (`TaskAdmin::set_user_limit`); decided by the database under racing
//! claimers in one process and in two; lowered while tasks run; with a worker gone and
//! a connection killed in the middle.

use std::collections::{HashMap, HashSet};
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use harness::{Dialect, TestDb, matrix, server_matrix};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait, QueryFilter, TransactionTrait,
};
use task_dedup::{
    CancellationToken, DedupError, InvalidReason, NewTask, Retention, RetryPolicy, Scope,
    TaskAdmin, TaskDedup, TaskKey, TaskLifecycle, TaskStatus, TypeLimits, Worker, task_run,
};
use tokio::sync::Barrier;

matrix!(
    racing_claimers_never_exceed_the_global_limit,
    a_limit_set_while_tasks_run_counts_them,
    a_follow_up_behind_its_running_key_holds_no_limited_claim_back,
    racing_claimers_never_exceed_the_per_user_limit,
    the_rate_limit_counts_starts_across_claims,
    other_types_flow_while_a_limited_type_waits,
    lowering_a_limit_interrupts_nothing,
    a_dead_workers_tasks_count_until_reaped,
    limits_are_listed_cleared_and_checked_before_sql,
    claims_in_a_caller_transaction_honour_limits,
    workers_in_two_processes_stay_within_the_limits,
    fair_claims_take_users_in_turn,
    racing_claimers_never_exceed_the_user_limit,
    one_resource_key_in_several_types_is_several_keys_under_the_user_limit,
    a_user_limit_set_elsewhere_holds_at_once,
    the_user_limit_is_set_listed_cleared_and_checked,
    workers_in_two_processes_stay_within_the_user_limit,
);

// Sessions to kill: the server dialects.
server_matrix!(
    a_claim_holding_the_limit_lock_killed_frees_the_type,
    a_claim_holding_the_user_limit_lock_killed_frees_the_claims,
);

const LEASE: Duration = Duration::from_secs(60);

async fn enqueue(db: &DatabaseConnection, user: &str, task_type: &str, resource: &str) {
    let key = TaskKey::new(user, task_type, resource).expect("key");
    let outcome = db
        .find_or_enqueue(NewTask::new(key))
        .await
        .expect("enqueue");
    assert!(outcome.is_created());
}

async fn limit(db: &DatabaseConnection, task_type: &str, limits: TypeLimits) {
    db.set_limits(task_type, &limits).await.expect("set limits");
}

/// Worker `w`'s claim of up to `max` tasks of `types`.
async fn claimed(db: &DatabaseConnection, types: &[&str], max: usize) -> Vec<task_run::Model> {
    db.claim_many("w", types, LEASE, max).await.expect("claim")
}

async fn running(db: &DatabaseConnection, task_type: &str) -> i64 {
    harness::count(
        db,
        format!("SELECT count(*) AS n FROM task_run WHERE task_type = '{task_type}' AND status = 'running'"),
    )
    .await
}

/// `claimers` callers on connections of their own, released together, each claiming up
/// to `max` tasks of `types` once; every task they got.
async fn race(
    db: &TestDb,
    claimers: usize,
    types: &'static [&'static str],
    max: usize,
) -> Vec<task_run::Model> {
    let pool = Arc::new(db.pool(claimers as u32).await);
    let barrier = Arc::new(Barrier::new(claimers));
    let mut handles = Vec::new();
    for n in 0..claimers {
        let (pool, barrier) = (Arc::clone(&pool), Arc::clone(&barrier));
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            pool.claim_many(&format!("w{n}"), types, LEASE, max)
                .await
                .expect("claim")
        }));
    }
    let mut claimed = Vec::new();
    for handle in handles {
        claimed.extend(handle.await.expect("claimer"));
    }
    claimed
}

/// 8 claimers of 4 tasks each at once, limit 3: exactly 3 start, whoever wins; as tasks
/// end, exactly as many start again. (With the limit check removed from the claim,
/// every claimer takes its 4: checked.)
async fn racing_claimers_never_exceed_the_global_limit(db: &TestDb) {
    db.migrate().await;
    limit(&db.db, "export", TypeLimits::new().max_running(3)).await;
    for i in 0..40 {
        enqueue(&db.db, &format!("u{}", i % 5), "export", &i.to_string()).await;
    }
    let claimed = race(db, 8, &["export"], 4).await;
    assert_eq!(claimed.len(), 3, "{claimed:?}");
    assert_eq!(running(&db.db, "export").await, 3);
    // Two end: exactly two start, however many ask.
    for task in &claimed[..2] {
        let owner = task.lease_owner.as_deref().expect("owner");
        db.db
            .complete(task.id, owner, None)
            .await
            .expect("complete");
    }
    let claimed = race(db, 8, &["export"], 4).await;
    assert_eq!(claimed.len(), 2, "{claimed:?}");
    assert_eq!(running(&db.db, "export").await, 3);
    // Claims of any type honour it the same.
    let claimed = race(db, 8, &[], 4).await;
    assert!(claimed.is_empty(), "{claimed:?}");
}

/// Tasks that were running when the limit was set hold no run slot: they count all the
/// same (the claims take the locked path while any runs; SQLite's count them in its
/// statement), and once they ended the claims take slots again.
async fn a_limit_set_while_tasks_run_counts_them(db: &TestDb) {
    db.migrate().await;
    for i in 0..8 {
        enqueue(&db.db, "u", "export", &i.to_string()).await;
    }
    let before = claimed(&db.db, &[], 3).await;
    assert_eq!(before.len(), 3);
    limit(&db.db, "export", TypeLimits::new().max_running(2)).await;
    assert!(
        race(db, 8, &["export"], 2).await.is_empty(),
        "3 run, the limit is 2"
    );
    for (ended, task) in before.iter().enumerate() {
        db.db.complete(task.id, "w", None).await.expect("complete");
        let started = race(db, 8, &["export"], 2).await;
        // 2, 1, then none of those left, with what started meanwhile.
        assert_eq!(started.len(), [0, 1, 1][ended], "after {} ended", ended + 1);
    }
    assert_eq!(running(&db.db, "export").await, 2);
    // SQLite's claim counts the running tasks in its statement (one writer at a time)
    // and gives no slots.
    let slotted = match db.dialect {
        Dialect::Sqlite => 0,
        _ => 2,
    };
    let slots = harness::count(
        &db.db,
        "SELECT count(DISTINCT run_slot) AS n FROM task_run \
         WHERE status = 'running' AND run_slot IN (0, 1)",
    )
    .await;
    assert_eq!(
        slots, slotted,
        "each started task holds a slot below the limit"
    );
}

/// A follow-up waiting at the head of a limited type's queue behind its key's running
/// task: the claim passes over it and starts the next keys. (The first claim on a queue
/// of distinct keys is the optimistic one, which picks the follow-up, fails in
/// `task_running_resource_uidx` and runs again probing; treated as a lost race instead,
/// it ran into the same follow-up five times and started nothing: checked.)
async fn a_follow_up_behind_its_running_key_holds_no_limited_claim_back(db: &TestDb) {
    db.migrate().await;
    limit(&db.db, "export", TypeLimits::new().max_running(10)).await;
    // Scope::Queued: a task holds its key only while queued, so a follow-up may wait
    // while it runs.
    let queued =
        || NewTask::new(TaskKey::new("u", "export", "a").expect("key")).scope(Scope::Queued);
    assert!(
        db.db
            .find_or_enqueue(queued())
            .await
            .expect("enqueue")
            .is_created()
    );
    let first = claimed(&db.db, &["export"], 1).await;
    assert_eq!(first.len(), 1);
    let follow_up = db.db.find_or_enqueue(queued()).await.expect("follow-up");
    assert!(follow_up.is_created());
    enqueue(&db.db, "u", "export", "b").await;
    enqueue(&db.db, "u", "export", "c").await;
    let started = claimed(&db.db, &["export"], 3).await;
    let mut keys: Vec<&str> = started.iter().map(|t| t.resource_key.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["b", "c"]);
    assert_eq!(running(&db.db, "export").await, 3);
}

/// Two users with 10 tasks each, at most 2 running per user: 8 claimers at once start
/// exactly 2 of each, the batch passing over a user's tasks beyond its room.
async fn racing_claimers_never_exceed_the_per_user_limit(db: &TestDb) {
    db.migrate().await;
    limit(&db.db, "sync", TypeLimits::new().max_running_per_user(2)).await;
    for i in 0..10 {
        enqueue(&db.db, "heavy", "sync", &i.to_string()).await;
    }
    for i in 0..10 {
        enqueue(&db.db, "light", "sync", &i.to_string()).await;
    }
    // One claim of 10: the heavy user's tasks come first in claim order, 2 of them are
    // taken, then the light user's.
    let claimed = db
        .db
        .claim_many("w", &["sync"], LEASE, 10)
        .await
        .expect("claim");
    let per_user = |tasks: &[task_run::Model]| {
        let mut per_user: HashMap<String, usize> = HashMap::new();
        for task in tasks {
            *per_user.entry(task.user_id.clone()).or_default() += 1;
        }
        per_user
    };
    assert_eq!(
        per_user(&claimed),
        HashMap::from([("heavy".to_owned(), 2), ("light".to_owned(), 2)])
    );
    let owner = claimed[0].lease_owner.clone().expect("owner");
    for task in &claimed {
        db.db
            .complete(task.id, &owner, None)
            .await
            .expect("complete");
    }
    let claimed = race(db, 8, &["sync"], 3).await;
    assert_eq!(
        per_user(&claimed),
        HashMap::from([("heavy".to_owned(), 2), ("light".to_owned(), 2)])
    );
}

/// 5 starts per window (a long one, so the test never straddles two): 8 claimers of 3
/// start exactly 5, and after they all end, none more; the others stay queued with no
/// attempt counted.
async fn the_rate_limit_counts_starts_across_claims(db: &TestDb) {
    db.migrate().await;
    let window = Duration::from_secs(30 * 24 * 3600);
    limit(&db.db, "mail", TypeLimits::new().rate(5, window)).await;
    for i in 0..20 {
        enqueue(&db.db, &format!("u{i}"), "mail", &i.to_string()).await;
    }
    let claimed = race(db, 8, &["mail"], 3).await;
    assert_eq!(claimed.len(), 5, "{claimed:?}");
    for task in &claimed {
        let owner = task.lease_owner.as_deref().expect("owner");
        db.db
            .complete(task.id, owner, None)
            .await
            .expect("complete");
    }
    assert!(race(db, 8, &["mail"], 3).await.is_empty());
    let listed = db.db.limits().await.expect("limits");
    assert_eq!(listed[0].starts_in_window, 5);
    assert_eq!(listed[0].running, 0);
    let queued: Vec<_> = harness::rows::all(&db.db)
        .await
        .into_iter()
        .filter(|t| t.status == TaskStatus::Queued)
        .collect();
    assert_eq!(queued.len(), 15);
    assert!(queued.iter().all(|t| t.attempts == 0), "{queued:?}");
}

/// A fair type's claims serve the users with queued work in turn, one task each before
/// a second of any, however long one user's backlog, and go on after the last user
/// served; the one per key rule and per-user limits hold the same.
async fn fair_claims_take_users_in_turn(db: &TestDb) {
    db.migrate().await;
    limit(&db.db, "report", TypeLimits::new().fair_between_users()).await;
    for i in 0..50 {
        enqueue(&db.db, "heavy", "report", &i.to_string()).await;
    }
    for user in ["light-1", "light-2"] {
        for i in 0..2 {
            enqueue(&db.db, user, "report", &i.to_string()).await;
        }
    }
    let users = |tasks: Vec<task_run::Model>| {
        let mut users: Vec<String> = tasks.into_iter().map(|t| t.user_id).collect();
        users.sort();
        users
    };
    let claim = |max| db.db.claim_many("w", &["report"], LEASE, max);
    assert_eq!(
        users(claim(3).await.expect("claim")),
        ["heavy", "light-1", "light-2"]
    );
    assert_eq!(
        users(claim(3).await.expect("claim")),
        ["heavy", "light-1", "light-2"]
    );
    // The light users are done: the heavy one has the batch to itself.
    assert_eq!(
        users(claim(3).await.expect("claim")),
        ["heavy", "heavy", "heavy"]
    );

    // One task at a time: the turn goes round.
    for i in 0..2 {
        enqueue(&db.db, "light-1", "report", &format!("later-{i}")).await;
    }
    let mut order = Vec::new();
    for _ in 0..5 {
        order.extend(users(claim(1).await.expect("claim")));
    }
    assert_eq!(order, ["light-1", "heavy", "light-1", "heavy", "heavy"]);

    // With a per-user limit too: the heavy user's 5 running tasks take its turn away.
    limit(
        &db.db,
        "report",
        TypeLimits::new()
            .fair_between_users()
            .max_running_per_user(5),
    )
    .await;
    enqueue(&db.db, "light-2", "report", "later").await;
    assert!(running(&db.db, "report").await >= 5);
    assert_eq!(users(claim(3).await.expect("claim")), ["light-2"]);
}

/// A limited type at its limit holds back only its own tasks: a batch fills from the
/// others, whichever part of the claim goes first.
async fn other_types_flow_while_a_limited_type_waits(db: &TestDb) {
    db.migrate().await;
    limit(&db.db, "export", TypeLimits::new().max_running(1)).await;
    for i in 0..5 {
        enqueue(&db.db, "u", "export", &i.to_string()).await;
        enqueue(&db.db, "u", "email", &i.to_string()).await;
    }
    let mut exports = 0;
    let mut emails = 0;
    for _ in 0..3 {
        for task in claimed(&db.db, &[], 2).await {
            match task.task_type.as_str() {
                "export" => exports += 1,
                _ => emails += 1,
            }
        }
    }
    assert_eq!((exports, emails), (1, 5));
    assert!(claimed(&db.db, &["export"], 2).await.is_empty());
}

/// Lowered below what runs: nothing is interrupted, and nothing starts until the type is
/// under the new limit.
async fn lowering_a_limit_interrupts_nothing(db: &TestDb) {
    db.migrate().await;
    limit(&db.db, "export", TypeLimits::new().max_running(3)).await;
    for i in 0..6 {
        enqueue(&db.db, "u", "export", &i.to_string()).await;
    }
    let first = claimed(&db.db, &[], 6).await;
    assert_eq!(first.len(), 3);
    limit(&db.db, "export", TypeLimits::new().max_running(1)).await;
    assert_eq!(running(&db.db, "export").await, 3, "still running");
    for task in &first {
        db.db
            .heartbeat(task.id, "w", LEASE)
            .await
            .expect("lease still held");
    }
    // 3, 2, then 1 running, the limit 1: nothing starts; at 0, one.
    for task in &first {
        assert!(claimed(&db.db, &[], 6).await.is_empty());
        db.db.complete(task.id, "w", None).await.expect("complete");
    }
    assert_eq!(claimed(&db.db, &[], 6).await.len(), 1);
}

/// A worker that died with tasks running holds their slots until their leases expire
/// and the reaper requeues them; then they start again, within the limit.
async fn a_dead_workers_tasks_count_until_reaped(db: &TestDb) {
    db.migrate().await;
    limit(&db.db, "export", TypeLimits::new().max_running(2)).await;
    for i in 0..4 {
        enqueue(&db.db, "u", "export", &i.to_string()).await;
    }
    let short = Duration::from_millis(300);
    let dead = db
        .db
        .claim_many("dead", &[], short, 4)
        .await
        .expect("claim");
    assert_eq!(dead.len(), 2);
    assert!(claimed(&db.db, &[], 4).await.is_empty());
    tokio::time::sleep(Duration::from_millis(600)).await;
    let reaped = db
        .db
        .reap_expired(&RetryPolicy::default())
        .await
        .expect("reap");
    assert_eq!(reaped.requeued, 2);
    let claimed = claimed(&db.db, &[], 4).await;
    assert_eq!(claimed.len(), 2);
    assert_eq!(running(&db.db, "export").await, 2);
}

async fn limits_are_listed_cleared_and_checked_before_sql(db: &TestDb) {
    // Before the migrations: a statement would fail with a database error instead.
    let too_long = "x".repeat(task_run::TASK_TYPE_MAX_CHARS + 1);
    for (name, reason) in [
        ("", InvalidReason::Empty),
        ("a\0b", InvalidReason::ContainsNul),
    ] {
        match db
            .db
            .set_limits(name, &TypeLimits::new().max_running(1))
            .await
        {
            Err(DedupError::InvalidArgument {
                name: "task_type",
                reason: got,
            }) => assert_eq!(got, reason),
            other => panic!("{name:?}: {other:?}"),
        }
    }
    assert!(matches!(
        db.db.clear_limits(&too_long).await,
        Err(DedupError::InvalidArgument {
            name: "task_type",
            ..
        })
    ));
    for (limits, field) in [
        (TypeLimits::new(), "limits"),
        (TypeLimits::new().max_running(0), "max_running"),
        (
            TypeLimits::new().max_running_per_user(2_000_000),
            "max_running_per_user",
        ),
        (
            TypeLimits::new().rate(5, Duration::from_micros(10)),
            "rate.per",
        ),
        (
            TypeLimits::new().rate(0, Duration::from_secs(1)),
            "rate.starts",
        ),
    ] {
        match db.db.set_limits("export", &limits).await {
            Err(DedupError::InvalidArgument { name, .. }) => assert_eq!(name, field),
            other => panic!("{limits:?}: {other:?}"),
        }
    }

    db.migrate().await;
    let before = task_run::now();
    let limits = TypeLimits::new()
        .max_running(4)
        .max_running_per_user(2)
        .rate(100, Duration::from_secs(60));
    db.db.set_limits("export", &limits).await.expect("set");
    db.db
        .set_limits("Export", &TypeLimits::new().max_running(1))
        .await
        .expect("another spelling, another type");
    enqueue(&db.db, "u", "export", "1").await;
    assert_eq!(claimed(&db.db, &[], 5).await.len(), 1);
    let listed = db.db.limits().await.expect("limits");
    assert_eq!(
        listed
            .iter()
            .map(|l| l.task_type.as_str())
            .collect::<Vec<_>>(),
        ["Export", "export"]
    );
    let export = &listed[1];
    assert_eq!(export.limits, limits);
    assert_eq!((export.running, export.starts_in_window), (1, 1));
    assert!(export.updated_at >= before - chrono::Duration::seconds(1));

    // Replaced whole: the rate is gone.
    db.db
        .set_limits("export", &TypeLimits::new().max_running(1))
        .await
        .expect("replace");
    let listed = db.db.limits().await.expect("limits");
    assert_eq!(listed[1].limits, TypeLimits::new().max_running(1));
    assert!(db.db.clear_limits("export").await.expect("clear"));
    assert!(!db.db.clear_limits("export").await.expect("clear again"));
    // Cleared: its tasks are claimed as any others'.
    enqueue(&db.db, "u", "export", "2").await;
    assert_eq!(claimed(&db.db, &[], 5).await.len(), 1);
}

/// A claim in the caller's transaction is limited the same, and takes effect with it.
async fn claims_in_a_caller_transaction_honour_limits(db: &TestDb) {
    db.migrate().await;
    limit(&db.db, "export", TypeLimits::new().max_running(1)).await;
    for i in 0..3 {
        enqueue(&db.db, "u", "export", &i.to_string()).await;
    }
    let txn = db.db.begin().await.expect("begin");
    assert_eq!(
        txn.claim_many("w", &[], LEASE, 3)
            .await
            .expect("claim")
            .len(),
        1
    );
    assert!(
        txn.claim_many("w", &[], LEASE, 3)
            .await
            .expect("claim")
            .is_empty()
    );
    txn.rollback().await.expect("rollback");
    assert_eq!(running(&db.db, "export").await, 0);
    let txn = db.db.begin().await.expect("begin");
    assert_eq!(
        txn.claim_many("w", &[], LEASE, 3)
            .await
            .expect("claim")
            .len(),
        1
    );
    txn.commit().await.expect("commit");
    assert_eq!(running(&db.db, "export").await, 1);
}

/// A claim killed with its connection while it holds a type's lock takes nothing, and
/// the type's next claim goes through: the lock went with the session.
async fn a_claim_holding_the_limit_lock_killed_frees_the_type(db: &TestDb) {
    db.migrate().await;
    // With a per-user limit too: the locked claim (`max_running` alone takes slots
    // without the lock).
    let limits = TypeLimits::new().max_running(2).max_running_per_user(5);
    limit(&db.db, "export", limits).await;
    killed_while_waiting_for(db, "export", 2).await;
}

/// The same for the lock of the limit across all types, which a claim of a type without
/// limits of its own takes.
async fn a_claim_holding_the_user_limit_lock_killed_frees_the_claims(db: &TestDb) {
    db.migrate().await;
    db.db.set_user_limit(3).await.expect("set");
    killed_while_waiting_for(db, "", 3).await;
}

/// 4 tasks of one user, of a type without limits of its own: a claim waits behind
/// another session holding the limits' row of `task_type`, is killed, took nothing;
/// after the pools reconnect a claim takes `then`.
async fn killed_while_waiting_for(db: &TestDb, task_type: &str, then: usize) {
    for i in 0..4 {
        enqueue(&db.db, "u", "export", &i.to_string()).await;
    }
    // Another session holds the row: the claim waits behind it.
    let holder = db.pool(1).await;
    let txn = holder.begin().await.expect("begin");
    txn.execute_unprepared(&format!(
        "SELECT * FROM task_dedup_limits WHERE task_type = '{task_type}' FOR UPDATE"
    ))
    .await
    .expect("lock");
    let claimer = Arc::new(db.pool(1).await);
    let waiting = {
        let claimer = Arc::clone(&claimer);
        tokio::spawn(async move { claimer.claim_many("w", &[], LEASE, 4).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the claim waits for the lock");
    db.kill_all_sessions().await;
    let outcome = waiting.await.expect("claimer");
    assert!(
        matches!(outcome, Err(DedupError::ConnectionLost(_))),
        "{outcome:?}"
    );
    drop(txn);
    assert_eq!(
        running(&db.db, "export").await,
        0,
        "the killed claim took nothing"
    );
    // The pools reconnect; the lock is free.
    let claimed = claimer.claim_many("w", &[], LEASE, 4).await.expect("claim");
    assert_eq!(claimed.len(), then);
}

/// The child process of [`workers_in_two_processes_stay_within_the_limits`]: a worker of
/// 4 at a time, each task taking a moment, until it is killed. Does nothing unless the
/// parent started it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of workers_in_two_processes_stay_within_the_limits"]
async fn child_limited_worker_runs_until_killed() {
    harness::children::run_worker(
        ("TASK_DEDUP_LIMITS_CHILD_URL", "TASK_DEDUP_LIMITS_CHILD_ID"),
        4,
        (Duration::from_millis(5), Duration::from_millis(20)),
        Duration::from_millis(100),
        Duration::from_millis(25),
    )
    .await;
}

fn child(url: &str, id: &str) -> Child {
    harness::children::spawn_ready(
        &harness::children::test_name(module_path!(), "child_limited_worker_runs_until_killed"),
        &[
            ("TASK_DEDUP_LIMITS_CHILD_URL", url),
            ("TASK_DEDUP_LIMITS_CHILD_ID", id),
        ],
    )
}

/// The most tasks of `tasks` that ran at once, from the database's own start and end
/// times: an end at the instant of a start comes first (the start waited for it).
fn most_at_once<'a>(tasks: impl Iterator<Item = &'a task_run::Model>) -> usize {
    let mut events: Vec<(DateTime<Utc>, i32)> = Vec::new();
    for task in tasks {
        events.push((task.started_at.expect("started"), 1));
        events.push((task.finished_at.expect("finished"), -1));
    }
    events.sort();
    let (mut now, mut most) = (0, 0);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    most as usize
}

/// 8 workers in 2 processes drain three limited types: at most 3 exports ran at once
/// (by the database's start and end times, and by a monitor polling the table), at most
/// 1 sync per user, and exactly 6 mails started in the rate's window, the rest queued
/// with no attempt counted.
async fn workers_in_two_processes_stay_within_the_limits(db: &TestDb) {
    db.migrate().await;
    let limits = [
        ("export", TypeLimits::new().max_running(3)),
        ("sync", TypeLimits::new().max_running_per_user(1)),
        (
            "mail",
            TypeLimits::new().rate(6, Duration::from_secs(30 * 24 * 3600)),
        ),
    ];
    for (task_type, limits) in &limits {
        db.db.set_limits(task_type, limits).await.expect("set");
    }
    for i in 0..24 {
        enqueue(&db.db, &format!("u{}", i % 4), "export", &i.to_string()).await;
        enqueue(&db.db, &format!("u{}", i % 3), "sync", &i.to_string()).await;
        enqueue(&db.db, &format!("u{}", i % 4), "mail", &i.to_string()).await;
    }
    let _children =
        harness::children::Children(vec![child(&db.url, "child-1"), child(&db.url, "child-2")]);

    let monitor = "SELECT count(*) AS n FROM task_run WHERE task_type = 'export' \
                   AND status = 'running'";
    let mut most_seen = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        most_seen = most_seen.max(harness::count(&db.db, monitor).await);
        let rows = harness::rows::all(&db.db).await;
        let done = |task_type: &str| {
            rows.iter()
                .filter(|t| t.task_type == task_type && t.status == TaskStatus::Succeeded)
                .count()
        };
        if done("export") == 24 && done("sync") == 24 && done("mail") == 6 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the workers never drained: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // A moment for a seventh mail, if the rate let one through.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rows = harness::rows::all(&db.db).await;
    assert!(
        most_seen <= 3,
        "the monitor saw {most_seen} exports running"
    );
    let exports = rows.iter().filter(|t| t.task_type == "export");
    assert_eq!(
        most_at_once(exports),
        3,
        "at most 3 at once, and the limit was reached"
    );
    let mut syncs: HashMap<&str, Vec<&task_run::Model>> = HashMap::new();
    for task in rows.iter().filter(|t| t.task_type == "sync") {
        syncs.entry(task.user_id.as_str()).or_default().push(task);
    }
    for (user, tasks) in syncs {
        assert_eq!(most_at_once(tasks.into_iter()), 1, "{user}");
    }
    let mails: Vec<_> = rows.iter().filter(|t| t.task_type == "mail").collect();
    let started: Vec<_> = mails.iter().filter(|t| t.attempts > 0).collect();
    assert_eq!(started.len(), 6, "{mails:?}");
    assert!(
        mails
            .iter()
            .filter(|t| t.attempts == 0)
            .all(|t| t.status == TaskStatus::Queued)
    );
    let owners: HashSet<_> = rows.iter().filter_map(|t| t.lease_owner.clone()).collect();
    assert_eq!(owners.len(), 2, "both processes claimed: {owners:?}");
}

/// Every user's tasks running now, all types together.
async fn running_per_user(db: &DatabaseConnection) -> HashMap<String, usize> {
    let mut per_user: HashMap<String, usize> = HashMap::new();
    for task in harness::rows::all(db).await {
        if task.status == TaskStatus::Running {
            *per_user.entry(task.user_id).or_default() += 1;
        }
    }
    per_user
}

/// At most 2 running tasks per user across all types, with a type of its own per-user
/// limit of 1 ("sync") and two without limits: one claim of everything starts exactly 2
/// per user, at most 1 sync each; 8 claimers at once, of any type or of one, start
/// nothing more; when one of a user's tasks ends, exactly one more of that user's
/// starts. (With the check removed from the claim of the types without limits of their
/// own, the first claim starts 6 of each: checked.)
async fn racing_claimers_never_exceed_the_user_limit(db: &TestDb) {
    db.migrate().await;
    db.db.set_user_limit(2).await.expect("set");
    limit(&db.db, "sync", TypeLimits::new().max_running_per_user(1)).await;
    for user in ["heavy", "light"] {
        for task_type in ["export", "sync", "mail"] {
            for i in 0..4 {
                enqueue(&db.db, user, task_type, &i.to_string()).await;
            }
        }
    }
    let first = claimed(&db.db, &[], 20).await;
    let expected = HashMap::from([("heavy".to_owned(), 2), ("light".to_owned(), 2)]);
    assert_eq!(running_per_user(&db.db).await, expected, "{first:?}");
    assert_eq!(first.len(), 4);
    for user in ["heavy", "light"] {
        let syncs = first
            .iter()
            .filter(|t| t.user_id == user && t.task_type == "sync")
            .count();
        assert!(syncs <= 1, "{first:?}");
    }
    assert!(race(db, 8, &[], 4).await.is_empty());
    assert!(race(db, 8, &["mail"], 4).await.is_empty());
    assert!(race(db, 8, &["sync", "export"], 4).await.is_empty());
    // One of heavy's ends: one more of heavy's starts, whoever asks.
    let ended = first
        .iter()
        .find(|t| t.user_id == "heavy")
        .expect("heavy's");
    db.db.complete(ended.id, "w", None).await.expect("complete");
    let again = race(db, 8, &[], 4).await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].user_id, "heavy");
    assert_eq!(running_per_user(&db.db).await, expected);
    // Raised: each user gets room for two more.
    db.db.set_user_limit(4).await.expect("raise");
    let raised = race(db, 8, &[], 4).await;
    assert_eq!(raised.len(), 4, "{raised:?}");
    let four = HashMap::from([("heavy".to_owned(), 4), ("light".to_owned(), 4)]);
    assert_eq!(running_per_user(&db.db).await, four);
}

/// A key is the user, the type and the resource key: under a limit across all types,
/// one user's tasks of three types on the same resource key are three keys, and the
/// claim of the types without limits of their own starts as many as the limit allows,
/// not one. (With the type left out of the claim's one-run-per-key check, it started 1
/// of acme's 3: checked.)
async fn one_resource_key_in_several_types_is_several_keys_under_the_user_limit(db: &TestDb) {
    db.migrate().await;
    db.db.set_user_limit(2).await.expect("set");
    for task_type in ["export", "sync", "mail"] {
        enqueue(&db.db, "acme", task_type, "all").await;
    }
    enqueue(&db.db, "globex", "mail", "all").await;
    let started = claimed(&db.db, &[], 10).await;
    assert_eq!(started.len(), 3, "{started:?}");
    let expected = HashMap::from([("acme".to_owned(), 2), ("globex".to_owned(), 1)]);
    assert_eq!(running_per_user(&db.db).await, expected);
}

/// A limit across all types stored while this process still trusts its list of limited
/// types (read once a second) holds at once: the claims without limits check for it in
/// their own statements and start nothing, until the list is read again and the claims
/// take the locked path.
async fn a_user_limit_set_elsewhere_holds_at_once(db: &TestDb) {
    db.migrate().await;
    for i in 0..4 {
        enqueue(&db.db, "u", "export", &i.to_string()).await;
    }
    // The list is read (nothing limited) and trusted for a second.
    assert!(claimed(&db.db, &["none"], 1).await.is_empty());
    let now = match db.dialect {
        Dialect::Postgres => "now()",
        Dialect::MySql => "UTC_TIMESTAMP(6)",
        Dialect::Sqlite => "'2026-01-01T00:00:00.000000+00:00'",
    };
    db.db
        .execute_unprepared(&format!(
            "INSERT INTO task_dedup_limits (task_type, max_running_per_user, updated_at) \
             VALUES ('', 1, {now})"
        ))
        .await
        .expect("insert the row");
    assert!(claimed(&db.db, &[], 4).await.is_empty());
    assert!(claimed(&db.db, &["export"], 4).await.is_empty());
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(claimed(&db.db, &[], 4).await.len(), 1);
    assert_eq!(running(&db.db, "export").await, 1);
}

/// `user_limit` reads it with the users running now; `limits` does not list it; it is
/// checked before any SQL, replaced, and cleared.
async fn the_user_limit_is_set_listed_cleared_and_checked(db: &TestDb) {
    db.migrate().await;
    assert_eq!(db.db.user_limit().await.expect("read"), None);
    for bad in [0, task_dedup::MAX_LIMIT + 1] {
        let err = db.db.set_user_limit(bad).await.expect_err("refused");
        assert!(
            matches!(
                err,
                DedupError::InvalidArgument {
                    name: "max_running",
                    ..
                }
            ),
            "{err:?}"
        );
    }
    assert_eq!(
        db.db.user_limit().await.expect("read"),
        None,
        "nothing written"
    );
    db.db.set_user_limit(2).await.expect("set");
    for (user, n) in [("a", 3), ("b", 1)] {
        for i in 0..n {
            enqueue(&db.db, user, "export", &i.to_string()).await;
        }
    }
    claimed(&db.db, &[], 10).await;
    let read = db.db.user_limit().await.expect("read").expect("set");
    assert_eq!(
        (
            read.max_running,
            read.users_running,
            read.users_at_limit,
            read.busiest
        ),
        (2, 2, 1, 2)
    );
    assert!(db.db.limits().await.expect("limits").is_empty());
    db.db.set_user_limit(1).await.expect("lower");
    let read = db.db.user_limit().await.expect("read").expect("set");
    assert_eq!(
        (read.max_running, read.users_at_limit, read.busiest),
        (1, 2, 2)
    );
    assert!(db.db.clear_user_limit().await.expect("clear"));
    assert!(!db.db.clear_user_limit().await.expect("clear again"));
    assert_eq!(db.db.user_limit().await.expect("read"), None);
    // Cleared: a's last task starts.
    assert_eq!(claimed(&db.db, &[], 10).await.len(), 1);
}

/// 8 workers in 2 processes drain three types, one with a limit of its own (at most 3
/// exports anywhere), under a limit of 2 running tasks per user across all types: the
/// monitor never sees a user with more than 2 running, nor do the database's start and
/// end times, and every user reached 2.
async fn workers_in_two_processes_stay_within_the_user_limit(db: &TestDb) {
    db.migrate().await;
    db.db.set_user_limit(2).await.expect("set");
    limit(&db.db, "export", TypeLimits::new().max_running(3)).await;
    for i in 0..16 {
        for task_type in ["export", "sync", "mail"] {
            enqueue(&db.db, &format!("u{}", i % 4), task_type, &i.to_string()).await;
        }
    }
    let _children =
        harness::children::Children(vec![child(&db.url, "child-1"), child(&db.url, "child-2")]);
    let monitor = "SELECT coalesce(max(n), 0) AS n FROM (SELECT count(*) AS n FROM task_run \
                   WHERE status = 'running' GROUP BY user_id) AS per_user";
    let mut most_seen = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        most_seen = most_seen.max(harness::count(&db.db, monitor).await);
        let rows = harness::rows::all(&db.db).await;
        if rows.iter().all(|t| t.status == TaskStatus::Succeeded) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the workers never drained: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        most_seen <= 2,
        "the monitor saw a user with {most_seen} running"
    );
    let rows = harness::rows::all(&db.db).await;
    let mut per_user: HashMap<&str, Vec<&task_run::Model>> = HashMap::new();
    for task in &rows {
        per_user
            .entry(task.user_id.as_str())
            .or_default()
            .push(task);
    }
    for (user, tasks) in per_user {
        assert_eq!(most_at_once(tasks.into_iter()), 2, "{user}");
    }
    assert!(most_at_once(rows.iter().filter(|t| t.task_type == "export")) <= 3);
    let owners: HashSet<_> = rows.iter().filter_map(|t| t.lease_owner.clone()).collect();
    assert_eq!(owners.len(), 2, "both processes claimed: {owners:?}");
}

/// The fairness figure of BENCHMARKS.md ("Fair claims"): a light user's enqueue-to-start
/// times (by the database's clock) while a heavy user's backlog drains, against the same
/// without the backlog, and with the backlog but no fairness. A measurement, not a
/// check: ignored by default, run with
/// `cargo test --release --test lifecycle -- --ignored --nocapture fairness_figure`.
mod fairness_figure {
    use harness::{Dialect, run};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement (BENCHMARKS.md \"Fair claims\")"]
    async fn postgres() {
        run(Dialect::Postgres, "fairness_figure", super::fairness_figure).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement (BENCHMARKS.md \"Fair claims\")"]
    async fn mysql() {
        run(Dialect::MySql, "fairness_figure", super::fairness_figure).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement (BENCHMARKS.md \"Fair claims\")"]
    async fn sqlite() {
        run(Dialect::Sqlite, "fairness_figure", super::fairness_figure).await;
    }
}

async fn fairness_figure(db: &TestDb) {
    db.migrate().await;
    let backlog: usize = std::env::var("FAIRNESS_BACKLOG")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    for (case, heavy, fair) in [
        ("no backlog, fair", 0, true),
        ("heavy backlog, fair", backlog, true),
        ("no backlog, no limits", 0, false),
        ("heavy backlog, no limits", backlog, false),
    ] {
        db.exec("DELETE FROM task_run").await;
        if fair {
            limit(&db.db, "report", TypeLimits::new().fair_between_users()).await;
        } else {
            db.db.clear_limits("report").await.expect("clear");
        }
        let keys: Vec<usize> = (0..heavy).collect();
        for chunk in keys.chunks(1_000) {
            let tasks = chunk.iter().map(|i| {
                NewTask::new(TaskKey::new("heavy", "report", i.to_string()).expect("key"))
            });
            db.db.find_or_enqueue_many(tasks).await.expect("backlog");
        }
        // Statistics, as autovacuum and InnoDB keep them for a table in service (the
        // bench's `analyze` does the same).
        db.exec(match db.dialect {
            Dialect::MySql => "ANALYZE TABLE task_run",
            Dialect::Postgres => "ANALYZE task_run",
            Dialect::Sqlite => "ANALYZE",
        })
        .await;
        let shutdown = CancellationToken::new();
        let workers_pool = db.pool(16).await;
        let mut workers = Vec::new();
        for w in 0..2 {
            let worker = Worker::builder(workers_pool.db.clone())
                .id(format!("w{w}"))
                .concurrency(4)
                .retention(Retention::off())
                .handler(|_: task_run::Model, _: CancellationToken| async {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    Ok(None)
                })
                .build()
                .expect("worker");
            let shutdown = shutdown.clone();
            workers.push(tokio::spawn(async move { worker.run(shutdown).await }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        for i in 0..40 {
            enqueue(&db.db, "light", "report", &i.to_string()).await;
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let deadline = Instant::now() + Duration::from_secs(300);
        let waiting = "SELECT count(*) AS n FROM task_run \
                       WHERE user_id = 'light' AND started_at IS NULL";
        while harness::count(&db.db, waiting).await > 0 {
            assert!(
                Instant::now() < deadline,
                "the light user's tasks never started"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let light = task_run::Entity::find()
            .filter(task_run::Column::UserId.eq("light"))
            .all(&db.db)
            .await
            .expect("light tasks");
        shutdown.cancel();
        for worker in workers {
            worker.await.expect("worker").expect("run");
        }
        let mut waits: Vec<f64> = light
            .iter()
            .map(|t| {
                let started = t.started_at.expect("started");
                (started - t.created_at).num_microseconds().unwrap_or(0) as f64 / 1000.0
            })
            .collect();
        waits.sort_by(f64::total_cmp);
        println!(
            "{:?} {case} (heavy {heavy}): light user's enqueue-to-start p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms",
            db.dialect,
            waits[waits.len() / 2],
            waits[waits.len() * 9 / 10],
            waits[waits.len() - 1]
        );
    }
}
