//! Migrations, the unique index they create, and the compat patch, on every dialect.

use harness::rows::{self, at, is_unique_violation};
use harness::{Dialect, TestDb, matrix};
use sea_orm::ConnectionTrait;
use sea_orm_migration::prelude::*;
use task_dedup::TaskStatus::{Cancelled, Failed, Queued, Running, Succeeded};
use task_dedup::{NewTask, TaskDedup, TaskKey};
use task_dedup_migration::{MIGRATION_TABLE, Migrator, SchemaError, ensure_schema};

matrix!(
    each_step_leaves_its_pinned_schema,
    up_down_up_leaves_schema_identical,
    up_twice_is_a_noop,
    index_admits_one_active_row_per_key,
    keys_are_byte_exact,
    timestamps_and_text_round_trip_exactly,
    migration_cancels_duplicate_active_rows,
    ensure_schema_upgrades_a_legacy_table,
    ensure_schema_makes_mysql_keys_exact_by_collation_or_varbinary,
    ensure_schema_after_migrations_changes_nothing,
    ensure_schema_refuses_what_it_cannot_fix_before_changing_anything,
    migrations_splice_into_an_application_migrator,
    standalone_and_application_migrators_keep_their_own_ledgers,
    upgrade_from_the_first_release_keeps_every_invariant,
    ensure_schema_brings_the_first_release_up_to_date,
    serial_upgrade_leaves_running_duplicates_running,
    serial_upgrade_by_ensure_schema_leaves_running_duplicates_running,
    running_index_admits_one_serial_run_per_key,
);

/// What the first release's migrations leave (steps 1 and 2).
const FIRST_RELEASE_STEPS: u32 = 2;

/// What the schema of `task_run` looks like, as the database describes it.
async fn schema(db: &TestDb) -> String {
    harness::schema::describe(&db.db, db.dialect).await
}

async fn has_table(db: &TestDb, table: &str) -> bool {
    SchemaManager::new(&db.db)
        .has_table(table)
        .await
        .expect("has_table")
}

/// Pins the schema each migration step leaves, per dialect (`schema/snapshots/`), and that
/// each step's `down` returns to the previous one. A released migration never changes:
/// if this fails after an edit to one, undo the edit and write a new migration instead.
async fn each_step_leaves_its_pinned_schema(db: &TestDb) {
    let steps = task_dedup_migration::migrations().len();
    let mut pinned = vec![schema(db).await];
    for step in 1..=steps {
        Migrator::up(&db.db, Some(1)).await.expect("one step up");
        let now = schema(db).await;
        insta::assert_snapshot!(format!("{}_step_{step}", db.dialect.name()), now);
        pinned.push(now);
    }
    for step in (1..=steps).rev() {
        Migrator::down(&db.db, Some(1))
            .await
            .expect("one step down");
        assert_eq!(schema(db).await, pinned[step - 1], "down of step {step}");
    }
}

async fn up_down_up_leaves_schema_identical(db: &TestDb) {
    Migrator::up(&db.db, None).await.expect("up");
    let first = schema(db).await;
    assert!(first.contains("task_active_resource_uidx"), "{first}");

    Migrator::down(&db.db, None).await.expect("down");
    assert!(!has_table(db, "task_run").await);
    assert!(schema(db).await.is_empty());

    Migrator::up(&db.db, None).await.expect("up again");
    assert_eq!(schema(db).await, first);
}

async fn up_twice_is_a_noop(db: &TestDb) {
    Migrator::up(&db.db, None).await.expect("up");
    let before = schema(db).await;
    Migrator::up(&db.db, None).await.expect("second up");
    assert_eq!(schema(db).await, before);
    assert!(
        Migrator::get_pending_migrations(&db.db)
            .await
            .expect("status")
            .is_empty()
    );
    assert_eq!(
        Migrator::get_applied_migrations(&db.db)
            .await
            .expect("status")
            .len(),
        task_dedup_migration::migrations().len()
    );
}

async fn index_admits_one_active_row_per_key(db: &TestDb) {
    db.migrate().await;
    for (n, (first, second)) in [
        (Queued, Queued),
        (Queued, Running),
        (Running, Queued),
        (Running, Running),
    ]
    .into_iter()
    .enumerate()
    {
        let key = ("u", "t", &*format!("combo-{n}"));
        rows::insert(&db.db, key, first, at(0))
            .await
            .expect("first active row");
        let err = rows::insert(&db.db, key, second, at(1))
            .await
            .expect_err("second active row must be rejected");
        assert!(
            is_unique_violation(&err),
            "{first:?} then {second:?}: {err}"
        );
    }

    // Finished rows never conflict, with each other or with the one active row.
    let key = ("u", "t", "history");
    for status in [Succeeded, Failed, Cancelled, Succeeded, Failed, Cancelled] {
        rows::insert(&db.db, key, status, at(0))
            .await
            .expect("finished row");
    }
    rows::insert(&db.db, key, Running, at(1))
        .await
        .expect("active row next to history");

    // Keys that differ in any one part are different keys.
    for key in [
        ("u", "t", "r"),
        ("u2", "t", "r"),
        ("u", "t2", "r"),
        ("u", "t", "r2"),
    ] {
        rows::insert(&db.db, key, Queued, at(0))
            .await
            .expect("distinct key");
    }
    assert_eq!(rows::all(&db.db).await.len(), 4 + 7 + 4);
}

