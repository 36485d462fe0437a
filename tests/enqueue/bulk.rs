//! `find_or_enqueue_many` on every dialect: overlapping batches behind a barrier, a
//! 100,000-task batch, repeats inside a batch, policies, transactions, bad input.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use harness::{Dialect, TestDb, matrix, rows};
use sea_orm::{DatabaseConnection, TransactionTrait};
use task_dedup::{
    DedupError, Enqueued, InvalidReason, NewTask, OnConflict, Scope, TaskDedup, TaskKey,
    TaskLifecycle, TaskStatus,
};
use tokio::sync::Barrier;

matrix!(
    overlapping_batches_create_each_key_once,
    harness_catches_a_check_then_insert_batch,
    a_hundred_thousand_tasks_in_one_call,
    repeats_in_a_batch_get_the_first_occurrences_task,
    each_outcome_is_what_find_or_enqueue_would_give,
    a_rolled_back_batch_leaves_nothing,
    an_invalid_item_is_named_and_nothing_is_written,
);

const CALLERS: usize = 16;
const BATCH: usize = 1_000;
const KEYS: usize = 2_000;

fn key(resource: &str) -> TaskKey {
    TaskKey::new("user-1", "reindex", resource).expect("valid key")
}

fn tasks(resources: impl IntoIterator<Item = String>) -> Vec<NewTask> {
    resources
        .into_iter()
        .map(|r| NewTask::new(key(&r)))
        .collect()
}

/// Caller `c`'s batch: 1,000 of the 2,000 keys, starting at `c * 125`, so that every key
/// is in 8 of the 16 batches.
fn batch_of(caller: usize) -> Vec<String> {
    (0..BATCH)
        .map(|i| format!("doc-{}", (caller * (KEYS / CALLERS) + i) % KEYS))
        .collect()
}

/// Keys held by more than one task, and the number of tasks holding a key.
async fn holders(db: &DatabaseConnection) -> (i64, i64) {
    let occupies = task_dedup_entity::OCCUPIES_KEY_SQL;
    let duplicates = harness::count(
        db,
        format!(
            "SELECT COUNT(*) AS n FROM (SELECT user_id FROM task_run WHERE {occupies} \
         GROUP BY user_id, task_type, resource_key, dedup_window_end HAVING COUNT(*) > 1) d"
        ),
    )
    .await;
    let held = harness::count(
        db,
        format!("SELECT COUNT(*) AS n FROM task_run WHERE {occupies}"),
    )
    .await;
    (duplicates, held)
}

async fn overlapping_batches_create_each_key_once(db: &TestDb) {
    db.migrate().await;
    let pool = db.pool(CALLERS as u32).await;
    let start = Arc::new(Barrier::new(CALLERS));
    let mut callers = Vec::new();
    for c in 0..CALLERS {
        let (pool, start) = (pool.db.clone(), start.clone());
        callers.push(tokio::spawn(async move {
            let resources = batch_of(c);
            start.wait().await;
            let outcomes = pool
                .find_or_enqueue_many(tasks(resources.clone()))
                .await
                .expect("batch");
            (resources, outcomes)
        }));
    }
    let mut created: HashMap<String, usize> = HashMap::new();
    let mut ids: HashMap<String, HashSet<uuid::Uuid>> = HashMap::new();
    for caller in callers {
        let (resources, outcomes) = caller.await.expect("caller");
        assert_eq!(outcomes.len(), resources.len(), "one outcome per task");
        for (resource, outcome) in resources.iter().zip(&outcomes) {
            assert_eq!(&outcome.task().resource_key, resource, "in input order");
            assert!(!outcome.is_replaced());
            *created.entry(resource.clone()).or_default() += usize::from(outcome.is_created());
            ids.entry(resource.clone())
                .or_default()
                .insert(outcome.task().id);
        }
    }
    assert_eq!(created.len(), KEYS);
    assert!(
        created.values().all(|&n| n == 1),
        "exactly one Created per key across all callers"
    );
    assert!(ids.values().all(|ids| ids.len() == 1), "one task per key");
    assert_eq!(holders(&db.db).await, (0, KEYS as i64));
}

