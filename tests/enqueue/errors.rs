//! The error a caller gets does not depend on the path: on a pool `find_or_enqueue` and
//! `find_active` run on sqlx directly, in a transaction through SeaORM, and both return
//! the `DbErr` variant SeaORM returns for the same failure (`Query` for statements that
//! return rows, `Exec` for the others, `Conn` when no connection can be had).

use std::time::Duration;

use harness::{Dialect, TestDb, matrix};
use sea_orm::{ConnectionTrait, DbErr, Statement, TransactionTrait};
use task_dedup::{DedupError, NewTask, TaskDedup, TaskKey};

matrix!(
    failed_statements_give_seaorms_variant_on_both_paths,
    failed_acquire_gives_seaorms_variant,
    a_row_that_is_not_a_task_gives_the_same_error_on_both_paths,
);

fn key() -> TaskKey {
    TaskKey::new("user-1", "render", "doc").expect("valid key")
}

/// The `DbErr` inside a `DedupError::Database`, as a variant name.
fn variant(err: &DedupError) -> &'static str {
    match err {
        DedupError::Database(db) => db_variant(db),
        other => panic!("expected a database error, got {other:?}"),
    }
}

fn db_variant(err: &DbErr) -> &'static str {
    match err {
        DbErr::Exec(_) => "Exec",
        DbErr::Query(_) => "Query",
        DbErr::Conn(_) => "Conn",
        DbErr::ConnectionAcquire(_) => "ConnectionAcquire",
        other => panic!("unexpected DbErr {other:?}"),
    }
}

async fn failed_statements_give_seaorms_variant_on_both_paths(db: &TestDb) {
    // No table: the INSERT fails, and so does the SELECT.
    let pool_write = db
        .db
        .find_or_enqueue(NewTask::new(key()))
        .await
        .expect_err("no table");
    let pool_read = db.db.find_active(&key()).await.expect_err("no table");

    let txn = db.db.begin().await.expect("begin");
    let txn_write = txn
        .find_or_enqueue(NewTask::new(key()))
        .await
        .expect_err("no table");
    txn.rollback().await.expect("rollback");
    let txn = db.db.begin().await.expect("begin");
    let txn_read = txn.find_active(&key()).await.expect_err("no table");
    txn.rollback().await.expect("rollback");

    // SeaORM's own statement layer, for the same kinds of statement: the insert returns
    // the new id on PostgreSQL and SQLite (a query there), and is a plain write on MySQL.
    let insert = Statement::from_string(
        db.dialect.backend(),
        match db.dialect {
            Dialect::MySql => "INSERT INTO task_run (id) VALUES (NULL)",
            Dialect::Postgres | Dialect::Sqlite => {
                "INSERT INTO task_run (id) VALUES (NULL) RETURNING id"
            }
        },
    );
    let seaorm_write = match db.dialect {
        Dialect::MySql => db.db.execute_raw(insert).await.map(drop),
        Dialect::Postgres | Dialect::Sqlite => db.db.query_one_raw(insert).await.map(drop),
    }
    .expect_err("no table");
    let seaorm_read = db
        .db
        .query_one_raw(Statement::from_string(
            db.dialect.backend(),
            "SELECT id FROM task_run",
        ))
        .await
        .expect_err("no table");

    let write = match db.dialect {
        Dialect::MySql => "Exec",
        Dialect::Postgres | Dialect::Sqlite => "Query",
    };
    assert_eq!(db_variant(&seaorm_write), write);
    assert_eq!(db_variant(&seaorm_read), "Query");
    assert_eq!(
        (variant(&pool_write), variant(&txn_write)),
        (write, write),
        "{pool_write:?} / {txn_write:?}"
    );
    assert_eq!(
        (variant(&pool_read), variant(&txn_read)),
        ("Query", "Query"),
        "{pool_read:?} / {txn_read:?}"
    );
}

/// A pool whose connections expire at once, on a database that then goes away: every
/// call must open a new connection and cannot. In a transaction that failure happens at
/// `begin`, in SeaORM's code, so the comparison is with SeaORM's own statements on the
/// same pool.
async fn failed_acquire_gives_seaorms_variant(db: &TestDb) {
    db.migrate().await;
    let dir = std::env::temp_dir().join(format!("task-dedup-acquire-{}", uuid::Uuid::now_v7()));
    let url = match db.dialect {
        Dialect::Sqlite => {
            std::fs::create_dir_all(&dir).expect("dir");
            format!("sqlite://{}/gone.db?mode=rwc", dir.display())
        }
        Dialect::Postgres | Dialect::MySql => db.url.clone(),
    };
    let mut options = sea_orm::ConnectOptions::new(url);
    options
        .max_connections(2)
        .max_lifetime(Duration::from_millis(50))
        .acquire_timeout(Duration::from_secs(5))
        .sqlx_logging(false);
    let pool = task_dedup::connect_with(options).await.expect("pool");
    match db.dialect {
        // The directory goes: SQLite cannot create or open the file any more.
        Dialect::Sqlite => std::fs::remove_dir_all(&dir).expect("remove dir"),
        // The database goes (PostgreSQL terminates its sessions).
        Dialect::Postgres | Dialect::MySql => {
            let name = db.url.rsplit('/').next().expect("path");
            let name = name.split('?').next().expect("name");
            let admin = task_dedup::connect(&harness::with_database(&db.url, admin_db(db.dialect)))
                .await
                .expect("admin");
            let force = if db.dialect == Dialect::Postgres {
                " WITH (FORCE)"
            } else {
                ""
            };
            admin
                .execute_unprepared(&format!("DROP DATABASE {name}{force}"))
                .await
                .expect("drop database");
            admin.close().await.expect("close");
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let ours_write = pool
        .find_or_enqueue(NewTask::new(key()))
        .await
        .expect_err("no connection");
    let ours_read = pool.find_active(&key()).await.expect_err("no connection");
    let seaorm = pool
        .query_one_raw(Statement::from_string(db.dialect.backend(), "SELECT 1"))
        .await
        .expect_err("no connection");
    let seaorm = db_variant(&seaorm);
    assert_eq!(seaorm, "Conn", "SeaORM: {seaorm}");
    assert_eq!(
        (variant(&ours_write), variant(&ours_read)),
        (seaorm, seaorm)
    );
}

fn admin_db(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => "postgres",
        Dialect::MySql => "mysql",
        Dialect::Sqlite => unreachable!("no admin database"),
    }
}

/// A row the library cannot read as a task (a status no version wrote) is an error, and
/// the same one on a pool (PostgreSQL: read from sqlx's row by task-dedup) and in a
/// transaction (SeaORM's mapping): `DbErr::Type`, naming the value.
async fn a_row_that_is_not_a_task_gives_the_same_error_on_both_paths(db: &TestDb) {
    db.migrate().await;
    // A period task holds its key whatever its status.
    let task = NewTask::new(key()).scope(task_dedup::Scope::Period(Duration::from_secs(3_600)));
    db.db.find_or_enqueue(task.clone()).await.expect("enqueue");
    db.exec("UPDATE task_run SET status = 'archived'").await;
    let on_pool = db.db.find_occupant(&task).await.expect_err("not a status");
    let txn = db.db.begin().await.expect("begin");
    let in_txn = txn.find_occupant(&task).await.expect_err("not a status");
    txn.rollback().await.expect("rollback");
    for err in [&on_pool, &in_txn] {
        match err {
            DedupError::Database(DbErr::Type(message)) => {
                assert!(message.contains("archived"), "{message}")
            }
            other => panic!("expected DbErr::Type, got {other:?}"),
        }
    }
}
