//! Typed tasks: the `Task` trait, typed enqueue (single, bulk, in a transaction), a
//! Worker that routes each type to its handler under its own limit, bad payloads and
//! results, and the testing helpers, on every dialect.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use harness::{TestDb, matrix};
use sea_orm::{DatabaseConnection, EntityTrait, PaginatorTrait, TransactionTrait};
use serde::{Deserialize, Serialize};
use serde_json::json;
use task_dedup::task_run::{self, TaskStatus};
use task_dedup::{
    CancellationToken, DedupError, HandlerError, Job, KeyField, NewTask, RetryPolicy, Scope, Task,
    TaskDedup, TaskKey, TaskOptions, Worker, testing,
};

matrix!(
    typed_round_trip_stores_and_decodes,
    thirty_two_typed_callers_create_one_task,
    per_call_overrides_change_only_that_task,
    two_types_keep_their_own_limits_under_load,
    an_undecodable_payload_fails_for_good_at_once,
    an_unregistered_type_is_left_unclaimed,
    typed_bulk_keeps_the_first_of_a_repeated_key,
    a_rolled_back_transaction_leaves_no_typed_task,
    a_result_that_does_not_serialize_fails_the_attempt,
    a_handler_extends_its_lease_and_a_type_sets_its_own,
    drain_runs_due_tasks_inline_and_reports_them,
    assert_enqueued_finds_by_fields_and_fails_when_absent,
);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct RenderPdf {
    user: String,
    document_id: i64,
    revision: u32,
}

impl Task for RenderPdf {
    const TASK_TYPE: &'static str = "render-pdf";

    fn user_id(&self) -> Option<String> {
        Some(self.user.clone())
    }

    fn resource_key(&self) -> String {
        format!("document/{}", self.document_id)
    }

