//! `TaskAdmin`, the admin API, on every dialect: lists (each filter, keyset pages stable
//! under inserts), one task, the overview's counts, retry (never a duplicate, once under
//! a race), cancel and delete rules, bulk actions with a limit, bad input refused before
//! SQL, and everything inside a transaction rolled back with it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use harness::rows::{self, at};
use harness::{Dialect, TestDb, matrix};
use sea_orm::{DatabaseConnection, TransactionTrait};
use task_dedup::{
    Cursor, DedupError, ListTasks, MAX_ADMIN_BATCH, MAX_COUNT_LIMIT, NewTask, Order, Retry,
    TaskAdmin, TaskDedup, TaskFilter, TaskKey, TaskLifecycle, TaskStatus, Transition, task_run,
};
use tokio::sync::Barrier;
use uuid::Uuid;

matrix!(
    lists_filter_by_each_condition,
    pages_neither_repeat_nor_skip_while_tasks_are_inserted,
    get_task_returns_the_row,
    counts_throughput_and_oldest_queued,
    counts_up_to_stop_at_the_limit,
    retry_requeues_a_failed_or_cancelled_task,
    retry_with_a_held_key_returns_the_holder_and_creates_nothing,
    concurrent_retries_of_one_task_retry_it_once,
    concurrent_retries_of_one_keys_tasks_leave_one_active,
    cancel_and_delete_rules,
    bulk_actions_respect_filter_status_and_limit,
    bulk_retry_counts_held_keys,
    bad_input_is_refused_before_sql,
    actions_in_a_rolled_back_transaction_leave_nothing,
);

/// One seeded row: (user, type, key, status, seconds after `at(0)`).
type Seed = (&'static str, &'static str, &'static str, TaskStatus, i64);

const SEEDS: [Seed; 10] = [
    ("u1", "export", "a%b/1", TaskStatus::Failed, 0),
    ("u1", "export", "a_b/1", TaskStatus::Succeeded, 1),
    ("u1", "export", "axb/1", TaskStatus::Failed, 2),
    ("u2", "export", "A%b/2", TaskStatus::Queued, 3),
    ("u2", "mail", "a%b/1", TaskStatus::Failed, 4),
    ("u2", "mail", "x/1", TaskStatus::Cancelled, 5),
    ("", "mail", "x/2", TaskStatus::Running, 6),
    ("", "sync", "café/1", TaskStatus::Failed, 7),
    ("u3", "sync", "café/2", TaskStatus::Succeeded, 8),
    ("u3", "sync", "cafe/3", TaskStatus::Queued, 9),
];

/// Inserts the seeds, returning their ids in seed order.
async fn seed(db: &TestDb) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for (user, task_type, key, status, seconds) in SEEDS {
        let id = rows::insert(&db.db, (user, task_type, key), status, at(seconds))
            .await
            .expect("seed");
        ids.push(id);
    }
    ids
}

/// The ids a filter lists, newest first, read in pages of 3.
async fn listed(db: &DatabaseConnection, filter: TaskFilter) -> Vec<Uuid> {
    let mut query = ListTasks::new(filter).limit(3);
    let mut ids = Vec::new();
    loop {
        let page = db.list_tasks(&query).await.expect("list");
        assert!(page.tasks.len() <= 3);
        ids.extend(page.tasks.iter().map(|t| t.id));
        match page.next {
            Some(next) => query = query.after(Some(next)),
            None => return ids,
        }
    }
}

