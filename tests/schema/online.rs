//! Online migrations (`task_dedup_migration::online`): the schema they leave is the one
//! the migrations leave, step by step; duplicates written while a unique index builds
//! are resolved and the build run again; a killed build's INVALID index is found, taken
//! for absent by the guard, and built again; writers keep working through an upgrade.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use harness::rows::{self, at, is_unique_violation};
use harness::{Dialect, TestDb, matrix, server_matrix};
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};
use sea_orm_migration::prelude::*;
use task_dedup::TaskStatus::{Cancelled, Queued, Running, Succeeded};
use task_dedup::{DedupError, NewTask, TaskDedup, TaskKey};
use task_dedup_migration::Migrator;
use task_dedup_migration::online::{
    self, Method, OnlineError, OnlineOptions, OnlineReport, ensure_schema_online, up_online,
};
use tokio::sync::Barrier;
use tokio::task::JoinHandle;

matrix!(
    online_steps_leave_the_schemas_of_the_migrations,
    fresh_database_migrates_online_in_one_call,
    ensure_schema_online_leaves_what_ensure_schema_leaves,
);

// SQLite: one writer at a time, whose migrations are not built online.
server_matrix!(
    online_upgrade_to_the_last_step_copies_nothing,
    writers_keep_working_through_an_online_upgrade,
    unique_build_resolves_duplicates_written_while_it_waits,
    duplicate_written_during_the_resolution,
    last_attempt_after_duplicates_locks_the_table,
    killed_build_is_found_and_built_again,
    killed_guarded_build_leaves_a_guard_the_next_run_drops,
    a_held_lock_makes_the_run_give_up_naming_its_holder,
);

/// How many migrations there are.
fn steps() -> usize {
    task_dedup_migration::migrations().len()
}

async fn schema(db: &TestDb) -> String {
    harness::schema::describe(&db.db, db.dialect).await
}

fn options() -> OnlineOptions {
    let mut options = OnlineOptions::default();
    options.retry_delay = Duration::from_millis(10);
    options
}

/// The methods a dialect uses for indexes: every index online where the server can.
fn assert_online(db: &TestDb, report: &OnlineReport) {
    for change in &report.changes {
        let index = !change.object.starts_with("column")
            && !change.object.starts_with("drop")
            && !change.object.starts_with("rename");
        let expected: &[Method] = match db.dialect {
            Dialect::Sqlite => &[Method::Blocking],
            Dialect::Postgres if index => &[Method::Concurrently],
            Dialect::Postgres => &[Method::Instant],
            // A unique build that kept meeting duplicates of racing writers blocks
            // writes for its last attempts.
            Dialect::MySql if index => &[Method::InPlace, Method::InPlaceShared, Method::Locked],
            // Columns: the strongest form the server takes; STORED generated ones copy.
            Dialect::MySql => &[Method::Instant, Method::InPlace, Method::Copy],
        };
        assert!(expected.contains(&change.method), "{change}");
    }
}

/// Some history, queued and running tasks, on the table of the first step (only the
/// columns it has).
async fn seed(db: &TestDb) {
    for n in 0..30 {
        let status = [Succeeded, Succeeded, Cancelled, Queued, Running][n % 5];
        rows::insert(&db.db, ("u", "t", &format!("r{n}")), status, at(n as i64))
            .await
            .expect("seed");
    }
}

/// The schema `migrations.rs` pins for `step` of the migrations as they are.
fn pinned(db: &TestDb, step: usize) -> String {
    let path = format!(
        "{}/tests/schema/snapshots/schema__migrations__{}_step_{step}.snap",
        env!("CARGO_MANIFEST_DIR"),
        db.dialect.name()
    );
    let file = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    // insta's header: `---`, its fields, `---`; then the snapshot.
    let body = file
        .strip_prefix("---\n")
        .and_then(|rest| rest.split_once("\n---\n"))
        .map(|(_, body)| body)
        .unwrap_or_else(|| panic!("{path}: not an insta snapshot"));
    body.trim_end().to_owned()
}

