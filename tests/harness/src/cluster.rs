//! Clusters for `tests/cluster`: the nodes of a MariaDB Galera cluster
//! (`TASK_DEDUP_GALERA_URLS`, started by `.ci/galera.sh`) and a PostgreSQL formation
//! under pg_auto_failover (`TASK_DEDUP_PGAF_URL`, `.ci/pg-auto-failover.sh`).
//!
//! As for a dialect: unset, the suite is skipped with a line on stderr, unless
//! `CI=true`: then it fails the test.

use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, DatabaseConnection};
use task_dedup_migration::{Migrator, MigratorTrait};

use crate::with_database;

/// The value of `var`, or `None` with a line on stderr (a failure under `CI=true`).
pub fn required(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(value) if !value.is_empty() => Some(value),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{var} is required under CI=true ({what})")
        }
        _ => {
            eprintln!("\n[task-dedup tests] skipped {what}: {var} is not set");
            None
        }
    }
}

/// Runs the shell command `command` with `args` appended (`TASK_DEDUP_GALERA_KILL`:
/// `.ci/galera.sh kill`, say) to its end; its stderr passes through. Panics when it
/// fails.
pub async fn control(command: &str, args: &[&str]) {
    let line = format!("{command} {}", args.join(" "));
    let run = line.clone();
    let status = tokio::task::spawn_blocking(move || {
        std::process::Command::new("sh").args(["-c", &run]).status()
    })
    .await
    .expect("control task")
    .unwrap_or_else(|e| panic!("{line}: {e}"));
    assert!(status.success(), "{line}: {status}");
}

/// A fresh database on a three-node MariaDB Galera cluster, created and migrated
/// through the first node (DDL is replicated to the others in total order), with a pool
/// on each node.
pub struct Galera {
    /// Each node's URL of this test's database.
    pub urls: Vec<String>,
    /// A pool per node, of [`Galera::POOL`] connections.
    pub nodes: Vec<DatabaseConnection>,
    admin_url: String,
    name: String,
}

impl Galera {
    /// Connections of each node's pool.
    pub const POOL: u32 = 24;

    /// A fresh, migrated database on the cluster; `None` (a line on stderr) when
    /// `TASK_DEDUP_GALERA_URLS` is not set.
    pub async fn create(test: &str) -> Option<Galera> {
        let urls = required(
            "TASK_DEDUP_GALERA_URLS",
            "the MariaDB Galera suite (.ci/galera.sh start)",
        )?;
        let admin_urls: Vec<String> = urls.split(',').map(|u| u.trim().to_owned()).collect();
        assert_eq!(admin_urls.len(), 3, "TASK_DEDUP_GALERA_URLS: three nodes");
        let name = format!(
            "tdg_{}_{}",
            crate::short(test),
            uuid::Uuid::now_v7().simple()
        );
        let admin = task_dedup::connect(&admin_urls[0]).await.expect("node 1");
        admin
            .execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        admin.close().await.expect("close");
        let urls: Vec<String> = admin_urls
            .iter()
            .map(|url| with_database(url, &name))
            .collect();
        let mut nodes = Vec::new();
        for url in &urls {
            nodes.push(node_pool(url, Galera::POOL).await);
        }
        Migrator::up(&nodes[0], None)
            .await
            .expect("migrations apply");
        Some(Galera {
            urls,
            nodes,
            admin_url: admin_urls[0].clone(),
            name,
        })
    }

    /// Drops the database (through the first node).
    pub async fn remove(self) {
        for node in self.nodes {
            let _ = node.close().await;
        }
        if let Ok(admin) = task_dedup::connect(&self.admin_url).await {
            let _ = admin
                .execute_unprepared(&format!("DROP DATABASE IF EXISTS {}", self.name))
                .await;
            let _ = admin.close().await;
        }
    }
}

/// A pool of `size` connections on one node, opened up front; retried for 30 s while the
/// node has not applied the `CREATE DATABASE` yet.
pub async fn node_pool(url: &str, size: u32) -> DatabaseConnection {
    let started = Instant::now();
    loop {
        let mut options = sea_orm::ConnectOptions::new(url.to_owned());
        options
            .max_connections(size)
            .min_connections(size)
            .acquire_timeout(Duration::from_secs(10))
            .sqlx_logging(false);
        match task_dedup::connect_with(options).await {
            Ok(db) => return db,
            Err(e) if started.elapsed() < Duration::from_secs(30) => {
                eprintln!("[task-dedup tests] {url}: {e}; again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{url}: {e}"),
        }
    }
}

/// A fresh, migrated database on a PostgreSQL formation under pg_auto_failover (a
/// primary and a synchronous standby), reached through the formation's URL with both
/// hosts and `target_session_attrs=read-write`.
pub struct Formation {
    /// This test's database on the formation's multi-host URL.
    pub url: String,
    /// A pool on it ([`task_dedup::connect`]: on the primary, repointed after a failover).
    pub db: DatabaseConnection,
    /// The shell command that controls the formation (`.ci/pg-auto-failover.sh`:
    /// `switchover`, `kill-primary`, `wait-primary`).
    pub control: String,
    admin_url: String,
    name: String,
}

impl Formation {
    /// A fresh, migrated database on the formation; `None` (a line on stderr) when
    /// `TASK_DEDUP_PGAF_URL` or `TASK_DEDUP_PGAF_CTL` is not set.
    pub async fn create(test: &str) -> Option<Formation> {
        let admin_url = required(
            "TASK_DEDUP_PGAF_URL",
            "the pg_auto_failover suite (.ci/pg-auto-failover.sh start)",
        )?;
        let control = required(
            "TASK_DEDUP_PGAF_CTL",
            "the pg_auto_failover suite (.ci/pg-auto-failover.sh)",
        )?;
        let name = format!(
            "tdf_{}_{}",
            crate::short(test),
            uuid::Uuid::now_v7().simple()
        );
        let admin = task_dedup::connect(&admin_url).await.expect("the primary");
        admin
            .execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        admin.close().await.expect("close");
        let url = with_database(&admin_url, &name);
        let db = task_dedup::connect(&url).await.expect("pool");
        Migrator::up(&db, None).await.expect("migrations apply");
        Some(Formation {
            url,
            db,
            control,
            admin_url,
            name,
        })
    }

    /// Drops the database (on whichever host is the primary by then).
    pub async fn remove(self) {
        let _ = self.db.close().await;
        if let Ok(admin) = task_dedup::connect(&self.admin_url).await {
            let _ = admin
                .execute_unprepared(&format!(
                    "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                    self.name
                ))
                .await;
            let _ = admin.close().await;
        }
    }
}