async fn keys_are_byte_exact(db: &TestDb) {
    db.migrate().await;
    let variants = [
        "doc",
        "Doc",
        "DOC",
        "doc ",
        "doc  ",
        " doc",
        "café",
        "cafe\u{301}",
    ];
    for part in 0..3 {
        for variant in variants {
            let mut key = ["u", "t", "r"];
            key[part] = variant;
            rows::insert(&db.db, (key[0], key[1], key[2]), Queued, at(0))
                .await
                .unwrap_or_else(|e| panic!("part {part} = {variant:?} must be its own key: {e}"));
        }
        // ...and each variant is still exactly one key.
        let mut key = ["u", "t", "r"];
        key[part] = "doc ";
        let err = rows::insert(&db.db, (key[0], key[1], key[2]), Running, at(1))
            .await
            .expect_err("same bytes, same key");
        assert!(is_unique_violation(&err));
    }
}

async fn timestamps_and_text_round_trip_exactly(db: &TestDb) {
    db.migrate().await;
    let text = "🦀 café ";
    let created = at(0);
    let id = rows::insert(&db.db, ("ü", "t", text), Queued, created)
        .await
        .expect("insert");
    let row = rows::all(&db.db).await.remove(0);
    assert_eq!(row.id, id);
    assert_eq!(row.resource_key, text);
    assert_eq!(row.user_id, "ü");
    assert_eq!(row.created_at, created, "microseconds survive");
    assert_eq!(row.created_at.timestamp_subsec_micros(), 123_456);
}

async fn migration_cancels_duplicate_active_rows(db: &TestDb) {
    // The table as the first migration leaves it, before the unique index exists, with
    // the duplicates an old read-then-insert flow produced.
    Migrator::up(&db.db, Some(1))
        .await
        .expect("first migration");
    let a = ("u", "t", "a");
    let a_oldest = rows::insert(&db.db, a, Running, at(10))
        .await
        .expect("seed");
    let a_dup1 = rows::insert(&db.db, a, Queued, at(11)).await.expect("seed");
    let a_dup2 = rows::insert(&db.db, a, Queued, at(12)).await.expect("seed");
    let a_done = rows::insert(&db.db, a, Succeeded, at(5))
        .await
        .expect("seed");
    let b = ("u", "t", "b");
    let b_oldest = rows::insert(&db.db, b, Queued, at(20)).await.expect("seed");
    let b_dup = rows::insert(&db.db, b, Queued, at(21)).await.expect("seed");
    let c_only = rows::insert(&db.db, ("u", "t", "c"), Queued, at(30))
        .await
        .expect("seed");
    let before = row_count(db).await;

    Migrator::up(&db.db, None).await.expect("index migration");

    let after = rows::all(&db.db).await;
    assert_eq!(after.len() as i64, before, "nothing is deleted");
    let find = |id| after.iter().find(|row| row.id == id).expect("row kept");
    for (kept, status) in [
        (a_oldest, Running),
        (b_oldest, Queued),
        (c_only, Queued),
        (a_done, Succeeded),
    ] {
        assert_eq!(find(kept).status, status);
        assert_eq!(find(kept).error, None);
    }
    for (dup, superseded_by) in [(a_dup1, a_oldest), (a_dup2, a_oldest), (b_dup, b_oldest)] {
        let row = find(dup);
        assert_eq!(row.status, Cancelled);
        assert!(row.finished_at.is_some());
        let error = row
            .error
            .as_deref()
            .expect("error names the superseding task");
        assert!(error.contains(&superseded_by.to_string()), "{error}");
    }
    let active = after.iter().filter(|row| row.status.is_active()).count();
    assert_eq!(active, 3);

    // The guarantee now holds.
    let err = rows::insert(&db.db, a, Queued, at(40))
        .await
        .expect_err("index exists");
    assert!(is_unique_violation(&err));
}