/// The same storm against a check-then-insert batch (read which keys are taken, insert
/// the others) on a table without the unique index: it creates duplicates. The harness
/// catches what `find_or_enqueue_many` is tested against.
async fn harness_catches_a_check_then_insert_batch(db: &TestDb) {
    db.migrate().await;
    db.drop_unique_index().await;
    let pool = db.pool(CALLERS as u32).await;
    let start = Arc::new(Barrier::new(CALLERS));
    let read = Arc::new(Barrier::new(CALLERS));
    let mut callers = Vec::new();
    for c in 0..CALLERS {
        let (pool, start, read) = (pool.db.clone(), start.clone(), read.clone());
        callers.push(tokio::spawn(async move {
            let resources = batch_of(c);
            start.wait().await;
            let mut missing = Vec::new();
            for resource in &resources {
                if pool
                    .find_active(&key(resource))
                    .await
                    .expect("read")
                    .is_none()
                {
                    missing.push(resource.clone());
                }
            }
            read.wait().await;
            for resource in missing {
                rows::insert(
                    &pool,
                    ("user-1", "reindex", &resource),
                    TaskStatus::Queued,
                    task_dedup::task_run::now(),
                )
                .await
                .expect("naive insert");
            }
        }));
    }
    for caller in callers {
        caller.await.expect("caller");
    }
    let (duplicates, _) = holders(&db.db).await;
    assert!(
        duplicates > KEYS as i64 / 2,
        "{duplicates} keys held twice or more"
    );
}

async fn a_hundred_thousand_tasks_in_one_call(db: &TestDb) {
    db.migrate().await;
    let resources: Vec<String> = (0..100_000).map(|i| format!("big-{i}")).collect();
    let started = std::time::Instant::now();
    let first = db
        .db
        .find_or_enqueue_many(tasks(resources.clone()))
        .await
        .expect("batch");
    let took = started.elapsed();
    assert_eq!(first.len(), 100_000);
    assert!(first.iter().all(Enqueued::is_created));
    let again = db
        .db
        .find_or_enqueue_many(tasks(resources.clone()))
        .await
        .expect("batch");
    assert!(
        again
            .iter()
            .zip(&first)
            .all(|(again, first)| matches!(again, Enqueued::Existing(t) if t == first.task()))
    );
    assert_eq!(holders(&db.db).await, (0, 100_000));
    println!("{}: 100,000 tasks in {took:?}", db.dialect.name());
}

