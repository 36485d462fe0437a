//! Never silently unguarded: a `task_run` without its unique index is refused before
//! anything is written, on a pool and in a transaction; SeaORM's entity-first workflow
//! gets a guarded table through `apply_with_task_run`. On every dialect.
//!
//! A test binary of its own (`[[test]] guard` in Cargo.toml, not a module of
//! `enqueue/main.rs`): the check is cached per process (for transactions, per dialect),
//! so a transaction's first check here must not follow another test's.

use std::sync::Arc;

use harness::{TestDb, matrix, rows};
use sea_orm::{ActiveModelTrait, ConnectionTrait, TransactionTrait};
use task_dedup::{DedupError, NewTask, TaskDedup, TaskKey, task_run};
use tokio::sync::Barrier;

matrix!(
    a_table_without_its_index_is_refused,
    entity_first_tables_get_the_guarantee_with_the_helper,
);

/// An application's entity, made entity-first beside `task_run`.
mod note {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "note")]
    pub struct Model {
        #[sea_orm(primary_key)]
        pub id: i32,
        pub body: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

fn key(resource: &str) -> TaskKey {
    TaskKey::new("user-1", "render", resource).expect("valid key")
}

fn assert_unguarded(outcome: Result<impl std::fmt::Debug, DedupError>) {
    match outcome {
        Err(err @ DedupError::Unguarded { .. }) => {
            let message = err.to_string();
            assert!(
                message.contains("task_active_resource_uidx") && message.contains("ensure_schema"),
                "the error names the index and the fix: {message}"
            );
        }
        other => panic!("expected Unguarded, got {other:?}"),
    }
}

/// 16 callers released together on one key: how many got `Created`.
async fn created_in_a_storm(db: &TestDb, resource: &str) -> usize {
    let pool = db.pool(16).await;
    let start = Arc::new(Barrier::new(16));
    let mut handles = Vec::new();
    for _ in 0..16 {
        let (pool, start) = (pool.db.clone(), start.clone());
        let key = key(resource);
        handles.push(tokio::spawn(async move {
            start.wait().await;
            pool.find_or_enqueue(NewTask::new(key))
                .await
                .expect("enqueue")
                .is_created()
        }));
    }
    let mut created = 0;
    for handle in handles {
        created += usize::from(handle.await.expect("caller"));
    }
    created
}

async fn a_table_without_its_index_is_refused(db: &TestDb) {
    db.migrate().await;
    db.drop_unique_index().await;

    // The caller's transaction first (see the module's doc): refused, and on PostgreSQL
    // the transaction is still usable (the check ran in a savepoint).
    let txn = db.db.begin().await.expect("begin");
    assert_unguarded(txn.find_or_enqueue(NewTask::new(key("in-txn"))).await);
    txn.execute_unprepared("SELECT 1")
        .await
        .expect("the transaction still works");
    txn.rollback().await.expect("rollback");

    // A pool: single and batch.
    assert_unguarded(db.db.find_or_enqueue(NewTask::new(key("doc"))).await);
    assert_unguarded(
        db.db
            .find_or_enqueue_many([NewTask::new(key("a")), NewTask::new(key("b"))])
            .await,
    );
    assert!(rows::all(&db.db).await.is_empty(), "nothing was written");

    // The fix the error names.
    task_dedup_migration::ensure_schema(&db.db)
        .await
        .expect("ensure_schema");
    assert_eq!(created_in_a_storm(db, "after-the-fix").await, 1);
}

async fn entity_first_tables_get_the_guarantee_with_the_helper(db: &TestDb) {
    // The trap: the entity alone makes a table without the unique index.
    db.db
        .get_schema_builder()
        .register(task_run::Entity)
        .apply(&db.db)
        .await
        .expect("entity-first table");
    assert_unguarded(db.db.find_or_enqueue(NewTask::new(key("doc"))).await);
    db.exec("DROP TABLE task_run").await;

    // The helper: the same workflow (an application entity beside it), guarded.
    let builder = db.db.get_schema_builder().register(note::Entity);
    let report = task_dedup_migration::apply_with_task_run(builder, &db.db)
        .await
        .expect("apply_with_task_run");
    assert!(report.created_table, "{report}");
    note::ActiveModel {
        id: sea_orm::ActiveValue::NotSet,
        body: sea_orm::ActiveValue::Set("the application's own table".into()),
    }
    .insert(&db.db)
    .await
    .expect("the application's table exists");
    assert_eq!(created_in_a_storm(db, "doc").await, 1);
    assert_eq!(rows::all(&db.db).await.len(), 1);
}