async fn ensure_schema_upgrades_a_legacy_table(db: &TestDb) {
    harness::schema::create_legacy_table(db).await;
    let key = ("u", "t", "doc");
    let oldest = rows::insert(&db.db, key, Queued, at(0))
        .await
        .expect("seed");
    let dup = rows::insert(&db.db, key, Running, at(1))
        .await
        .expect("seed");
    // Different bytes, so a different key, though MySQL's default collation says equal.
    let other_case = rows::insert(&db.db, ("u", "t", "DOC"), Queued, at(2))
        .await
        .expect("seed");

    let report = ensure_schema(&db.db).await.expect("compat patch");
    assert!(!report.created_table);
    assert_eq!(report.cancelled_duplicates, 1, "{report}");
    let mut added = vec![
        "lease_owner",
        "lease_expires_at",
        "started_at",
        "finished_at",
        "run_at",
        "priority",
        "scope",
        "dedup_window_end",
    ];
    if db.dialect == Dialect::MySql {
        added.extend(["occupied", "concurrent", "running_slot"]);
    } else {
        added.push("concurrent");
    }
    added.extend(["snoozes", "run_slot"]);
    if db.dialect == Dialect::MySql {
        added.push("running_run_slot");
    }
    assert_eq!(report.added_columns, added, "{report}");
    // PostgreSQL's claim index is the lean one of migration 13, and it has no lookup index.
    let claim_indexes: &[&str] = match db.dialect {
        Dialect::Postgres => &["task_run_queue_idx"],
        _ => &["task_run_lookup_idx", "task_run_claim_idx"],
    };
    for index in claim_indexes
        .iter()
        .chain(&["task_active_resource_uidx", "task_running_resource_uidx"])
    {
        assert!(
            report.created_indexes.iter().any(|i| i == index),
            "{report}"
        );
    }
    match db.dialect {
        Dialect::MySql => assert_eq!(
            report.converted_columns,
            ["user_id", "task_type", "resource_key"]
        ),
        Dialect::Sqlite | Dialect::Postgres => assert!(report.converted_columns.is_empty()),
    }

    let rows = rows::all(&db.db).await;
    assert_eq!(rows.len(), 3);
    let status = |id| rows.iter().find(|row| row.id == id).expect("row").status;
    assert_eq!(
        (status(oldest), status(dup), status(other_case)),
        (Queued, Cancelled, Queued)
    );

    let err = rows::insert(&db.db, key, Running, at(3))
        .await
        .expect_err("guarantee holds");
    assert!(is_unique_violation(&err));
    rows::insert(&db.db, ("u", "t", "doc "), Running, at(3))
        .await
        .expect("trailing space is another key");

    let again = ensure_schema(&db.db).await.expect("second call");
    assert!(again.is_unchanged(), "{again}");
    // The migrations run cleanly on top and change nothing either.
    let before = schema(db).await;
    Migrator::up(&db.db, None)
        .await
        .expect("migrations after the compat patch");
    assert_eq!(schema(db).await, before);
}

/// MySQL/MariaDB: how the compat patch makes each key column byte-exact. A `utf8mb4`
/// `VARCHAR`, whatever its collation (`utf8mb4_bin` too: it pads spaces, so `'u'` and
/// `'u '` were equal), keeps its type and takes the server's binary NO PAD collation, a
/// change MariaDB makes without copying the table; a column in another character set
/// becomes `VARBINARY`, as before. Afterwards keys that differ by case or by a trailing
/// space are different keys in every column, and the guarantee holds.
async fn ensure_schema_makes_mysql_keys_exact_by_collation_or_varbinary(db: &TestDb) {
    if db.dialect != Dialect::MySql {
        return;
    }
    let ddl = legacy_ddl(
        db.dialect,
        Some(("task_type", "varchar(64) CHARACTER SET latin1 NOT NULL")),
        "",
    );
    db.exec(&format!(
        "{ddl} DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci"
    ))
    .await;
    db.exec(
        "ALTER TABLE task_run MODIFY user_id varchar(64) \
         CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL",
    )
    .await;
    // Equal under the old collations, one pair per column.
    let keys = [
        ("u", "t", "doc"),
        ("u ", "t", "doc"),
        ("u", "T", "doc"),
        ("u", "t", "DOC"),
    ];
    for (n, key) in keys.into_iter().enumerate() {
        rows::insert(&db.db, key, Queued, at(n as i64))
            .await
            .expect("seed");
    }

    let report = ensure_schema(&db.db).await.expect("compat patch");
    assert_eq!(
        report.converted_columns,
        ["user_id", "task_type", "resource_key"]
    );
    assert_eq!(report.cancelled_duplicates, 0, "{report}");
    let exact = if harness::count(
        &db.db,
        "SELECT COUNT(*) AS n FROM information_schema.COLLATIONS \
         WHERE COLLATION_NAME = 'utf8mb4_nopad_bin'",
    )
    .await
        > 0
    {
        "utf8mb4_nopad_bin"
    } else {
        "utf8mb4_0900_bin"
    };
    let columns: Vec<String> = db
        .db
        .query_all_raw(sea_orm::Statement::from_string(
            db.db.get_database_backend(),
            "SELECT CAST(CONCAT(COLUMN_NAME, ' ', COLUMN_TYPE, ' ', \
             COALESCE(COLLATION_NAME, '-')) AS CHAR) AS c FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'task_run' \
             AND COLUMN_NAME IN ('user_id', 'task_type', 'resource_key') \
             ORDER BY ORDINAL_POSITION",
        ))
        .await
        .expect("columns")
        .iter()
        .map(|row| row.try_get("", "c").expect("c"))
        .collect();
    assert_eq!(
        columns,
        [
            format!("user_id varchar(64) {exact}"),
            "task_type varbinary(256) -".to_owned(),
            format!("resource_key varchar(255) {exact}"),
        ]
    );

    // Four keys, four active tasks; each key refuses a second.
    let all = rows::all(&db.db).await;
    assert_eq!(all.iter().filter(|row| row.status == Queued).count(), 4);
    for key in keys {
        let err = rows::insert(&db.db, key, Running, at(10))
            .await
            .expect_err("the guarantee holds");
        assert!(is_unique_violation(&err), "{key:?}: {err}");
    }
    assert!(ensure_schema(&db.db).await.expect("again").is_unchanged());

    // The library on these columns: a hit returns the task the key's bytes name, a key
    // that differs by case is a new one.
    let task = |user: &str, resource: &str| {
        NewTask::new(TaskKey::new(user, "t", resource).expect("valid key"))
    };
    let hit = db
        .db
        .find_or_enqueue(task("u", "DOC"))
        .await
        .expect("find_or_enqueue");
    assert!(!hit.is_created());
    assert_eq!(hit.task().resource_key, "DOC");
    let created = db
        .db
        .find_or_enqueue(task("u", "Doc"))
        .await
        .expect("find_or_enqueue");
    assert!(created.is_created());
}

