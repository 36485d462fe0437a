//! One run per key, on every dialect: a queued task is never claimed while another task
//! of its key runs (the `concurrent` opt-out aside), a batch fills from unblocked keys,
//! a follow-up is claimable as soon as its predecessor ends, and races between claims,
//! endings and the reaper keep the rule.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use harness::{Dialect, TestDb, matrix, server_matrix};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement, TransactionTrait};
use task_dedup::{
    DedupError, NewTask, RetryPolicy, Scope, TaskDedup, TaskKey, TaskLifecycle, TaskStatus,
    task_run,
};
use tokio::sync::{Barrier, Mutex};
use uuid::Uuid;

matrix!(
    a_follow_up_waits_for_the_task_it_follows,
    a_batch_fills_from_unblocked_keys,
    concurrent_tasks_opt_out,
    claims_without_the_running_index_still_pass_over_running_keys,
    race_follow_ups_start_after_their_predecessors,
    race_two_waiting_tasks_per_key_run_one_at_a_time,
    race_reaper_requeues_while_follow_ups_wait,
    follow_up_of_an_expired_lease_waits_for_the_reaper,
    worker_wakes_for_a_follow_up_when_its_predecessor_ends,
);

// Only a server lets two claims be in flight at once (SQLite serializes writers).
server_matrix!(
    claim_losing_the_index_race_is_run_again,
    claim_lost_with_its_connection_while_blocked_takes_nothing,
);

const LEASE: Duration = Duration::from_secs(60);
const WORKERS: usize = 8;
const KEYS: usize = 200;

/// The order of what the test's clients saw: a number taken after a claim returned, and
/// one taken before a complete was sent. A task of a key can only be claimed once the
/// end of the key's running task committed, which comes after its number was taken: so
/// a later run's claim number is higher than its predecessor's completing number, or two
/// ran at once. (The rows' timestamps cannot tell: MySQL's and PostgreSQL's are the
/// claim statement's start, and a claim that waited on the index for the predecessor's
/// end to commit started before that end.)
static SEQ: AtomicU64 = AtomicU64::new(0);

fn seq() -> u64 {
    SEQ.fetch_add(1, Ordering::SeqCst)
}

fn key(resource: &str) -> TaskKey {
    TaskKey::new("user-1", "render", resource).expect("valid key")
}

fn queued(resource: &str) -> NewTask {
    NewTask::new(key(resource)).scope(Scope::Queued)
}

async fn enqueue(db: &impl TaskDedup, task: NewTask) -> task_run::Model {
    let outcome = db.find_or_enqueue(task).await.expect("enqueue");
    assert!(outcome.is_created(), "{outcome:?}");
    outcome.task().clone()
}

/// Claims every due task for `worker`, in batches.
async fn claim_all(db: &DatabaseConnection, worker: &str) -> Vec<task_run::Model> {
    let mut all = Vec::new();
    loop {
        let batch = db.claim_many(worker, &[], LEASE, 100).await.expect("claim");
        if batch.is_empty() {
            return all;
        }
        all.extend(batch);
    }
}

/// Keys with more than one running task that did not opt out, right now.
async fn doubly_running(db: &DatabaseConnection) -> i64 {
    let sql = format!(
        "SELECT COUNT(*) AS n FROM (SELECT user_id FROM task_run WHERE {} \
         GROUP BY user_id, task_type, resource_key HAVING COUNT(*) > 1) d",
        task_dedup_entity::RUNS_SERIALLY_SQL
    );
    db.query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .expect("count")
        .expect("a row")
        .try_get("", "n")
        .expect("n")
}