async fn lists_filter_by_each_condition(db: &TestDb) {
    db.migrate().await;
    let ids = seed(db).await;
    // The expected ids: the seeds `keep` selects, newest first.
    let expect = |keep: &dyn Fn(&Seed) -> bool| -> Vec<Uuid> {
        let mut picked: Vec<Uuid> = SEEDS
            .iter()
            .zip(&ids)
            .filter(|(s, _)| keep(s))
            .map(|(_, id)| *id)
            .collect();
        picked.reverse();
        picked
    };
    let cases: Vec<(TaskFilter, Vec<Uuid>)> = vec![
        (TaskFilter::new(), expect(&|_| true)),
        (
            TaskFilter::new().status(TaskStatus::Failed),
            expect(&|s| s.3 == TaskStatus::Failed),
        ),
        (
            TaskFilter::new().statuses([TaskStatus::Queued, TaskStatus::Running]),
            expect(&|s| s.3.is_active()),
        ),
        (
            TaskFilter::new().task_type("mail"),
            expect(&|s| s.1 == "mail"),
        ),
        (
            TaskFilter::new()
                .task_type("export")
                .status(TaskStatus::Failed),
            expect(&|s| s.1 == "export" && s.3 == TaskStatus::Failed),
        ),
        (TaskFilter::new().user_id("u2"), expect(&|s| s.0 == "u2")),
        (TaskFilter::new().user_id(""), expect(&|s| s.0.is_empty())),
        // Wildcards in a prefix are characters: `%` and `_` match only themselves, and
        // case counts (SQLite's LIKE would ignore it).
        (
            TaskFilter::new().key_prefix("a%b"),
            expect(&|s| s.2.starts_with("a%b")),
        ),
        (
            TaskFilter::new().key_prefix("a_"),
            expect(&|s| s.2.starts_with("a_")),
        ),
        (
            TaskFilter::new().key_prefix("a"),
            expect(&|s| s.2.starts_with('a')),
        ),
        (
            TaskFilter::new().key_prefix("café"),
            expect(&|s| s.2.starts_with("café")),
        ),
        (
            TaskFilter::new().created_from(at(3)).created_before(at(7)),
            expect(&|s| (3..7).contains(&s.4)),
        ),
        (TaskFilter::new().created_from(at(8)), expect(&|s| s.4 >= 8)),
        (
            TaskFilter::new()
                .task_type("export")
                .user_id("u1")
                .key_prefix("a")
                .status(TaskStatus::Failed)
                .created_before(at(1)),
            expect(&|s| s.4 == 0),
        ),
        (TaskFilter::new().task_type("nothing"), vec![]),
    ];
    for (filter, expected) in cases {
        let got = listed(&db.db, filter.clone()).await;
        assert_eq!(got, expected, "{filter:?}");
        // Oldest first: the same tasks the other way round.
        let page = db
            .db
            .list_tasks(
                &ListTasks::new(filter.clone())
                    .order(Order::OldestFirst)
                    .limit(100),
            )
            .await
            .expect("list");
        let mut oldest: Vec<Uuid> = page.tasks.iter().map(|t| t.id).collect();
        oldest.reverse();
        assert_eq!(oldest, expected, "oldest first, {filter:?}");
        assert!(page.next.is_none());
    }
}

/// Pages of 7, newest or oldest first, while tasks are inserted between pages: older
/// and newer than any listed, and with the very `created_at` of the page's last task
/// (only the id breaks the tie). Each task that existed before the first page is listed
/// exactly once, and no task twice.
async fn pages_neither_repeat_nor_skip_while_tasks_are_inserted(db: &TestDb) {
    db.migrate().await;
    for order in [Order::NewestFirst, Order::OldestFirst] {
        db.exec("DELETE FROM task_run").await;
        let mut before = HashSet::new();
        for i in 0..30 {
            // Pairs of tasks share a creation time.
            let key = format!("k{i}");
            let id = rows::insert(&db.db, ("u", "t", &key), TaskStatus::Succeeded, at(i / 2))
                .await
                .expect("seed");
            before.insert(id);
        }
        let mut seen = Vec::new();
        let mut query = ListTasks::new(TaskFilter::new()).order(order).limit(7);
        let mut inserted = 0;
        loop {
            let page = db.db.list_tasks(&query).await.expect("page");
            seen.extend(page.tasks.iter().map(|t| t.id));
            let Some(next) = page.next else { break };
            let last = page.tasks.last().expect("a page before a cursor");
            for created_at in [at(-100 - inserted), at(100 + inserted), last.created_at] {
                let key = format!("new{inserted}");
                rows::insert(&db.db, ("u", "t", &key), TaskStatus::Succeeded, created_at)
                    .await
                    .expect("insert between pages");
                inserted += 1;
            }
            query = query.after(Some(next));
        }
        let unique: HashSet<Uuid> = seen.iter().copied().collect();
        assert_eq!(unique.len(), seen.len(), "{order:?}: a task listed twice");
        assert!(before.is_subset(&unique), "{order:?}: a task skipped");
        // The order is strict throughout.
        let all = rows::all(&db.db).await;
        let position = |id: &Uuid| all.iter().position(|t| t.id == *id).expect("row");
        let positions: Vec<usize> = seen.iter().map(position).collect();
        let ascending = positions.windows(2).all(|w| w[0] < w[1]);
        let descending = positions.windows(2).all(|w| w[0] > w[1]);
        match order {
            Order::NewestFirst => assert!(descending, "{positions:?}"),
            _ => assert!(ascending, "{positions:?}"),
        }
    }
}