/// A legacy `task_run` with one column's type replaced (`override_`) and `extra` column
/// definitions appended.
fn legacy_ddl(dialect: Dialect, override_: Option<(&str, &str)>, extra: &str) -> String {
    let (uuid, json, time) = match dialect {
        Dialect::Sqlite => ("uuid_text", "json_text", "timestamp_with_timezone_text"),
        Dialect::Postgres => ("uuid", "jsonb", "timestamptz"),
        Dialect::MySql => ("binary(16)", "json", "datetime(6)"),
    };
    let columns = [
        ("id", format!("{uuid} NOT NULL PRIMARY KEY")),
        ("user_id", "varchar(64) NOT NULL".to_owned()),
        ("task_type", "varchar(64) NOT NULL".to_owned()),
        ("resource_key", "varchar(255) NOT NULL".to_owned()),
        ("status", "varchar(16) NOT NULL".to_owned()),
        ("payload", json.to_owned()),
        ("error", "text".to_owned()),
        ("attempts", "integer NOT NULL DEFAULT 0".to_owned()),
        ("created_at", format!("{time} NOT NULL")),
        ("updated_at", format!("{time} NOT NULL")),
    ];
    let mut parts: Vec<String> = columns
        .iter()
        .map(|(name, def)| match override_ {
            Some((column, replacement)) if column == *name => format!("{name} {replacement}"),
            _ => format!("{name} {def}"),
        })
        .collect();
    if !extra.is_empty() {
        parts.push(extra.to_owned());
    }
    format!("CREATE TABLE task_run ({})", parts.join(", "))
}

async fn ensure_schema_refuses_what_it_cannot_fix_before_changing_anything(db: &TestDb) {
    use Dialect::{MySql, Postgres, Sqlite};
    /// Dialects, the column the error must name, a column override, an extra column.
    type Case<'a> = (&'a [Dialect], &'a str, Option<(&'a str, &'a str)>, &'a str);
    let cases: [Case; 9] = [
        (
            &[Sqlite, Postgres, MySql],
            "tenant_id",
            None,
            "tenant_id varchar(64) NOT NULL",
        ),
        (
            &[Sqlite, Postgres, MySql],
            "payload",
            Some(("payload", "varchar(255) NOT NULL")),
            "",
        ),
        (
            &[Postgres, MySql],
            "user_id",
            Some(("user_id", "varchar(32) NOT NULL")),
            "",
        ),
        (
            &[Postgres],
            "id",
            Some(("id", "bigserial NOT NULL PRIMARY KEY")),
            "",
        ),
        (
            &[Postgres],
            "created_at",
            Some(("created_at", "timestamp NOT NULL")),
            "",
        ),
        (
            &[MySql],
            "created_at",
            Some(("created_at", "datetime NOT NULL")),
            "",
        ),
        (
            &[MySql],
            "id",
            Some(("id", "char(36) NOT NULL PRIMARY KEY")),
            "",
        ),
        (&[Sqlite], "id", Some(("id", "INTEGER PRIMARY KEY")), ""),
        (
            &[Postgres],
            "attempts",
            Some(("attempts", "bigint NOT NULL DEFAULT 0")),
            "",
        ),
    ];
    for (dialects, column, override_, extra) in cases {
        if !dialects.contains(&db.dialect) {
            continue;
        }
        db.exec(&legacy_ddl(db.dialect, override_, extra)).await;
        assert_refused(db, column).await;
        db.exec("DROP TABLE task_run").await;
    }

    // SQLite: ids another ORM wrote as 36-character text.
    if db.dialect == Sqlite {
        db.exec(&legacy_ddl(db.dialect, None, "")).await;
        db.exec(
            "INSERT INTO task_run (id, user_id, task_type, resource_key, status, \
             created_at, updated_at) VALUES ('0193a4f2-7c1e-7a2b-9c3d-4e5f6a7b8c9d', 'u', 't', \
             'r', 'queued', '2026-11-30T00:00:00+00:00', '2026-11-30T00:00:00+00:00')",
        )
        .await;
        let problems = assert_refused(db, "id").await;
        assert!(
            problems.contains("0193a4f2-7c1e-7a2b-9c3d-4e5f6a7b8c9d"),
            "{problems}"
        );
    }
}

