//! Pausing and resuming a task type: claims pass over a paused type's tasks, enqueue
//! goes on, workers in other processes honour it; on every dialect.

use std::collections::HashSet;
use std::process::Child;
use std::time::{Duration, Instant};

use harness::{TestDb, matrix};
use sea_orm::{DatabaseConnection, TransactionTrait};
use task_dedup::{
    DedupError, InvalidReason, NewTask, TaskDedup, TaskKey, TaskLifecycle, TaskStatus, task_run,
};

matrix!(
    paused_types_are_passed_over_and_resumed,
    pause_in_a_transaction_takes_effect_at_commit,
    invalid_type_names_are_rejected_before_sql,
    workers_in_two_processes_honour_a_pause,
);

const LEASE: Duration = Duration::from_secs(60);

async fn enqueue(db: &DatabaseConnection, task_type: &str, resource: &str) -> task_run::Model {
    let key = TaskKey::new("u", task_type, resource).expect("key");
    let outcome = db
        .find_or_enqueue(NewTask::new(key))
        .await
        .expect("enqueue");
    assert!(outcome.is_created());
    outcome.into_task()
}

async fn paused_types_are_passed_over_and_resumed(db: &TestDb) {
    db.migrate().await;
    let a1 = enqueue(&db.db, "export", "1").await;
    let b1 = enqueue(&db.db, "email", "1").await;

    assert!(db.db.pause("export").await.expect("pause"));
    assert!(
        !db.db.pause("export").await.expect("pause again"),
        "already paused"
    );
    let listed = db.db.paused().await.expect("paused");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].task_type, "export");
    assert!(listed[0].paused_at <= task_run::now());

    // Enqueue goes on while paused.
    let a2 = enqueue(&db.db, "export", "2").await;
    // The oldest task is the paused type's: claims pass over it, whatever they ask for.
    let claimed = db.db.claim_many("w", &[], LEASE, 10).await.expect("claim");
    assert_eq!(
        claimed.iter().map(|t| t.id).collect::<Vec<_>>(),
        [b1.id],
        "only the other type"
    );
    assert!(
        db.db
            .claim_many("w", &["export"], LEASE, 10)
            .await
            .expect("claim")
            .is_empty()
    );

    // Byte-exact names: another spelling is another type.
    assert!(db.db.pause("Export").await.expect("pause"));
    assert_eq!(harness::paused_types(&db.db).await, ["Export", "export"]);
    assert!(db.db.resume("Export").await.expect("resume"));

    assert!(db.db.resume("export").await.expect("resume"));
    assert!(
        !db.db.resume("export").await.expect("resume again"),
        "not paused"
    );
    assert!(db.db.paused().await.expect("paused").is_empty());
    let claimed: HashSet<_> = db
        .db
        .claim_many("w", &["export"], LEASE, 10)
        .await
        .expect("claim")
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(claimed, HashSet::from([a1.id, a2.id]));
}

async fn pause_in_a_transaction_takes_effect_at_commit(db: &TestDb) {
    db.migrate().await;
    let task = enqueue(&db.db, "export", "1").await;
    let txn = db.db.begin().await.expect("begin");
    assert!(txn.pause("export").await.expect("pause"));
    txn.rollback().await.expect("rollback");
    assert!(db.db.paused().await.expect("paused").is_empty());

    let txn = db.db.begin().await.expect("begin");
    assert!(txn.pause("export").await.expect("pause"));
    txn.commit().await.expect("commit");
    assert_eq!(harness::paused_types(&db.db).await, ["export"]);
    assert!(db.db.claim("w", &[], LEASE).await.expect("claim").is_none());
    let txn = db.db.begin().await.expect("begin");
    assert!(txn.resume("export").await.expect("resume"));
    txn.commit().await.expect("commit");
    let claimed = db.db.claim("w", &[], LEASE).await.expect("claim");
    assert_eq!(claimed.map(|t| t.id), Some(task.id));
}

