//! The `task-dedup-migrate` binary, run as a user would, against PostgreSQL: the URL comes
//! from `-u`, `DATABASE_URL` or `.env` in that order, `-s` picks the schema, the output
//! names the database (password redacted), and no SQLite file appears unless no URL is
//! given anywhere.
//!
//! Needs `TASK_DEDUP_POSTGRES_URL` (a server where the user may `CREATE DATABASE`);
//! without it the PostgreSQL cases are skipped with a message, unless `CI=true`.
// A test file: a panic is how it fails.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sea_orm_migration::sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement};

const BIN: &str = env!("CARGO_BIN_EXE_task-dedup-migrate");

/// A scratch directory to run the binary in, removed afterwards.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("task-dedup-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn files(&self) -> Vec<String> {
        let mut files: Vec<String> = std::fs::read_dir(&self.0)
            .expect("read scratch dir")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        files.sort();
        files
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the binary in `dir` with `args`, a clean environment but for `env`.
fn migrate(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .current_dir(dir)
        .env_remove("DATABASE_URL")
        .env_remove("DATABASE_SCHEMA");
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("run task-dedup-migrate");
    assert!(
        output.status.success(),
        "task-dedup-migrate {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The admin URL, or `None` (skipped) outside CI.
fn postgres_admin_url() -> Option<String> {
    match std::env::var("TASK_DEDUP_POSTGRES_URL") {
        Ok(url) => Some(url),
        Err(_) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("TASK_DEDUP_POSTGRES_URL is required under CI=true")
        }
        Err(_) => {
            eprintln!(
                "[task-dedup-migrate tests] skipped PostgreSQL: TASK_DEDUP_POSTGRES_URL is not set"
            );
            None
        }
    }
}

/// A fresh PostgreSQL database, dropped on `drop_all`.
struct PgDatabases {
    admin: DatabaseConnection,
    admin_url: String,
    names: Vec<String>,
}

impl PgDatabases {
    async fn new(admin_url: String) -> PgDatabases {
        let admin = Database::connect(&admin_url)
            .await
            .expect("admin connection");
        PgDatabases {
            admin,
            admin_url,
            names: Vec::new(),
        }
    }

    /// Creates a database and returns its URL.
    async fn create(&mut self, tag: &str) -> String {
        let name = format!("tdcli_{tag}_{}", std::process::id());
        self.admin
            .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await
            .expect("drop");
        self.admin
            .execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        self.names.push(name.clone());
        with_database(&self.admin_url, &name)
    }

    async fn drop_all(self) {
        for name in &self.names {
            let _ = self
                .admin
                .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        }
    }
}

/// The same server URL with another database in its path.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    format!("{}/{database}{query}", &base[..host_end])
}

/// Tables of `schema` in the database at `url`, sorted.
async fn tables(url: &str, schema: &str) -> Vec<String> {
    let db = Database::connect(url).await.expect("connect");
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(
            db.get_database_backend(),
            "SELECT table_name::text AS name FROM information_schema.tables \
             WHERE table_schema = $1 ORDER BY 1",
            [schema.into()],
        ))
        .await
        .expect("tables");
    let names = rows
        .iter()
        .map(|row| row.try_get::<String>("", "name").expect("name"))
        .collect();
    db.close().await.expect("close");
    names
}

const MIGRATED: [&str; 4] = [
    "task_dedup_limits",
    "task_dedup_migrations",
    "task_dedup_paused",
    "task_run",
];

#[tokio::test]
async fn url_comes_from_flag_then_environment_then_dotenv() {
    let Some(admin_url) = postgres_admin_url() else {
        return;
    };
    let mut dbs = PgDatabases::new(admin_url).await;
    let (flag, env, dotenv) = (
        dbs.create("flag").await,
        dbs.create("env").await,
        dbs.create("dotenv").await,
    );

    // `-u` wins over DATABASE_URL and .env.
    let dir = Scratch::new("flag");
    std::fs::write(dir.path().join(".env"), format!("DATABASE_URL={dotenv}\n")).expect(".env");
    let out = migrate(dir.path(), &["-u", &flag, "up"], &[("DATABASE_URL", &env)]);
    assert!(
        stderr(&out).contains(&format!("database {flag}")),
        "{}",
        stderr(&out)
    );
    assert_eq!(tables(&flag, "public").await, MIGRATED);
    assert!(tables(&env, "public").await.is_empty());
    assert!(tables(&dotenv, "public").await.is_empty());
    assert_eq!(dir.files(), [".env"], "no SQLite file appeared");

    // DATABASE_URL wins over .env.
    let out = migrate(dir.path(), &["up"], &[("DATABASE_URL", &env)]);
    assert!(
        stderr(&out).contains(&format!("database {env}")),
        "{}",
        stderr(&out)
    );
    assert_eq!(tables(&env, "public").await, MIGRATED);
    assert!(tables(&dotenv, "public").await.is_empty());

    // .env alone.
    let out = migrate(dir.path(), &["status"], &[]);
    assert!(
        stderr(&out).contains(&format!("database {dotenv}")),
        "{}",
        stderr(&out)
    );
    migrate(dir.path(), &[], &[]);
    assert_eq!(tables(&dotenv, "public").await, MIGRATED);
    assert_eq!(dir.files(), [".env"], "no SQLite file appeared");

    // reset rolls back on the database named, and only there.
    migrate(dir.path(), &["reset"], &[]);
    assert!(tables(&dotenv, "public").await.is_empty());
    assert_eq!(tables(&flag, "public").await, MIGRATED);
    dbs.drop_all().await;
}

