//! The `Worker`'s batched endings under faults, on every dialect where they apply: a
//! worker dropped between its handlers' end and its batch's recording (its tasks come
//! back through the reaper, never run twice at once), endings whose tasks were taken
//! over meanwhile (not applied, counted lost, the others of the batch recorded), and a
//! batch lost with its connection (retried within the budget, else reaped; a server
//! only: an embedded SQLite has no sessions to kill).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::{Dialect, TestDb, matrix, rows, server_matrix};
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};
use task_dedup::{
    HandlerError, NewTask, RetryPolicy, Scope, TaskDedup, TaskKey, TaskLifecycle, TaskStatus,
    Worker, task_run,
};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

matrix!(
    a_worker_dropped_before_its_batch_is_recorded_leaves_its_tasks_to_the_reaper,
    endings_whose_tasks_were_taken_over_are_not_applied,
    a_retry_behind_a_queued_follow_up_fails_for_good_from_a_batch,
);

server_matrix!(a_batch_lost_with_its_connection_is_retried_or_reaped);

/// One run of a handler: which task, by which worker, from when to when.
#[derive(Clone, Debug)]
struct Run {
    task: Uuid,
    worker: String,
    started: Instant,
    ended: Instant,
}

type Runs = Arc<Mutex<Vec<Run>>>;

fn runs_of(runs: &Runs) -> Vec<Run> {
    runs.lock().expect("lock").clone()
}

async fn enqueue(db: &DatabaseConnection, resource: &str) -> Uuid {
    let key = TaskKey::new("user-1", "job", resource).expect("valid key");
    db.find_or_enqueue(NewTask::new(key))
        .await
        .expect("enqueue")
        .task()
        .id
}

/// Polls `done` every 10 ms; fails with `what` after `limit`.
async fn wait_until(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !done().await {
        assert!(started.elapsed() < limit, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Retries much later: a retried task stays queued for the test's length.
fn later() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 5,
        base_delay: Duration::from_secs(3_600),
        max_delay: Duration::from_secs(3_600),
        jitter: 0.0,
    }
}

/// A worker whose handler logs each run in `runs`, waits for a permit of `gate` when
/// there is one, and ends as the task's resource key says: `fail...` fails,
/// `retry...` asks for a retry, anything else completes with `{"by": id}`.
fn worker(
    db: &DatabaseConnection,
    id: &str,
    lease: Duration,
    batch_delay: Duration,
    runs: &Runs,
    gate: Option<Arc<Semaphore>>,
) -> task_dedup::WorkerBuilder {
    let (runs, worker_id) = (runs.clone(), id.to_owned());
    Worker::builder(db.clone())
        .id(id)
        .concurrency(8)
        .lease(lease)
        .retry_policy(later())
        .poll_interval(Duration::from_millis(20), Duration::from_millis(100))
        .batch_endings(100, batch_delay)
        .handler(move |task: task_run::Model, _| {
            let (runs, worker_id, gate) = (runs.clone(), worker_id.clone(), gate.clone());
            async move {
                let started = Instant::now();
                if let Some(gate) = gate {
                    gate.acquire().await.expect("open gate").forget();
                }
                runs.lock().expect("lock").push(Run {
                    task: task.id,
                    worker: worker_id.clone(),
                    started,
                    ended: Instant::now(),
                });
                if task.resource_key.starts_with("fail") {
                    Err(HandlerError::fail("failed on purpose"))
                } else if task.resource_key.starts_with("retry") {
                    Err(HandlerError::retry("retry on purpose"))
                } else {
                    Ok(Some(serde_json::json!({ "by": worker_id })))
                }
            }
        })
}

/// A worker dropped (as a process dies) after its handlers returned and before their
/// batch was recorded records nothing: the tasks stay running under its leases, and
/// once those run out another worker's reaper requeues them and that worker runs them,
/// each run starting after the first one ended.
async fn a_worker_dropped_before_its_batch_is_recorded_leaves_its_tasks_to_the_reaper(db: &TestDb) {
    db.migrate().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(enqueue(&db.db, &format!("doc-{i}")).await);
    }
    let runs = Runs::default();
    // Lease 6 s, heartbeat 2 s: the longest batch delay allowed is 2 s.
    let lease = Duration::from_secs(6);
    let doomed = worker(&db.db, "doomed", lease, Duration::from_secs(2), &runs, None)
        .build()
        .expect("worker");
    let running = tokio::spawn(doomed.run(CancellationToken::new()));
    wait_until("five runs", Duration::from_secs(5), async || {
        runs_of(&runs).len() == 5
    })
    .await;
    running.abort();
    assert!(running.await.expect_err("aborted").is_cancelled());
    for task in rows::all(&db.db).await {
        assert_eq!(
            (task.status, task.lease_owner.as_deref()),
            (TaskStatus::Running, Some("doomed")),
            "nothing recorded: {task:?}"
        );
    }

    let rescuer = worker(
        &db.db,
        "rescuer",
        lease,
        Duration::from_millis(5),
        &runs,
        None,
    )
    .reap_every(Duration::from_millis(200))
    .retry_policy(RetryPolicy {
        base_delay: Duration::ZERO,
        max_delay: Duration::ZERO,
        jitter: 0.0,
        ..RetryPolicy::default()
    })
    .build()
    .expect("worker");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(rescuer.run(shutdown.clone()));
    wait_until("all succeeded", Duration::from_secs(20), async || {
        rows::all(&db.db)
            .await
            .iter()
            .all(|t| t.status == TaskStatus::Succeeded)
    })
    .await;
    shutdown.cancel();
    let report = running.await.expect("task").expect("run");
    assert_eq!((report.completed, report.lost), (5, 0), "{report:?}");

    let mut by_task: HashMap<Uuid, Vec<Run>> = HashMap::new();
    for run in runs_of(&runs) {
        by_task.entry(run.task).or_default().push(run);
    }
    for id in &ids {
        let task_runs = &by_task[id];
        let workers: Vec<&str> = task_runs.iter().map(|r| r.worker.as_str()).collect();
        assert_eq!(workers, ["doomed", "rescuer"], "{task_runs:?}");
        // Never two at once: the second run started after the first ended, and after
        // the first one's lease ran out.
        assert!(
            task_runs[1].started >= task_runs[0].ended + lease - Duration::from_millis(500),
            "{task_runs:?}"
        );
    }
    for task in rows::all(&db.db).await {
        assert_eq!(task.attempts, 2, "{task:?}");
        assert_eq!(task.lease_owner.as_deref(), Some("rescuer"));
        assert_eq!(task.result, Some(serde_json::json!({ "by": "rescuer" })));
    }
}