    fn options() -> TaskOptions {
        TaskOptions::default().scope(Scope::Queued).priority(3)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Thumbnail {
    image_id: u64,
}

impl Task for Thumbnail {
    const TASK_TYPE: &'static str = "thumbnail";

    fn resource_key(&self) -> String {
        format!("image/{}", self.image_id)
    }
}

#[derive(Debug, Serialize)]
struct Rendered {
    pages: u32,
    document_id: i64,
}

fn render(document_id: i64, revision: u32) -> RenderPdf {
    RenderPdf {
        user: "user-1".to_owned(),
        document_id,
        revision,
    }
}

async fn load(db: &DatabaseConnection, id: uuid::Uuid) -> task_run::Model {
    task_run::Entity::find_by_id(id)
        .one(db)
        .await
        .expect("load")
        .expect("row exists")
}

/// Runs `worker` until `done` says so (checked every 10 ms), at most 10 s; its report.
async fn run_until(
    worker: Worker,
    db: &DatabaseConnection,
    done: impl AsyncFn(&DatabaseConnection) -> bool,
) -> task_dedup::WorkerReport {
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let started = Instant::now();
    while !done(db).await {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the worker did not finish in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    running.await.expect("worker task").expect("worker")
}

async fn count_status(db: &DatabaseConnection, status: TaskStatus) -> u64 {
    use sea_orm::{ColumnTrait, QueryFilter};
    task_run::Entity::find()
        .filter(task_run::Column::Status.eq(status))
        .count(db)
        .await
        .expect("count")
}

fn quick(builder: task_dedup::WorkerBuilder) -> task_dedup::WorkerBuilder {
    builder
        .poll_interval(Duration::from_millis(10), Duration::from_millis(50))
        .fallback_poll(Duration::from_millis(200))
        .batch_endings(100, Duration::ZERO)
}

async fn typed_round_trip_stores_and_decodes(db: &TestDb) {
    db.migrate().await;
    let task = render(42, 1);
    let created = db.db.enqueue(&task).await.expect("enqueue");
    assert!(created.is_created());
    let stored = created.task();
    assert_eq!(
        (
            stored.user_id.as_str(),
            stored.task_type.as_str(),
            stored.resource_key.as_str()
        ),
        ("user-1", "render-pdf", "document/42")
    );
    assert_eq!(stored.scope, task_run::TaskScope::Queued);
    assert_eq!(stored.priority, 3);
    assert_eq!(created.decode::<RenderPdf>().expect("decodes"), task);

    // A hit returns the holder's payload, not this call's.
    let again = db.db.enqueue(&render(42, 2)).await.expect("enqueue");
    assert!(!again.is_created());
    assert_eq!(again.task().id, stored.id);
    assert_eq!(again.decode::<RenderPdf>().expect("decodes").revision, 1);
    // Decoding as another type names both types.
    match again.decode::<Thumbnail>() {
        Err(DedupError::Decode { task_type, .. }) => assert_eq!(task_type, "render-pdf"),
        other => panic!("{other:?}"),
    }

    let worker = quick(Worker::builder(db.db.clone()))
        .register::<RenderPdf>(|job: Job<RenderPdf>| async move {
            assert_eq!(job.attempt(), 1);
            assert_eq!(job.resource_key(), "document/42");
            assert_eq!(job.user_id(), "user-1");
            Ok::<_, HandlerError>(Rendered {
                pages: job.args.revision * 10,
                document_id: job.args.document_id,
            })
        })
        .build()
        .expect("worker");
    let report = run_until(worker, &db.db, async |db| {
        count_status(db, TaskStatus::Succeeded).await == 1
    })
    .await;
    assert_eq!((report.claimed, report.completed), (1, 1));
    let done = load(&db.db, stored.id).await;
    assert_eq!(done.result, Some(json!({"pages": 10, "document_id": 42})));
    assert_eq!(
        task_dedup::decode::<RenderPdf>(&done).expect("decodes"),
        task
    );
}

async fn thirty_two_typed_callers_create_one_task(db: &TestDb) {
    db.migrate().await;
    const CALLERS: usize = 32;
    let pool = db.pool(CALLERS as u32).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(CALLERS));
    let calls = (0..CALLERS).map(|i| {
        let (conn, barrier) = (pool.db.clone(), barrier.clone());
        tokio::spawn(async move {
            let task = render(77, i as u32);
            barrier.wait().await;
            conn.enqueue(&task).await.expect("enqueue")
        })
    });
    let mut outcomes = Vec::new();
    for call in calls.collect::<Vec<_>>() {
        outcomes.push(call.await.expect("caller"));
    }
    assert_eq!(outcomes.iter().filter(|o| o.is_created()).count(), 1);
    let id = outcomes[0].task().id;
    assert!(outcomes.iter().all(|o| o.task().id == id));
    assert_eq!(
        task_run::Entity::find().count(&db.db).await.expect("count"),
        1
    );
}

async fn per_call_overrides_change_only_that_task(db: &TestDb) {
    db.migrate().await;
    let later = chrono::Utc::now() + Duration::from_secs(3_600);
    let task = NewTask::from_task(&render(1, 1))
        .expect("valid")
        .run_at(later)
        .priority(-5)
        .scope(Scope::Active);
    let stored = db.db.find_or_enqueue(task).await.expect("enqueue");
    let stored = stored.task();
    assert_eq!(stored.priority, -5);
    assert_eq!(stored.scope, task_run::TaskScope::Active);
    assert!(stored.run_at > chrono::Utc::now() + Duration::from_secs(3_000));
    // The type's defaults are untouched for the next task.
    let next = db.db.enqueue(&render(2, 1)).await.expect("enqueue");
    assert_eq!(next.task().priority, 3);
    // Bad input is refused before any SQL: the key's fields and the type name.
    let bad = RenderPdf {
        user: String::new(),
        document_id: 3,
        revision: 1,
    };
    match db.db.enqueue(&bad).await {
        Err(DedupError::InvalidKey { field, .. }) => assert_eq!(field, KeyField::UserId),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        task_run::Entity::find().count(&db.db).await.expect("count"),
        2
    );
}

/// Tracks how many run at once and the most ever seen.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    most: AtomicUsize,
    runs: AtomicUsize,
}

impl Gauge {
    async fn hold(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        self.runs.fetch_add(1, Ordering::SeqCst);
    }
}

async fn two_types_keep_their_own_limits_under_load(db: &TestDb) {
    db.migrate().await;
    let renders: Vec<RenderPdf> = (0..24).map(|i| render(i, 1)).collect();
    let thumbnails: Vec<Thumbnail> = (0..24).map(|i| Thumbnail { image_id: i }).collect();
    db.db.enqueue_many(&renders).await.expect("renders");
    db.db.enqueue_many(&thumbnails).await.expect("thumbnails");
    let (pdf, thumb) = (Arc::new(Gauge::default()), Arc::new(Gauge::default()));
    let worker = quick(Worker::builder(db.db.clone()))
        .concurrency(8)
        .register::<RenderPdf>({
            let pdf = pdf.clone();
            move |_: Job<RenderPdf>| {
                let pdf = pdf.clone();
                async move {
                    pdf.hold().await;
                    Ok::<_, HandlerError>(())
                }
            }
        })
        .register::<Thumbnail>({
            let thumb = thumb.clone();
            move |_: Job<Thumbnail>| {
                let thumb = thumb.clone();
                async move {
                    thumb.hold().await;
                    Ok::<_, HandlerError>(())
                }
            }
        })
        .task_type_concurrency("render-pdf", 2)
        .task_type_concurrency("thumbnail", 3)
        .build()
        .expect("worker");
    let report = run_until(worker, &db.db, async |db| {
        count_status(db, TaskStatus::Succeeded).await == 48
    })
    .await;
    assert_eq!(report.completed, 48);
    assert_eq!(pdf.runs.load(Ordering::SeqCst), 24);
    assert_eq!(thumb.runs.load(Ordering::SeqCst), 24);
    // Never over the limit, and the limit reached: the load was there to break it.
    assert_eq!(pdf.most.load(Ordering::SeqCst), 2);
    assert_eq!(thumb.most.load(Ordering::SeqCst), 3);
}

async fn an_undecodable_payload_fails_for_good_at_once(db: &TestDb) {
    db.migrate().await;
    let key = TaskKey::new("user-1", "render-pdf", "document/9").expect("key");
    let id = db
        .db
        .find_or_enqueue(NewTask::new(key).with_payload(json!({"document_id": "nine"})))
        .await
        .expect("enqueue")
        .task()
        .id;
    let ran = Arc::new(AtomicUsize::new(0));
    let worker = quick(Worker::builder(db.db.clone()))
        .retry_policy(RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::ZERO,
            max_delay: Duration::ZERO,
            jitter: 0.0,
        })
        .register::<RenderPdf>({
            let ran = ran.clone();
            move |_: Job<RenderPdf>| {
                ran.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, HandlerError>(()) }
            }
        })
        .build()
        .expect("worker");
    run_until(worker, &db.db, async |db| {
        count_status(db, TaskStatus::Failed).await == 1
    })
    .await;
    let failed = load(&db.db, id).await;
    assert_eq!(failed.attempts, 1, "no retry loop");
    let error = failed.error.expect("an error");
    assert!(
        error.contains("render-pdf") && error.contains("RenderPdf"),
        "{error}"
    );
    assert!(error.contains("invalid type"), "{error}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the handler never saw it");
}