/// Each migration applied online leaves exactly the schema it leaves when applied as
/// is (the snapshots `migrations.rs` pins), on a table with rows.
async fn online_steps_leave_the_schemas_of_the_migrations(db: &TestDb) {
    Migrator::up(&db.db, Some(1)).await.expect("first step");
    assert_eq!(schema(db).await, pinned(db, 1));
    seed(db).await;

    for step in 2..=steps() {
        let report = up_online(&db.db, Some(1), &options())
            .await
            .expect("one step online");
        assert_eq!(report.applied.len(), 1);
        assert!(!report.fresh);
        assert_online(db, &report);
        if db.dialect != Dialect::Sqlite {
            assert!(
                report
                    .changes
                    .iter()
                    .all(|c| c.migration == report.applied[0]),
                "{:?}",
                report.changes
            );
        }
        assert_eq!(
            schema(db).await.trim_end(),
            pinned(db, step),
            "step {step} online"
        );
    }
    assert!(
        Migrator::get_pending_migrations(&db.db)
            .await
            .expect("status")
            .is_empty()
    );
    assert_eq!(
        rows::all(&db.db).await.len(),
        30,
        "every row is still there"
    );
    assert!(
        online::invalid_indexes(&db.db)
            .await
            .expect("catalog")
            .is_empty()
    );
}

/// An upgrade from the first step to the last in one online run copies no table: on
/// MySQL/MariaDB the generated columns behind the unique indexes are added VIRTUAL
/// (instantly), since the last step makes them so, after every plain column (which
/// MariaDB adds instantly only while no indexed VIRTUAL column stands), and their
/// indexes are built in place; the schema is the last step's, and every row is still
/// there.
async fn online_upgrade_to_the_last_step_copies_nothing(db: &TestDb) {
    Migrator::up(&db.db, Some(1)).await.expect("first step");
    seed(db).await;

    let report = up_online(&db.db, None, &options())
        .await
        .expect("online up");
    assert_eq!(report.applied.len(), steps() - 1);
    assert_online(db, &report);
    let copied: Vec<String> = report
        .changes
        .iter()
        .filter(|c| matches!(c.method, Method::Copy | Method::Locked))
        .map(ToString::to_string)
        .collect();
    assert!(copied.is_empty(), "writes waited for: {copied:#?}");
    if db.dialect == Dialect::MySql {
        for column in ["occupied", "running_slot", "run_at", "snoozes", "run_slot"] {
            let change = report
                .changes
                .iter()
                .find(|c| c.object == format!("column {column}"))
                .unwrap_or_else(|| panic!("column {column} added: {report:#?}"));
            assert_eq!(change.method, Method::Instant, "{change}");
        }
    }
    assert_eq!(schema(db).await.trim_end(), pinned(db, steps()));
    assert_eq!(
        rows::all(&db.db).await.len(),
        30,
        "every row is still there"
    );
}

/// A fresh database: one call, the migrations as they are, every step recorded.
async fn fresh_database_migrates_online_in_one_call(db: &TestDb) {
    let report = up_online(&db.db, None, &options())
        .await
        .expect("online up");
    assert!(report.fresh);
    assert_eq!(report.applied.len(), steps());
    assert!(report.changes.iter().all(|c| c.method == Method::Blocking));
    let online = schema(db).await;
    // SQLite: on one connection. The same DDL text again on a pooled connection can meet
    // one that still sees the dropped table's index ("already exists"; seen under load).
    let single = db.pool(1).await;
    Migrator::down(&single.db, None).await.expect("down");
    Migrator::up(&single.db, None).await.expect("up");
    drop(single);
    assert_eq!(schema(db).await, online);
    // Nothing left to do.
    let again = up_online(&db.db, None, &options()).await.expect("again");
    assert!(
        again.applied.is_empty() && again.changes.is_empty(),
        "{again:?}"
    );
}

/// The compat patch online: the same report and the same schema as `ensure_schema`.
async fn ensure_schema_online_leaves_what_ensure_schema_leaves(db: &TestDb) {
    if db.dialect == Dialect::Sqlite {
        // ensure_schema_online is ensure_schema there; and the same DDL text twice on
        // SQLite's pooled connections meets one that still sees the dropped table's
        // index ("already exists").
        return;
    }
    let key = ("u", "t", "doc");
    let mut outcomes = Vec::new();
    for online in [false, true] {
        harness::schema::create_legacy_table(db).await;
        let oldest = rows::insert(&db.db, key, Queued, at(0))
            .await
            .expect("seed");
        let dup = rows::insert(&db.db, key, Running, at(1))
            .await
            .expect("seed");
        let report = if online {
            ensure_schema_online(&db.db, &options()).await
        } else {
            task_dedup_migration::ensure_schema(&db.db).await
        }
        .expect("compat patch");
        assert_eq!(report.cancelled_duplicates, 1, "{report}");
        let all = rows::all(&db.db).await;
        let status = |id| all.iter().find(|row| row.id == id).expect("row").status;
        assert_eq!((status(oldest), status(dup)), (Queued, Cancelled));
        let err = rows::insert(&db.db, key, Running, at(3))
            .await
            .expect_err("the guarantee holds");
        assert!(is_unique_violation(&err));
        if online && db.dialect != Dialect::Sqlite {
            assert!(
                report
                    .online
                    .iter()
                    .any(|c| c.object == "task_active_resource_uidx"),
                "{:?}",
                report.online
            );
            // Nothing copied the table: on MySQL/MariaDB the key columns took a byte-exact
            // collation, the generated columns came VIRTUAL.
            for change in &report.online {
                assert_ne!(change.method, Method::Copy, "{change}");
            }
        }
        if online {
            // Every index the patch created was built online, and said so: none left to
            // the frozen migrations' plain `CREATE INDEX`.
            for index in &report.created_indexes {
                assert!(
                    report
                        .online
                        .iter()
                        .any(|c| c.object.contains(index.as_str())),
                    "{index} not built online: {:#?}",
                    report.online
                );
            }
        }
        let mut report = report;
        report.online.clear();
        outcomes.push((report, schema(db).await));
        db.exec(drop_task_run(db.dialect)).await;
    }
    assert_eq!(outcomes[0], outcomes[1]);
}

