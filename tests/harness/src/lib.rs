//! The dialect-matrix harness.
//!
//! Each integration test is written once, as `async fn name(db: &TestDb)`, and
//! [`matrix!`] runs it on SQLite (always) and on PostgreSQL and MySQL/MariaDB when
//! `TASK_DEDUP_POSTGRES_URL` / `TASK_DEDUP_MYSQL_URL` are set. Every run gets a database
//! of its own, so tests run in parallel without seeing each other's rows.
//!
//! A dialect without a URL (or with an unreachable server) is skipped with a line on
//! stderr, unless `CI=true`: then it fails the test.
//!
//! A crate of its own (`tests/harness`, package `task-dedup-test-harness`), a
//! dev-dependency named `harness` of every package whose tests use it: the root
//! package's test binaries, `cli`, `loco` and `examples/adoption`.

pub mod children;
pub mod cluster;
pub mod pinned;
pub mod rows;
pub mod schema;

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use task_dedup_migration::{Migrator, MigratorTrait};
use tokio::sync::{Semaphore, SemaphorePermit};

/// Runs each named `async fn(&TestDb)` of the calling module on every dialect, as
/// `<name>::sqlite`, `<name>::postgres` and `<name>::mysql`.
#[macro_export]
macro_rules! matrix {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                use $crate::{run, Dialect};

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn sqlite() {
                    run(Dialect::Sqlite, stringify!($name), super::$name).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn postgres() {
                    run(Dialect::Postgres, stringify!($name), super::$name).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn mysql() {
                    run(Dialect::MySql, stringify!($name), super::$name).await;
                }
            }
        )*
    };
}

/// [`matrix!`] for what only a database server has (sessions to kill, a server to
/// restart): `<name>::postgres` and `<name>::mysql`.
#[macro_export]
macro_rules! server_matrix {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                use $crate::{run, Dialect};

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn postgres() {
                    run(Dialect::Postgres, stringify!($name), super::$name).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn mysql() {
                    run(Dialect::MySql, stringify!($name), super::$name).await;
                }
            }
        )*
    };
}

/// A database the harness can provide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
    MySql,
}

impl Dialect {
    fn env_var(self) -> Option<&'static str> {
        match self {
            Dialect::Sqlite => None,
            Dialect::Postgres => Some("TASK_DEDUP_POSTGRES_URL"),
            Dialect::MySql => Some("TASK_DEDUP_MYSQL_URL"),
        }
    }

    /// `sqlite`, `postgres` or `mysql`: the name tests use in file and snapshot names.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
            Dialect::MySql => "mysql",
        }
    }

    pub fn backend(self) -> DbBackend {
        match self {
            Dialect::Sqlite => DbBackend::Sqlite,
            Dialect::Postgres => DbBackend::Postgres,
            Dialect::MySql => DbBackend::MySql,
        }
    }
}

/// Connections the big pools of one test binary may hold at once, per dialect; each
/// test's own pool ([`TEST_POOL`]) comes on top.
const BUDGET: u32 = 72;

/// The size of [`TestDb::db`].
pub const TEST_POOL: u32 = 8;

static CONNECTION_BUDGET: [Semaphore; 3] = [
    Semaphore::const_new(BUDGET as usize),
    Semaphore::const_new(BUDGET as usize),
    Semaphore::const_new(BUDGET as usize),
];

/// A pool from [`TestDb::pool`]; derefs to the connection.
pub struct Pool {
    pub db: DatabaseConnection,
    _permit: SemaphorePermit<'static>,
}

impl std::ops::Deref for Pool {
    type Target = DatabaseConnection;

    fn deref(&self) -> &DatabaseConnection {
        &self.db
    }
}

/// A fresh, empty database of one dialect, with a pool on it.
pub struct TestDb {
    pub dialect: Dialect,
    /// URL of this test's own database.
    pub url: String,
    /// A pool of [`TEST_POOL`] connections with task-dedup's settings.
    pub db: DatabaseConnection,
    cleanup: Cleanup,
}

enum Cleanup {
    Files(PathBuf),
    Drop { admin_url: String, name: String },
}

impl TestDb {
    /// Applies task-dedup's migrations.
    pub async fn migrate(&self) {
        Migrator::up(&self.db, None)
            .await
            .expect("migrations apply");
    }

