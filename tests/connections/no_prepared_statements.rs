//! The pooler mode per handle, and the function that mode's hits and creates call
//! (issue 35): a pool runs in the mode of its endpoint, a transaction in the default
//! unless its handle says otherwise ([`TaskDedup::with_pooler_mode`]), never in a mode
//! another pool of the process uses; in `PoolerMode::NoPreparedStatements`
//! `find_or_enqueue` calls `task_dedup_insert_or_find_v1`, falls back to the plain
//! statement while it is missing, and keeps the guarantee under a 64-way race.
//!
//! On a direct PostgreSQL server: two endpoints of one database are the same server
//! under two host names (`127.0.0.1`, `localhost`). Through real poolers:
//! `pgbouncer.rs`. SQLite and MySQL/MariaDB ignore the mode: their part checks that
//! the handle changes nothing there.

use std::collections::HashSet;

use harness::{Dialect, TestDb, matrix};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement, TransactionTrait};
use task_dedup::{Enqueued, NewTask, PoolerMode, TaskDedup, TaskKey};

matrix!(
    the_mode_is_the_handles_not_the_process,
    the_function_answers_hits_and_creates,
    a_missing_function_falls_back_to_the_statement,
    sixty_four_callers_through_the_function_create_exactly_one,
);

fn key(resource: &str) -> TaskKey {
    TaskKey::new("user-1", "export", resource).expect("valid key")
}

/// A pool of `size` on the test's database, reached as `host`, in `mode`.
async fn pool_at(db: &TestDb, host: &str, mode: PoolerMode, size: u32) -> DatabaseConnection {
    let mut options = sea_orm::ConnectOptions::new(db.url.replacen("127.0.0.1", host, 1));
    options
        .max_connections(size)
        .min_connections(size)
        .sqlx_logging(false);
    task_dedup::connect_with_pooler(options, mode)
        .await
        .expect("a pool")
}

/// The named prepared statements of the session `conn` runs on that mention `task_run`
/// or the function (a pool of one connection, or a transaction).
async fn prepared<C: ConnectionTrait>(conn: &C) -> HashSet<String> {
    let rows = conn
        .query_all_raw(Statement::from_string(
            conn.get_database_backend(),
            "SELECT statement FROM pg_prepared_statements",
        ))
        .await
        .expect("pg_prepared_statements");
    rows.iter()
        .map(|row| row.try_get::<String>("", "statement").expect("statement"))
        .filter(|s| s.contains("INSERT INTO task_run") || s.contains("insert_or_find_v1("))
        .collect()
}

/// The statements `conn`'s session prepared while `call` ran: their texts.
async fn prepared_by<C: ConnectionTrait>(conn: &C, call: impl AsyncFnOnce()) -> Vec<String> {
    let before = prepared(conn).await;
    call().await;
    let after = prepared(conn).await;
    after.difference(&before).cloned().collect()
}

/// Whether `statements` hold the insert-or-find sent as a prepared statement with
/// bound parameters (`$1`), and whether they hold the function's call with its values
/// written in.
fn forms(statements: &[String]) -> (bool, bool) {
    let bound = statements
        .iter()
        .any(|s| s.contains("INSERT INTO task_run") && s.contains("$1"));
    let called = statements
        .iter()
        .any(|s| s.contains("task_dedup_insert_or_find_v1('") && !s.contains("$1"));
    (bound, called)
}

/// SQLite and MySQL/MariaDB: the handle's mode changes nothing.
async fn ignored_elsewhere(db: &TestDb) {
    let wrapped = db.db.with_pooler_mode(PoolerMode::NoPreparedStatements);
    let first = wrapped.find_or_enqueue(NewTask::new(key("a"))).await;
    assert!(first.expect("create").is_created());
    let txn = db.db.begin().await.expect("begin");
    let again = txn
        .with_pooler_mode(PoolerMode::NoPreparedStatements)
        .find_or_enqueue(NewTask::new(key("a")))
        .await
        .expect("hit");
    txn.commit().await.expect("commit");
    assert!(!again.is_created());
}