/// MySQL/MariaDB: what of the online guard is on the database (its triggers on
/// `task_run`, its table of keys).
async fn mysql_guard_left(db: &TestDb) -> i64 {
    harness::count(
        &db.db,
        "SELECT (SELECT COUNT(*) FROM information_schema.TRIGGERS \
         WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = 'task_run') \
         + (SELECT COUNT(*) FROM information_schema.TABLES \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'task_dedup_online_keys') AS n",
    )
    .await
}

fn key(resource: &str) -> TaskKey {
    TaskKey::new("user-1", "render", resource).expect("valid key")
}

/// An older, read-then-insert release enqueueing `resource` (only the columns of the
/// first step): inserts unless an active task of the key shows. Returns whether it
/// inserted; a unique violation (the index refused a duplicate) is `false`.
async fn legacy_enqueue(db: &DatabaseConnection, dialect: Dialect, resource: &str) -> bool {
    let holder = format!(
        "SELECT COUNT(*) AS n FROM task_run WHERE user_id = 'legacy' AND task_type = 't' \
         AND resource_key = '{resource}' AND status IN ('queued', 'running')"
    );
    if harness::count(db, holder).await > 0 {
        return false;
    }
    match rows::insert(db, ("legacy", "t", resource), Queued, chrono::Utc::now()).await {
        Ok(_) => true,
        Err(err) if is_unique_violation(&err) => false,
        // InnoDB: inserters waiting on one key's index entry can deadlock (see
        // SEAORM-NOTES); the insert is rolled back, as it would be without a migration.
        Err(err) if dialect == Dialect::MySql && err.to_string().contains("1213") => false,
        Err(err) => panic!("legacy enqueue failed: {err}"),
    }
}

/// Writers run through an online upgrade from the first step to the last: an older
/// release's read-then-insert enqueues (which race into duplicates until the unique
/// index exists) and finishes. None of their statements fails, the upgrade completes,
/// and afterwards every key has at most one active task, and `find_or_enqueue` works.
/// Exact counts: every row a writer inserted is there.
async fn writers_keep_working_through_an_online_upgrade(db: &TestDb) {
    Migrator::up(&db.db, Some(1)).await.expect("first step");
    seed(db).await;
    const WRITERS: usize = 8;
    let pool = db.pool(WRITERS as u32).await;
    let start = Arc::new(Barrier::new(WRITERS + 1));
    let done = Arc::new(AtomicBool::new(false));
    let inserted = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (pool, start, done, inserted) = (
            pool.db.clone(),
            start.clone(),
            done.clone(),
            inserted.clone(),
        );
        let dialect = db.dialect;
        writers.push(tokio::spawn(async move {
            start.wait().await;
            let mut n = 0u64;
            // Until the upgrade is done, and at least 20 rounds.
            while !done.load(Ordering::Acquire) || n < 20 {
                let resource = format!("hot-{}", n % 4);
                if legacy_enqueue(&pool, dialect, &resource).await {
                    inserted.fetch_add(1, Ordering::Relaxed);
                }
                if (n + w as u64).is_multiple_of(3) {
                    let finish = format!(
                        "UPDATE task_run SET status = 'succeeded' WHERE user_id = 'legacy' \
                         AND resource_key = '{resource}' AND status = 'queued'"
                    );
                    if let Err(err) = pool.execute_unprepared(&finish).await {
                        let deadlock =
                            dialect == Dialect::MySql && err.to_string().contains("1213");
                        assert!(deadlock, "finish failed: {err}");
                    }
                }
                n += 1;
            }
        }));
    }
    start.wait().await;
    let report = up_online(&db.db, None, &options())
        .await
        .expect("online upgrade");
    done.store(true, Ordering::Release);
    for writer in writers {
        writer.await.expect("no writer failed");
    }
    assert_eq!(report.applied.len(), steps() - 1);
    assert_online(db, &report);
    // The guard (PostgreSQL: from before the first resolution; MySQL/MariaDB: from the
    // second attempt on) keeps the racing writers' duplicates out of the unique build:
    // online, in at most 3 attempts (a first build that met a duplicate written before
    // the guard, and one spurious InnoDB duplicate to spare). Without the MySQL guard,
    // 2 of 6 local runs fell to `LOCK=SHARED` at the 6th attempt, and 2 more needed 3.
    let active = unique_build(&report);
    assert!(
        matches!(active.method, Method::InPlace | Method::Concurrently) && active.attempts <= 3,
        "{active}"
    );

    let legacy = harness::count(
        &db.db,
        "SELECT COUNT(*) AS n FROM task_run WHERE user_id = 'legacy'",
    )
    .await;
    assert_eq!(
        legacy as u64,
        inserted.load(Ordering::Relaxed),
        "nothing lost"
    );
    let doubled = harness::keys_with_two_active(&db.db).await;
    assert_eq!(doubled, 0, "at most one active task per key");
    assert!(
        online::invalid_indexes(&db.db)
            .await
            .expect("catalog")
            .is_empty()
    );
    let first = db.db.find_or_enqueue(NewTask::new(key("after"))).await;
    assert!(first.expect("enqueue after the upgrade").is_created());
    let second = db.db.find_or_enqueue(NewTask::new(key("after"))).await;
    assert!(!second.expect("hit").is_created());
}