/// `ensure_schema` fails naming `column`, and the table is exactly as before. Returns
/// the error message.
async fn assert_refused(db: &TestDb, column: &str) -> String {
    let before = schema(db).await;
    let rows_before = row_count(db).await;
    let err = ensure_schema(&db.db).await.expect_err("must refuse");
    let SchemaError::Incompatible { problems } = &err else {
        panic!("expected Incompatible, got {err:?}");
    };
    assert!(
        problems.iter().any(|p| p.column == column),
        "{column} not named: {err}"
    );
    let message = err.to_string();
    assert!(
        message.contains(column) && message.contains("nothing was changed"),
        "{message}"
    );
    assert_eq!(schema(db).await, before, "nothing was altered");
    let rows_after = row_count(db).await;
    assert_eq!(rows_after, rows_before);
    message
}

async fn row_count(db: &TestDb) -> i64 {
    // A count, not `SELECT *`: PostgreSQL's cached plan of the latter breaks when the
    // test recreates the table with other columns.
    let row = db
        .db
        .query_one_raw(db.stmt("SELECT COUNT(*) AS n FROM task_run", vec![]))
        .await
        .expect("count")
        .expect("a row");
    row.try_get::<i64>("", "n").expect("n")
}

async fn ensure_schema_after_migrations_changes_nothing(db: &TestDb) {
    db.migrate().await;
    let report = ensure_schema(&db.db).await.expect("compat patch");
    assert!(report.is_unchanged(), "{report}");

    // On an empty database it creates everything, and is a no-op the second time.
    Migrator::down(&db.db, None).await.expect("down");
    let report = ensure_schema(&db.db).await.expect("compat patch");
    assert!(report.created_table, "{report}");
    // PostgreSQL's lean set of migration 13: seven; elsewhere eleven.
    let indexes = match db.dialect {
        Dialect::Postgres => 7,
        _ => 11,
    };
    assert_eq!(report.created_indexes.len(), indexes, "{report}");
    // Workers' claims read the paused and the limited types: ensure_schema creates their
    // tables too.
    assert!(has_table(db, "task_dedup_paused").await);
    assert!(has_table(db, "task_dedup_limits").await);
    assert!(ensure_schema(&db.db).await.expect("again").is_unchanged());
}

/// An application's own migration, next to task-dedup's.
struct CreateWidget;

impl MigrationName for CreateWidget {
    fn name(&self) -> &str {
        "m20270101_000001_create_widget"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for CreateWidget {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("app_widget")
                    .col(ColumnDef::new("id").integer().not_null().primary_key())
                    .col(ColumnDef::new("name").string().not_null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table("app_widget").to_owned())
            .await
    }
}

struct AppMigrator;

#[async_trait::async_trait]
impl MigratorTrait for AppMigrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        let mut migrations = task_dedup_migration::migrations();
        migrations.push(Box::new(CreateWidget));
        migrations
    }
}