async fn get_task_returns_the_row(db: &TestDb) {
    db.migrate().await;
    let ids = seed(db).await;
    let task = db.db.get_task(ids[4]).await.expect("get").expect("exists");
    assert_eq!(
        (
            task.user_id.as_str(),
            task.task_type.as_str(),
            task.resource_key.as_str()
        ),
        ("u2", "mail", "a%b/1")
    );
    assert_eq!(task.created_at, at(4));
    assert_eq!(db.db.get_task(Uuid::now_v7()).await.expect("get"), None);
}

async fn counts_throughput_and_oldest_queued(db: &TestDb) {
    db.migrate().await;
    let started = task_run::now();
    let mut enqueued = Vec::new();
    for (task_type, key) in [("a", "1"), ("a", "2"), ("a", "3"), ("b", "1"), ("b", "2")] {
        let key = TaskKey::new("u", task_type, key).expect("key");
        let task = db
            .db
            .find_or_enqueue(NewTask::new(key))
            .await
            .expect("enqueue");
        enqueued.push(task.into_task());
    }
    let lease = Duration::from_secs(60);
    let first = db
        .db
        .claim("w", &["a"], lease)
        .await
        .expect("claim")
        .expect("a task");
    db.db.complete(first.id, "w", None).await.expect("complete");
    let second = db
        .db
        .claim("w", &["a"], lease)
        .await
        .expect("claim")
        .expect("a task");
    db.db
        .fail(second.id, "w", "boom", Retry::Never)
        .await
        .expect("fail");

    let counts: Vec<(String, TaskStatus, u64)> = db
        .db
        .counts()
        .await
        .expect("counts")
        .into_iter()
        .map(|c| (c.task_type, c.status, c.count))
        .collect();
    let mut expected = vec![
        ("a".to_owned(), TaskStatus::Queued, 1),
        ("a".to_owned(), TaskStatus::Succeeded, 1),
        ("a".to_owned(), TaskStatus::Failed, 1),
        ("b".to_owned(), TaskStatus::Queued, 2),
    ];
    let mut sorted = counts.clone();
    sorted.sort_by(|x, y| (&x.0, x.1.as_str()).cmp(&(&y.0, y.1.as_str())));
    expected.sort_by(|x, y| (&x.0, x.1.as_str()).cmp(&(&y.0, y.1.as_str())));
    assert_eq!(sorted, expected);

    let throughput = db.db.throughput().await.expect("throughput");
    assert_eq!(throughput.minutes.len(), 60);
    let sum =
        |f: fn(&task_dedup::MinuteCounts) -> u64| -> u64 { throughput.minutes.iter().map(f).sum() };
    assert_eq!(sum(|m| m.created), 5);
    assert_eq!(sum(|m| m.succeeded), 1);
    assert_eq!(sum(|m| m.failed), 1);
    let minutes: Vec<_> = throughput.minutes.iter().map(|m| m.minute).collect();
    assert!(
        minutes
            .windows(2)
            .all(|w| w[1] - w[0] == chrono::Duration::minutes(1))
    );
    // The database's clock and this process's agree within a minute here.
    let last = *minutes.last().expect("60 minutes");
    assert!(
        (last - started).num_seconds().abs() <= 120,
        "{last} vs {started}"
    );

    let oldest = db.db.oldest_queued().await.expect("oldest queued");
    let types: Vec<&str> = oldest.iter().map(|o| o.task_type.as_str()).collect();
    assert_eq!(types, ["a", "b"]);
    let queued_a = enqueued
        .iter()
        .filter(|t| t.task_type == "a" && t.id != first.id && t.id != second.id)
        .map(|t| t.created_at)
        .min();
    assert_eq!(Some(oldest[0].created_at), queued_a);
    assert_eq!(oldest[1].created_at, enqueued[3].created_at);
    assert!(
        oldest[0].age < Duration::from_secs(120),
        "{:?}",
        oldest[0].age
    );
}

