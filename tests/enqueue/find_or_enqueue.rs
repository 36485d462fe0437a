//! `find_or_enqueue` under races, churn and transactions, on every dialect.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use harness::{Dialect, TestDb, matrix, rows};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, EntityTrait, PaginatorTrait,
    TransactionTrait,
};
use task_dedup::{
    DedupError, Enqueued, InvalidReason, KeyField, NewTask, OnConflict, TaskDedup, TaskKey,
    TaskStatus, task_run,
};
use tokio::sync::Barrier;

matrix!(
    storm_on_one_key_creates_exactly_one,
    storm_over_eight_keys_gives_each_caller_its_own_key,
    pool_opened_before_the_index_dedups,
    churn_never_errors_or_crosses_keys,
    hit_inside_a_transaction_leaves_it_usable,
    rolled_back_create_frees_the_key,
    deadlock_inside_a_transaction_is_reported_not_retried,
    harness_catches_read_then_insert,
    invalid_keys_are_rejected_before_sql,
    longest_keys_fit_every_dialect,
    unreachable_database_is_an_error,
    thousand_sequential_calls_on_one_connection,
    created_and_existing_match_the_stored_row,
    keys_without_a_user_are_unique_among_themselves,
);

const CALLERS: usize = 64;

fn key(resource: &str) -> TaskKey {
    TaskKey::new("user-1", "render", resource).expect("valid key")
}

/// How one storm caller gets its task.
#[derive(Clone, Copy)]
enum Strategy {
    /// The library.
    FindOrEnqueue,
    /// The bug this project removes: read, and insert when nothing was found. Every
    /// caller reads before any caller inserts (a second barrier), which is the losing
    /// interleaving made deterministic.
    ReadThenInsert,
}

/// `keys.len()` groups of callers, one pooled connection each, released together by a
/// barrier; caller `i` asks for `keys[i % keys.len()]`. Returns each caller's key and
/// outcome.
async fn storm(
    pool: &DatabaseConnection,
    keys: &[TaskKey],
    callers: usize,
    strategy: Strategy,
) -> Vec<(TaskKey, Enqueued)> {
    let start = Arc::new(Barrier::new(callers));
    let read_done = Arc::new(Barrier::new(callers));
    let mut handles = Vec::with_capacity(callers);
    for i in 0..callers {
        let (pool, start, read_done) = (pool.clone(), start.clone(), read_done.clone());
        let key = keys[i % keys.len()].clone();
        handles.push(tokio::spawn(async move {
            start.wait().await;
            let outcome = match strategy {
                Strategy::FindOrEnqueue => pool
                    .find_or_enqueue(NewTask::new(key.clone()))
                    .await
                    .expect("find_or_enqueue"),
                Strategy::ReadThenInsert => read_then_insert(&pool, &key, &read_done).await,
            };
            (key, outcome)
        }));
    }
    let mut outcomes = Vec::with_capacity(callers);
    for handle in handles {
        outcomes.push(handle.await.expect("caller task"));
    }
    outcomes
}

/// The naive flow, for the harness's own test. Test code only.
async fn read_then_insert(
    pool: &DatabaseConnection,
    key: &TaskKey,
    read_done: &Barrier,
) -> Enqueued {
    let existing = pool.find_active(key).await.expect("read");
    read_done.wait().await;
    match existing {
        Some(task) => Enqueued::Existing(task),
        None => {
            let id = rows::insert(
                pool,
                (key.user_id(), key.task_type(), key.resource_key()),
                TaskStatus::Queued,
                task_run::now(),
            )
            .await
            .expect("naive insert");
            let task = task_run::Entity::find_by_id(id)
                .one(pool)
                .await
                .expect("read back");
            Enqueued::Created(task.expect("inserted row"))
        }
    }
}