#[tokio::test]
async fn schema_flag_sets_the_search_path_and_passwords_are_redacted() {
    let Some(admin_url) = postgres_admin_url() else {
        return;
    };
    let mut dbs = PgDatabases::new(admin_url).await;
    let url = dbs.create("schema").await;
    let db = Database::connect(&url).await.expect("connect");
    db.execute_unprepared("CREATE SCHEMA tenant_a")
        .await
        .expect("schema");
    db.close().await.expect("close");

    // Trust authentication ignores the password, which must not be printed.
    let with_password = url.replacen("://postgres@", "://postgres:hunter2@", 1);
    assert_ne!(with_password, url, "the URL names user postgres");
    let dir = Scratch::new("schema");
    let out = migrate(
        dir.path(),
        &["-u", &with_password, "-s", "tenant_a", "up"],
        &[],
    );
    let printed = stderr(&out);
    assert!(!printed.contains("hunter2"), "{printed}");
    assert!(printed.contains("postgres:****@"), "{printed}");
    assert_eq!(tables(&url, "tenant_a").await, MIGRATED);
    assert!(tables(&url, "public").await.is_empty());

    // DATABASE_SCHEMA works like -s.
    let out = migrate(
        dir.path(),
        &["status"],
        &[("DATABASE_URL", &url), ("DATABASE_SCHEMA", "tenant_a")],
    );
    assert!(stderr(&out).contains("Applied"), "{}", stderr(&out));
    dbs.drop_all().await;
}

#[test]
fn without_any_url_the_embedded_sqlite_file_is_used() {
    let dir = Scratch::new("default");
    let out = migrate(dir.path(), &["up"], &[]);
    assert!(
        stderr(&out).contains("database sqlite://task_dedup.db"),
        "{}",
        stderr(&out)
    );
    assert_eq!(dir.files(), ["task_dedup.db"]);
    let out = migrate(dir.path(), &["status"], &[]);
    assert!(stderr(&out).contains("Applied"), "{}", stderr(&out));
}

/// Runs the binary in `dir` with `args` and a clean environment, expecting it to fail;
/// returns its stderr's last line, after checking that it failed with status 1 and one
/// line of error, neither a panic nor a backtrace.
fn migrate_failing(dir: &Path, args: &[&str]) -> String {
    let output = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env_remove("DATABASE_URL")
        .env_remove("DATABASE_SCHEMA")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run task-dedup-migrate");
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{args:?}: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    let errors: Vec<&str> = err
        .lines()
        .filter(|line| line.starts_with("task-dedup-migrate: cannot connect"))
        .collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert_eq!(err.lines().last(), Some(errors[0]), "{err}");
    errors[0].to_owned()
}

/// An unreachable database fails at once with the cause, not after the pool's 30 s
/// acquire timeout with "pool timed out".
#[test]
fn an_unreachable_database_fails_at_once_naming_the_cause() {
    let dir = Scratch::new("unreachable");
    for (url, cause) in [
        (
            "postgres://nobody@127.0.0.1:5999/x",
            "connection refused by 127.0.0.1:5999",
        ),
        (
            "mysql://nobody@127.0.0.1:5999/x",
            "connection refused by 127.0.0.1:5999",
        ),
        (
            "postgres://nobody@no-such-host.invalid/x",
            "unknown host \"no-such-host.invalid\"",
        ),
        ("ftp://example/x", "unsupported database URL scheme \"ftp\""),
        (
            "sqlite:///nonexistent-dir/x.db",
            "no such database: the SQLite file /nonexistent-dir/x.db does not exist",
        ),
        ("not a url", "not a database URL"),
    ] {
        let line = migrate_failing(dir.path(), &["-u", url, "status"]);
        assert!(line.contains(cause), "{url}: {line}");
    }
    assert!(dir.files().is_empty(), "{:?}", dir.files());
}