/// A direct pool and a pool in the pooler mode in one process: each pool sends its
/// statements in its own mode, a bare transaction in the default whichever pool it came
/// from, and a transaction whose handle says the mode in that mode. Before the mode was
/// per handle, both transactions ran unprepared once any pool of the process did.
async fn the_mode_is_the_handles_not_the_process(db: &TestDb) {
    db.migrate().await;
    if db.dialect != Dialect::Postgres {
        return ignored_elsewhere(db).await;
    }
    let direct = pool_at(db, "127.0.0.1", PoolerMode::PreparedStatements, 1).await;
    let pooled = pool_at(db, "localhost", PoolerMode::NoPreparedStatements, 1).await;

    let on_direct = prepared_by(&direct, async || {
        let created = direct.find_or_enqueue(NewTask::new(key("direct"))).await;
        assert!(created.expect("on the direct pool").is_created());
    })
    .await;
    assert_eq!(forms(&on_direct), (true, false), "{on_direct:?}");
    let on_pooled = prepared_by(&pooled, async || {
        let created = pooled.find_or_enqueue(NewTask::new(key("pooled"))).await;
        assert!(created.expect("on the pooled pool").is_created());
    })
    .await;
    assert!(on_pooled.is_empty(), "simple-protocol text: {on_pooled:?}");

    // Each check on a session of its own: a statement a session prepared before is not
    // prepared again.
    for (name, host, mode) in [
        ("direct", "127.0.0.1", PoolerMode::PreparedStatements),
        ("pooled", "localhost", PoolerMode::NoPreparedStatements),
    ] {
        let pool = pool_at(db, host, mode, 1).await;
        let txn = pool.begin().await.expect("begin");
        let resource = format!("bare-{name}");
        let in_txn = prepared_by(&txn, async || {
            let created = txn.find_or_enqueue(NewTask::new(key(&resource))).await;
            assert!(created.expect("in a bare transaction").is_created());
        })
        .await;
        assert_eq!(forms(&in_txn), (true, false), "{name}: {in_txn:?}");
        txn.commit().await.expect("commit");
    }

    // A transaction whose handle says the mode, against its pool's: the direct pool's in
    // the pooler mode (the function, values written in; a create, then a hit), the pooled
    // pool's in the default (two hits).
    for (host, pool_mode, handle_mode, expected, creates) in [
        (
            "127.0.0.1",
            PoolerMode::PreparedStatements,
            PoolerMode::NoPreparedStatements,
            (false, true),
            true,
        ),
        (
            "localhost",
            PoolerMode::NoPreparedStatements,
            PoolerMode::PreparedStatements,
            (true, false),
            false,
        ),
    ] {
        let pool = pool_at(db, host, pool_mode, 1).await;
        let txn = pool.begin().await.expect("begin");
        let in_txn = prepared_by(&txn, async || {
            let wrapped = txn.with_pooler_mode(handle_mode);
            for call in 0..2 {
                let outcome = wrapped.find_or_enqueue(NewTask::new(key("wrapped"))).await;
                let created = outcome.expect("in a wrapped transaction").is_created();
                assert_eq!(created, creates && call == 0, "{host}, call {call}");
            }
        })
        .await;
        assert_eq!(forms(&in_txn), expected, "{host}: {in_txn:?}");
        txn.commit().await.expect("commit");
    }
    assert_eq!(
        harness::count(&db.db, "SELECT COUNT(*) AS n FROM task_run").await,
        5
    );
}

/// In the pooler mode a create and a hit go through the function (made to fail here, to
/// show it is what runs) and answer as the statement does: `Created` with the new
/// task, then `Existing` with the same task, on a pool and in a transaction.
async fn the_function_answers_hits_and_creates(db: &TestDb) {
    db.migrate().await;
    if db.dialect != Dialect::Postgres {
        return ignored_elsewhere(db).await;
    }
    let pooled = pool_at(db, "127.0.0.1", PoolerMode::NoPreparedStatements, 2).await;
    let task = NewTask::new(key("doc")).with_payload(serde_json::json!({"pages": [1, 2]}));
    let created = pooled.find_or_enqueue(task.clone()).await.expect("create");
    let Enqueued::Created(created) = created else {
        panic!("expected Created, got {created:?}");
    };
    let hit = pooled.find_or_enqueue(task.clone()).await.expect("hit");
    let Enqueued::Existing(existing) = hit else {
        panic!("expected Existing, got {hit:?}");
    };
    assert_eq!(existing, created, "the stored task, read back whole");
    let txn = pooled.begin().await.expect("begin");
    let inside = txn
        .with_pooler_mode(PoolerMode::NoPreparedStatements)
        .find_or_enqueue(task.clone())
        .await
        .expect("hit in a transaction");
    txn.commit().await.expect("commit");
    assert_eq!(inside.task().id, created.id);

    // The same name and arguments, made to fail: the next call is refused by it.
    db.exec(&FAILING_FUNCTION.replace("$BODY", "RAISE EXCEPTION 'the function ran';"))
        .await;
    let refused = pooled.find_or_enqueue(task.clone()).await;
    let message = format!("{refused:?}");
    assert!(message.contains("the function ran"), "{message}");
}