async fn active_rows(db: &DatabaseConnection, key: &TaskKey) -> Vec<task_run::Model> {
    rows::all(db)
        .await
        .into_iter()
        .filter(|row| {
            row.status.is_active()
                && row.user_id == key.user_id()
                && row.task_type == key.task_type()
                && row.resource_key == key.resource_key()
        })
        .collect()
}

fn assert_one_created(outcomes: &[(TaskKey, Enqueued)], callers: usize) {
    let created = outcomes.iter().filter(|(_, o)| o.is_created()).count();
    assert_eq!(created, 1, "exactly one caller creates");
    assert_eq!(outcomes.len() - created, callers - 1);
    let ids: HashSet<_> = outcomes.iter().map(|(_, o)| o.task().id).collect();
    assert_eq!(ids.len(), 1, "everyone got the same task");
}

async fn storm_on_one_key_creates_exactly_one(db: &TestDb) {
    db.migrate().await;
    let pool = db.pool(CALLERS as u32).await;
    for round in 0..20 {
        let key = key(&format!("doc-{round}"));
        let outcomes = storm(
            &pool,
            std::slice::from_ref(&key),
            CALLERS,
            Strategy::FindOrEnqueue,
        )
        .await;
        assert_one_created(&outcomes, CALLERS);
        assert_eq!(active_rows(&db.db, &key).await.len(), 1);
    }
    assert_eq!(
        task_run::Entity::find().count(&db.db).await.expect("count"),
        20
    );
}

/// Keys without a user: a storm on one creates one task, it round-trips with an empty
/// `user_id`, and it never meets a user's key of the same type and resource.
async fn keys_without_a_user_are_unique_among_themselves(db: &TestDb) {
    db.migrate().await;
    let pool = db.pool(CALLERS as u32).await;
    let shared = TaskKey::without_user("render", "doc-shared").expect("valid key");
    let outcomes = storm(
        &pool,
        std::slice::from_ref(&shared),
        CALLERS,
        Strategy::FindOrEnqueue,
    )
    .await;
    assert_one_created(&outcomes, CALLERS);
    let stored = active_rows(&db.db, &shared).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].user_id, "");
    let found = db
        .db
        .find_active(&shared)
        .await
        .expect("read")
        .expect("held");
    assert_eq!(found.id, stored[0].id);
    // A user's key with the same type and resource is another key.
    let users = db
        .db
        .find_or_enqueue(NewTask::new(key("doc-shared")))
        .await
        .expect("enqueue");
    assert!(users.is_created());
    assert_ne!(users.task().id, found.id);
    assert!(
        TaskKey::without_user("", "r").is_err() && TaskKey::without_user("t", "").is_err(),
        "the type and the resource are still checked"
    );
}

async fn storm_over_eight_keys_gives_each_caller_its_own_key(db: &TestDb) {
    db.migrate().await;
    let pool = db.pool(CALLERS as u32).await;
    let keys: Vec<TaskKey> = (0..8).map(|k| key(&format!("doc-{k}"))).collect();
    let outcomes = storm(&pool, &keys, CALLERS, Strategy::FindOrEnqueue).await;
    for key in &keys {
        let mine: Vec<_> = outcomes.iter().filter(|(k, _)| k == key).cloned().collect();
        assert_one_created(&mine, CALLERS / keys.len());
        for (_, outcome) in &mine {
            let task = outcome.task();
            assert_eq!(
                (
                    task.user_id.as_str(),
                    task.task_type.as_str(),
                    task.resource_key.as_str()
                ),
                (key.user_id(), key.task_type(), key.resource_key())
            );
        }
        assert_eq!(active_rows(&db.db, key).await.len(), 1);
    }
}