/// The server's refusals: a user it does not know, a database that does not exist.
#[test]
fn refusals_by_the_server_name_the_cause() {
    let dir = Scratch::new("refused");
    let mut cases = Vec::new();
    if let Some(admin) = postgres_admin_url() {
        cases.push((
            with_database(&admin, "x").replacen("postgres@", "nobody@", 1),
            "authentication failed",
        ));
        cases.push((
            with_database(&admin, "task_dedup_no_such_db"),
            "no such database",
        ));
    }
    if let Ok(admin) = std::env::var("TASK_DEDUP_MYSQL_URL") {
        cases.push((
            with_database(&admin, "x").replacen("root@", "nobody@", 1),
            "authentication failed",
        ));
        cases.push((
            with_database(&admin, "task_dedup_no_such_db"),
            "no such database",
        ));
    }
    for (url, cause) in cases {
        let line = migrate_failing(dir.path(), &["-u", &url, "status"]);
        assert!(line.contains(cause), "{url}: {line}");
    }
}

/// `up --online` says what it built, how and how long it took; `status` names an INVALID
/// index a failed build left, and the next `up` (not online) drops it and builds it again,
/// online, with its migration's definition.
#[tokio::test]
async fn online_up_reports_its_builds_and_up_rebuilds_invalid_indexes() {
    let Some(admin_url) = postgres_admin_url() else {
        return;
    };
    let mut dbs = PgDatabases::new(admin_url).await;
    let url = dbs.create("online").await;
    let dir = Scratch::new("online");
    migrate(dir.path(), &["-u", &url, "up", "-n", "1"], &[]);
    let db = Database::connect(&url).await.expect("connect");
    db.execute_unprepared(
        "INSERT INTO task_run (id, user_id, task_type, resource_key, status, created_at, \
         updated_at) SELECT gen_random_uuid(), 'u', 't', 'r' || n, 'succeeded', now(), now() \
         FROM generate_series(1, 100) n",
    )
    .await
    .expect("rows");

    let out = migrate(dir.path(), &["-u", &url, "up", "--online"], &[]);
    let printed = stderr(&out);
    for index in [
        "task_active_resource_uidx",
        "task_running_resource_uidx",
        "task_run_type_status_idx",
    ] {
        assert!(
            printed.contains(&format!("{index} (online, CONCURRENTLY) in ")),
            "{printed}"
        );
    }
    assert_eq!(tables(&url, "public").await, MIGRATED);

    // A failed build of one of task-dedup's indexes (here: made to fail) leaves it INVALID.
    db.execute_unprepared("DROP INDEX task_run_type_status_idx")
        .await
        .expect("drop");
    let failed = db
        .execute_unprepared(
            "CREATE UNIQUE INDEX CONCURRENTLY task_run_type_status_idx ON task_run (status)",
        )
        .await;
    assert!(failed.is_err(), "100 rows share a status");
    let out = migrate(dir.path(), &["-u", &url, "status"], &[]);
    assert!(
        stderr(&out).contains("index task_run_type_status_idx of task_run is INVALID"),
        "{}",
        stderr(&out)
    );

    let out = migrate(dir.path(), &["-u", &url, "up"], &[]);
    let printed = stderr(&out);
    assert!(
        printed.contains("dropped INVALID index task_run_type_status_idx"),
        "{printed}"
    );
    let rebuilt = db
        .query_one_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT i.indisvalid AS valid, pg_get_indexdef(i.indexrelid) AS def FROM pg_index i \
             JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = 'task_run_type_status_idx'",
        ))
        .await
        .expect("catalog")
        .expect("the index is back");
    assert!(rebuilt.try_get::<bool>("", "valid").expect("valid"));
    assert_eq!(
        rebuilt.try_get::<String>("", "def").expect("def"),
        "CREATE INDEX task_run_type_status_idx ON public.task_run USING btree \
         (task_type, status, created_at, id) WHERE ((status)::text <> 'running'::text)"
    );
    let out = migrate(dir.path(), &["-u", &url, "status"], &[]);
    assert!(!stderr(&out).contains("INVALID"), "{}", stderr(&out));
    db.close().await.expect("close");
    dbs.drop_all().await;
}