/// A connection to the server's admin database, for watching and killing sessions.
async fn admin(db: &TestDb) -> DatabaseConnection {
    let (admin_url, _) = db.server().expect("a server dialect");
    task_dedup::connect(admin_url)
        .await
        .expect("admin connection")
}

/// The session of a build that waits for a lock (PostgreSQL: for the writers older than
/// it; MySQL/MariaDB: for the metadata lock), by the start of its statement.
fn waiting_build(dialect: Dialect, statement: &str) -> String {
    match dialect {
        Dialect::Postgres => format!(
            "SELECT pid::int8 AS id FROM pg_stat_activity WHERE datname = $1 \
             AND wait_event_type = 'Lock' AND query LIKE '{statement}%'"
        ),
        _ => format!(
            "SELECT CAST(ID AS SIGNED) AS id FROM information_schema.PROCESSLIST \
             WHERE DB = ? AND STATE LIKE 'Waiting for table metadata lock' \
             AND INFO LIKE '{statement}%'"
        ),
    }
}

/// A duplicate written by a transaction that is open when the run starts. MySQL/MariaDB:
/// the build waits for it, so the duplicate lands after the first resolution and before
/// the index checks new rows; the build fails, the run resolves it as the first ones
/// (the oldest stays, the newer is cancelled) and builds again. PostgreSQL: the guard
/// trigger waits for it (its lock waits for every transaction that wrote before it),
/// so the resolution that follows finds it and the build succeeds at once.
/// Deterministic: the writer's transaction is open when the run starts.
///
/// Without the protocol (a build that is not run again after resolving; on PostgreSQL a
/// guard installed after the resolution), this fails: the run gives up with a unique
/// violation after one attempt.
async fn unique_build_resolves_duplicates_written_while_it_waits(db: &TestDb) {
    first_step_with_marker(db).await;
    let k = ("u", "t", "k");
    let oldest = rows::insert(&db.db, k, Running, at(0)).await.expect("seed");
    let old_dup = rows::insert(&db.db, k, Queued, at(1)).await.expect("seed");

    let writer = db.pool(1).await;
    let txn = writer.db.begin().await.expect("begin");
    let late_dup = rows::insert(&txn, k, Queued, at(2))
        .await
        .expect("late duplicate");

    let admin = admin(db).await;
    let run = second_step_online(db);
    // MySQL/MariaDB install the guard after the first resolution: the late duplicate
    // lands before it, and the first build meets it.
    let (statement, attempts) = match db.dialect {
        Dialect::Postgres => ("CREATE TRIGGER task_dedup_online_guard", 1),
        _ => ("CREATE TRIGGER task_dedup_online_guard", 2),
    };
    harness::wait_for_session(
        &admin,
        db,
        &waiting_build(db.dialect, statement),
        "the build",
    )
    .await;
    txn.commit().await.expect("the late duplicate lands");

    let report = run.await.expect("run").expect("the build succeeds");
    let build = unique_build(&report);
    assert_eq!(build.attempts, attempts, "{build}");
    assert_eq!(build.resolved_duplicates, 2, "{build}");
    // The table is at the second step: not every column of the entity is there yet.
    let rows = db
        .db
        .query_all_raw(db.stmt("SELECT id, status, error FROM task_run", vec![]))
        .await
        .expect("rows");
    assert_eq!(rows.len(), 3, "nothing is deleted");
    let row = |id: uuid::Uuid| {
        let row = rows
            .iter()
            .find(|row| row.try_get::<uuid::Uuid>("", "id").expect("id") == id)
            .expect("row kept");
        let status: String = row.try_get("", "status").expect("status");
        let error: Option<String> = row.try_get("", "error").expect("error");
        (status, error)
    };
    assert_eq!(row(oldest), ("running".to_owned(), None));
    for dup in [old_dup, late_dup] {
        let (status, error) = row(dup);
        assert_eq!(status, "cancelled");
        let error = error.expect("names the task kept");
        assert!(error.contains(&oldest.to_string()), "{error}");
    }
    assert!(
        online::invalid_indexes(&db.db)
            .await
            .expect("catalog")
            .is_empty()
    );
    let err = rows::insert(&db.db, k, Queued, at(3))
        .await
        .expect_err("guarded");
    assert!(is_unique_violation(&err));
    admin.close().await.expect("close");
}

