//! The `task-dedup` binary, run as an operator would, on SQLite, PostgreSQL and
//! MySQL/MariaDB (the workspace's dialect-matrix harness, `tests/harness`): each
//! subcommand's effect read back from the database and its `--json` parsed; bad input
//! refused with one line and status 2 before any connection; an unmigrated database
//! named as such; an unreachable one named within the probe's seconds.
// A test file: a panic is how it fails.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use chrono::Duration;
use harness::rows::{self, at};
use harness::{TestDb, matrix};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
use serde_json::Value;
use task_dedup::{TaskAdmin, TaskLifecycle, TaskStatus, task_run};
use uuid::Uuid;

const BIN: &str = env!("CARGO_BIN_EXE_task-dedup");

matrix!(
    list_pages_and_show,
    retry_cancel_delete_one_task,
    bulk_actions_need_a_limit_and_respect_it,
    stats_pause_resume_and_prune,
    an_unmigrated_database_is_named_then_migrate_fixes_it,
    limits_set_list_and_clear,
);

/// What one run printed, and its status.
struct Ran {
    status: Option<i32>,
    stdout: String,
    stderr: String,
}

/// An empty directory of this test binary's own, to run the binary in: no `.env` of
/// this repository, no `task_dedup.db` but those the tests make.
fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("task-dedup-cli-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    })
}