async fn counts_up_to_stop_at_the_limit(db: &TestDb) {
    db.migrate().await;
    // Five queued tasks of one type (past the limit of 3), three cancelled of another
    // (at it).
    let seeds: &[(&str, &str, TaskStatus, i64)] = &[
        ("a", "q1", TaskStatus::Queued, 0),
        ("a", "q2", TaskStatus::Queued, 0),
        ("a", "q3", TaskStatus::Queued, 0),
        ("a", "q4", TaskStatus::Queued, 0),
        ("a", "q5", TaskStatus::Queued, 0),
        ("a", "f1", TaskStatus::Failed, 1),
        ("a", "f2", TaskStatus::Failed, 2),
        ("b", "s1", TaskStatus::Succeeded, 3),
        ("c", "c1", TaskStatus::Cancelled, 4),
        ("c", "c2", TaskStatus::Cancelled, 5),
        ("c", "c3", TaskStatus::Cancelled, 6),
        ("d", "r1", TaskStatus::Running, 7),
    ];
    for &(task_type, key, status, seconds) in seeds {
        rows::insert(&db.db, ("u", task_type, key), status, at(seconds))
            .await
            .expect("seed");
    }
    let view = |counts: Vec<task_dedup::StatusCount>| -> Vec<(String, TaskStatus, u64, bool)> {
        counts
            .into_iter()
            .map(|c| (c.task_type, c.status, c.count, c.at_least))
            .collect()
    };
    let row = |t: &str, s, n, at_least| (t.to_owned(), s, n, at_least);
    assert_eq!(
        view(db.db.counts_up_to(3).await.expect("counts up to 3")),
        [
            row("a", TaskStatus::Failed, 2, false),
            row("a", TaskStatus::Queued, 3, true),
            row("b", TaskStatus::Succeeded, 1, false),
            // Exactly the limit: exact, not "at least".
            row("c", TaskStatus::Cancelled, 3, false),
            row("d", TaskStatus::Running, 1, false),
        ]
    );
    // Under a limit no count reaches, the exact counts.
    let exact = view(db.db.counts().await.expect("counts"));
    let mut capped = view(db.db.counts_up_to(6).await.expect("counts up to 6"));
    let mut exact_sorted = exact.clone();
    exact_sorted.sort_by(|x, y| (&x.0, x.1.as_str()).cmp(&(&y.0, y.1.as_str())));
    capped.sort_by(|x, y| (&x.0, x.1.as_str()).cmp(&(&y.0, y.1.as_str())));
    assert_eq!(capped, exact_sorted);
    assert!(exact.iter().all(|c| !c.3));
    for bad in [0, MAX_COUNT_LIMIT + 1] {
        let err = db.db.counts_up_to(bad).await.expect_err("a bad limit");
        assert!(
            matches!(err, DedupError::InvalidArgument { .. }),
            "{bad}: {err:?}"
        );
    }
}