/// A function of the same name and arguments whose body is `$BODY`.
const FAILING_FUNCTION: &str = "CREATE OR REPLACE FUNCTION task_dedup_insert_or_find_v1( \
    p_id uuid, p_user_id text, p_task_type text, p_resource_key text, p_payload jsonb, \
    p_created_at timestamptz, p_updated_at timestamptz, p_run_at timestamptz, \
    p_priority int2, p_scope text, p_dedup_window_end int8, p_concurrent bool) \
    RETURNS SETOF task_run LANGUAGE plpgsql AS $f$ BEGIN $BODY END $f$";

/// Without the function (its migration not run yet, or rolled back while a pool knew
/// it) the pooler mode sends the plain statement: on a pool at once, in a transaction
/// at the latest from the next call on; nothing is written twice.
async fn a_missing_function_falls_back_to_the_statement(db: &TestDb) {
    db.migrate().await;
    if db.dialect != Dialect::Postgres {
        return ignored_elsewhere(db).await;
    }
    let pooled = pool_at(db, "127.0.0.1", PoolerMode::NoPreparedStatements, 2).await;
    let first = pooled.find_or_enqueue(NewTask::new(key("a"))).await;
    assert!(first.expect("through the function").is_created());
    // Dropped while the process knew the function, as its migration's `down` does (the
    // later migrations stay: the columns the statements read).
    db.exec("DROP FUNCTION task_dedup_insert_or_find_v1").await;
    let hit = pooled.find_or_enqueue(NewTask::new(key("a"))).await;
    assert!(!hit.expect("a hit by the statement").is_created());
    let create = pooled.find_or_enqueue(NewTask::new(key("b"))).await;
    assert!(create.expect("a create by the statement").is_created());
    // In a transaction: the process's transactions share what they know of the
    // function (they do not tell their database), so the first call may still try it
    // here and fail, naming it; the next call looks again.
    let mut attempts = 0;
    let inside = loop {
        attempts += 1;
        let txn = pooled.begin().await.expect("begin");
        let inside = txn
            .with_pooler_mode(PoolerMode::NoPreparedStatements)
            .find_or_enqueue(NewTask::new(key("c")))
            .await;
        match inside {
            Ok(inside) => {
                txn.commit().await.expect("commit");
                break inside;
            }
            Err(err) if attempts == 1 => {
                let message = err.to_string();
                assert!(
                    message.contains("task_dedup_insert_or_find_v1"),
                    "{message}"
                );
            }
            Err(err) => panic!("a second call falls back: {err}"),
        }
    };
    assert!(inside.is_created());

    // A process that never saw it: another endpoint, looked up afresh.
    let fresh = pool_at(db, "localhost", PoolerMode::NoPreparedStatements, 2).await;
    let txn = fresh.begin().await.expect("begin");
    let inside = txn
        .with_pooler_mode(PoolerMode::NoPreparedStatements)
        .find_or_enqueue(NewTask::new(key("c")))
        .await;
    assert!(!inside.expect("a hit in a transaction").is_created());
    txn.commit().await.expect("commit");
    assert_eq!(
        harness::count(&db.db, "SELECT COUNT(*) AS n FROM task_run").await,
        3
    );
}

/// 64 callers released together on one key, each on its own connection in the pooler
/// mode (the function): exactly one `Created`, everyone holds the same task; five rounds.
async fn sixty_four_callers_through_the_function_create_exactly_one(db: &TestDb) {
    db.migrate().await;
    let callers = 64;
    let pool = if db.dialect == Dialect::Postgres {
        pool_at(
            db,
            "127.0.0.1",
            PoolerMode::NoPreparedStatements,
            callers as u32,
        )
        .await
    } else {
        db.pool(callers as u32).await.clone()
    };
    harness::storm_one_key(&pool, PoolerMode::NoPreparedStatements, callers).await;
    assert_eq!(
        harness::count(&db.db, "SELECT COUNT(*) AS n FROM task_run").await,
        5
    );
}