    /// Removes the dedup guarantee from a migrated `task_run`, as a table made by hand
    /// or by a read-then-insert release would be: the unique index goes.
    /// `task_dedup_migration::ensure_schema` brings it back.
    pub async fn drop_unique_index(&self) {
        self.exec(match self.dialect {
            Dialect::MySql => "ALTER TABLE task_run DROP INDEX task_active_resource_uidx",
            Dialect::Sqlite | Dialect::Postgres => "DROP INDEX task_active_resource_uidx",
        })
        .await;
    }

    /// Another pool on the same database, of `max_connections` connections, all opened
    /// up front so a race starts with every caller on its own live connection.
    ///
    /// Big pools share a per-dialect budget, so that the tests running in parallel stay
    /// under PostgreSQL's default `max_connections = 100`.
    pub async fn pool(&self, max_connections: u32) -> Pool {
        let budget = &CONNECTION_BUDGET[self.dialect as usize];
        let permit = budget
            .acquire_many(max_connections.min(BUDGET))
            .await
            .expect("budget semaphore is never closed");
        let mut options = sea_orm::ConnectOptions::new(self.url.clone());
        options
            .max_connections(max_connections)
            .min_connections(max_connections)
            .sqlx_logging(false);
        let db = task_dedup::connect_with(options).await.expect("pool opens");
        Pool {
            db,
            _permit: permit,
        }
    }

    /// The server's admin URL and this test's database name (PostgreSQL, MySQL/MariaDB).
    pub fn server(&self) -> Option<(&str, &str)> {
        match &self.cleanup {
            Cleanup::Drop { admin_url, name } => Some((admin_url, name)),
            Cleanup::Files(_) => None,
        }
    }

    /// Kills every server session of this test's database, from an admin connection of
    /// its own (opened and closed here). Returns how many.
    pub async fn kill_all_sessions(&self) -> usize {
        let (admin_url, _) = self.server().expect("a server dialect");
        let admin = task_dedup::connect(admin_url).await.expect("admin");
        let killed = self.kill_sessions(&admin).await;
        admin.close().await.expect("close");
        killed
    }

    /// Kills every server session of this test's database but `admin`'s own
    /// (`pg_terminate_backend` on PostgreSQL, `KILL CONNECTION` on MariaDB), from
    /// `admin`, a connection to the server's admin database. Returns how many.
    pub async fn kill_sessions(&self, admin: &DatabaseConnection) -> usize {
        let (_, database) = self
            .server()
            .expect("a server dialect has sessions to kill");
        let sql = match self.dialect {
            Dialect::Postgres => {
                "SELECT pg_terminate_backend(pid) AS id FROM pg_stat_activity \
                 WHERE datname = $1 AND pid <> pg_backend_pid()"
            }
            _ => {
                "SELECT ID AS id FROM information_schema.PROCESSLIST \
                 WHERE DB = ? AND ID <> CONNECTION_ID()"
            }
        };
        let rows = admin
            .query_all_raw(Statement::from_sql_and_values(
                self.dialect.backend(),
                sql,
                [database.into()],
            ))
            .await
            .expect("sessions");
        if self.dialect == Dialect::MySql {
            for row in &rows {
                let id: i64 = row.try_get("", "id").expect("id");
                // Already gone by itself: fine.
                let _ = admin
                    .execute_unprepared(&format!("KILL CONNECTION {id}"))
                    .await;
            }
        }
        rows.len()
    }

    /// The SQLite file of this test (SQLite only).
    pub fn sqlite_path(&self) -> Option<&std::path::Path> {
        match &self.cleanup {
            Cleanup::Files(path) => Some(path),
            Cleanup::Drop { .. } => None,
        }
    }