/// Runs the binary with `args` in [`scratch`], `DATABASE_URL` unset, backtraces on (a
/// panic would show one).
fn run(args: &[&str]) -> Ran {
    let output = Command::new(BIN)
        .args(args)
        .current_dir(scratch())
        .env_remove("DATABASE_URL")
        .env_remove("DATABASE_SCHEMA")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run task-dedup");
    Ran {
        status: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `task-dedup -u <db> <args>`, which must succeed; its stdout.
fn ok(db: &TestDb, args: &[&str]) -> String {
    let ran = run(&[&["-u", db.url.as_str()], args].concat());
    assert_eq!(ran.status, Some(0), "{args:?}: {}", ran.stderr);
    ran.stdout
}

/// [`ok`] with `--json`: the one document it printed.
fn json(db: &TestDb, args: &[&str]) -> Value {
    let stdout = ok(db, &[&["--json"], args].concat());
    serde_json::from_str(&stdout).unwrap_or_else(|err| panic!("{args:?}: {err}: {stdout}"))
}

/// Runs `args`, which must fail with `status` and exactly one line on stderr, neither a
/// panic nor a backtrace; returns that line.
fn refused(args: &[&str], status: i32) -> String {
    let ran = run(args);
    assert_eq!(ran.status, Some(status), "{args:?}: {}", ran.stderr);
    let lines: Vec<&str> = ran.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: {}", ran.stderr);
    assert!(lines[0].starts_with("task-dedup: "), "{}", lines[0]);
    assert!(!ran.stderr.contains("panicked"), "{}", ran.stderr);
    assert!(ran.stdout.is_empty(), "{args:?}: {}", ran.stdout);
    lines[0].to_owned()
}

/// The task as stored, `None` when deleted.
async fn stored(db: &TestDb, id: Uuid) -> Option<task_run::Model> {
    db.db.get_task(id).await.expect("get_task")
}

/// Seeds `(type, key, status)` rows one second apart, oldest first; their ids.
async fn seed(db: &TestDb, rows: &[(&str, &str, TaskStatus)]) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for (seconds, (task_type, key, status)) in (0..).zip(rows) {
        let id = rows::insert(&db.db, ("u1", task_type, key), *status, at(seconds))
            .await
            .expect("seed");
        ids.push(id);
    }
    ids
}

fn ids_of(document: &Value) -> Vec<Uuid> {
    document["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|task| task["id"].as_str().expect("id").parse().expect("uuid"))
        .collect()
}

async fn list_pages_and_show(db: &TestDb) {
    db.migrate().await;
    let ids = seed(
        db,
        &[
            ("export", "r/1", TaskStatus::Failed),
            ("export", "r/2", TaskStatus::Succeeded),
            ("export", "r/3", TaskStatus::Failed),
            ("mail", "r/4", TaskStatus::Failed),
            ("export", "q/5", TaskStatus::Failed),
        ],
    )
    .await;

    // Newest first, two a page, the cursor of the next page printed.
    let filter = ["tasks", "list", "--status", "failed", "--type", "export"];
    let first = json(db, &[&filter[..], &["--limit", "2"]].concat());
    assert_eq!(ids_of(&first), [ids[4], ids[2]]);
    assert_eq!(first["tasks"][0]["status"], "failed");
    assert_eq!(first["tasks"][0]["resource_key"], "q/5");
    let next = first["next"].as_str().expect("a next page").to_owned();
    let second = json(
        db,
        &[&filter[..], &["--limit", "2", "--after", &next]].concat(),
    );
    assert_eq!(ids_of(&second), [ids[0]]);
    assert_eq!(second["next"], Value::Null);

    // Each other condition, oldest first.
    let prefixed = json(db, &["tasks", "list", "--key-prefix", "r/", "--oldest"]);
    assert_eq!(ids_of(&prefixed), ids[..4]);
    let window = json(
        db,
        &[
            "tasks",
            "list",
            "--user",
            "u1",
            "--created-after",
            &at(1).to_rfc3339(),
            "--created-before",
            &at(3).to_rfc3339(),
        ],
    );
    assert_eq!(ids_of(&window), [ids[2], ids[1]]);

    // The table names each task and the way on.
    let table = ok(db, &[&filter[..], &["--limit", "2"]].concat());
    let header = table.lines().next().expect("header");
    assert!(
        header.starts_with("ID") && header.contains("STATUS"),
        "{table}"
    );
    assert!(table.contains(&ids[4].to_string()), "{table}");
    assert!(table.contains(&format!("--after {next}")), "{table}");

    let shown = json(db, &["tasks", "show", &ids[3].to_string()]);
    assert_eq!(shown["id"], ids[3].to_string());
    assert_eq!(shown["task_type"], "mail");
    assert_eq!(shown["attempts"], 0);
    let text = ok(db, &["tasks", "show", &ids[3].to_string()]);
    assert!(
        text.contains("resource_key") && text.contains("r/4"),
        "{text}"
    );

    let missing = Uuid::now_v7();
    let line = refused(&["-u", &db.url, "tasks", "show", &missing.to_string()], 1);
    assert!(
        line.contains(&format!("task {missing} not found")),
        "{line}"
    );
}

async fn retry_cancel_delete_one_task(db: &TestDb) {
    db.migrate().await;
    let ids = seed(
        db,
        &[
            ("export", "r/1", TaskStatus::Failed),
            ("export", "r/2", TaskStatus::Failed),
            ("export", "r/2", TaskStatus::Queued),
            ("export", "r/3", TaskStatus::Succeeded),
        ],
    )
    .await;
    let [failed, held, holder, succeeded] = [ids[0], ids[1], ids[2], ids[3]];

    let retried = json(db, &["tasks", "retry", &failed.to_string()]);
    assert_eq!(retried["status"], "queued");
    assert_eq!(stored(db, failed).await.unwrap().status, TaskStatus::Queued);

    // Another task holds the key: refused, the holder named, nothing changed.
    let line = refused(&["-u", &db.url, "tasks", "retry", &held.to_string()], 1);
    assert!(line.contains(&format!("held by task {holder}")), "{line}");
    assert_eq!(stored(db, held).await.unwrap().status, TaskStatus::Failed);
    // A queued task is not retried; a succeeded one not cancelled.
    let line = refused(&["-u", &db.url, "tasks", "retry", &holder.to_string()], 1);
    assert!(line.contains("it is queued"), "{line}");
    let line = refused(
        &["-u", &db.url, "tasks", "cancel", &succeeded.to_string()],
        1,
    );
    assert!(line.contains("it is succeeded"), "{line}");

    let text = ok(
        db,
        &[
            "tasks",
            "cancel",
            &holder.to_string(),
            "--reason",
            "duplicate export",
        ],
    );
    assert!(text.contains(&format!("cancelled task {holder}")), "{text}");
    let cancelled = stored(db, holder).await.unwrap();
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
    assert_eq!(cancelled.error.as_deref(), Some("duplicate export"));

    // An active task is not deleted; a finished one is.
    let line = refused(&["-u", &db.url, "tasks", "delete", &failed.to_string()], 1);
    assert!(line.contains("cannot delete"), "{line}");
    let deleted = json(db, &["tasks", "delete", &succeeded.to_string()]);
    assert_eq!(deleted["deleted"], succeeded.to_string());
    assert!(stored(db, succeeded).await.is_none());
}

async fn bulk_actions_need_a_limit_and_respect_it(db: &TestDb) {
    db.migrate().await;
    let ids = seed(
        db,
        &[
            ("export", "r/1", TaskStatus::Failed),
            ("export", "r/2", TaskStatus::Failed),
            ("export", "r/3", TaskStatus::Failed),
            ("mail", "r/4", TaskStatus::Failed),
            ("export", "r/3", TaskStatus::Queued),
        ],
    )
    .await;

    let line = refused(
        &[
            "-u", &db.url, "tasks", "retry", "--status", "failed", "--type", "export",
        ],
        2,
    );
    assert!(line.contains("--limit"), "{line}");
    let line = refused(
        &[
            "-u",
            &db.url,
            "tasks",
            "retry",
            &ids[0].to_string(),
            "--type",
            "x",
        ],
        2,
    );
    assert!(line.contains("cannot be used with"), "{line}");

    // The two oldest failed exports; the mail task is not of the type.
    let outcome = json(
        db,
        &[
            "tasks", "retry", "--status", "failed", "--type", "export", "--limit", "2",
        ],
    );
    assert_eq!(outcome["action"], "retry");
    assert_eq!(
        (outcome["selected"].as_u64(), outcome["applied"].as_u64()),
        (Some(2), Some(2))
    );
    for (id, status) in [
        (ids[0], TaskStatus::Queued),
        (ids[1], TaskStatus::Queued),
        (ids[2], TaskStatus::Failed),
        (ids[3], TaskStatus::Failed),
    ] {
        assert_eq!(stored(db, id).await.unwrap().status, status);
    }
    // The third's key is held by a queued task: counted, left alone.
    let outcome = json(db, &["tasks", "retry", "--type", "export", "--limit", "10"]);
    assert_eq!(outcome["key_held"], 1);
    assert_eq!(outcome["applied"], 0);

    let outcome = json(
        db,
        &[
            "tasks", "cancel", "--type", "export", "--limit", "10", "--reason", "drain",
        ],
    );
    assert_eq!(
        (outcome["selected"].as_u64(), outcome["applied"].as_u64()),
        (Some(3), Some(3))
    );
    assert_eq!(
        stored(db, ids[4]).await.unwrap().error.as_deref(),
        Some("drain")
    );

    let text = ok(
        db,
        &["tasks", "delete", "--status", "cancelled", "--limit", "2"],
    );
    assert!(text.starts_with("deleted 2 of 2 selected"), "{text}");
    let left = db.db.counts().await.unwrap();
    let cancelled: u64 = left
        .iter()
        .filter(|c| c.status == TaskStatus::Cancelled)
        .map(|c| c.count)
        .sum();
    assert_eq!(cancelled, 1);
    assert!(stored(db, ids[0]).await.is_none() && stored(db, ids[1]).await.is_none());
}

async fn stats_pause_resume_and_prune(db: &TestDb) {
    db.migrate().await;
    let ids = seed(
        db,
        &[
            ("export", "r/1", TaskStatus::Succeeded),
            ("export", "r/2", TaskStatus::Failed),
            ("mail", "r/3", TaskStatus::Queued),
            ("mail", "r/4", TaskStatus::Succeeded),
        ],
    )
    .await;

    let stats = json(db, &["tasks", "stats"]);
    let counts = stats["counts"].as_array().expect("counts");
    assert_eq!(counts.len(), 4, "{stats}");
    assert!(counts.contains(&serde_json::json!(
        {"task_type": "export", "status": "failed", "count": 1}
    )));
    assert_eq!(stats["oldest_queued"][0]["task_type"], "mail");
    assert!(stats["oldest_queued"][0]["age_seconds"].as_u64().unwrap() > 86_400);
    assert_eq!(stats["last_hour"]["created"], 0);
    let text = ok(db, &["tasks", "stats"]);
    assert!(text.starts_with("TYPE"), "{text}");
    assert!(text.contains("last hour: 0 created"), "{text}");

    let paused = json(db, &["pause", "mail"]);
    assert_eq!(
        paused,
        serde_json::json!({"task_type": "mail", "paused": true, "changed": true})
    );
    assert_eq!(ok(db, &["pause", "mail"]), "mail was already paused\n");
    let names: Vec<String> = db
        .db
        .paused()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.task_type)
        .collect();
    assert_eq!(names, ["mail"]);
    assert_eq!(json(db, &["paused"])["paused"][0]["task_type"], "mail");
    assert_eq!(
        json(db, &["tasks", "stats"])["paused"][0]["task_type"],
        "mail"
    );
    assert_eq!(ok(db, &["resume", "mail"]), "resumed mail\n");
    assert!(db.db.paused().await.unwrap().is_empty());
    assert_eq!(ok(db, &["paused"]), "no task type is paused\n");

    // Finished two days ago: the defaults prune the succeeded ones, keep the failed one.
    task_run::Entity::update_many()
        .col_expr(
            task_run::Column::FinishedAt,
            Expr::value(chrono::Utc::now() - Duration::days(2)),
        )
        .filter(task_run::Column::Status.ne(TaskStatus::Queued))
        .exec(&db.db)
        .await
        .expect("backdate");
    let pruned = json(db, &["prune"]);
    assert_eq!(
        pruned,
        serde_json::json!({"succeeded": 2, "failed": 0, "cancelled": 0, "total": 2})
    );
    assert!(stored(db, ids[0]).await.is_none() && stored(db, ids[3]).await.is_none());
    assert!(stored(db, ids[1]).await.is_some());
    let text = ok(db, &["prune", "--failed", "1d", "--batch-size", "10"]);
    assert_eq!(
        text,
        "pruned 1 task(s): 0 succeeded, 1 failed, 0 cancelled\n"
    );
    assert!(stored(db, ids[1]).await.is_none());
    assert!(
        stored(db, ids[2]).await.is_some(),
        "a queued task is never pruned"
    );
}

async fn an_unmigrated_database_is_named_then_migrate_fixes_it(db: &TestDb) {
    let line = refused(&["-u", &db.url, "tasks", "list"], 1);
    assert!(line.contains("run `task-dedup migrate up`"), "{line}");
    let line = refused(&["-u", &db.url, "--json", "migrate", "up"], 2);
    assert!(line.contains("--json does not apply"), "{line}");
    let ran = run(&["-u", &db.url, "migrate", "up"]);
    assert_eq!(ran.status, Some(0), "{}", ran.stderr);
    assert!(ran.stderr.contains("database "), "{}", ran.stderr);
    let listed = json(db, &["tasks", "list"]);
    assert_eq!(listed, serde_json::json!({"tasks": [], "next": null}));
    let ran = run(&["-u", &db.url, "migrate", "status"]);
    assert!(ran.stderr.contains("Applied"), "{}", ran.stderr);
}

/// Refused by the arguments alone: the URL points at a port nobody listens on, so any
/// attempt to connect would say so instead.
#[test]
fn bad_input_is_refused_before_connecting() {
    let nowhere = "postgres://nobody@127.0.0.1:1/x";
    let id = "0190a8c2-5b1e-7c3d-8e4f-a1b2c3d4e5f6";
    for (args, cause) in [
        (&["tasks", "show", "42"][..], "not a task id"),
        (&["tasks", "retry", "not-a-uuid"], "not a task id"),
        (
            &["tasks", "list", "--status", "done"],
            "unknown task status \"done\"",
        ),
        (
            &["tasks", "list", "--created-after", "yesterday"],
            "not an RFC 3339 time",
        ),
        (&["tasks", "list", "--after", "12.x"], "invalid cursor"),
        (
            &["tasks", "list", "--limit", "0"],
            "not a number from 1 to 1000",
        ),
        (&["tasks", "delete", "--status", "failed"], "--limit"),
        (
            &["tasks", "cancel", "--limit", "1001"],
            "not a number from 1 to 1000",
        ),
        (
            &["tasks", "cancel", id, "--limit", "5"],
            "cannot be used with",
        ),
        (&["prune", "--failed", "soon"], "a duration such as 36h"),
        (
            &["prune", "--batch-size", "0"],
            "not a number from 1 to 100000",
        ),
        (&["tasks", "frobnicate"], "unrecognized subcommand"),
    ] {
        let line = refused(&[&["-u", nowhere], args].concat(), 2);
        assert!(line.contains(cause), "{args:?}: {line}");
    }
}

/// What the library refuses before any SQL is bad usage too.
#[test]
fn arguments_the_library_refuses_are_bad_usage() {
    let url = format!("sqlite://{}/usage.db?mode=rwc", scratch().display());
    let long = "x".repeat(65);
    for (args, cause) in [
        (
            &["tasks", "list", "--type", long.as_str()][..],
            "invalid task_type",
        ),
        (&["pause", ""], "invalid task_type"),
        (
            &[
                "tasks",
                "list",
                "--created-after",
                "2026-01-02T00:00:00Z",
                "--created-before",
                "2026-01-01T00:00:00Z",
            ],
            "invalid created_before",
        ),
    ] {
        let line = refused(&[&["-u", url.as_str()], args].concat(), 2);
        assert!(line.contains(cause), "{args:?}: {line}");
    }
}

/// The connection probe of task-dedup-migrate, which this command shares: the cause in
/// one line at once, not "pool timed out" after 30 s.
#[test]
fn an_unreachable_database_is_named() {
    let mut cases = vec![
        (
            "postgres://nobody@127.0.0.1:5999/x".to_owned(),
            "connection refused by 127.0.0.1:5999",
        ),
        (
            "mysql://nobody@127.0.0.1:5999/x".to_owned(),
            "connection refused by 127.0.0.1:5999",
        ),
        (
            "postgres://nobody@no-such-host.invalid/x".to_owned(),
            "unknown host \"no-such-host.invalid\"",
        ),
        (
            "sqlite:///nonexistent-dir/task_dedup.db".to_owned(),
            "no such database",
        ),
    ];
    for (var, user) in [
        ("TASK_DEDUP_POSTGRES_URL", "postgres@"),
        ("TASK_DEDUP_MYSQL_URL", "root@"),
    ] {
        match std::env::var(var) {
            Ok(admin) => {
                let bad_user = harness::with_database(&admin, "x").replacen(user, "nobody@", 1);
                cases.push((bad_user, "authentication failed"));
                cases.push((
                    harness::with_database(&admin, "task_dedup_no_such_db"),
                    "no such database",
                ));
            }
            Err(_) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("{var} is required under CI=true")
            }
            Err(_) => eprintln!("[task-dedup-cli tests] skipped the {var} refusals: not set"),
        }
    }
    for (url, cause) in cases {
        let started = std::time::Instant::now();
        let line = refused(&["-u", &url, "tasks", "stats"], 1);
        assert!(
            line.contains("cannot connect") && line.contains(cause),
            "{url}: {line}"
        );
        eprintln!("{url}: {:?}", started.elapsed());
    }
}