/// The test's stand-in for "reaped and claimed by another worker" while an ending
/// waited in its batch: the task runs under `thief` now, one attempt further.
async fn take_over(db: &TestDb, id: Uuid) {
    let sql = match db.dialect {
        Dialect::Postgres => {
            "UPDATE task_run SET lease_owner = 'thief', attempts = attempts + 1 WHERE id = $1"
        }
        _ => "UPDATE task_run SET lease_owner = 'thief', attempts = attempts + 1 WHERE id = ?",
    };
    let updated = db
        .db
        .execute_raw(db.stmt(sql, vec![id.into()]))
        .await
        .expect("take over");
    assert_eq!(updated.rows_affected(), 1);
}

/// A batch with each kind of ending, two of whose tasks another worker took over
/// after their handlers returned: those two are left as the other worker holds them
/// and counted lost; the others are recorded, each counted once by its outcome.
async fn endings_whose_tasks_were_taken_over_are_not_applied(db: &TestDb) {
    db.migrate().await;
    let mut ids = HashMap::new();
    for resource in ["done", "done-stolen", "fail", "retry", "retry-stolen"] {
        ids.insert(resource, enqueue(&db.db, resource).await);
    }
    let runs = Runs::default();
    let lease = Duration::from_secs(30);
    let slow = worker(&db.db, "slow", lease, Duration::from_secs(5), &runs, None)
        .build()
        .expect("worker");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(slow.run(shutdown.clone()));
    wait_until("five runs", Duration::from_secs(5), async || {
        runs_of(&runs).len() == 5
    })
    .await;
    take_over(db, ids["done-stolen"]).await;
    take_over(db, ids["retry-stolen"]).await;
    // The shutdown records the batch at once.
    shutdown.cancel();
    let report = running.await.expect("task").expect("run");
    assert_eq!(
        (
            report.claimed,
            report.completed,
            report.failed,
            report.retried,
            report.lost
        ),
        (5, 1, 1, 1, 2),
        "{report:?}"
    );

    let stored: HashMap<Uuid, task_run::Model> = rows::all(&db.db)
        .await
        .into_iter()
        .map(|t| (t.id, t))
        .collect();
    let done = &stored[&ids["done"]];
    assert_eq!(done.status, TaskStatus::Succeeded);
    assert_eq!(done.result, Some(serde_json::json!({ "by": "slow" })));
    let failed = &stored[&ids["fail"]];
    assert_eq!(failed.status, TaskStatus::Failed);
    assert_eq!(failed.error.as_deref(), Some("failed on purpose"));
    let retried = &stored[&ids["retry"]];
    assert_eq!(
        (retried.status, retried.error.as_deref()),
        (TaskStatus::Queued, Some("retry on purpose"))
    );
    assert!(retried.run_at > task_run::now() + Duration::from_secs(3_000));
    for stolen in ["done-stolen", "retry-stolen"] {
        let task = &stored[&ids[stolen]];
        assert_eq!(
            (
                task.status,
                task.lease_owner.as_deref(),
                task.attempts,
                &task.result,
                &task.error
            ),
            (TaskStatus::Running, Some("thief"), 2, &None, &None),
            "{stolen}"
        );
    }
}