/// An application whose pool was open while the unique index was created (a rolling
/// upgrade, or migrations run through the same pool): SQLite keeps each connection's
/// schema in memory, so those connections knew `task_run` but not the index.
async fn pool_opened_before_the_index_dedups(db: &TestDb) {
    db.migrate().await;
    db.drop_unique_index().await;
    let pool = db.pool(8).await;
    // Every pooled connection reads task_run once: eight transactions hold all eight
    // connections at the same time.
    let mut txns = Vec::new();
    for _ in 0..8 {
        let txn = pool.begin().await.expect("begin");
        task_run::Entity::find()
            .count(&txn)
            .await
            .expect("read task_run");
        txns.push(txn);
    }
    drop(txns);
    task_dedup_migration::ensure_schema(&db.db)
        .await
        .expect("the index comes back");
    for round in 0..3 {
        let key = key(&format!("doc-{round}"));
        let outcomes = storm(
            &pool,
            std::slice::from_ref(&key),
            8,
            Strategy::FindOrEnqueue,
        )
        .await;
        assert_one_created(&outcomes, 8);
        assert_eq!(active_rows(&db.db, &key).await.len(), 1);
    }
}

/// Marks the active task of `key` succeeded with plain SQL, as a worker would.
fn finish_statement(key: &TaskKey) -> sea_orm::sea_query::UpdateStatement {
    use sea_orm::sea_query::{Expr, ExprTrait, Query};
    use task_run::Column;
    Query::update()
        .table(task_run::Entity)
        .value(Column::Status, TaskStatus::Succeeded.as_str())
        .value(Column::FinishedAt, task_run::now())
        .and_where(Expr::col(Column::UserId).eq(key.user_id()))
        .and_where(Expr::col(Column::TaskType).eq(key.task_type()))
        .and_where(Expr::col(Column::ResourceKey).eq(key.resource_key()))
        .and_where(Expr::cust(task_dedup_entity::active_status_sql()))
        .to_owned()
}

async fn finish_active<C: ConnectionTrait>(db: &C, key: &TaskKey) -> u64 {
    let update = finish_statement(key);
    db.execute(&update).await.expect("finish").rows_affected()
}

/// [`finish_active`] for the churn finishers, which race the callers and each other: a
/// deadlock the database resolves by aborting the finisher counts as nothing finished.
async fn try_finish_active<C: ConnectionTrait>(db: &C, key: &TaskKey) -> u64 {
    match db.execute(&finish_statement(key)).await {
        Ok(result) => result.rows_affected(),
        Err(err) if task_dedup::is_transaction_conflict(&err) => 0,
        Err(err) => panic!("finish: {err}"),
    }
}

async fn churn_never_errors_or_crosses_keys(db: &TestDb) {
    db.migrate().await;
    let pool = db.pool(34).await;
    let keys: Arc<Vec<TaskKey>> = Arc::new((0..2).map(|k| key(&format!("hot-{k}"))).collect());
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));

    // The finisher holds each row's lock for a moment, so callers queue up behind it on
    // the index entry, and then either finishes the active task or (every other round)
    // enqueues inside a transaction it rolls back. On InnoDB, waiting inserters
    // deadlock when the entry they wait on goes away.
    let finisher = {
        let (pool, keys, done) = (pool.db.clone(), keys.clone(), done.clone());
        tokio::spawn(async move {
            let mut finished = 0;
            let mut round = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                round += 1;
                for key in keys.iter() {
                    let txn = pool.begin().await.expect("begin");
                    finished += try_finish_active(&txn, key).await;
                    if round.is_multiple_of(2) {
                        let _ = txn.find_or_enqueue(NewTask::new(key.clone())).await;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        txn.rollback().await.expect("rollback");
                    } else {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        txn.commit().await.expect("commit");
                    }
                }
            }
            finished
        })
    };

    // A second finisher completes tasks as fast as it can, in plain statements, so a
    // row can also change between a caller's failed insert and its read.
    let fast_finisher = {
        let (pool, keys, done) = (pool.db.clone(), keys.clone(), done.clone());
        tokio::spawn(async move {
            let mut finished = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                for key in keys.iter() {
                    finished += try_finish_active(&pool, key).await;
                }
            }
            finished
        })
    };

    let mut callers = Vec::new();
    for c in 0..32 {
        let (pool, keys) = (pool.db.clone(), keys.clone());
        callers.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for i in 0..40 {
                let key = keys[(c + i) % keys.len()].clone();
                let outcome = pool.find_or_enqueue(NewTask::new(key.clone())).await;
                outcomes.push((key, outcome));
            }
            outcomes
        }));
    }
    let mut created = 0;
    for caller in callers {
        for (key, outcome) in caller.await.expect("caller") {
            let outcome = outcome.unwrap_or_else(|e| panic!("{key}: {e}"));
            let task = outcome.task();
            assert_eq!(
                (
                    task.user_id.as_str(),
                    task.task_type.as_str(),
                    task.resource_key.as_str()
                ),
                (key.user_id(), key.task_type(), key.resource_key()),
            );
            created += usize::from(outcome.is_created());
        }
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let finished = finisher.await.expect("finisher") + fast_finisher.await.expect("finisher");
    assert!(finished > 0, "the finisher really raced the callers");
    assert!(
        created > keys.len(),
        "keys were released and taken again ({created} creates)"
    );
    for key in keys.iter() {
        assert!(active_rows(&db.db, key).await.len() <= 1);
    }
}