/// The second step, online, in a task of its own, with a `lock_timeout` long enough to
/// outwait a test's open writer.
fn second_step_online(db: &TestDb) -> JoinHandle<Result<OnlineReport, OnlineError>> {
    second_step_online_with(db, options().attempts)
}

/// [`second_step_online`] with `attempts`.
fn second_step_online_with(
    db: &TestDb,
    attempts: u32,
) -> JoinHandle<Result<OnlineReport, OnlineError>> {
    let db = db.db.clone();
    let mut opts = options();
    opts.lock_timeout = Duration::from_secs(30);
    opts.attempts = attempts;
    tokio::spawn(async move { up_online(&db, Some(1), &opts).await })
}

/// The unique index's build in a run's report.
fn unique_build(report: &OnlineReport) -> &online::Change {
    report
        .changes
        .iter()
        .find(|c| c.object == "task_active_resource_uidx")
        .expect("the unique build")
}

/// The first step, and on MySQL/MariaDB the generated column the unique index reads,
/// as the second step adds it (here, so that the online run does not wait for a test's
/// open writer to add it, and copy the table).
async fn first_step_with_marker(db: &TestDb) {
    Migrator::up(&db.db, Some(1)).await.expect("first step");
    if db.dialect == Dialect::MySql {
        db.exec(
            "ALTER TABLE task_run ADD COLUMN active_marker tinyint GENERATED ALWAYS AS \
             (CASE WHEN status IN ('queued', 'running') THEN 1 END) STORED",
        )
        .await;
    }
}

/// A duplicate that arrives after the run has read the duplicates it resolves, and
/// before the unique index takes inserts (here: while the resolution waits for a row
/// another transaction locked). PostgreSQL: the guard trigger, in place since before
/// the resolution, refuses it as the index will (23505), and the build succeeds at
/// once. MySQL/MariaDB (whose guard comes after the first resolution): it goes in, the
/// build meets it and fails, the guarded run
/// resolves it and builds again. Either way, once the index stands every key has one
/// active task and nothing was deleted.
///
/// Without the guard (or with it installed after the resolution), the PostgreSQL run
/// takes the MySQL path: the duplicate goes in and this fails.
async fn duplicate_written_during_the_resolution(db: &TestDb) {
    let report = build_with_a_duplicate_during_the_resolution(db, 10).await;
    let build = unique_build(&report);
    if db.dialect == Dialect::MySql {
        assert_eq!(build.method, Method::InPlace, "{build}");
    }
}

/// As [`duplicate_written_during_the_resolution`], with two attempts: on MySQL/MariaDB
/// the second is the last after duplicates failed the first, and runs with the table
/// locked from its resolution to the end of the build, so that no writer can slip a
/// duplicate in between (writers faster than a build otherwise fail every attempt, as
/// `writers_keep_working_through_an_online_upgrade` once did in CI). PostgreSQL's
/// guard needs one attempt.
///
/// Without the locked last attempt (an ordinary second attempt), the MySQL run
/// reports `InPlaceShared` and this fails.
async fn last_attempt_after_duplicates_locks_the_table(db: &TestDb) {
    let report = build_with_a_duplicate_during_the_resolution(db, 2).await;
    let build = unique_build(&report);
    if db.dialect == Dialect::MySql {
        assert_eq!(build.method, Method::Locked, "{build}");
        let locks = harness::count(
            &db.db,
            "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST \
             WHERE STATE LIKE 'Waiting for table%'",
        )
        .await;
        assert_eq!(locks, 0, "the table is unlocked");
    }
}