    /// Runs SQL that takes no parameters.
    pub async fn exec(&self, sql: &str) {
        self.db
            .execute_unprepared(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Builds a statement for this dialect.
    pub fn stmt(&self, sql: &str, values: Vec<sea_orm::Value>) -> Statement {
        Statement::from_sql_and_values(self.dialect.backend(), sql, values)
    }

    async fn create(dialect: Dialect, test: &str) -> Result<TestDb, String> {
        let unique = format!("{}_{}", short(test), uuid::Uuid::now_v7().simple());
        match dialect {
            Dialect::Sqlite => {
                let dir = std::env::temp_dir().join("task-dedup-tests");
                std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
                let path = dir.join(format!("{unique}.db"));
                let url = format!("sqlite://{}?mode=rwc", path.display());
                let db = test_pool(&url).await?;
                Ok(TestDb {
                    dialect,
                    url,
                    db,
                    cleanup: Cleanup::Files(path),
                })
            }
            Dialect::Postgres | Dialect::MySql => {
                let var = dialect
                    .env_var()
                    .expect("server dialects have a URL variable");
                let admin_url = std::env::var(var).map_err(|_| format!("{var} is not set"))?;
                let name = format!("tdt_{unique}");
                let mut options = sea_orm::ConnectOptions::new(admin_url.clone());
                options
                    .acquire_timeout(std::time::Duration::from_secs(10))
                    .sqlx_logging(false);
                let admin = task_dedup::connect_with(options)
                    .await
                    .map_err(|e| format!("{var}: {e}"))?;
                admin
                    .execute_unprepared(&format!("CREATE DATABASE {name}"))
                    .await
                    .map_err(|e| format!("CREATE DATABASE {name}: {e}"))?;
                admin.close().await.map_err(|e| e.to_string())?;
                let url = with_database(&admin_url, &name);
                let db = test_pool(&url).await?;
                Ok(TestDb {
                    dialect,
                    url,
                    db,
                    cleanup: Cleanup::Drop { admin_url, name },
                })
            }
        }
    }

    async fn remove(self) {
        let _ = self.db.close().await;
        match self.cleanup {
            Cleanup::Files(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }
            Cleanup::Drop { admin_url, name } => {
                let force = if self.dialect == Dialect::Postgres {
                    " WITH (FORCE)"
                } else {
                    ""
                };
                if let Ok(admin) = task_dedup::connect(&admin_url).await {
                    let _ = admin
                        .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name}{force}"))
                        .await;
                    let _ = admin.close().await;
                }
            }
        }
    }
}

async fn test_pool(url: &str) -> Result<DatabaseConnection, String> {
    let mut options = sea_orm::ConnectOptions::new(url);
    options.max_connections(TEST_POOL).sqlx_logging(false);
    task_dedup::connect_with(options)
        .await
        .map_err(|e| e.to_string())
}

/// Runs `test` on a fresh database of `dialect`, or reports the dialect as skipped.
pub async fn run(dialect: Dialect, test: &str, body: impl AsyncFnOnce(&TestDb)) {
    if !selected(dialect) {
        report_skip(dialect, "not in TASK_DEDUP_DIALECTS");
        return;
    }
    let db = match TestDb::create(dialect, test).await {
        Ok(db) => db,
        Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{dialect:?} is required under CI=true but unavailable: {why}")
        }
        Err(why) => {
            report_skip(dialect, &why);
            return;
        }
    };
    body(&db).await;
    db.remove().await;
}

/// Whether `dialect` is among those `TASK_DEDUP_DIALECTS` names (a comma-separated
/// list: `postgres`, say, to run a suite again on another PostgreSQL version); every
/// dialect when it is unset. A dialect left out on purpose is skipped under `CI=true`
/// too.
fn selected(dialect: Dialect) -> bool {
    std::env::var("TASK_DEDUP_DIALECTS").map_or(true, |names| {
        names.split(',').any(|name| name.trim() == dialect.name())
    })
}