/// A batch of two retries, one of whose keys a `Scope::Queued` follow-up took while the
/// task ran: the batch's statement runs into the key and changes nothing, and each
/// retry is then recorded on its own as `fail` decides it: the one behind the follow-up
/// fails for good (the follow-up does the work), the other goes back to the queue.
async fn a_retry_behind_a_queued_follow_up_fails_for_good_from_a_batch(db: &TestDb) {
    db.migrate().await;
    let key = |resource: &str| TaskKey::new("user-1", "job", resource).expect("valid key");
    let queued = |resource: &str| NewTask::new(key(resource)).scope(Scope::Queued);
    let behind = db
        .db
        .find_or_enqueue(queued("retry-behind"))
        .await
        .expect("enqueue")
        .task()
        .id;
    let alone = enqueue(&db.db, "retry-alone").await;
    let runs = Runs::default();
    let gate = Arc::new(Semaphore::new(0));
    let worker = worker(
        &db.db,
        "w",
        Duration::from_secs(30),
        Duration::from_millis(200),
        &runs,
        Some(gate.clone()),
    )
    .build()
    .expect("worker");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_until("two claims", Duration::from_secs(5), async || {
        rows::all(&db.db)
            .await
            .iter()
            .filter(|t| t.status == TaskStatus::Running)
            .count()
            == 2
    })
    .await;
    // Due in an hour: no worker claims it during the test.
    let follow_up = queued("retry-behind").run_at(task_run::now() + Duration::from_secs(3_600));
    let follow_up = db.db.find_or_enqueue(follow_up).await.expect("follow-up");
    assert!(follow_up.is_created());
    gate.add_permits(2);
    wait_until("two endings", Duration::from_secs(5), async || {
        rows::all(&db.db)
            .await
            .iter()
            .all(|t| t.status != TaskStatus::Running)
    })
    .await;
    shutdown.cancel();
    let report = running.await.expect("task").expect("run");
    assert_eq!(
        (report.retried, report.failed, report.lost),
        (1, 1, 0),
        "{report:?}"
    );
    let stored: HashMap<Uuid, task_run::Model> = rows::all(&db.db)
        .await
        .into_iter()
        .map(|t| (t.id, t))
        .collect();
    let failed = &stored[&behind];
    assert_eq!(failed.status, TaskStatus::Failed);
    let error = failed.error.as_deref().expect("error");
    assert!(
        error.starts_with("retry on purpose") && error.contains("not retried"),
        "{error}"
    );
    assert_eq!(stored[&alone].status, TaskStatus::Queued);
    assert_eq!(stored[&follow_up.task().id].status, TaskStatus::Queued);
}