/// The scenario of [`duplicate_written_during_the_resolution`], with `attempts` for the
/// run, and the outcome checked: what was kept, what was cancelled, no guard left.
async fn build_with_a_duplicate_during_the_resolution(db: &TestDb, attempts: u32) -> OnlineReport {
    first_step_with_marker(db).await;
    let k = ("u", "t", "k");
    let oldest = rows::insert(&db.db, k, Running, at(0)).await.expect("seed");
    let old_dup = rows::insert(&db.db, k, Queued, at(1)).await.expect("seed");

    // Holds the row the resolution will cancel: the run waits there.
    let holder = db.pool(1).await;
    let txn = holder.db.begin().await.expect("begin");
    let lock = match db.dialect {
        Dialect::Postgres => "SELECT id FROM task_run WHERE id = $1 FOR UPDATE",
        _ => "SELECT id FROM task_run WHERE id = ? FOR UPDATE",
    };
    txn.query_all_raw(db.stmt(lock, vec![old_dup.into()]))
        .await
        .expect("lock the duplicate");

    let admin = admin(db).await;
    let run = second_step_online_with(db, attempts);
    let waiting = match db.dialect {
        Dialect::Postgres => waiting_build(db.dialect, "UPDATE task_run SET status"),
        // Seen at all, the UPDATE waits: the row it needs is locked. (Not joined with
        // INNODB_TRX: MariaDB answered that join's prepared statement from its first
        // execution ever after.)
        _ => "SELECT CAST(ID AS SIGNED) AS id FROM information_schema.PROCESSLIST \
              WHERE DB = ? AND INFO LIKE 'UPDATE task_run%SET status%'"
            .to_owned(),
    };
    harness::wait_for_session(&admin, db, &waiting, "the resolution").await;
    let late = rows::insert(&db.db, k, Queued, at(2)).await;
    txn.commit().await.expect("release the row");

    let report = run.await.expect("run").expect("the build succeeds");
    let build = unique_build(&report);
    let (rows_left, statuses) = match db.dialect {
        Dialect::Postgres => {
            let err = late.expect_err("the guard refuses the duplicate");
            assert!(is_unique_violation(&err), "{err}");
            assert_eq!(
                (build.attempts, build.resolved_duplicates),
                (1, 1),
                "{build}"
            );
            (2, vec![(oldest, "running"), (old_dup, "cancelled")])
        }
        _ => {
            let late = late.expect("before the guard: the duplicate goes in");
            assert_eq!(
                (build.attempts, build.resolved_duplicates),
                (2, 2),
                "{build}"
            );
            let expected = vec![
                (oldest, "running"),
                (old_dup, "cancelled"),
                (late, "cancelled"),
            ];
            (3, expected)
        }
    };
    let rows = db
        .db
        .query_all_raw(db.stmt("SELECT id, status FROM task_run", vec![]))
        .await
        .expect("rows");
    assert_eq!(rows.len(), rows_left, "nothing is deleted");
    for (id, status) in statuses {
        let row = rows
            .iter()
            .find(|row| row.try_get::<uuid::Uuid>("", "id").expect("id") == id)
            .expect("row kept");
        assert_eq!(row.try_get::<String>("", "status").expect("status"), status);
    }
    let guards = match db.dialect {
        Dialect::Postgres => {
            harness::count(
                &db.db,
                "SELECT COUNT(*) AS n FROM pg_trigger WHERE tgname = 'task_dedup_online_guard'",
            )
            .await
        }
        _ => mysql_guard_left(db).await,
    };
    assert_eq!(guards, 0, "the guard is gone with the build");
    admin.close().await.expect("close");
    report
}