/// Samples [`doubly_running`] until `stop`; the most it saw.
fn monitor(db: DatabaseConnection, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<i64> {
    tokio::spawn(async move {
        let mut worst = 0;
        while !stop.load(Ordering::Relaxed) {
            worst = worst.max(doubly_running(&db).await);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        worst
    })
}

/// One run of a task as a worker saw it: the database's clock, and the clients' order
/// ([`SEQ`]).
#[derive(Debug, Clone)]
struct Run {
    id: Uuid,
    resource: String,
    started: DateTime<Utc>,
    claimed: u64,
    completing: u64,
}

/// `WORKERS` workers on `pool`, released together, claiming batches of up to 8 and
/// completing each task after `hold`, until `total` tasks ran. A claim error fails the
/// test: a lost race must never surface.
async fn run_workers(pool: &DatabaseConnection, total: usize, hold: Duration) -> Vec<Run> {
    let start = Arc::new(Barrier::new(WORKERS));
    let done = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut handles = Vec::new();
    for w in 0..WORKERS {
        let (pool, start, done, runs) = (pool.clone(), start.clone(), done.clone(), runs.clone());
        handles.push(tokio::spawn(async move {
            let worker = format!("worker-{w}");
            start.wait().await;
            while done.load(Ordering::Relaxed) < total {
                assert!(Instant::now() < deadline, "tasks left waiting");
                let batch = pool
                    .claim_many(&worker, &[], LEASE, 8)
                    .await
                    .expect("a claim never surfaces a lost race");
                if batch.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                let claimed = seq();
                for task in batch {
                    tokio::time::sleep(hold).await;
                    let completing = seq();
                    pool.complete(task.id, &worker, None)
                        .await
                        .expect("complete");
                    runs.lock().await.push(Run {
                        id: task.id,
                        resource: task.resource_key.clone(),
                        started: task.started_at.expect("started"),
                        claimed,
                        completing,
                    });
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for handle in handles {
        handle.await.expect("worker");
    }
    Arc::try_unwrap(runs).expect("workers done").into_inner()
}

/// No two runs of one key overlap: each was claimed after the one before it was being
/// completed ([`SEQ`]).
fn assert_serial(runs: &[Run]) {
    let mut by_key: HashMap<&str, Vec<&Run>> = HashMap::new();
    for run in runs {
        by_key.entry(&run.resource).or_default().push(run);
    }
    for (resource, mut runs) in by_key {
        runs.sort_by_key(|r| r.claimed);
        for pair in runs.windows(2) {
            assert!(
                pair[1].claimed > pair[0].completing,
                "{resource}: {:?} started while {:?} ran",
                pair[1],
                pair[0]
            );
        }
    }
}

/// The reported bug: a worker claimed a `Scope::Queued` follow-up while the task it
/// follows still ran.
async fn a_follow_up_waits_for_the_task_it_follows(db: &TestDb) {
    db.migrate().await;
    enqueue(&db.db, queued("doc")).await;
    let running = db.db.claim("w", &[], LEASE).await.expect("claim");
    let running = running.expect("the first task");
    let follow_up = enqueue(&db.db, queued("doc")).await;
    assert_eq!(db.db.claim("w2", &[], LEASE).await.expect("claim"), None);
    // Every way a run ends lets the follow-up go, and at once.
    db.db
        .complete(running.id, "w", None)
        .await
        .expect("complete");
    let next = db.db.claim("w2", &[], LEASE).await.expect("claim");
    assert_eq!(next.map(|t| t.id), Some(follow_up.id));

    for (n, how) in ["fail", "cancel", "retry later"].into_iter().enumerate() {
        // An `active` task of the key and a follow-up in a period window of its own:
        // the retry then keeps its task queued.
        let resource = format!("end-{n}");
        enqueue(&db.db, NewTask::new(key(&resource))).await;
        let first = claim_all(&db.db, "w").await;
        assert_eq!(first.len(), 1, "{how}");
        let period = Scope::Period(Duration::from_secs(3_600));
        let follow_up = enqueue(&db.db, NewTask::new(key(&resource)).scope(period)).await;
        assert!(claim_all(&db.db, "w2").await.is_empty(), "{how}: blocked");
        let id = first[0].id;
        match how {
            "fail" => {
                let never = task_dedup::Retry::Never;
                db.db.fail(id, "w", "boom", never).await.expect("fail");
            }
            "cancel" => {
                db.db.cancel(id, "stop").await.expect("cancel");
            }
            _ => {
                let later = task_dedup::Retry::After(Duration::from_secs(3_600));
                let task = db.db.fail(id, "w", "later", later).await.expect("retry");
                assert_eq!(task.status, TaskStatus::Queued);
            }
        }
        let next = claim_all(&db.db, "w2").await;
        assert_eq!(
            next.iter().map(|t| t.id).collect::<Vec<_>>(),
            [follow_up.id],
            "{how}"
        );
        db.db
            .complete(follow_up.id, "w2", None)
            .await
            .expect("complete");
    }
}

/// No head-of-line blocking: the oldest tasks all wait behind running keys, and one
/// claim still fills its batch from the free ones behind them.
async fn a_batch_fills_from_unblocked_keys(db: &TestDb) {
    db.migrate().await;
    let blocked = 50;
    let tasks: Vec<NewTask> = (0..blocked).map(|i| queued(&format!("b-{i}"))).collect();
    db.db.find_or_enqueue_many(tasks).await.expect("enqueue");
    assert_eq!(claim_all(&db.db, "holder").await.len(), blocked);
    let follow_ups: Vec<NewTask> = (0..blocked).map(|i| queued(&format!("b-{i}"))).collect();
    db.db
        .find_or_enqueue_many(follow_ups)
        .await
        .expect("follow-ups");
    let free: Vec<NewTask> = (0..10).map(|i| queued(&format!("free-{i}"))).collect();
    db.db.find_or_enqueue_many(free).await.expect("free");

    let batch = db.db.claim_many("w", &[], LEASE, 10).await.expect("claim");
    let mut got: Vec<_> = batch.iter().map(|t| t.resource_key.clone()).collect();
    got.sort();
    let mut want: Vec<_> = (0..10).map(|i| format!("free-{i}")).collect();
    want.sort();
    assert_eq!(got, want);
}

/// `NewTask::concurrent(true)`: runs beside the tasks of its key, and they beside it.
async fn concurrent_tasks_opt_out(db: &TestDb) {
    db.migrate().await;
    let first = enqueue(&db.db, queued("doc")).await;
    assert!(!first.concurrent);
    let running = claim_all(&db.db, "w").await;
    assert_eq!(running.len(), 1);
    let beside = enqueue(&db.db, queued("doc").concurrent(true)).await;
    assert!(beside.concurrent);
    let claimed = claim_all(&db.db, "w").await;
    assert_eq!(
        claimed.iter().map(|t| t.id).collect::<Vec<_>>(),
        [beside.id]
    );
    // While the opt-out task runs (and the first), a serial one waits for the first
    // only: the concurrent one never blocks it.
    db.db.complete(first.id, "w", None).await.expect("complete");
    let serial = enqueue(&db.db, queued("doc")).await;
    let claimed = claim_all(&db.db, "w").await;
    assert_eq!(
        claimed.iter().map(|t| t.id).collect::<Vec<_>>(),
        [serial.id]
    );
    assert_eq!(doubly_running(&db.db).await, 0);
}

/// A table without `task_running_resource_uidx` (made from the entity, or with migration
/// 5 rolled back): claims cannot rely on the index to refuse a second run of a key, so
/// they keep looking for running tasks of their keys (the optimistic claim, which does
/// not, would start the follow-up here: checked by making every claim optimistic).
async fn claims_without_the_running_index_still_pass_over_running_keys(db: &TestDb) {
    db.migrate().await;
    db.exec(match db.dialect {
        Dialect::MySql => "ALTER TABLE task_run DROP INDEX task_running_resource_uidx",
        _ => "DROP INDEX task_running_resource_uidx",
    })
    .await;
    enqueue(&db.db, queued("doc")).await;
    assert_eq!(claim_all(&db.db, "w").await.len(), 1);
    enqueue(&db.db, queued("doc")).await;
    let free = enqueue(&db.db, queued("free")).await;
    let claimed = claim_all(&db.db, "w2").await;
    assert_eq!(claimed.iter().map(|t| t.id).collect::<Vec<_>>(), [free.id]);
    assert_eq!(doubly_running(&db.db).await, 0);
}

/// 200 keys, each with a running task and a due follow-up; 8 workers released together
/// claim while the running tasks end in random order: each follow-up starts after its
/// predecessor ended, and no key ever has two running tasks.
///
/// Shown to catch the bug: with main's claim statements (no probe of running tasks)
/// and without `task_running_resource_uidx`, follow-ups started beside their
/// predecessors at once; with the index but without the retry of a lost race, claims
/// failed with the unique violation.
async fn race_follow_ups_start_after_their_predecessors(db: &TestDb) {
    db.migrate().await;
    let pool = db.pool(WORKERS as u32 + 4).await;
    let firsts: Vec<NewTask> = (0..KEYS).map(|i| queued(&format!("k-{i}"))).collect();
    pool.find_or_enqueue_many(firsts).await.expect("enqueue");
    let predecessors = claim_all(&pool, "predecessor").await;
    assert_eq!(predecessors.len(), KEYS);
    let follow_ups: Vec<NewTask> = (0..KEYS).map(|i| queued(&format!("k-{i}"))).collect();
    let follow_ups = pool
        .find_or_enqueue_many(follow_ups)
        .await
        .expect("follow-ups");
    assert!(follow_ups.iter().all(|o| o.is_created()));

    let stop = Arc::new(AtomicBool::new(false));
    let watch = monitor(pool.db.clone(), stop.clone());
    // The predecessors end in random order while the workers claim.
    let ender = {
        let pool = pool.db.clone();
        // Shuffled by id bits: not the order they were created or claimed in.
        let mut order = predecessors.clone();
        order.sort_by_key(|t| t.id.as_u128().reverse_bits());
        tokio::spawn(async move {
            let mut ended = HashMap::new();
            for task in order {
                ended.insert(task.resource_key.clone(), seq());
                pool.complete(task.id, "predecessor", None)
                    .await
                    .expect("complete");
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
            ended
        })
    };
    let runs = run_workers(&pool, KEYS, Duration::ZERO).await;
    let ended = ender.await.expect("ender");
    stop.store(true, Ordering::Relaxed);
    assert_eq!(
        watch.await.expect("monitor"),
        0,
        "two running tasks of a key"
    );

    let ids: HashSet<Uuid> = runs.iter().map(|r| r.id).collect();
    let expected: HashSet<Uuid> = follow_ups.iter().map(|o| o.task().id).collect();
    assert_eq!(ids, expected, "each follow-up ran exactly once");
    assert_eq!(runs.len(), KEYS);
    for run in &runs {
        let predecessor_ending = ended[&run.resource];
        assert!(
            run.claimed > predecessor_ending,
            "{run:?} claimed before its predecessor was being completed (at {predecessor_ending})"
        );
    }
}

/// Two waiting tasks per key and nothing running (an `active` task and one in a period
/// window of its own): 8 workers released together often pick tasks of one key at once,
/// the index lets one through, the loser runs its claim again. Every task runs once,
/// one at a time per key, and no claim fails.
async fn race_two_waiting_tasks_per_key_run_one_at_a_time(db: &TestDb) {
    db.migrate().await;
    let pool = db.pool(WORKERS as u32 + 4).await;
    let keys = KEYS / 2;
    let period = Scope::Period(Duration::from_secs(3_600));
    let mut tasks = Vec::new();
    for i in 0..keys {
        tasks.push(NewTask::new(key(&format!("k-{i}"))));
        tasks.push(NewTask::new(key(&format!("k-{i}"))).scope(period));
    }
    // Interleaved in claim order, so that one claim's batch ends between two tasks of a
    // key and the next claim's starts there.
    for task in tasks {
        enqueue(&*pool, task).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let watch = monitor(pool.db.clone(), stop.clone());
    let runs = run_workers(&pool, 2 * keys, Duration::from_millis(1)).await;
    stop.store(true, Ordering::Relaxed);
    assert_eq!(
        watch.await.expect("monitor"),
        0,
        "two running tasks of a key"
    );
    assert_eq!(runs.len(), 2 * keys);
    assert_eq!(
        runs.iter().map(|r| r.id).collect::<HashSet<_>>().len(),
        2 * keys
    );
    assert_serial(&runs);
}

/// Leases expire while follow-ups wait: the reaper fails (`Scope::Queued`: the
/// follow-up holds the key) or requeues (`active`, with the follow-up in a period window)
/// the expired tasks while 8 workers claim. No key ever has two running tasks; each
/// follow-up starts after its predecessor left `running`; requeued tasks run again one
/// at a time with their follow-ups.
async fn race_reaper_requeues_while_follow_ups_wait(db: &TestDb) {
    db.migrate().await;
    let pool = db.pool(WORKERS as u32 + 4).await;
    let keys = 60;
    let period = Scope::Period(Duration::from_secs(3_600));
    for i in 0..keys {
        let task = if i % 2 == 0 {
            queued(&format!("k-{i}"))
        } else {
            NewTask::new(key(&format!("k-{i}")))
        };
        enqueue(&*pool, task).await;
    }
    // A worker that dies: short leases it never renews.
    let dead = pool
        .claim_many("dead", &[], Duration::from_millis(300), keys)
        .await
        .expect("claim");
    assert_eq!(dead.len(), keys);
    let mut follow_ups = Vec::new();
    for i in 0..keys {
        let task = if i % 2 == 0 {
            queued(&format!("k-{i}"))
        } else {
            NewTask::new(key(&format!("k-{i}"))).scope(period)
        };
        follow_ups.push(enqueue(&*pool, task).await.id);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let watch = monitor(pool.db.clone(), stop.clone());
    let reaper = {
        let (pool, stop) = (pool.db.clone(), stop.clone());
        tokio::spawn(async move {
            let policy = RetryPolicy {
                base_delay: Duration::ZERO,
                max_delay: Duration::ZERO,
                jitter: 0.0,
                ..RetryPolicy::default()
            };
            let mut reaped = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                let report = pool.reap_expired(&policy).await.expect("reap");
                reaped.0 += report.requeued;
                reaped.1 += report.failed;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            reaped
        })
    };
    // The follow-ups and the requeued `active` tasks.
    let total = keys + keys / 2;
    let runs = run_workers(&pool, total, Duration::from_millis(1)).await;
    stop.store(true, Ordering::Relaxed);
    let (requeued, failed) = reaper.await.expect("reaper");
    assert_eq!(
        watch.await.expect("monitor"),
        0,
        "two running tasks of a key"
    );
    assert_eq!((requeued, failed), (keys as u64 / 2, keys as u64 / 2));
    assert_serial(&runs);

    let rows = harness::rows::all(&pool.db).await;
    let by_id: HashMap<Uuid, &task_run::Model> = rows.iter().map(|r| (r.id, r)).collect();
    for (i, predecessor) in dead.iter().enumerate() {
        let follow_up = &runs
            .iter()
            .find(|r| r.id == follow_ups[i])
            .expect("each follow-up ran");
        let stored = by_id[&predecessor.id];
        if i % 2 == 0 {
            // Failed by the reaper: the follow-up started after that.
            assert_eq!(stored.status, TaskStatus::Failed, "{stored:?}");
            assert!(follow_up.started >= stored.finished_at.expect("finished"));
        } else {
            assert_eq!((stored.status, stored.attempts), (TaskStatus::Succeeded, 2));
        }
        // The dead worker's lease had run out before anything else of the key ran.
        assert!(follow_up.started >= predecessor.lease_expires_at.expect("lease"));
    }
}

/// A follow-up claimed right as its predecessor's lease expires: the predecessor still
/// runs (its worker may be alive, only late), so the follow-up waits until the reaper
/// takes the predecessor out of `running`; the late worker's ending is then refused.
async fn follow_up_of_an_expired_lease_waits_for_the_reaper(db: &TestDb) {
    db.migrate().await;
    enqueue(&db.db, queued("doc")).await;
    let late = db
        .db
        .claim("late", &[], Duration::from_millis(100))
        .await
        .expect("claim")
        .expect("the task");
    let follow_up = enqueue(&db.db, queued("doc")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        db.db.claim("w", &[], LEASE).await.expect("claim"),
        None,
        "an expired lease still runs until it is reaped"
    );
    let report = db
        .db
        .reap_expired(&RetryPolicy::default())
        .await
        .expect("reap");
    // Its follow-up holds the key: failed for good, not requeued.
    assert_eq!((report.requeued, report.failed), (0, 1));
    let next = db.db.claim("w", &[], LEASE).await.expect("claim");
    assert_eq!(next.map(|t| t.id), Some(follow_up.id));
    let err = db
        .db
        .complete(late.id, "late", None)
        .await
        .expect_err("the late worker lost its task");
    assert!(
        matches!(err, DedupError::InvalidTransition { .. }),
        "{err:?}"
    );
    assert_eq!(doubly_running(&db.db).await, 0);
}

/// Waits until a session of this test's database waits for a lock; returns its id.
async fn wait_for_a_blocked_session(db: &TestDb, admin: &DatabaseConnection) -> i64 {
    let sql = match db.dialect {
        Dialect::Postgres => {
            "SELECT pid::bigint AS id FROM pg_stat_activity \
             WHERE datname = $1 AND wait_event_type = 'Lock'"
        }
        // The claim's UPDATE cannot end before the holder does: while it shows, it
        // waits (MariaDB's INNODB_TRX does not always list a lock wait).
        _ => {
            "SELECT CAST(ID AS SIGNED) AS id FROM information_schema.PROCESSLIST \
             WHERE DB = ? AND COMMAND IN ('Query', 'Execute') \
             AND INFO LIKE 'UPDATE task_run%SET status = ''running'',%attempts%'"
        }
    };
    harness::wait_for_session(admin, db, sql, "the claim waiting for the index entry").await
}

/// A transaction starts task `x` of a key and holds its commit while a claim picks `y`
/// of the same key (it cannot see `x` running yet) and a free task: the claim waits on
/// the index entry. Returns the transaction, the claim and the three ids.
async fn hold_a_key_run(
    db: &TestDb,
) -> (
    sea_orm::DatabaseTransaction,
    tokio::task::JoinHandle<Result<Vec<task_run::Model>, DedupError>>,
    [Uuid; 3],
) {
    db.migrate().await;
    let period = Scope::Period(Duration::from_secs(3_600));
    let x = enqueue(&db.db, NewTask::new(key("doc"))).await.id;
    let y = enqueue(&db.db, NewTask::new(key("doc")).scope(period))
        .await
        .id;
    let free = enqueue(&db.db, NewTask::new(key("free"))).await.id;
    let holder = db.db.begin().await.expect("begin");
    let sql = match db.dialect {
        Dialect::Postgres => "UPDATE task_run SET status = 'running' WHERE id = $1",
        _ => "UPDATE task_run SET status = 'running' WHERE id = ?",
    };
    holder
        .execute_raw(db.stmt(sql, vec![x.into()]))
        .await
        .expect("x runs, uncommitted");
    let claim = {
        let pool = db.db.clone();
        tokio::spawn(async move { pool.claim_many("w", &[], LEASE, 5).await })
    };
    (holder, claim, [x, y, free])
}

/// The index race, made deterministic: the claim loses it when the holder commits, its
/// failure is classified and the claim runs again, now passing over the key: it returns
/// the free task, never the error.
async fn claim_losing_the_index_race_is_run_again(db: &TestDb) {
    let (holder, claim, [x, y, free]) = hold_a_key_run(db).await;
    let (admin_url, _) = db.server().expect("server");
    let admin = task_dedup::connect(admin_url).await.expect("admin");
    wait_for_a_blocked_session(db, &admin).await;
    holder.commit().await.expect("x runs");
    let claimed = claim
        .await
        .expect("claim task")
        .expect("a lost race never surfaces");
    assert_eq!(claimed.iter().map(|t| t.id).collect::<Vec<_>>(), [free]);
    let rows = harness::rows::all(&db.db).await;
    let status = |id| rows.iter().find(|r| r.id == id).expect("row").status;
    assert_eq!(
        (status(x), status(y), status(free)),
        (TaskStatus::Running, TaskStatus::Queued, TaskStatus::Running)
    );
}

/// A lost connection during a claim blocked on the index: the claim is not retried
/// (it may have committed) and here took nothing; the key still runs one task at a
/// time and the next claim finds what is due.
async fn claim_lost_with_its_connection_while_blocked_takes_nothing(db: &TestDb) {
    let (holder, claim, [x, y, free]) = hold_a_key_run(db).await;
    let (admin_url, _) = db.server().expect("server");
    let admin = task_dedup::connect(admin_url).await.expect("admin");
    let blocked = wait_for_a_blocked_session(db, &admin).await;
    let kill = match db.dialect {
        Dialect::Postgres => format!("SELECT pg_terminate_backend({blocked})"),
        _ => format!("KILL CONNECTION {blocked}"),
    };
    admin.execute_unprepared(&kill).await.expect("kill");
    let err = claim
        .await
        .expect("claim task")
        .expect_err("a lost claim is not retried");
    assert!(err.is_connection_lost(), "{err:?}");
    // The client hears of the kill before the server has rolled the claim back and
    // released the rows it picked, which a claim would pass over (`SKIP LOCKED`).
    let gone = match db.dialect {
        Dialect::Postgres => "SELECT 1 AS n FROM pg_stat_activity WHERE pid = $1",
        _ => "SELECT 1 AS n FROM information_schema.PROCESSLIST WHERE ID = ?",
    };
    while !admin
        .query_all_raw(db.stmt(gone, vec![blocked.into()]))
        .await
        .expect("sessions")
        .is_empty()
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    holder.rollback().await.expect("x back to queued");
    let rows = harness::rows::all(&db.db).await;
    assert!(
        rows.iter().all(|r| r.status == TaskStatus::Queued),
        "{rows:?}"
    );
    let claimed: HashSet<Uuid> = claim_all(&db.db, "w").await.iter().map(|t| t.id).collect();
    assert_eq!(claimed.len(), 2, "one per key");
    assert!(claimed.contains(&free) && (claimed.contains(&x) ^ claimed.contains(&y)));
    assert_eq!(doubly_running(&db.db).await, 0);
}

/// The scenario in a `Worker` (concurrency 4): the follow-up queued behind a
/// running task is not started beside it, and when the running task ends the same
/// worker, waiting with free slots and polling only every 30 s, starts the follow-up at
/// once.
async fn worker_wakes_for_a_follow_up_when_its_predecessor_ends(db: &TestDb) {
    use task_dedup::Worker;
    use tokio_util::sync::CancellationToken;

    db.migrate().await;
    let release = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(Mutex::new(Vec::<(Uuid, Instant)>::new()));
    let handler = {
        let (release, started) = (release.clone(), started.clone());
        move |task: task_run::Model, _cancel: CancellationToken| {
            let (release, started) = (release.clone(), started.clone());
            async move {
                started.lock().await.push((task.id, Instant::now()));
                if started.lock().await.len() == 1 {
                    release.notified().await;
                }
                Ok(None)
            }
        }
    };
    let worker = Worker::builder(db.db.clone())
        .concurrency(4)
        .poll_interval(Duration::from_secs(30), Duration::from_secs(30))
        .fallback_poll(Duration::from_secs(30))
        .handler(handler)
        .build()
        .expect("worker");
    // Before the worker starts: MySQL/MariaDB workers hear of no enqueue, they claim at
    // start and poll.
    let first = enqueue(&db.db, queued("doc")).await;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let wait_for = |n: usize| {
        let started = started.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while started.lock().await.len() < n {
                assert!(Instant::now() < deadline, "{n} tasks never started");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    wait_for(1).await;
    let follow_up = enqueue(&db.db, queued("doc")).await;
    // The enqueue woke the worker (or its poll came): it must not start the follow-up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        started.lock().await.len(),
        1,
        "the follow-up ran beside its predecessor"
    );
    let ended = Instant::now();
    release.notify_one();
    wait_for(2).await;
    let woke_after = started.lock().await[1].1 - ended;
    assert!(
        woke_after < Duration::from_secs(2),
        "the follow-up waited {woke_after:?} for a poll"
    );
    shutdown.cancel();
    let report = running.await.expect("worker task").expect("worker");
    assert_eq!(report.completed, 2);
    let rows = harness::rows::all(&db.db).await;
    let row = |id| rows.iter().find(|r| r.id == id).expect("row").clone();
    let (first, follow_up) = (row(first.id), row(follow_up.id));
    assert!(follow_up.started_at.expect("started") >= first.finished_at.expect("finished"));
}

/// PostgreSQL: a worker's recorded ending wakes the workers of other processes, which
/// LISTEN (here a bare listener): a follow-up of the ended task's key may be waiting for
/// one of them. (A worker wakes itself for its own endings: the test above. SQLite's
/// doorbell is in-process; MySQL/MariaDB workers poll.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ending_wakes_listening_workers_postgres() {
    harness::run(Dialect::Postgres, "an_ending_wakes", async |db: &TestDb| {
        use sea_orm::sqlx::postgres::PgListener;
        use task_dedup::Worker;
        use tokio_util::sync::CancellationToken;

        db.migrate().await;
        let mut listener = PgListener::connect(&db.url).await.expect("listener");
        listener.listen("task_dedup_wakeup").await.expect("listen");
        let release = Arc::new(tokio::sync::Notify::new());
        let started = Arc::new(AtomicUsize::new(0));
        let handler = {
            let (release, started) = (release.clone(), started.clone());
            move |_task: task_run::Model, _cancel: CancellationToken| {
                let (release, started) = (release.clone(), started.clone());
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    release.notified().await;
                    Ok(None)
                }
            }
        };
        let worker = Worker::builder(db.db.clone())
            .concurrency(1)
            .poll_interval(Duration::from_secs(30), Duration::from_secs(30))
            .fallback_poll(Duration::from_secs(30))
            .handler(handler)
            .build()
            .expect("worker");
        let task = enqueue(&db.db, queued("doc")).await;
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(worker.run(shutdown.clone()));
        let deadline = Instant::now() + Duration::from_secs(10);
        while started.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the task never started");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The enqueue's notification, and past the debounce.
        while tokio::time::timeout(Duration::from_millis(200), listener.recv())
            .await
            .is_ok()
        {}
        release.notify_one();
        let heard = tokio::time::timeout(Duration::from_secs(5), listener.recv())
            .await
            .expect("no wake-up when the run ended")
            .expect("notification");
        assert_eq!(heard.channel(), "task_dedup_wakeup");
        shutdown.cancel();
        let report = running.await.expect("worker task").expect("worker");
        assert_eq!(report.completed, 1);
        let row = harness::rows::all(&db.db).await;
        assert_eq!(row[0].id, task.id);
        assert_eq!(row[0].status, TaskStatus::Succeeded);
    })
    .await;
}