/// Says once per test binary and dialect that it was skipped. Written to the stderr
/// handle directly: libtest captures `eprintln!` of passing tests.
fn report_skip(dialect: Dialect, why: &str) {
    static SAID: [OnceLock<()>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    SAID[dialect as usize].get_or_init(|| {
        let _ = writeln!(
            std::io::stderr(),
            "\n[task-dedup tests] skipped {dialect:?}: {why}"
        );
    });
}

/// The `n` of the one row `sql` returns (a `SELECT COUNT(*) AS n ...`).
pub async fn count(db: &DatabaseConnection, sql: impl Into<String>) -> i64 {
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .expect("count")
        .expect("a row");
    row.try_get("", "n").expect("n")
}

/// Keys with more than one active (queued or running) task, by status alone: valid on the
/// schema of every migration step, for checks during and after an upgrade.
pub async fn keys_with_two_active(db: &DatabaseConnection) -> i64 {
    count(
        db,
        "SELECT COUNT(*) AS n FROM (SELECT user_id, task_type, resource_key FROM task_run \
         WHERE status IN ('queued', 'running') GROUP BY user_id, task_type, resource_key \
         HAVING COUNT(*) > 1) d",
    )
    .await
}

/// The paused task types' names, as `TaskLifecycle::paused` lists them.
pub async fn paused_types(db: &DatabaseConnection) -> Vec<String> {
    task_dedup::TaskLifecycle::paused(db)
        .await
        .expect("paused")
        .into_iter()
        .map(|p| p.task_type)
        .collect()
}

/// The same server URL with another database in its path.
pub fn with_database(url: &str, database: &str) -> String {
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

/// Database names are limited to 63 (PostgreSQL) / 64 (MySQL) characters.
pub(crate) fn short(test: &str) -> String {
    test.chars().take(24).collect()
}

/// Polls `sql` (one parameter: this test's database name) on `admin` every 10 ms until it
/// returns a row, and returns that row's `id`: the server session a test waits to see
/// blocked before it acts. Fails the test, naming `what`, after 10 s.
pub async fn wait_for_session(
    admin: &DatabaseConnection,
    db: &TestDb,
    sql: &str,
    what: &str,
) -> i64 {
    let (_, database) = db.server().expect("a server dialect");
    let started = std::time::Instant::now();
    loop {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{what} never showed"
        );
        let rows = admin
            .query_all_raw(Statement::from_sql_and_values(
                db.dialect.backend(),
                sql,
                [database.into()],
            ))
            .await
            .expect("sessions");
        if let Some(row) = rows.first() {
            return row.try_get("", "id").expect("id");
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Five rounds of `callers` tasks released together at a barrier, each a
/// `find_or_enqueue` of one key (a new one per round) on `pool` in `mode`: asserts that
/// exactly one caller of each round creates and that everyone holds the same task.
pub async fn storm_one_key(
    pool: &DatabaseConnection,
    mode: task_dedup::PoolerMode,
    callers: usize,
) {
    use task_dedup::{NewTask, TaskDedup, TaskKey};
    for round in 0..5 {
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(callers));
        let mut handles = Vec::new();
        for _ in 0..callers {
            let (pool, start) = (pool.clone(), start.clone());
            handles.push(tokio::spawn(async move {
                start.wait().await;
                let resource = format!("contended-{round}");
                let key = TaskKey::new("user-1", "export", &resource).expect("valid key");
                pool.with_pooler_mode(mode)
                    .find_or_enqueue(NewTask::new(key))
                    .await
                    .expect("find_or_enqueue")
            }));
        }
        let mut outcomes = Vec::new();
        for handle in handles {
            outcomes.push(handle.await.expect("caller"));
        }
        let created = outcomes.iter().filter(|o| o.is_created()).count();
        assert_eq!(created, 1, "round {round}: exactly one caller creates");
        let ids: std::collections::HashSet<_> = outcomes.iter().map(|o| o.task().id).collect();
        assert_eq!(ids.len(), 1, "round {round}: everyone got the same task");
    }
}

/// When the server last started, as it says.
pub async fn server_started_at(db: &DatabaseConnection, dialect: Dialect) -> String {
    let sql = match dialect {
        Dialect::Postgres => "SELECT pg_postmaster_start_time()::text AS started",
        _ => {
            "SELECT CAST(UTC_TIMESTAMP() - INTERVAL VARIABLE_VALUE SECOND AS CHAR) AS started \
              FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME'"
        }
    };
    // Right after a restart the pool's connections are dead and the server may still be
    // recovering: ask again until it answers, for as long as a slow CI machine may need.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        match db
            .query_one_raw(Statement::from_string(dialect.backend(), sql))
            .await
        {
            Ok(row) => return row.expect("a row").try_get("", "started").expect("started"),
            Err(err) if std::time::Instant::now() < deadline => {
                eprintln!("[task-dedup tests] {dialect:?} not answering yet: {err}");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(err) => panic!("{dialect:?} did not answer within 90 s: {err}"),
        }
    }
}

/// The shell command that restarts `dialect`'s server (`TASK_DEDUP_<DIALECT>_RESTART`,
/// which `.ci/run` exports); `None`, with a line on stderr, when it is not set (a
/// failure under `CI=true`).
pub fn restart_command(dialect: Dialect) -> Option<String> {
    let var = match dialect {
        Dialect::Postgres => "TASK_DEDUP_POSTGRES_RESTART",
        Dialect::MySql => "TASK_DEDUP_MYSQL_RESTART",
        Dialect::Sqlite => unreachable!("no server to restart"),
    };
    match std::env::var(var) {
        Ok(command) => Some(command),
        Err(_) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{var} is required under CI=true")
        }
        Err(_) => {
            eprintln!("[task-dedup tests] skipped the restart of {dialect:?}: {var} is not set");
            None
        }
    }
}

/// Runs a [`restart_command`] to its end.
pub async fn restart_server(command: String) {
    let status = tokio::task::spawn_blocking(move || {
        std::process::Command::new("sh")
            .args(["-c", &command])
            .status()
    })
    .await
    .expect("restart task")
    .expect("run the restart command");
    assert!(status.success(), "restart command failed");
}