async fn repeats_in_a_batch_get_the_first_occurrences_task(db: &TestDb) {
    db.migrate().await;
    let held = db
        .db
        .find_or_enqueue(NewTask::new(key("held")))
        .await
        .expect("enqueue")
        .into_task();
    let order = ["a", "b", "a", "held", "c", "b", "held", "a"];
    let outcomes = db
        .db
        .find_or_enqueue_many(
            order
                .iter()
                .map(|r| NewTask::new(key(r)).with_payload(serde_json::json!(r))),
        )
        .await
        .expect("batch");
    let kinds: Vec<&str> = outcomes
        .iter()
        .map(|o| match o {
            Enqueued::Created(_) => "created",
            Enqueued::Existing(_) => "existing",
            Enqueued::Replaced(_) => "replaced",
            other => panic!("an outcome this test does not know: {other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "created", "created", "existing", "existing", "created", "existing", "existing",
            "existing"
        ]
    );
    for (outcome, resource) in outcomes.iter().zip(order) {
        assert_eq!(outcome.task().resource_key, resource);
    }
    assert_eq!(outcomes[2].task(), outcomes[0].task());
    assert_eq!(outcomes[5].task(), outcomes[1].task());
    assert_eq!(outcomes[3].task(), &held);
    assert_eq!(rows::all(&db.db).await.len(), 4);
}

async fn each_outcome_is_what_find_or_enqueue_would_give(db: &TestDb) {
    db.migrate().await;
    // A running task, a finished period task of this hour, a queued task.
    db.db
        .find_or_enqueue(NewTask::new(key("running")))
        .await
        .expect("enqueue");
    let hourly = || Scope::Period(Duration::from_secs(3_600));
    db.db
        .find_or_enqueue(NewTask::new(key("hourly")).scope(hourly()))
        .await
        .expect("enqueue");
    while let Some(task) = db
        .db
        .claim("w", &[], Duration::from_secs(60))
        .await
        .expect("claim")
    {
        if task.resource_key == "hourly" {
            db.db.complete(task.id, "w", None).await.expect("complete");
        }
    }
    db.db
        .find_or_enqueue(NewTask::new(key("queued")).with_payload(serde_json::json!(1)))
        .await
        .expect("enqueue");

    let replace = |r: &str| {
        NewTask::new(key(r))
            .with_payload(serde_json::json!({"latest": r}))
            .on_conflict(OnConflict::ReplaceIfQueued)
            .priority(3)
    };
    let batch = vec![
        replace("queued"),
        replace("running"),
        replace("fresh"),
        NewTask::new(key("hourly")).scope(hourly()),
        NewTask::new(key("queued")).scope(Scope::Queued),
        NewTask::new(key("running")).scope(Scope::Queued),
        NewTask::new(key("daily")).scope(Scope::Period(Duration::from_secs(86_400))),
    ];
    let outcomes = db.db.find_or_enqueue_many(batch).await.expect("batch");
    let stored: HashMap<uuid::Uuid, task_dedup::task_run::Model> = rows::all(&db.db)
        .await
        .into_iter()
        .map(|t| (t.id, t))
        .collect();
    for outcome in &outcomes {
        assert_eq!(
            Some(outcome.task()),
            stored.get(&outcome.task().id),
            "as stored"
        );
    }
    // The queued task took the latest payload; the running one kept its own.
    assert!(
        matches!(&outcomes[0], Enqueued::Replaced(t) if t.payload == Some(serde_json::json!({"latest": "queued"})) && t.priority == 3)
    );
    assert!(
        matches!(&outcomes[1], Enqueued::Existing(t) if t.status == TaskStatus::Running && t.payload.is_none())
    );
    assert!(matches!(&outcomes[2], Enqueued::Created(t) if t.priority == 3));
    assert!(matches!(&outcomes[3], Enqueued::Existing(t) if t.status == TaskStatus::Succeeded));
    // Repeats of items 0 and 1's slots (whatever their scope): the first occurrence
    // decided.
    assert!(matches!(&outcomes[4], Enqueued::Existing(t) if t.id == outcomes[0].task().id));
    assert!(matches!(&outcomes[5], Enqueued::Existing(t) if t.id == outcomes[1].task().id));
    assert!(outcomes[6].is_created());
}

async fn a_rolled_back_batch_leaves_nothing(db: &TestDb) {
    db.migrate().await;
    let txn = db.db.begin().await.expect("begin");
    let outcomes = txn
        .find_or_enqueue_many(tasks((0..2_500).map(|i| format!("t-{i}"))))
        .await
        .expect("batch in a transaction");
    assert!(outcomes.iter().all(Enqueued::is_created));
    // The transaction sees its own tasks and stays usable.
    let again = txn
        .find_or_enqueue_many(tasks((0..10).map(|i| format!("t-{i}"))))
        .await
        .expect("again");
    assert!(again.iter().all(|o| !o.is_created()));
    txn.rollback().await.expect("rollback");
    assert!(rows::all(&db.db).await.is_empty(), "nothing stayed");
    let outcomes = db
        .db
        .find_or_enqueue_many(tasks((0..10).map(|i| format!("t-{i}"))))
        .await
        .expect("batch");
    assert!(
        outcomes.iter().all(Enqueued::is_created),
        "the keys are free"
    );
}

async fn an_invalid_item_is_named_and_nothing_is_written(db: &TestDb) {
    db.migrate().await;
    let mut batch = tasks((0..10).map(|i| format!("ok-{i}")));
    batch[3] = NewTask::new(key("bad")).with_payload(serde_json::json!({"x": "nul\0"}));
    batch[7] = NewTask::new(key("worse")).scope(Scope::Period(Duration::from_millis(10)));
    let err = db
        .db
        .find_or_enqueue_many(batch)
        .await
        .expect_err("invalid");
    match &err {
        DedupError::InvalidItem { index: 3, source } => assert!(
            matches!(
                **source,
                DedupError::InvalidArgument {
                    name: "payload",
                    reason: InvalidReason::ContainsNul
                }
            ),
            "{source:?}"
        ),
        other => panic!("expected item 3, got {other:?}"),
    }
    assert!(err.to_string().contains("item 3"), "{err}");
    assert!(rows::all(&db.db).await.is_empty());
    // An empty batch is fine.
    let none: Vec<NewTask> = Vec::new();
    assert!(
        db.db
            .find_or_enqueue_many(none)
            .await
            .expect("empty")
            .is_empty()
    );
    let _ = Dialect::Sqlite;
}