/// Without any URL: the SQLite file `task_dedup.db` of the current directory, which
/// `migrate` creates and the other commands expect.
#[test]
fn without_a_url_the_sqlite_file_must_exist() {
    let line = refused(&["tasks", "stats"], 1);
    assert!(
        line.contains("no such database") && line.contains("task_dedup.db"),
        "{line}"
    );
}

/// A reader that stops reading (`| head`) ends the output quietly: no panic.
#[test]
fn a_closed_stdout_is_no_panic() {
    let url = format!("sqlite://{}/pipe.db?mode=rwc", scratch().display());
    assert_eq!(run(&["-u", &url, "migrate", "up"]).status, Some(0));
    let mut child = Command::new(BIN)
        .args(["-u", &url, "--json", "tasks", "stats"])
        .current_dir(scratch())
        .env("RUST_BACKTRACE", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn task-dedup");
    // Closed before the command connects, so before it writes.
    drop(child.stdout.take());
    let output = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}

/// `-s` (PostgreSQL's search path) reaches the admin commands' pool as it does migrate's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_flag_picks_the_postgres_schema() {
    harness::run(harness::Dialect::Postgres, "schema_flag", schema_flag).await;
}

async fn schema_flag(db: &TestDb) {
    db.exec("CREATE SCHEMA tenant_a").await;
    ok(db, &["-s", "tenant_a", "migrate", "up"]);
    assert_eq!(
        json(db, &["-s", "tenant_a", "pause", "mail"])["changed"],
        true
    );
    let paused = json(db, &["-s", "tenant_a", "paused"]);
    assert_eq!(paused["paused"][0]["task_type"], "mail");
    // The default schema, public, was never migrated.
    let line = refused(&["-u", &db.url, "paused"], 1);
    assert!(line.contains("run `task-dedup migrate up`"), "{line}");
}