async fn retry_requeues_a_failed_or_cancelled_task(db: &TestDb) {
    db.migrate().await;
    let key = TaskKey::new("u", "t", "r").expect("key");
    let task = db
        .db
        .find_or_enqueue(NewTask::new(key.clone()))
        .await
        .expect("enqueue");
    let id = task.task().id;
    let lease = Duration::from_secs(60);
    db.db
        .claim("w", &[], lease)
        .await
        .expect("claim")
        .expect("task");
    let failed = db
        .db
        .fail(id, "w", "boom", Retry::Never)
        .await
        .expect("fail");
    assert_eq!(failed.attempts, 1);

    let retried = db.db.retry_task(id).await.expect("retry");
    assert_eq!(retried.status, TaskStatus::Queued);
    assert_eq!(retried.attempts, 0);
    assert_eq!(retried.finished_at, None);
    assert_eq!(retried.lease_owner, None);
    assert_eq!(
        retried.error.as_deref(),
        Some("boom"),
        "the last failure stays"
    );
    assert_eq!(
        db.db.get_task(id).await.expect("get"),
        Some(retried.clone())
    );
    // It holds its key again, and a worker runs it.
    let hit = db
        .db
        .find_or_enqueue(NewTask::new(key))
        .await
        .expect("enqueue");
    assert_eq!(hit.task().id, id);
    assert!(!hit.is_created());
    let claimed = db
        .db
        .claim("w", &[], lease)
        .await
        .expect("claim")
        .expect("task");
    assert_eq!((claimed.id, claimed.attempts), (id, 1));

    // Not failed or cancelled: refused, unchanged.
    match db.db.retry_task(id).await {
        Err(DedupError::InvalidTransition {
            transition: Transition::Retry,
            status: TaskStatus::Running,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    db.db.cancel_task(id, "stop").await.expect("cancel");
    assert_eq!(
        db.db.retry_task(id).await.expect("retry").status,
        TaskStatus::Queued
    );
    let done = rows::insert(&db.db, ("u", "t", "done"), TaskStatus::Succeeded, at(0))
        .await
        .expect("seed");
    assert!(matches!(
        db.db.retry_task(done).await,
        Err(DedupError::InvalidTransition {
            status: TaskStatus::Succeeded,
            ..
        })
    ));
    let missing = Uuid::now_v7();
    assert!(matches!(
        db.db.retry_task(missing).await,
        Err(DedupError::NotFound { id }) if id == missing
    ));
}

async fn retry_with_a_held_key_returns_the_holder_and_creates_nothing(db: &TestDb) {
    db.migrate().await;
    let failed = rows::insert(&db.db, ("u", "t", "r"), TaskStatus::Failed, at(0))
        .await
        .expect("seed");
    let key = TaskKey::new("u", "t", "r").expect("key");
    let holder = db
        .db
        .find_or_enqueue(NewTask::new(key))
        .await
        .expect("enqueue");
    assert!(holder.is_created());
    let before = rows::all(&db.db).await;
    match db.db.retry_task(failed).await {
        Err(DedupError::KeyHeld { id, holder: held }) => {
            assert_eq!(id, failed);
            assert_eq!(held.id, holder.task().id);
            assert_eq!(held.status, TaskStatus::Queued);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(rows::all(&db.db).await, before, "nothing changed");
    // Once the holder finished, the retry goes through.
    db.db
        .cancel_task(holder.task().id, "make way")
        .await
        .expect("cancel");
    assert_eq!(
        db.db.retry_task(failed).await.expect("retry").status,
        TaskStatus::Queued
    );
    let active = db
        .db
        .list_tasks(&ListTasks::new(
            TaskFilter::new().statuses(TaskStatus::ACTIVE),
        ))
        .await
        .expect("list");
    assert_eq!(active.tasks.len(), 1, "one active task per key");
}

async fn concurrent_retries_of_one_task_retry_it_once(db: &TestDb) {
    db.migrate().await;
    let id = rows::insert(&db.db, ("u", "t", "r"), TaskStatus::Failed, at(0))
        .await
        .expect("seed");
    let callers = 16;
    let pool = Arc::new(db.pool(callers).await);
    let start = Arc::new(Barrier::new(callers as usize));
    let mut handles = Vec::new();
    for _ in 0..callers {
        let (pool, start) = (pool.clone(), start.clone());
        handles.push(tokio::spawn(async move {
            start.wait().await;
            pool.db.retry_task(id).await
        }));
    }
    let mut retried = 0;
    let mut refused = 0;
    for handle in handles {
        match handle.await.expect("caller") {
            Ok(task) => {
                assert_eq!(task.status, TaskStatus::Queued);
                retried += 1;
            }
            Err(DedupError::InvalidTransition {
                status: TaskStatus::Queued,
                ..
            }) => refused += 1,
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!((retried, refused), (1, callers - 1));
    assert_eq!(rows::all(&db.db).await.len(), 1);
}

/// Sixteen failed tasks of one key, each retried by its own caller at once: the unique
/// index lets exactly one back in the queue; every other caller is told which task holds
/// the key, and that is the one retried. Never two active tasks of the key.
async fn concurrent_retries_of_one_keys_tasks_leave_one_active(db: &TestDb) {
    db.migrate().await;
    let callers = 16;
    let mut ids = Vec::new();
    for i in 0..callers {
        let id = rows::insert(
            &db.db,
            ("u", "t", "r"),
            TaskStatus::Failed,
            at(i64::from(i)),
        )
        .await
        .expect("seed");
        ids.push(id);
    }
    let pool = Arc::new(db.pool(callers).await);
    let start = Arc::new(Barrier::new(callers as usize));
    let mut handles = Vec::new();
    for id in ids {
        let (pool, start) = (pool.clone(), start.clone());
        handles.push(tokio::spawn(async move {
            start.wait().await;
            pool.db.retry_task(id).await
        }));
    }
    let mut retried = Vec::new();
    let mut holders = Vec::new();
    for handle in handles {
        match handle.await.expect("caller") {
            Ok(task) => retried.push(task.id),
            Err(DedupError::KeyHeld { holder, .. }) => holders.push(holder.id),
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(retried.len(), 1, "{retried:?}");
    assert_eq!(holders.len(), callers as usize - 1);
    assert!(holders.iter().all(|h| *h == retried[0]), "{holders:?}");
    let active: Vec<Uuid> = rows::all(&db.db)
        .await
        .into_iter()
        .filter(|t| t.status.is_active())
        .map(|t| t.id)
        .collect();
    assert_eq!(active, retried);
}

async fn cancel_and_delete_rules(db: &TestDb) {
    db.migrate().await;
    let key = TaskKey::new("u", "t", "r").expect("key");
    let queued = db
        .db
        .find_or_enqueue(NewTask::new(key))
        .await
        .expect("enqueue");
    let id = queued.task().id;
    match db.db.delete_task(id).await {
        Err(DedupError::InvalidTransition {
            transition: Transition::Delete,
            status: TaskStatus::Queued,
            ..
        }) => {}
        other => panic!("an active task is never deleted: {other:?}"),
    }
    let cancelled = db
        .db
        .cancel_task(id, "no longer needed")
        .await
        .expect("cancel");
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
    assert_eq!(cancelled.error.as_deref(), Some("no longer needed"));
    db.db.delete_task(id).await.expect("delete");
    assert_eq!(db.db.get_task(id).await.expect("get"), None);
    assert!(matches!(
        db.db.delete_task(id).await,
        Err(DedupError::NotFound { .. })
    ));
    let done = rows::insert(&db.db, ("u", "t", "s"), TaskStatus::Succeeded, at(0))
        .await
        .expect("seed");
    assert!(matches!(
        db.db.cancel_task(done, "late").await,
        Err(DedupError::InvalidTransition {
            transition: Transition::Cancel,
            ..
        })
    ));
    db.db.delete_task(done).await.expect("delete finished");
    assert!(rows::all(&db.db).await.is_empty());
}

async fn bulk_actions_respect_filter_status_and_limit(db: &TestDb) {
    db.migrate().await;
    let mut failed_a = Vec::new();
    for i in 0..5 {
        let key = format!("f{i}");
        let id = rows::insert(&db.db, ("u", "a", &key), TaskStatus::Failed, at(i))
            .await
            .expect("seed");
        failed_a.push(id);
    }
    for i in 0..2 {
        let key = format!("f{i}");
        rows::insert(&db.db, ("u", "b", &key), TaskStatus::Failed, at(10 + i))
            .await
            .expect("seed");
    }
    for i in 0..4 {
        let key = format!("q{i}");
        rows::insert(&db.db, ("u", "a", &key), TaskStatus::Queued, at(20 + i))
            .await
            .expect("seed");
    }
    let type_a = TaskFilter::new().task_type("a");

    // Retry: only failed or cancelled, oldest first, at most the limit.
    let outcome = db.db.retry_tasks(&type_a, 3).await.expect("retry");
    assert_eq!(
        (
            outcome.selected,
            outcome.applied,
            outcome.key_held,
            outcome.skipped
        ),
        (3, 3, 0, 0)
    );
    for (i, id) in failed_a.iter().enumerate() {
        let status = db.db.get_task(*id).await.expect("get").expect("row").status;
        let expected = if i < 3 {
            TaskStatus::Queued
        } else {
            TaskStatus::Failed
        };
        assert_eq!(status, expected, "task {i}");
    }
    // A filter whose statuses the action does not apply to selects nothing.
    let none = db
        .db
        .retry_tasks(&type_a.clone().status(TaskStatus::Queued), 10)
        .await
        .expect("retry");
    assert_eq!(none, task_dedup::BulkOutcome::default());

    // Cancel: the queued ones of type a (3 retried + 4 seeded), 5 of them.
    let outcome = db
        .db
        .cancel_tasks(&type_a, 5, "bulk")
        .await
        .expect("cancel");
    assert_eq!((outcome.selected, outcome.applied), (5, 5));
    let queued_a = type_a.clone().status(TaskStatus::Queued);
    assert_eq!(listed(&db.db, queued_a.clone()).await.len(), 2);
    let outcome = db
        .db
        .cancel_tasks(&queued_a, 100, "bulk")
        .await
        .expect("cancel");
    assert_eq!((outcome.selected, outcome.applied), (2, 2));

    // Delete: finished tasks only; type b untouched.
    let outcome = db
        .db
        .delete_tasks(&type_a, MAX_ADMIN_BATCH)
        .await
        .expect("delete");
    assert_eq!((outcome.selected, outcome.applied), (9, 9));
    let left = rows::all(&db.db).await;
    assert_eq!(left.len(), 2);
    assert!(left.iter().all(|t| t.task_type == "b"));
}

async fn bulk_retry_counts_held_keys(db: &TestDb) {
    db.migrate().await;
    for key in ["r0", "r1", "r2"] {
        rows::insert(&db.db, ("u", "t", key), TaskStatus::Failed, at(0))
            .await
            .expect("seed");
    }
    let key = TaskKey::new("u", "t", "r1").expect("key");
    let holder = db
        .db
        .find_or_enqueue(NewTask::new(key))
        .await
        .expect("enqueue");
    let outcome = db
        .db
        .retry_tasks(&TaskFilter::new(), 10)
        .await
        .expect("retry");
    assert_eq!(
        (
            outcome.selected,
            outcome.applied,
            outcome.key_held,
            outcome.skipped
        ),
        (3, 2, 1, 0)
    );
    let all = rows::all(&db.db).await;
    assert_eq!(all.len(), 4, "nothing created");
    let r1: Vec<&task_run::Model> = all.iter().filter(|t| t.resource_key == "r1").collect();
    assert_eq!(r1.len(), 2);
    for task in r1 {
        let expected = if task.id == holder.task().id {
            TaskStatus::Queued
        } else {
            TaskStatus::Failed
        };
        assert_eq!(task.status, expected);
    }
}

/// On a database without `task_run`, any statement would fail: input errors coming back
/// instead show that they were found before any SQL ran.
async fn bad_input_is_refused_before_sql(db: &TestDb) {
    let invalid = |outcome: Result<task_dedup::Page, DedupError>, name: &str| match outcome {
        Err(DedupError::InvalidArgument { name: got, .. }) if got == name => {}
        other => panic!("{name}: {other:?}"),
    };
    let list = |filter: TaskFilter, limit: usize| ListTasks::new(filter).limit(limit);
    invalid(db.db.list_tasks(&list(TaskFilter::new(), 0)).await, "limit");
    invalid(
        db.db
            .list_tasks(&list(TaskFilter::new(), MAX_ADMIN_BATCH + 1))
            .await,
        "limit",
    );
    invalid(
        db.db
            .list_tasks(&list(TaskFilter::new().task_type(""), 10))
            .await,
        "task_type",
    );
    invalid(
        db.db
            .list_tasks(&list(TaskFilter::new().task_type("x".repeat(65)), 10))
            .await,
        "task_type",
    );
    invalid(
        db.db
            .list_tasks(&list(TaskFilter::new().task_type("a\0b"), 10))
            .await,
        "task_type",
    );
    invalid(
        db.db
            .list_tasks(&list(TaskFilter::new().user_id("u".repeat(65)), 10))
            .await,
        "user_id",
    );
    invalid(
        db.db
            .list_tasks(&list(TaskFilter::new().key_prefix(""), 10))
            .await,
        "key_prefix",
    );
    invalid(
        db.db
            .list_tasks(&list(
                TaskFilter::new().created_from(at(5)).created_before(at(5)),
                10,
            ))
            .await,
        "created_before",
    );
    for bad in [
        "",
        "x",
        "1.nope",
        "1.2.3",
        "+1.0190a8c2-5b1e-7c3d-8e4f-a1b2c3d4e5f6",
    ] {
        assert!(
            matches!(
                bad.parse::<Cursor>(),
                Err(DedupError::InvalidArgument { name: "cursor", .. })
            ),
            "{bad:?}"
        );
    }
    let bulk_invalid =
        |outcome: Result<task_dedup::BulkOutcome, DedupError>, name: &str| match outcome {
            Err(DedupError::InvalidArgument { name: got, .. }) if got == name => {}
            other => panic!("{name}: {other:?}"),
        };
    bulk_invalid(db.db.retry_tasks(&TaskFilter::new(), 0).await, "limit");
    bulk_invalid(
        db.db
            .cancel_tasks(&TaskFilter::new(), MAX_ADMIN_BATCH + 1, "x")
            .await,
        "limit",
    );
    bulk_invalid(
        db.db.cancel_tasks(&TaskFilter::new(), 10, "a\0").await,
        "reason",
    );
    bulk_invalid(
        db.db
            .delete_tasks(&TaskFilter::new().task_type(""), 10)
            .await,
        "task_type",
    );
    // Valid input does reach the database, which has no table.
    assert!(matches!(
        db.db.list_tasks(&ListTasks::new(TaskFilter::new())).await,
        Err(DedupError::Database(_))
    ));
}

async fn actions_in_a_rolled_back_transaction_leave_nothing(db: &TestDb) {
    db.migrate().await;
    let failed = rows::insert(&db.db, ("u", "t", "f"), TaskStatus::Failed, at(0))
        .await
        .expect("seed");
    let done = rows::insert(&db.db, ("u", "t", "d"), TaskStatus::Succeeded, at(1))
        .await
        .expect("seed");
    let queued = rows::insert(&db.db, ("u", "t", "q"), TaskStatus::Queued, at(2))
        .await
        .expect("seed");
    let held = rows::insert(&db.db, ("u", "t", "q"), TaskStatus::Failed, at(3))
        .await
        .expect("seed");
    let before = rows::all(&db.db).await;

    let txn = db.db.begin().await.expect("begin");
    assert_eq!(
        txn.retry_task(failed).await.expect("retry").status,
        TaskStatus::Queued
    );
    txn.delete_task(done).await.expect("delete");
    txn.cancel_task(queued, "txn").await.expect("cancel");
    // The key of `held` is free now inside the transaction (its holder is cancelled).
    assert_eq!(
        txn.retry_task(held).await.expect("retry").status,
        TaskStatus::Queued
    );
    // A held key inside the transaction does not abort it (PostgreSQL: a savepoint).
    let other = rows::insert(&txn, ("u", "t", "f"), TaskStatus::Failed, at(4))
        .await
        .expect("seed in txn");
    assert!(matches!(
        txn.retry_task(other).await,
        Err(DedupError::KeyHeld { holder, .. }) if holder.id == failed
    ));
    let page = txn
        .list_tasks(&ListTasks::new(
            TaskFilter::new().status(TaskStatus::Queued),
        ))
        .await
        .expect("the transaction is still usable");
    assert_eq!(page.tasks.len(), 2);
    let outcome = txn
        .delete_tasks(&TaskFilter::new(), MAX_ADMIN_BATCH)
        .await
        .expect("bulk delete");
    assert_eq!(outcome.applied, 2, "the cancelled and the new failed task");
    txn.rollback().await.expect("rollback");

    assert_eq!(rows::all(&db.db).await, before);
    if db.dialect == Dialect::Sqlite {
        // Nothing is left holding SQLite's write lock either.
        db.db
            .retry_task(failed)
            .await
            .expect("retry after rollback");
    }
}