/// A build killed while it runs. PostgreSQL leaves an INVALID index: `invalid_indexes`
/// (what `migrate status` shows) names it, the guard takes it for absent
/// (`DedupError::Unguarded`), and `repair_invalid_indexes` (what `migrate up` runs first,
/// in either mode) drops it and builds it again. MySQL/MariaDB leave nothing, and the next
/// online run builds the index.
async fn killed_build_is_found_and_built_again(db: &TestDb) {
    db.migrate().await;
    let full = schema(db).await;
    // The guarantee's index gone, as if an upgrade were building it again.
    db.drop_unique_index().await;
    let writer = db.pool(1).await;
    let txn = writer.db.begin().await.expect("begin");
    rows::insert(&txn, ("u", "t", "open"), Queued, at(0))
        .await
        .expect("an open writer");

    let admin = admin(db).await;
    let run = {
        let db = db.db.clone();
        let mut opts = options();
        opts.lock_timeout = Duration::from_secs(30);
        tokio::spawn(async move { online::prepare_online(&db, &opts).await })
    };
    let (statement, interim) = match db.dialect {
        Dialect::Postgres => ("CREATE UNIQUE INDEX CONCURRENTLY", "task_run_occupied_uidx"),
        // The guard's trigger waits for the open writer, as the build would.
        _ => (
            "CREATE TRIGGER task_dedup_online_guard",
            "task_active_resource_uidx",
        ),
    };
    let session = harness::wait_for_session(
        &admin,
        db,
        &waiting_build(db.dialect, statement),
        "the build",
    )
    .await;
    let kill = match db.dialect {
        Dialect::Postgres => format!("SELECT pg_terminate_backend({session})"),
        _ => format!("KILL CONNECTION {session}"),
    };
    admin
        .execute_unprepared(&kill)
        .await
        .expect("kill the build");
    let killed = run.await.expect("run");
    assert!(
        matches!(
            killed,
            Err(OnlineError::GaveUp { .. } | OnlineError::Database(_))
        ),
        "{killed:?}"
    );
    txn.commit().await.expect("commit");

    let invalid = online::invalid_indexes(&db.db).await.expect("catalog");
    match db.dialect {
        Dialect::Postgres => {
            assert_eq!(invalid, [interim]);
            let manager = SchemaManager::new(&db.db);
            assert!(
                manager
                    .has_index("task_run", interim)
                    .await
                    .expect("has_index")
            );
            match db.db.find_or_enqueue(NewTask::new(key("doc"))).await {
                Err(DedupError::Unguarded { .. }) => {}
                other => panic!("an INVALID index is no guarantee: {other:?}"),
            }
            let repaired = online::repair_invalid_indexes(&db.db, &options())
                .await
                .expect("repair");
            assert_eq!(repaired.repaired, [interim]);
            assert!(
                repaired
                    .changes
                    .iter()
                    .any(|c| c.object == interim && c.method == Method::Concurrently),
                "{repaired:?}"
            );
        }
        _ => {
            assert!(invalid.is_empty());
            let manager = SchemaManager::new(&db.db);
            assert!(
                !manager
                    .has_index("task_run", interim)
                    .await
                    .expect("has_index")
            );
            let report = online::prepare_online(&db.db, &options())
                .await
                .expect("built online");
            assert!(
                report.changes.iter().any(|c| c.object == interim),
                "{report:?}"
            );
            // The killed run's guard (its table, or its triggers) is gone too.
            let left = mysql_guard_left(db).await;
            assert_eq!(left, 0, "the next run dropped the killed run's guard");
        }
    }
    assert!(
        online::invalid_indexes(&db.db)
            .await
            .expect("catalog")
            .is_empty()
    );
    if db.dialect == Dialect::MySql {
        // SHOW CREATE TABLE lists unique keys in the order they were made: this test
        // dropped one, and the run made it again after the other.
        let sorted = |schema: String| {
            let mut lines: Vec<String> = schema
                .lines()
                .map(|line| line.trim_end_matches(',').to_owned())
                .collect();
            lines.sort();
            lines
        };
        assert_eq!(sorted(schema(db).await), sorted(full));
    } else {
        assert_eq!(schema(db).await, full);
    }
    let created = db.db.find_or_enqueue(NewTask::new(key("doc"))).await;
    assert!(created.expect("guarded again").is_created());
    admin.close().await.expect("close");
}