async fn limits_set_list_and_clear(db: &TestDb) {
    db.migrate().await;
    assert_eq!(ok(db, &["limits", "list"]), "no task type is limited\n");
    let set = json(
        db,
        &[
            "limits",
            "set",
            "export",
            "--max-running",
            "2",
            "--per-user",
            "1",
            "--rate",
            "60/1m",
            "--fair",
        ],
    );
    assert_eq!(set["set"]["task_type"], "export");
    assert_eq!(set["set"]["max_running"], 2);
    assert_eq!(set["set"]["max_running_per_user"], 1);
    assert_eq!(
        set["set"]["rate"],
        serde_json::json!({"starts": 60, "per_seconds": 60.0})
    );
    assert_eq!(set["set"]["fair"], true);
    let stored = db.db.limits().await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].limits.max_running, Some(2));

    rows::insert(&db.db, ("u1", "export", "r/1"), TaskStatus::Queued, at(0))
        .await
        .expect("seed");
    db.db
        .claim_many("w", &[], std::time::Duration::from_secs(60), 5)
        .await
        .expect("claim");
    let text = ok(db, &["limits", "list"]);
    assert!(text.starts_with("TYPE"), "{text}");
    assert!(text.contains("export") && text.contains("1/2"), "{text}");
    assert!(text.contains("60/1m (1 used)"), "{text}");
    assert_eq!(json(db, &["limits", "list"])["limits"][0]["running"], 1);

    // Bad input: usage errors before any SQL, or the library's refusal.
    let url = db.url.as_str();
    refused(&["-u", url, "limits", "set", "export", "--rate", "60"], 2);
    let line = refused(&["-u", url, "limits", "set", "export"], 2);
    assert!(line.contains("limits"), "{line}");
    refused(
        &["-u", url, "limits", "set", "export", "--max-running", "0"],
        2,
    );

    assert_eq!(
        json(db, &["limits", "clear", "export"]),
        serde_json::json!({"task_type": "export", "cleared": true})
    );
    assert_eq!(
        ok(db, &["limits", "clear", "export"]),
        "export had no limits\n"
    );
    assert!(db.db.limits().await.unwrap().is_empty());

    // The limit per user across all types.
    let set = json(db, &["limits", "set-user", "3"]);
    assert_eq!(set["set"]["max_running"], 3);
    assert_eq!(set["set"]["users_running"], 1);
    assert_eq!(
        db.db.user_limit().await.unwrap().map(|l| l.max_running),
        Some(3)
    );
    let text = ok(db, &["limits", "list"]);
    assert!(
        text.starts_with("at most 3 running per user across all types: 1 users running"),
        "{text}"
    );
    assert_eq!(json(db, &["limits", "list"])["user_limit"]["busiest"], 1);
    refused(&["-u", url, "limits", "set-user", "0"], 2);
    refused(&["-u", url, "limits", "set-user"], 2);
    assert_eq!(
        json(db, &["limits", "clear-user"]),
        serde_json::json!({"cleared": true})
    );
    assert_eq!(
        ok(db, &["limits", "clear-user"]),
        "no limit per user across all types was set\n"
    );
    assert_eq!(db.db.user_limit().await.unwrap(), None);
}
