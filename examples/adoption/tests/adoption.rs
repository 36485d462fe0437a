//! The blog adopts task-dedup, on every dialect: its migrator (task-dedup's migrations
//! after its own) or an entity-first schema, its `DbErr` services enqueueing in their
//! transactions, concurrent edits of one post, and a worker on its own pool.

#![allow(clippy::expect_used, clippy::unwrap_used)] // tests may panic on what they did not expect

use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::{TestDb, matrix};
use sea_orm::EntityTrait;
use sea_orm_migration::MigratorTrait;
use task_dedup::{CancellationToken, Enqueued, TaskDedup};
use task_dedup_adoption::entity::post;
use task_dedup_adoption::migration::Migrator;
use task_dedup_adoption::{service, worker};
use tokio::sync::Barrier;

matrix!(
    the_migrator_appends_task_dedup_after_the_blog,
    concurrent_edits_queue_one_reindex_and_the_worker_indexes_the_last,
    an_entity_first_schema_is_guarded,
);

/// The blog's migrations, then task-dedup's; `down` of one step undoes task-dedup's
/// latest, never the blog's own.
async fn the_migrator_appends_task_dedup_after_the_blog(db: &TestDb) {
    Migrator::up(&db.db, None).await.expect("up");
    let names: Vec<String> = Migrator::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    assert_eq!(names[0], "m20270101_000001_create_post");
    assert!(
        names[1..].iter().all(|name| name.contains("task_dedup")),
        "{names:?}"
    );
    Migrator::down(&db.db, Some(1)).await.expect("down one");
    let pending: Vec<String> = Migrator::get_pending_migrations(&db.db)
        .await
        .expect("pending")
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    assert_eq!(
        pending,
        [names[names.len() - 1].clone()],
        "task-dedup's last step"
    );
    post::Entity::find()
        .all(&db.db)
        .await
        .expect("the blog's table stayed");
    Migrator::up(&db.db, None).await.expect("up again");
    service::create_post(&db.db, "first post")
        .await
        .expect("create after up");
}

/// Eight editors save one post together while its reindex is queued: one reindex task,
/// seven joins, never an error; the worker then indexes the last revision.
async fn concurrent_edits_queue_one_reindex_and_the_worker_indexes_the_last(db: &TestDb) {
    Migrator::up(&db.db, None).await.expect("up");
    let pool = db.pool(8).await;
    let post = service::create_post(&pool, "draft").await.expect("create");
    let start = Arc::new(Barrier::new(8));
    let mut editors = Vec::new();
    for editor in 0..8 {
        let (db, start) = (pool.db.clone(), start.clone());
        editors.push(tokio::spawn(async move {
            start.wait().await;
            service::edit_post(&db, post.id, &format!("edit by {editor}")).await
        }));
    }
    let mut created = 0;
    for editor in editors {
        let outcome = editor.await.expect("editor").expect("edit");
        created += usize::from(matches!(outcome, Enqueued::Created(_)));
    }
    // The create already queued the reindex; every edit joined it.
    assert_eq!(
        created, 0,
        "the reindex queued by the create took every edit"
    );
    let queued = pool
        .find_active(&service::reindex(post.id).expect("key").key().clone())
        .await
        .expect("read")
        .expect("queued");
    assert_eq!(queued.status, task_dedup::TaskStatus::Queued);

    let reindexer = worker::reindexer(&db.url, 3).await.expect("worker");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(reindexer.run(shutdown.clone()));
    let started = Instant::now();
    loop {
        let stored = post::Entity::find_by_id(post.id)
            .one(&pool.db)
            .await
            .expect("read")
            .expect("post");
        if stored.indexed_revision == stored.revision {
            assert_eq!(stored.revision, 9, "the create and eight edits");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not indexed: {stored:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let report = running.await.expect("worker task").expect("worker");
    assert_eq!(
        report.completed, 1,
        "one reindex for nine writes: {report:?}"
    );
}

/// The entity-first workflow: the blog's entity and a guarded `task_run`.
async fn an_entity_first_schema_is_guarded(db: &TestDb) {
    let builder = db.db.get_schema_builder().register(post::Entity);
    task_dedup::migration::apply_with_task_run(builder, &db.db)
        .await
        .expect("schema");
    let post = service::create_post(&db.db, "entity-first")
        .await
        .expect("create");
    let again = service::request_reindex(&db.db, post.id)
        .await
        .expect("request");
    assert!(!again.is_created(), "the create's reindex holds the key");
}