async fn migrations_splice_into_an_application_migrator(db: &TestDb) {
    AppMigrator::up(&db.db, None)
        .await
        .expect("spliced migrations apply");
    assert!(has_table(db, "task_run").await && has_table(db, "app_widget").await);
    let applied: Vec<String> = AppMigrator::get_applied_migrations(&db.db)
        .await
        .expect("status")
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    assert_eq!(
        applied,
        [
            "m20261130_000001_task_dedup_create_task_run",
            "m20261130_000002_task_dedup_active_resource_uidx",
            "m20261130_000003_task_dedup_scheduling",
            "m20261130_000004_task_dedup_scopes",
            "m20261201_000005_task_dedup_serial_per_key",
            "m20261202_000006_task_dedup_maintenance",
            "m20261202_000007_task_dedup_admin",
            "m20261203_000008_task_dedup_key_prefix",
            "m20261203_000009_task_dedup_pooler_function",
            "m20261204_000010_task_dedup_snoozes",
            "m20261205_000011_task_dedup_limits",
            "m20261206_000012_task_dedup_virtual_markers",
            "m20261207_000013_task_dedup_lean_indexes",
            "m20270101_000001_create_widget",
        ]
    );
    rows::insert(&db.db, ("u", "t", "r"), Queued, at(0))
        .await
        .expect("task_run usable");

    AppMigrator::down(&db.db, None)
        .await
        .expect("everything rolls back");
    assert!(!has_table(db, "task_run").await && !has_table(db, "app_widget").await);
}

/// The spliced migrations record into the application's ledger, the standalone migrator
/// into its own: each runs after the other without tripping over its records.
async fn standalone_and_application_migrators_keep_their_own_ledgers(db: &TestDb) {
    AppMigrator::up(&db.db, None)
        .await
        .expect("application migrator");
    let migrated = schema(db).await;

    Migrator::up(&db.db, None)
        .await
        .expect("standalone migrator after the application's");
    assert_eq!(
        schema(db).await,
        migrated,
        "the standalone run changed nothing"
    );
    assert!(has_table(db, MIGRATION_TABLE).await);
    let standalone: Vec<String> = Migrator::get_applied_migrations(&db.db)
        .await
        .expect("standalone status")
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    assert_eq!(
        standalone,
        [
            "m20261130_000001_task_dedup_create_task_run",
            "m20261130_000002_task_dedup_active_resource_uidx",
            "m20261130_000003_task_dedup_scheduling",
            "m20261130_000004_task_dedup_scopes",
            "m20261201_000005_task_dedup_serial_per_key",
            "m20261202_000006_task_dedup_maintenance",
            "m20261202_000007_task_dedup_admin",
            "m20261203_000008_task_dedup_key_prefix",
            "m20261203_000009_task_dedup_pooler_function",
            "m20261204_000010_task_dedup_snoozes",
            "m20261205_000011_task_dedup_limits",
            "m20261206_000012_task_dedup_virtual_markers",
            "m20261207_000013_task_dedup_lean_indexes",
        ]
    );

    AppMigrator::up(&db.db, None)
        .await
        .expect("application migrator again");
    assert!(
        AppMigrator::get_pending_migrations(&db.db)
            .await
            .expect("application status")
            .is_empty()
    );
    assert_eq!(
        AppMigrator::get_applied_migrations(&db.db)
            .await
            .expect("application status")
            .len(),
        task_dedup_migration::migrations().len() + 1
    );
    Migrator::status(&db.db).await.expect("standalone status");
    assert_eq!(schema(db).await, migrated);
}

/// A database as the first release left it, in use: duplicates an even older flow left
/// (resolved by step 2), queued, running and finished tasks. Returns the ids of the
/// queued tasks, oldest first, and of the running one.
async fn seed_first_release(db: &TestDb) -> (Vec<uuid::Uuid>, uuid::Uuid) {
    Migrator::up(&db.db, Some(1)).await.expect("step 1");
    let dup_oldest = rows::insert(&db.db, ("u", "t", "dup"), Queued, at(0))
        .await
        .expect("seed");
    rows::insert(&db.db, ("u", "t", "dup"), Queued, at(1))
        .await
        .expect("seed");
    Migrator::up(&db.db, Some(1)).await.expect("step 2");
    let queued = rows::insert(&db.db, ("u", "t", "queued"), Queued, at(2))
        .await
        .expect("seed");
    let running = rows::insert(&db.db, ("u", "t", "running"), Running, at(3))
        .await
        .expect("seed");
    for status in [Succeeded, Failed, Cancelled] {
        rows::insert(&db.db, ("u", "t", "done"), status, at(4))
            .await
            .expect("seed");
    }
    rows::insert(&db.db, ("u", "t", "hist"), Succeeded, at(5))
        .await
        .expect("seed");
    let hist = rows::insert(&db.db, ("u", "t", "hist"), Queued, at(6))
        .await
        .expect("seed");
    (vec![dup_oldest, queued, hist], running)
}