/// The server session running the batch's UPDATE once it waits for a row lock.
async fn blocked_batch(admin: &DatabaseConnection, db: &TestDb) -> i64 {
    let sql = match db.dialect {
        Dialect::Postgres => {
            "SELECT pid::bigint AS id FROM pg_stat_activity WHERE datname = $1 \
             AND wait_event_type = 'Lock' AND query LIKE 'UPDATE task_run AS t%SET status%'"
        }
        _ => {
            "SELECT CAST(ID AS SIGNED) AS id FROM information_schema.PROCESSLIST \
             WHERE DB = ? AND INFO LIKE 'UPDATE task_run%SET status = ''succeeded''%'"
        }
    };
    harness::wait_for_session(admin, db, sql, "the batch waiting for the lock").await
}

/// A batch's connection killed while its UPDATE waits for a row lock: with the retry
/// budget, the batch runs again on a fresh connection and every ending is recorded
/// once; with none, no ending is recorded, each is counted lost, and the tasks stay
/// running until their leases run out and the reaper takes them back.
async fn a_batch_lost_with_its_connection_is_retried_or_reaped(db: &TestDb) {
    db.migrate().await;
    let (admin_url, _) = db.server().expect("a server dialect");
    let admin = task_dedup::connect(admin_url).await.expect("admin");
    for (round, budget) in [(0, None), (1, Some(Duration::ZERO))] {
        let mut ids = Vec::new();
        for i in 0..3 {
            ids.push(enqueue(&db.db, &format!("round-{round}-{i}")).await);
        }
        let runs = Runs::default();
        let gate = Arc::new(Semaphore::new(0));
        let lease = Duration::from_secs(3);
        let name = format!("worker-{round}");
        let mut builder = worker(
            &db.db,
            &name,
            lease,
            Duration::from_millis(50),
            &runs,
            Some(gate.clone()),
        );
        if let Some(budget) = budget {
            builder = builder.retry_budget(budget);
        }
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(builder.build().expect("worker").run(shutdown.clone()));
        wait_until("three claims", Duration::from_secs(5), async || {
            rows::all(&db.db)
                .await
                .iter()
                .filter(|t| t.status == TaskStatus::Running)
                .count()
                == 3
        })
        .await;
        // Hold one row, let the handlers return, kill the batch waiting for the row.
        let holder = db.db.begin().await.expect("begin");
        let lock = match db.dialect {
            Dialect::Postgres => {
                format!("SELECT id FROM task_run WHERE id = '{}' FOR UPDATE", ids[0])
            }
            _ => format!(
                "SELECT id FROM task_run WHERE id = x'{}' FOR UPDATE",
                ids[0].simple()
            ),
        };
        holder
            .execute_unprepared(&lock)
            .await
            .expect("hold the row");
        gate.add_permits(3);
        let session = blocked_batch(&admin, db).await;
        let kill = match db.dialect {
            Dialect::Postgres => format!("SELECT pg_terminate_backend({session})"),
            _ => format!("KILL CONNECTION {session}"),
        };
        admin.execute_unprepared(&kill).await.expect("kill");
        tokio::time::sleep(Duration::from_millis(100)).await;
        holder.rollback().await.expect("rollback");
        shutdown.cancel();
        let report = running.await.expect("task").expect("run");
        assert_eq!(runs_of(&runs).len(), 3, "each task ran once");
        let mine = |t: &task_run::Model| ids.contains(&t.id);

        if budget.is_none() {
            assert_eq!((report.completed, report.lost), (3, 0), "{report:?}");
            for task in rows::all(&db.db).await.iter().filter(|t| mine(t)) {
                assert_eq!((task.status, task.attempts), (TaskStatus::Succeeded, 1));
            }
            continue;
        }
        assert_eq!((report.completed, report.lost), (0, 3), "{report:?}");
        for task in rows::all(&db.db).await.iter().filter(|t| mine(t)) {
            assert_eq!(
                (task.status, task.lease_owner.as_deref()),
                (TaskStatus::Running, Some(name.as_str()))
            );
        }
        tokio::time::sleep(lease).await;
        let reaped = db
            .db
            .reap_expired(&RetryPolicy::default())
            .await
            .expect("reap");
        assert_eq!(reaped.requeued, 3);
        for task in rows::all(&db.db).await.iter().filter(|t| mine(t)) {
            assert_eq!((task.status, task.attempts), (TaskStatus::Queued, 1));
        }
    }
}