async fn hit_inside_a_transaction_leaves_it_usable(db: &TestDb) {
    db.migrate().await;
    let taken = db
        .db
        .find_or_enqueue(NewTask::new(key("taken")))
        .await
        .expect("enqueue");

    let txn = db.db.begin().await.expect("begin");
    let hit = txn
        .find_or_enqueue(NewTask::new(key("taken")))
        .await
        .expect("hit in txn");
    assert_eq!(hit, Enqueued::Existing(taken.task().clone()));
    // The transaction goes on: more statements, another enqueue, a read of its own row.
    let fresh = txn
        .find_or_enqueue(NewTask::new(key("fresh")))
        .await
        .expect("create in txn");
    assert!(fresh.is_created());
    let again = txn
        .find_or_enqueue(NewTask::new(key("fresh")))
        .await
        .expect("own row");
    assert_eq!(again, Enqueued::Existing(fresh.task().clone()));
    assert_eq!(
        task_run::Entity::find()
            .count(&txn)
            .await
            .expect("count in txn"),
        2
    );
    txn.commit().await.expect("commit after a hit");

    assert_eq!(
        db.db.find_active(&key("fresh")).await.expect("read"),
        Some(fresh.task().clone())
    );
}

async fn rolled_back_create_frees_the_key(db: &TestDb) {
    db.migrate().await;
    let txn = db.db.begin().await.expect("begin");
    let created = txn
        .find_or_enqueue(NewTask::new(key("doc")))
        .await
        .expect("create");
    assert!(created.is_created());
    txn.rollback().await.expect("rollback");

    assert_eq!(db.db.find_active(&key("doc")).await.expect("read"), None);
    let again = db
        .db
        .find_or_enqueue(NewTask::new(key("doc")))
        .await
        .expect("create");
    assert!(again.is_created());
    assert_ne!(again.task().id, created.task().id);
}

/// Enqueues `key` in `txn`, then commits on success or rolls back on error (as a caller
/// must after `TransactionAborted`), returning the outcome.
async fn enqueue_and_end(txn: DatabaseTransaction, key: TaskKey) -> Result<Enqueued, DedupError> {
    let outcome = txn.find_or_enqueue(NewTask::new(key)).await;
    match &outcome {
        Ok(_) => txn.commit().await.expect("commit"),
        Err(_) => txn.rollback().await.expect("rollback"),
    }
    outcome
}