async fn an_unregistered_type_is_left_unclaimed(db: &TestDb) {
    db.migrate().await;
    let other = TaskKey::new("user-1", "render-pdfs", "document/1").expect("key");
    let other = db
        .db
        .find_or_enqueue(NewTask::new(other))
        .await
        .expect("enqueue")
        .task()
        .id;
    db.db
        .enqueue(&Thumbnail { image_id: 1 })
        .await
        .expect("enqueue");
    let worker = quick(Worker::builder(db.db.clone()))
        .register::<Thumbnail>(|_: Job<Thumbnail>| async { Ok::<_, HandlerError>(()) })
        .build()
        .expect("worker");
    let report = run_until(worker, &db.db, async |db| {
        count_status(db, TaskStatus::Succeeded).await == 1
    })
    .await;
    assert_eq!(report.claimed, 1);
    let untouched = load(&db.db, other).await;
    assert_eq!(
        (untouched.status, untouched.attempts),
        (TaskStatus::Queued, 0)
    );
}

async fn typed_bulk_keeps_the_first_of_a_repeated_key(db: &TestDb) {
    db.migrate().await;
    let batch = [render(1, 1), render(2, 1), render(1, 2)];
    let outcomes = db.db.enqueue_many(&batch).await.expect("bulk");
    assert!(outcomes[0].is_created() && outcomes[1].is_created());
    assert!(!outcomes[2].is_created());
    assert_eq!(outcomes[2].task().id, outcomes[0].task().id);
    assert_eq!(
        outcomes[2].decode::<RenderPdf>().expect("decodes").revision,
        1
    );
    // An invalid item is named by its index, and nothing of the batch is written.
    let bad = [
        render(3, 1),
        RenderPdf {
            user: "u\0".to_owned(),
            document_id: 4,
            revision: 1,
        },
    ];
    match db.db.enqueue_many(&bad).await {
        Err(DedupError::InvalidItem { index, .. }) => assert_eq!(index, 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        task_run::Entity::find().count(&db.db).await.expect("count"),
        2
    );
}

async fn a_rolled_back_transaction_leaves_no_typed_task(db: &TestDb) {
    db.migrate().await;
    let txn = db.db.begin().await.expect("begin");
    let created = txn.enqueue(&render(5, 1)).await.expect("enqueue");
    assert!(created.is_created());
    let batch = txn
        .enqueue_many(&[Thumbnail { image_id: 1 }, Thumbnail { image_id: 2 }])
        .await
        .expect("bulk");
    assert_eq!(batch.len(), 2);
    txn.rollback().await.expect("rollback");
    assert_eq!(
        task_run::Entity::find().count(&db.db).await.expect("count"),
        0
    );
}

async fn a_result_that_does_not_serialize_fails_the_attempt(db: &TestDb) {
    db.migrate().await;
    #[derive(Serialize, Deserialize)]
    struct Report {
        id: u32,
    }
    impl Task for Report {
        const TASK_TYPE: &'static str = "report";
        fn resource_key(&self) -> String {
            self.id.to_string()
        }
        fn options() -> TaskOptions {
            // One attempt: the failure is final and visible at once.
            TaskOptions::default().retry(RetryPolicy {
                max_attempts: 1,
                ..RetryPolicy::default()
            })
        }
    }
    let id = db
        .db
        .enqueue(&Report { id: 1 })
        .await
        .expect("enqueue")
        .task()
        .id;
    let worker = quick(Worker::builder(db.db.clone()))
        .register::<Report>(|_: Job<Report>| async {
            // JSON object keys must be strings.
            Ok::<_, HandlerError>(HashMap::from([((1, 2), "cell")]))
        })
        .build()
        .expect("worker");
    run_until(worker, &db.db, async |db| {
        count_status(db, TaskStatus::Failed).await == 1
    })
    .await;
    let failed = load(&db.db, id).await;
    let error = failed.error.expect("error");
    assert!(
        error.contains("result of task type `report`") && error.contains("does not serialize"),
        "{error}"
    );
}

async fn a_handler_extends_its_lease_and_a_type_sets_its_own(db: &TestDb) {
    db.migrate().await;
    #[derive(Serialize, Deserialize)]
    struct Upload {
        file: u32,
    }
    impl Task for Upload {
        const TASK_TYPE: &'static str = "upload";
        fn resource_key(&self) -> String {
            self.file.to_string()
        }
        fn options() -> TaskOptions {
            TaskOptions::default().lease(Duration::from_secs(600))
        }
    }
    let id = db
        .db
        .enqueue(&Upload { file: 1 })
        .await
        .expect("enqueue")
        .task()
        .id;
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let (release, finish) = (CancellationToken::new(), CancellationToken::new());
    let worker = quick(Worker::builder(db.db.clone()))
        .lease(Duration::from_secs(30))
        .register::<Upload>({
            let (release, finish) = (release.clone(), finish.clone());
            move |job: Job<Upload>| {
                let (seen_tx, release, finish) = (seen_tx.clone(), release.clone(), finish.clone());
                async move {
                    assert_eq!(job.lease().current(), Duration::from_secs(600));
                    let refused = job.lease().extend(Duration::ZERO).await;
                    assert!(matches!(refused, Err(DedupError::InvalidArgument { .. })));
                    seen_tx.send("started").expect("send");
                    release.cancelled().await;
                    job.lease()
                        .extend(Duration::from_secs(3_600))
                        .await
                        .map_err(HandlerError::retry)?;
                    seen_tx.send("extended").expect("send");
                    finish.cancelled().await;
                    Ok::<_, HandlerError>(())
                }
            }
        })
        .build()
        .expect("worker");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    assert_eq!(seen_rx.recv().await, Some("started"));
    // The first heartbeat, at once, renewed the claim's 30 s for the type's 10 minutes.
    let lease_left = async || {
        let task = load(&db.db, id).await;
        task.lease_expires_at.expect("leased") - chrono::Utc::now()
    };
    let started = Instant::now();
    while lease_left().await < chrono::TimeDelta::seconds(500) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the type's lease never applied"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    release.cancel();
    assert_eq!(seen_rx.recv().await, Some("extended"));
    assert!(lease_left().await > chrono::TimeDelta::seconds(3_000));
    finish.cancel();
    shutdown.cancel();
    running.await.expect("worker task").expect("worker");
}

async fn drain_runs_due_tasks_inline_and_reports_them(db: &TestDb) {
    db.migrate().await;
    db.db
        .enqueue(&Thumbnail { image_id: 1 })
        .await
        .expect("enqueue");
    db.db
        .enqueue(&Thumbnail { image_id: 2 })
        .await
        .expect("enqueue");
    db.db
        .enqueue(&Thumbnail { image_id: 0 })
        .await
        .expect("enqueue");
    db.db
        .enqueue(&Thumbnail { image_id: 7 })
        .await
        .expect("enqueue");
    let later = NewTask::from_task(&Thumbnail { image_id: 3 })
        .expect("valid")
        .run_at(chrono::Utc::now() + Duration::from_secs(3_600));
    db.db.find_or_enqueue(later).await.expect("enqueue");
    let worker = Worker::builder(db.db.clone())
        .retry_policy(RetryPolicy {
            max_attempts: 3,
            base_delay: Duration::from_secs(60),
            max_delay: Duration::from_secs(60),
            jitter: 0.0,
        })
        .register::<Thumbnail>(|job: Job<Thumbnail>| async move {
            match job.args.image_id {
                0 => Err(HandlerError::fail("no image 0")),
                7 => Err(HandlerError::retry("image 7 is busy")),
                id => Ok(id * 100),
            }
        })
        .build()
        .expect("worker");
    let drained = testing::drain(&worker).await.expect("drain");
    assert_eq!(drained.len(), 4, "the scheduled task is not due");
    let results: Vec<_> = drained.completed.iter().map(|t| t.result.clone()).collect();
    assert_eq!(results, [Some(json!(100)), Some(json!(200))]);
    assert_eq!(drained.failed.len(), 1);
    assert_eq!(drained.failed[0].error.as_deref(), Some("no image 0"));
    assert_eq!(drained.retried.len(), 1);
    assert_eq!(drained.retried[0].status, TaskStatus::Queued);
    // Nothing left that is due: a second drain runs nothing.
    assert!(testing::drain(&worker).await.expect("drain").is_empty());
}

async fn assert_enqueued_finds_by_fields_and_fails_when_absent(db: &TestDb) {
    db.migrate().await;
    db.db.enqueue(&render(8, 4)).await.expect("enqueue");
    db.db.enqueue(&render(9, 1)).await.expect("enqueue");
    let (task, args) =
        testing::assert_enqueued::<RenderPdf, _>(&db.db, json!({"document_id": 9})).await;
    assert_eq!(args, render(9, 1));
    assert_eq!(task.resource_key, "document/9");
    let all = testing::enqueued::<RenderPdf, _>(&db.db)
        .await
        .expect("list");
    assert_eq!(all.len(), 2);
    // Absent: the assertion fails, naming what is there.
    let conn = db.db.clone();
    let absent = tokio::spawn(async move {
        testing::assert_enqueued::<RenderPdf, _>(&conn, json!({"document_id": 10})).await
    })
    .await;
    let panic = absent.expect_err("no such task").into_panic();
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("render-pdf") && message.contains("\"document_id\":8"),
        "{message}"
    );
}