/// After the upgrade, tasks of the first release behave as `Scope::Active` tasks of
/// priority 0 that are due now, and every invariant holds.
async fn assert_upgraded(db: &TestDb, queued: &[uuid::Uuid], running: uuid::Uuid) {
    use task_dedup::task_run::TaskScope;
    use task_dedup::{NewTask, Scope, TaskDedup, TaskKey, TaskLifecycle};

    let all = rows::all(&db.db).await;
    assert_eq!(all.len(), 9, "nothing lost");
    for row in &all {
        assert_eq!(
            (row.scope, row.dedup_window_end, row.priority),
            (TaskScope::Active, 0, 0),
            "{row:?}"
        );
        assert!(row.run_at <= chrono::Utc::now(), "due now: {row:?}");
    }
    let cancelled_dups = all
        .iter()
        .filter(|r| r.resource_key == "dup" && r.status == Cancelled)
        .count();
    assert_eq!(cancelled_dups, 1);

    let key = |resource: &str| TaskKey::new("u", "t", resource).expect("key");
    // Held keys stay held, whatever the new request's policy.
    for (resource, held_by) in [
        ("queued", queued[1]),
        ("running", running),
        ("dup", queued[0]),
    ] {
        for task in [
            NewTask::new(key(resource)),
            NewTask::new(key(resource)).scope(Scope::Queued),
        ] {
            let outcome = db.db.find_or_enqueue(task).await.expect("enqueue");
            assert_eq!((outcome.is_created(), outcome.task().id), (false, held_by));
        }
    }
    // A key with only finished tasks is free.
    assert!(
        db.db
            .find_or_enqueue(NewTask::new(key("done")))
            .await
            .expect("enqueue")
            .is_created()
    );
    // Old queued tasks are claimed first, oldest first, then the new one.
    let mut claimed = Vec::new();
    while let Some(task) = db
        .db
        .claim("w", &[], std::time::Duration::from_secs(60))
        .await
        .expect("claim")
    {
        claimed.push(task.id);
    }
    assert_eq!(claimed.len(), 4);
    assert_eq!(claimed[..3], *queued);
}

async fn upgrade_from_the_first_release_keeps_every_invariant(db: &TestDb) {
    let (queued, running) = seed_first_release(db).await;
    assert_eq!(
        Migrator::get_applied_migrations(&db.db)
            .await
            .expect("status")
            .len(),
        FIRST_RELEASE_STEPS as usize
    );
    Migrator::up(&db.db, None).await.expect("upgrade");
    assert_upgraded(db, &queued, running).await;
}

async fn ensure_schema_brings_the_first_release_up_to_date(db: &TestDb) {
    let (queued, running) = seed_first_release(db).await;
    let report = ensure_schema(&db.db).await.expect("compat patch");
    assert!(!report.created_table);
    for column in ["run_at", "priority", "scope", "dedup_window_end"] {
        assert!(
            report.added_columns.iter().any(|c| c == column),
            "{column}: {report}"
        );
    }
    assert_eq!(report.cancelled_duplicates, 0, "step 2 had resolved them");
    let upgraded = schema(db).await;
    Migrator::up(&db.db, None)
        .await
        .expect("the migrator afterwards");
    assert_eq!(schema(db).await, upgraded, "and it changes nothing");
    assert_upgraded(db, &queued, running).await;
}

/// Steps 1-4, then three tasks of one key running side by side as older releases let
/// them (scope `queued`, and one `active`), and a follow-up queued behind them; another
/// key with one running task. Returns the running ids of the key, oldest first, and the
/// follow-up's.
async fn seed_running_duplicates(db: &TestDb) -> (Vec<uuid::Uuid>, uuid::Uuid) {
    Migrator::up(&db.db, Some(4)).await.expect("steps 1-4");
    let key = ("u", "t", "doc");
    let mut running = Vec::new();
    for n in 0..3 {
        let id = rows::insert(&db.db, key, Running, at(n))
            .await
            .expect("seed");
        // `queued` scope: a running task no longer holds the key, so the next one fits.
        if n < 2 {
            let sql = match db.dialect {
                Dialect::Postgres => "UPDATE task_run SET scope = 'queued' WHERE id = $1",
                _ => "UPDATE task_run SET scope = 'queued' WHERE id = ?",
            };
            db.db
                .execute_raw(db.stmt(sql, vec![id.into()]))
                .await
                .expect("scope");
        }
        running.push(id);
    }
    rows::insert(&db.db, ("u", "t", "other"), Running, at(3))
        .await
        .expect("seed");
    // The third running task is `active` and holds the key: the follow-up takes a
    // period window of its own (written finished, then moved there).
    let follow_up = rows::insert(&db.db, key, Succeeded, at(4))
        .await
        .expect("seed");
    let sql = match db.dialect {
        Dialect::Postgres => {
            "UPDATE task_run SET status = 'queued', scope = 'period', dedup_window_end = 1 \
             WHERE id = $1"
        }
        _ => {
            "UPDATE task_run SET status = 'queued', scope = 'period', dedup_window_end = 1 \
             WHERE id = ?"
        }
    };
    db.db
        .execute_raw(db.stmt(sql, vec![follow_up.into()]))
        .await
        .expect("window");
    (running, follow_up)
}