async fn deadlock_inside_a_transaction_is_reported_not_retried(db: &TestDb) {
    db.migrate().await;
    let (a, b) = (key("a"), key("b"));
    let t1 = db.db.begin().await.expect("begin");
    let t2 = db.db.begin().await.expect("begin");
    match db.dialect {
        Dialect::Postgres | Dialect::MySql => {
            // Each transaction holds one key and then asks for the other's: a cycle the
            // database breaks by aborting one of them.
            assert!(
                t1.find_or_enqueue(NewTask::new(a.clone()))
                    .await
                    .expect("a")
                    .is_created()
            );
            assert!(
                t2.find_or_enqueue(NewTask::new(b.clone()))
                    .await
                    .expect("b")
                    .is_created()
            );
            let first = tokio::spawn(enqueue_and_end(t1, b.clone()));
            tokio::time::sleep(Duration::from_millis(200)).await;
            let second = enqueue_and_end(t2, a.clone()).await;
            let first = first.await.expect("first transaction");
            let (aborted, survived) = match (first, second) {
                (Err(e), Ok(o)) | (Ok(o), Err(e)) => (e, o),
                other => panic!("expected exactly one victim, got {other:?}"),
            };
            assert!(
                matches!(aborted, DedupError::TransactionAborted(_)),
                "{aborted:?}"
            );
            // The victim's rows are gone, so the survivor created the other key.
            assert!(survived.is_created());
            let active = db.db.find_active(&a).await.expect("a").is_some() as u8
                + db.db.find_active(&b).await.expect("b").is_some() as u8;
            assert_eq!(active, 2, "the survivor holds both keys");
        }
        Dialect::Sqlite => {
            // One writer at a time: the second transaction waits for the first to
            // commit instead of deadlocking, then finds its task.
            assert!(
                t1.find_or_enqueue(NewTask::new(a.clone()))
                    .await
                    .expect("a")
                    .is_created()
            );
            let second = tokio::spawn(enqueue_and_end(t2, a.clone()));
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(
                t1.find_or_enqueue(NewTask::new(b.clone()))
                    .await
                    .expect("b")
                    .is_created()
            );
            t1.commit().await.expect("commit");
            let second = second.await.expect("second").expect("waited, no error");
            assert!(!second.is_created());
        }
    }
}

async fn harness_catches_read_then_insert(db: &TestDb) {
    // Without the unique index, the naive flow under the storm creates a task per caller.
    db.migrate().await;
    db.drop_unique_index().await;
    let pool = db.pool(CALLERS as u32).await;
    let doc = key("doc");
    let naive = storm(
        &pool,
        std::slice::from_ref(&doc),
        CALLERS,
        Strategy::ReadThenInsert,
    )
    .await;
    let naive_created = naive.iter().filter(|(_, o)| o.is_created()).count();
    assert_eq!(
        naive_created, CALLERS,
        "every naive caller saw nothing and inserted"
    );
    assert_eq!(active_rows(&db.db, &doc).await.len(), CALLERS);

    // The same storm against the library, on the same table (the compat patch
    // resolves the naive duplicates first): exactly one.
    task_dedup_migration::ensure_schema(&db.db)
        .await
        .expect("the index comes back");
    let other = key("other");
    let real = storm(
        &pool,
        std::slice::from_ref(&other),
        CALLERS,
        Strategy::FindOrEnqueue,
    )
    .await;
    assert_one_created(&real, CALLERS);
    assert_eq!(active_rows(&db.db, &other).await.len(), 1);
    assert_eq!(
        active_rows(&db.db, &doc).await.len(),
        1,
        "duplicates were resolved"
    );
}