#[tokio::test]
async fn the_builder_refuses_bad_registrations() {
    #[derive(Serialize, Deserialize)]
    struct Nameless;
    impl Task for Nameless {
        const TASK_TYPE: &'static str = "";
        fn resource_key(&self) -> String {
            "x".to_owned()
        }
    }
    let db = testing::sqlite_memory().await.expect("database");
    let ok = |_: Job<Thumbnail>| async { Ok::<_, HandlerError>(()) };
    let untyped = |_: task_run::Model, _: CancellationToken| async { Ok(None) };
    let refused = |built: Result<Worker, DedupError>| match built {
        Err(err) => err,
        Ok(_) => panic!("built"),
    };
    match refused(
        Worker::builder(db.clone())
            .register::<Thumbnail>(ok)
            .register::<Thumbnail>(ok)
            .build(),
    ) {
        DedupError::DuplicateTaskType { task_type } => assert_eq!(task_type, "thumbnail"),
        other => panic!("{other}"),
    }
    match refused(
        Worker::builder(db.clone())
            .register::<Thumbnail>(ok)
            .handler(untyped)
            .task_types(["thumbnail"])
            .build(),
    ) {
        DedupError::DuplicateTaskType { task_type } => assert_eq!(task_type, "thumbnail"),
        other => panic!("{other}"),
    }
    let nameless = |_: Job<Nameless>| async { Ok::<_, HandlerError>(()) };
    match refused(
        Worker::builder(db.clone())
            .register::<Nameless>(nameless)
            .build(),
    ) {
        DedupError::InvalidArgument { name, .. } => assert_eq!(name, "register"),
        other => panic!("{other}"),
    }
    // The untyped handler beside typed ones must say which types it runs.
    match refused(
        Worker::builder(db.clone())
            .register::<Thumbnail>(ok)
            .handler(untyped)
            .build(),
    ) {
        DedupError::InvalidArgument { name, .. } => assert_eq!(name, "task_types"),
        other => panic!("{other}"),
    }
    match refused(
        Worker::builder(db.clone())
            .register::<Thumbnail>(ok)
            .task_type_concurrency("render-pdf", 2)
            .build(),
    ) {
        DedupError::InvalidArgument { name, .. } => assert_eq!(name, "task_type_concurrency"),
        other => panic!("{other}"),
    }
    // Both kinds in one worker: fine.
    Worker::builder(db.clone())
        .register::<Thumbnail>(ok)
        .handler(untyped)
        .task_types(["legacy"])
        .build()
        .expect("typed beside untyped");
}