/// A run killed while its guard trigger stands (PostgreSQL; the other dialects have no
/// guard, and their killed builds are `killed_build_is_found_and_built_again`): the
/// trigger outlives the run and keeps refusing duplicates, which is safe; the next run's
/// repair drops it and builds the index.
async fn killed_guarded_build_leaves_a_guard_the_next_run_drops(db: &TestDb) {
    if db.dialect != Dialect::Postgres {
        return;
    }
    first_step_with_marker(db).await;
    let k = ("u", "t", "k");
    rows::insert(&db.db, k, Running, at(0)).await.expect("seed");
    let dup = rows::insert(&db.db, k, Queued, at(1)).await.expect("seed");
    let holder = db.pool(1).await;
    let txn = holder.db.begin().await.expect("begin");
    txn.query_all_raw(db.stmt(
        "SELECT id FROM task_run WHERE id = $1 FOR UPDATE",
        vec![dup.into()],
    ))
    .await
    .expect("lock the duplicate");

    let admin = admin(db).await;
    let run = second_step_online(db);
    let waiting = waiting_build(db.dialect, "UPDATE task_run SET status");
    harness::wait_for_session(&admin, db, &waiting, "the resolution").await;
    // The run's own session, which installed the guard and would build the index.
    let session = harness::wait_for_session(
        &admin,
        db,
        "SELECT pid::int8 AS id FROM pg_stat_activity WHERE datname = $1 \
         AND query LIKE 'CREATE TRIGGER task_dedup_online_guard%'",
        "the guard's session",
    )
    .await;
    admin
        .execute_unprepared(&format!("SELECT pg_terminate_backend({session})"))
        .await
        .expect("kill the run's session");
    txn.commit().await.expect("release the row");
    let killed = run.await.expect("run");
    assert!(killed.is_err(), "{killed:?}");

    let guards = "SELECT COUNT(*) AS n FROM pg_trigger WHERE tgname = 'task_dedup_online_guard'";
    assert_eq!(harness::count(&db.db, guards).await, 1, "left standing");
    let err = rows::insert(&db.db, k, Queued, at(2))
        .await
        .expect_err("still guarded");
    assert!(is_unique_violation(&err), "{err}");

    let report = up_online(&db.db, Some(1), &options())
        .await
        .expect("the next run");
    assert!(
        report
            .changes
            .iter()
            .any(|c| c.object == "task_active_resource_uidx"),
        "{report:?}"
    );
    assert_eq!(harness::count(&db.db, guards).await, 0, "dropped");
    assert_eq!(harness::keys_with_two_active(&db.db).await, 0);
    admin.close().await.expect("close");
}

/// Drops `task_run`; on PostgreSQL with the function whose rows are its rows
/// (`task_dedup_insert_or_find_v1` depends on the table's row type).
fn drop_task_run(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => "DROP TABLE task_run CASCADE",
        Dialect::Sqlite | Dialect::MySql => "DROP TABLE task_run",
    }
}

/// What a subscriber wrote, for a test to read.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A transaction that read `task_run` and stays open keeps every change of the table
/// waiting: each attempt's lock wait expires, the run gives up after its attempts with
/// `GaveUp` (nothing changed: the step is not recorded), and each expiry's warning names
/// the session that holds the lock, so that an operator knows what to end. Once that
/// transaction ends, the same run completes.
async fn a_held_lock_makes_the_run_give_up_naming_its_holder(db: &TestDb) {
    use tracing::instrument::WithSubscriber;
    Migrator::up(&db.db, Some(2)).await.expect("two steps");
    let holder = db.pool(1).await;
    let txn = holder.db.begin().await.expect("begin");
    let session = match db.dialect {
        Dialect::Postgres => "SELECT pg_backend_pid()::int8 AS n",
        _ => "SELECT CAST(CONNECTION_ID() AS SIGNED) AS n",
    };
    let read = |sql: &'static str| {
        let statement = sea_orm::Statement::from_string(txn.get_database_backend(), sql);
        async {
            let row = txn.query_one_raw(statement).await.expect("read");
            row.expect("a row").try_get::<i64>("", "n").expect("n")
        }
    };
    let session = read(session).await;
    read("SELECT COUNT(*) AS n FROM task_run WHERE resource_key = 'held-by-the-test'").await;

    let mut opts = options();
    opts.attempts = 2;
    opts.lock_timeout = Duration::from_millis(200);
    let log = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer({
            let log = log.clone();
            move || log.clone()
        })
        .finish();
    let outcome = up_online(&db.db, None, &opts)
        .with_subscriber(subscriber)
        .await;
    let why = match outcome {
        Err(OnlineError::GaveUp { attempts, why, .. }) => {
            assert_eq!(attempts, 2);
            why
        }
        other => panic!("expected GaveUp, got {other:?}"),
    };
    assert!(why.contains("timeout expired each time"), "{why}");
    let log = String::from_utf8(log.0.lock().expect("log").clone()).expect("utf-8");
    let named = match db.dialect {
        Dialect::Postgres => format!("held longest by pid {session} (idle in transaction"),
        _ => format!("held longest by session {session} (Sleep, transaction open"),
    };
    assert_eq!(log.matches(&named).count(), 2, "{log}");
    if db.dialect == Dialect::Postgres {
        // PostgreSQL keeps an idle session's last statement.
        assert!(log.contains("held-by-the-test"), "{log}");
    }
    let applied = harness::count(
        &db.db,
        format!(
            "SELECT COUNT(*) AS n FROM {}",
            task_dedup_migration::MIGRATION_TABLE
        ),
    )
    .await;
    assert_eq!(applied, 2);

    txn.rollback().await.expect("rollback");
    drop(holder);
    let report = up_online(&db.db, None, &opts)
        .await
        .expect("the lock is free");
    assert_eq!(report.applied.len(), steps() - 2);
}
