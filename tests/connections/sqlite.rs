//! What only SQLite files need: the write-ahead log stays checkpointed.

use std::time::Duration;

use harness::{Dialect, TestDb};
use task_dedup::{NewTask, TaskDedup, TaskKey, TaskLifecycle};

/// SQLite checkpoints its WAL (every 1,000 pages by default) only when a write statement
/// steps to its end. A `... RETURNING` write read with sqlx's `fetch_optional` is reset
/// after its first row instead: it commits, but never checkpoints, and the WAL grows with
/// every write until the last connection closes (measured: 900 MB for 20,000 tasks
/// through a worker, every read slower for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_wal_stays_checkpointed() {
    harness::run(Dialect::Sqlite, "the_wal_stays_checkpointed", wal_bounded).await;
}

async fn wal_bounded(db: &TestDb) {
    db.migrate().await;
    let wal = {
        let mut path = db.sqlite_path().expect("a file").as_os_str().to_owned();
        path.push("-wal");
        std::path::PathBuf::from(path)
    };
    // Inserts, replaces, claims and completes: every write statement of the hot paths.
    for i in 0..1_500 {
        let key = TaskKey::new("user-1", "job", format!("doc-{i}")).expect("valid key");
        let task = NewTask::new(key).with_payload(serde_json::json!({ "pad": "x".repeat(200) }));
        db.db.find_or_enqueue(task).await.expect("enqueue");
        let running = db
            .db
            .claim("w", &[], Duration::from_secs(30))
            .await
            .expect("claim")
            .expect("a task");
        db.db
            .complete(running.id, "w", None)
            .await
            .expect("complete");
    }
    let size = std::fs::metadata(&wal).expect("the WAL").len();
    // 1,000 pages of 4 KiB and the transaction that crossed them.
    assert!(
        size < 8 * 1024 * 1024,
        "the WAL grew to {} MB",
        size / 1024 / 1024
    );
}