async fn invalid_keys_are_rejected_before_sql(db: &TestDb) {
    db.migrate().await;
    let long = |n| "x".repeat(n);
    let cases = [
        (("", "t", "r"), KeyField::UserId, InvalidReason::Empty),
        (("u", "", "r"), KeyField::TaskType, InvalidReason::Empty),
        (("u", "t", ""), KeyField::ResourceKey, InvalidReason::Empty),
        (
            (&*long(65), "t", "r"),
            KeyField::UserId,
            InvalidReason::TooLong {
                max_chars: 64,
                chars: 65,
            },
        ),
        (
            ("u", &*long(65), "r"),
            KeyField::TaskType,
            InvalidReason::TooLong {
                max_chars: 64,
                chars: 65,
            },
        ),
        (
            ("u", "t", &*long(256)),
            KeyField::ResourceKey,
            InvalidReason::TooLong {
                max_chars: 255,
                chars: 256,
            },
        ),
        (
            ("u\0", "t", "r"),
            KeyField::UserId,
            InvalidReason::ContainsNul,
        ),
        (
            ("u", "t\0", "r"),
            KeyField::TaskType,
            InvalidReason::ContainsNul,
        ),
        (
            ("u", "t", "r\0"),
            KeyField::ResourceKey,
            InvalidReason::ContainsNul,
        ),
    ];
    for ((user, task_type, resource), field, reason) in cases {
        match TaskKey::new(user, task_type, resource).map_err(DedupError::from) {
            Err(DedupError::InvalidKey {
                field: f,
                reason: r,
            }) => {
                assert_eq!((f, &r), (field, &reason));
                let message = DedupError::InvalidKey { field, reason: r }.to_string();
                assert!(message.contains(field.as_str()), "{message}");
            }
            other => panic!("{field} {reason}: expected InvalidKey, got {other:?}"),
        }
    }
    assert_eq!(
        task_run::Entity::find().count(&db.db).await.expect("count"),
        0
    );

    // A payload PostgreSQL could not store is refused on every dialect, before SQL.
    let nul_payload = serde_json::json!({"note": ["fine", "not\0fine"]});
    let err = db
        .db
        .find_or_enqueue(NewTask::new(key("doc")).with_payload(nul_payload))
        .await
        .expect_err("NUL in payload");
    assert!(
        matches!(
            err,
            DedupError::InvalidArgument {
                name: "payload",
                reason: InvalidReason::ContainsNul
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        task_run::Entity::find().count(&db.db).await.expect("count"),
        0
    );
}

async fn longest_keys_fit_every_dialect(db: &TestDb) {
    db.migrate().await;
    // 4-byte characters at every column's limit: the MySQL index stays under its byte
    // limit and no dialect truncates.
    let crab = |n| "🦀".repeat(n);
    let key = TaskKey::new(crab(64), crab(64), crab(255)).expect("at the limits");
    let created = db
        .db
        .find_or_enqueue(NewTask::new(key.clone()))
        .await
        .expect("create");
    let existing = db
        .db
        .find_or_enqueue(NewTask::new(key.clone()))
        .await
        .expect("hit");
    assert!(created.is_created() && !existing.is_created());
    assert_eq!(existing.task(), created.task());
    assert_eq!(existing.task().resource_key, crab(255));
}

async fn unreachable_database_is_an_error(db: &TestDb) {
    db.migrate().await;
    // A pool that is gone.
    let pool = db.pool(2).await;
    pool.db.close_by_ref().await.expect("close");
    let err = pool
        .find_or_enqueue(NewTask::new(key("doc")))
        .await
        .expect_err("closed pool");
    assert!(matches!(err, DedupError::Database(_)), "{err:?}");

    // A server that is not there: an error within the connect timeout, no panic.
    let url = match db.dialect {
        Dialect::Sqlite => "sqlite:///nonexistent-dir/task-dedup/x.db?mode=rwc".to_owned(),
        Dialect::Postgres => "postgres://postgres@127.0.0.1:1/test".to_owned(),
        Dialect::MySql => "mysql://root@127.0.0.1:1/test".to_owned(),
    };
    let mut options = sea_orm::ConnectOptions::new(url);
    options
        .connect_timeout(Duration::from_secs(5))
        .acquire_timeout(Duration::from_secs(5));
    let started = std::time::Instant::now();
    let err: DedupError = task_dedup::connect_with(options)
        .await
        .expect_err("nothing listens");
    assert!(started.elapsed() < Duration::from_secs(30), "{err}");

    // The database vanishing under a live pool.
    if db.dialect != Dialect::Sqlite {
        let doomed = db.pool(2).await;
        // CASCADE: PostgreSQL's insert-or-find function returns the table's rows.
        db.exec(match db.dialect {
            Dialect::Postgres => "DROP TABLE task_run CASCADE",
            _ => "DROP TABLE task_run",
        })
        .await;
        let err = doomed
            .find_or_enqueue(NewTask::new(key("doc")))
            .await
            .expect_err("no table");
        assert!(matches!(err, DedupError::Database(_)), "{err:?}");
    }
}

/// A pool of one connection: an attempt runs all its statements (the read after a
/// conflict, the replace path's transaction) on the connection it holds, so none of them
/// may wait for a second one.
async fn thousand_sequential_calls_on_one_connection(db: &TestDb) {
    db.migrate().await;
    let one = db.pool(1).await;
    let mut active: HashMap<String, uuid::Uuid> = HashMap::new();
    let (mut created, mut existing, mut replaced) = (0, 0, 0);
    for i in 0..1_000u32 {
        let resource = format!("doc-{}", i % 100);
        let replace = i % 5 == 4;
        let mut task = NewTask::new(key(&resource));
        if replace {
            task = task.on_conflict(OnConflict::ReplaceIfQueued);
        }
        let outcome = tokio::time::timeout(Duration::from_secs(30), one.find_or_enqueue(task))
            .await
            .unwrap_or_else(|_| panic!("call {i} waited for a second connection"))
            .unwrap_or_else(|e| panic!("call {i}: {e}"));
        match active.get(&resource) {
            Some(id) if replace => {
                assert!(
                    matches!(outcome, Enqueued::Replaced(_)),
                    "call {i}: {outcome:?}"
                );
                assert_eq!(outcome.task().id, *id);
                replaced += 1;
            }
            Some(id) => {
                assert_eq!(outcome, Enqueued::Existing(outcome.task().clone()));
                assert_eq!(outcome.task().id, *id);
                existing += 1;
            }
            None => {
                assert!(outcome.is_created(), "call {i}");
                active.insert(resource.clone(), outcome.task().id);
                created += 1;
            }
        }
        if i.is_multiple_of(7) {
            assert_eq!(finish_active(&one.db, &key(&resource)).await, 1);
            active.remove(&resource);
        }
    }
    assert_eq!(created + existing + replaced, 1_000);
    assert!(
        created > 100 && existing > 100 && replaced > 50,
        "{created} created, {existing} existing, {replaced} replaced"
    );
}

async fn created_and_existing_match_the_stored_row(db: &TestDb) {
    db.migrate().await;
    let payload = serde_json::json!({"pages": [1, 2, 3], "title": "Ünïcode 🦀", "ratio": 0.25});
    let created = db
        .db
        .find_or_enqueue(NewTask::new(key("doc")).with_payload(payload.clone()))
        .await
        .expect("create")
        .into_task();
    let stored = task_run::Entity::find_by_id(created.id)
        .one(&db.db)
        .await
        .expect("read");
    assert_eq!(
        Some(&created),
        stored.as_ref(),
        "Created carries the row as stored"
    );
    assert_eq!(created.payload, Some(payload));
    assert_eq!(created.status, TaskStatus::Queued);

    let hit = db
        .db
        .find_or_enqueue(NewTask::new(key("doc")).with_payload(serde_json::json!("ignored")))
        .await
        .expect("hit");
    assert_eq!(
        hit,
        Enqueued::Existing(created.clone()),
        "the first payload stays"
    );
    assert_eq!(
        db.db.find_active(&key("doc")).await.expect("read"),
        Some(created)
    );
    assert_eq!(
        db.db.find_active(&key("nothing")).await.expect("read"),
        None
    );
}