/// No table exists here: a statement would fail with a database error instead.
async fn invalid_type_names_are_rejected_before_sql(db: &TestDb) {
    let too_long = "x".repeat(task_run::TASK_TYPE_MAX_CHARS + 1);
    for (name, reason) in [
        ("", InvalidReason::Empty),
        ("a\0b", InvalidReason::ContainsNul),
        (
            too_long.as_str(),
            InvalidReason::TooLong {
                max_chars: task_run::TASK_TYPE_MAX_CHARS,
                chars: task_run::TASK_TYPE_MAX_CHARS + 1,
            },
        ),
    ] {
        for outcome in [db.db.pause(name).await, db.db.resume(name).await] {
            match outcome {
                Err(DedupError::InvalidArgument {
                    name: "task_type",
                    reason: got,
                }) => assert_eq!(got, reason),
                other => panic!("{name:?}: {other:?}"),
            }
        }
    }
}

/// The child process of [`workers_in_two_processes_honour_a_pause`]: a worker of every
/// type, one task at a time, each taking a moment, until it is killed. Does nothing
/// unless the parent started it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of workers_in_two_processes_honour_a_pause"]
async fn child_worker_runs_until_killed() {
    harness::children::run_worker(
        ("TASK_DEDUP_PAUSE_CHILD_URL", "TASK_DEDUP_PAUSE_CHILD_ID"),
        1,
        (Duration::from_millis(10), Duration::from_millis(50)),
        Duration::from_millis(200),
        Duration::from_millis(30),
    )
    .await;
}

fn child(url: &str, id: &str) -> Child {
    harness::children::spawn_ready(
        &harness::children::test_name(module_path!(), "child_worker_runs_until_killed"),
        &[
            ("TASK_DEDUP_PAUSE_CHILD_URL", url),
            ("TASK_DEDUP_PAUSE_CHILD_ID", id),
        ],
    )
}

/// Waits until every task of `task_type` in `ids` succeeded.
async fn wait_done(db: &DatabaseConnection, ids: &HashSet<uuid::Uuid>) -> Vec<task_run::Model> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rows: Vec<task_run::Model> = harness::rows::all(db)
            .await
            .into_iter()
            .filter(|t| ids.contains(&t.id))
            .collect();
        if rows.len() == ids.len() && rows.iter().all(|t| t.status == TaskStatus::Succeeded) {
            return rows;
        }
        assert!(Instant::now() < deadline, "tasks never finished: {rows:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two worker processes poll (or listen) while a type is paused: both keep running the
/// other type's tasks, queued behind the paused ones, and neither takes a paused one;
/// resumed, the paused tasks run. Paused again while they run, the same.
async fn workers_in_two_processes_honour_a_pause(db: &TestDb) {
    db.migrate().await;
    assert!(db.db.pause("job").await.expect("pause"));
    let _children =
        harness::children::Children(vec![child(&db.url, "child-1"), child(&db.url, "child-2")]);

    for round in 0..2 {
        // The paused type's tasks first: a claim that ignored the pause would take them
        // before the others.
        let mut jobs = HashSet::new();
        for i in 0..10 {
            jobs.insert(enqueue(&db.db, "job", &format!("{round}-{i}")).await.id);
        }
        let mut others = HashSet::new();
        for i in 0..12 {
            others.insert(enqueue(&db.db, "other", &format!("{round}-{i}")).await.id);
        }
        let done = wait_done(&db.db, &others).await;
        let owners: HashSet<_> = done.iter().filter_map(|t| t.lease_owner.clone()).collect();
        assert_eq!(
            owners,
            HashSet::from(["child-1".to_owned(), "child-2".to_owned()]),
            "both processes claimed"
        );
        for task in harness::rows::all(&db.db).await {
            if jobs.contains(&task.id) {
                assert_eq!(task.status, TaskStatus::Queued, "{task:?}");
                assert_eq!(task.attempts, 0, "{task:?}");
            }
        }

        assert!(db.db.resume("job").await.expect("resume"));
        wait_done(&db.db, &jobs).await;
        // Paused again while the workers run: from their next claim on.
        assert!(db.db.pause("job").await.expect("pause"));
    }
}