/// After the upgrade: every task that ran still runs (the oldest of the key keeps its
/// run, the others were marked `concurrent`), and the rule holds from the next claim:
/// the follow-up waits until the oldest ends.
async fn assert_serial_upgrade(db: &TestDb, running: &[uuid::Uuid], follow_up: uuid::Uuid) {
    use task_dedup::TaskLifecycle;
    let lease = std::time::Duration::from_secs(60);
    let all = rows::all(&db.db).await;
    let of_key: Vec<_> = all.iter().filter(|r| r.resource_key == "doc").collect();
    let still_running: Vec<_> = of_key
        .iter()
        .filter(|r| r.status == Running)
        .map(|r| (r.id, r.concurrent))
        .collect();
    assert_eq!(
        still_running,
        [(running[0], false), (running[1], true), (running[2], true)],
        "all keep running; the oldest keeps the key's run"
    );
    assert!(all.iter().all(|r| r.resource_key == "doc" || !r.concurrent));
    assert_eq!(db.db.claim("w", &[], lease).await.expect("claim"), None);
    // A second serial run of the key is refused by the database itself.
    let sql = match db.dialect {
        Dialect::Postgres => "UPDATE task_run SET status = 'running' WHERE id = $1",
        _ => "UPDATE task_run SET status = 'running' WHERE id = ?",
    };
    let err = db
        .db
        .execute_raw(db.stmt(sql, vec![follow_up.into()]))
        .await
        .expect_err("the running index");
    assert!(is_unique_violation(&err), "{err}");
    // The exempted ones ending frees nothing; the oldest ending lets the follow-up run.
    for id in &running[1..] {
        finish(db, *id).await;
    }
    assert_eq!(db.db.claim("w", &[], lease).await.expect("claim"), None);
    finish(db, running[0]).await;
    // Claimed as a worker would, polling: PostgreSQL answers the refused UPDATE above
    // before its session has let go of the follow-up's row lock, which a claim
    // (`SKIP LOCKED`) then passes over for a moment (seen once in CI, on a loaded
    // machine).
    let polled = std::time::Instant::now();
    let next = loop {
        let next = db.db.claim("w", &[], lease).await.expect("claim");
        if next.is_some() || polled.elapsed() > std::time::Duration::from_secs(2) {
            break next;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(next.map(|t| t.id), Some(follow_up));
}

/// Marks a task succeeded behind the library's back (the seeded rows have no lease).
async fn finish(db: &TestDb, id: uuid::Uuid) {
    let sql = match db.dialect {
        Dialect::Postgres => "UPDATE task_run SET status = 'succeeded' WHERE id = $1",
        _ => "UPDATE task_run SET status = 'succeeded' WHERE id = ?",
    };
    db.db
        .execute_raw(db.stmt(sql, vec![id.into()]))
        .await
        .expect("finish");
}

async fn serial_upgrade_leaves_running_duplicates_running(db: &TestDb) {
    let (running, follow_up) = seed_running_duplicates(db).await;
    Migrator::up(&db.db, None).await.expect("step 5");
    assert_serial_upgrade(db, &running, follow_up).await;
}

async fn serial_upgrade_by_ensure_schema_leaves_running_duplicates_running(db: &TestDb) {
    let (running, follow_up) = seed_running_duplicates(db).await;
    let report = ensure_schema(&db.db).await.expect("compat patch");
    assert!(
        report
            .created_indexes
            .iter()
            .any(|i| i == "task_running_resource_uidx"),
        "{report}"
    );
    assert_serial_upgrade(db, &running, follow_up).await;
}

/// The index itself: one running task per key that did not opt out, whatever the
/// scopes and windows; `concurrent` ones and other statuses are free.
async fn running_index_admits_one_serial_run_per_key(db: &TestDb) {
    db.migrate().await;
    let key = ("u", "t", "doc");
    let first = rows::insert(&db.db, key, Running, at(0))
        .await
        .expect("one run");
    let set = |sql: &str| match db.dialect {
        Dialect::Postgres => sql.replace('?', "$1"),
        _ => sql.to_owned(),
    };
    db.db
        .execute_raw(db.stmt(
            &set("UPDATE task_run SET scope = 'queued' WHERE id = ?"),
            vec![first.into()],
        ))
        .await
        .expect("scope");
    // Not held by the first (scope queued, running), so the active index lets it in...
    let err = rows::insert(&db.db, key, Running, at(1))
        .await
        .expect_err("...but the running index does not");
    assert!(is_unique_violation(&err), "{err}");
    let second = rows::insert(&db.db, key, Queued, at(2))
        .await
        .expect("queued behind it");
    db.db
        .execute_raw(db.stmt(
            &set("UPDATE task_run SET concurrent = true, status = 'running' WHERE id = ?"),
            vec![second.into()],
        ))
        .await
        .expect("a concurrent task runs beside it");
    rows::insert(&db.db, ("u", "t", "other"), Running, at(3))
        .await
        .expect("another key");
}
