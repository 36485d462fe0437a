//! `cost`: the physical work of a task's life, phase by phase, not its time.
//!
//! `--ops` tasks of distinct keys go through the library's public calls, each phase
//! measured on its own:
//! - `enqueue`: one `find_or_enqueue` per task (one row per insert), `--clients` callers;
//! - `claim`: `claim_many` of 32 until the queue is empty (the tasks stay running);
//! - `ending`: one `complete` per task, `--clients` callers;
//! - `drain`: `--ops` more tasks (bulk-enqueued, not measured), drained by `--workers`
//!   library Workers of `--concurrency` each: claims and batched endings as a Worker
//!   makes them.
//!
//! PostgreSQL: the WAL the phase wrote for this database (`pg_walinspect` over the
//! phase's LSN range, its commits included: `bench/cost/phase.sql`, the same query as
//! the peers' `bench/cost/peers.sh`), without full-page images (a checkpoint's timing,
//! not the task's), and the B-tree entries written. MySQL/MariaDB: InnoDB's redo log bytes
//! (`Innodb_lsn_current`) and records (`Innodb_log_write_requests`), and the rows the
//! handler wrote, updated and deleted, of the whole server (run it alone).
//! SQLite: not measured (its WAL is one file, checkpointed away).

use std::sync::Arc;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use task_dedup::{NewTask, TaskDedup, TaskKey, TaskLifecycle};

use crate::args::Args;

/// The measurement of one phase over an LSN range, shared with the peers' script.
const PHASE_SQL: &str = include_str!("../cost/phase.sql");

/// The figures a phase is reported by: name and value.
type Figures = Vec<(&'static str, f64)>;

/// Runs the cost workload and prints one line per phase.
pub async fn run(args: &Args) -> Result<(), String> {
    crate::run::prepare_schema(args).await?;
    let db = crate::worker::open(args, false).await?;
    let meter = Meter::new(&db).await?;
    let n = args.ops;
    let worker = "cost";
    let lease = Duration::from_secs(600);

    let mut lines = Vec::new();
    let before = meter.mark(&db).await?;
    for_each_task(args, &db, n, |db, i| async move {
        let key = TaskKey::new("bench", "noop", format!("cost-{i}")).map_err(|e| e.to_string())?;
        db.find_or_enqueue(NewTask::new(key))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await?;
    lines.push(("enqueue", meter.since(&db, &before, n).await?));

    crate::worker::analyze(&db).await?;
    let before = meter.mark(&db).await?;
    let mut claimed = Vec::with_capacity(n);
    loop {
        let batch = db
            .claim_many(worker, &["noop"], lease, 32)
            .await
            .map_err(|e| e.to_string())?;
        if batch.is_empty() {
            break;
        }
        claimed.extend(batch.into_iter().map(|t| t.id));
    }
    if claimed.len() != n {
        return Err(format!("claimed {} of {n} tasks", claimed.len()));
    }
    lines.push(("claim", meter.since(&db, &before, n).await?));

    let before = meter.mark(&db).await?;
    let ids = Arc::new(claimed);
    for_each_task(args, &db, n, move |db, i| {
        let id = ids[i];
        async move {
            db.complete(id, worker, None)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    })
    .await?;
    lines.push(("ending", meter.since(&db, &before, n).await?));

    crate::worker::prefill_scoped(&db, "drain", n, task_dedup::Scope::Active, false).await?;
    crate::worker::analyze(&db).await?;
    let before = meter.mark(&db).await?;
    crate::worker::drain_with_workers(args, &db, n).await?;
    lines.push(("drain", meter.since(&db, &before, n).await?));

    let life = |phases: &[&str]| -> Figures {
        let mut sum: Figures = Vec::new();
        for (name, figures) in &lines {
            if phases.contains(name) {
                for (i, (figure, value)) in figures.iter().enumerate() {
                    match sum.get_mut(i) {
                        Some((_, total)) => *total += value,
                        None => sum.push((figure, *value)),
                    }
                }
            }
        }
        sum
    };
    let (split, worker_life) = (
        life(&["enqueue", "claim", "ending"]),
        life(&["enqueue", "drain"]),
    );
    lines.push(("life (enqueue+claim+ending)", split));
    lines.push(("life (enqueue+drain)", worker_life));
    println!("# cost per task, {n} tasks, dialect {}", meter.name());
    for (phase, figures) in lines {
        let figures: Vec<String> = figures
            .iter()
            .map(|(name, value)| format!("{name}={value:.1}"))
            .collect();
        println!("{phase}: {}", figures.join(" "));
    }
    Ok(())
}

/// Calls `call` for every task index, from `--clients` callers at a time.
async fn for_each_task<F, Fut>(
    args: &Args,
    db: &DatabaseConnection,
    n: usize,
    call: F,
) -> Result<(), String>
where
    F: Fn(DatabaseConnection, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let clients = args.clients.max(1);
    let mut callers = Vec::new();
    for c in 0..clients {
        let (db, call) = (db.clone(), call.clone());
        callers.push(tokio::spawn(async move {
            for i in (c..n).step_by(clients) {
                call(db.clone(), i).await?;
            }
            Ok::<(), String>(())
        }));
    }
    for caller in callers {
        caller.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// What a phase is measured by, per dialect.
enum Meter {
    Postgres,
    MySql,
}

/// Where a phase began.
enum Mark {
    Lsn(String),
    Status(Vec<(String, f64)>),
}

/// MariaDB's server-wide counters read before and after a phase.
const MYSQL_STATUS: [&str; 5] = [
    "Innodb_lsn_current",
    "Innodb_log_write_requests",
    "Handler_write",
    "Handler_update",
    "Handler_delete",
];

impl Meter {
    async fn new(db: &DatabaseConnection) -> Result<Self, String> {
        match db.get_database_backend() {
            DbBackend::Postgres => {
                db.execute_unprepared("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
                    .await
                    .map_err(|e| format!("pg_walinspect: {e}"))?;
                // A checkpoint would recycle the phases' WAL before it is read: a
                // temporary slot keeps it while the pool's connection that made it lives
                // (this process).
                db.execute_unprepared(
                    "SELECT pg_create_physical_replication_slot(\
                     'task_dedup_cost_' || pg_backend_pid(), true, true)",
                )
                .await
                .map_err(|e| format!("a slot that keeps the WAL: {e}"))?;
                Ok(Meter::Postgres)
            }
            DbBackend::MySql => Ok(Meter::MySql),
            _ => Err("cost: PostgreSQL and MySQL/MariaDB only".into()),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Meter::Postgres => "postgres (pg_walinspect, this database's records)",
            Meter::MySql => "mysql (InnoDB counters, whole server)",
        }
    }

    async fn mark(&self, db: &DatabaseConnection) -> Result<Mark, String> {
        match self {
            Meter::Postgres => {
                let row = query_one(db, "SELECT pg_current_wal_insert_lsn()::text AS lsn").await?;
                Ok(Mark::Lsn(
                    row.try_get("", "lsn").map_err(|e| e.to_string())?,
                ))
            }
            Meter::MySql => Ok(Mark::Status(mysql_status(db).await?)),
        }
    }

    async fn since(
        &self,
        db: &DatabaseConnection,
        mark: &Mark,
        n: usize,
    ) -> Result<Figures, String> {
        let n = n as f64;
        match (self, mark) {
            (Meter::Postgres, Mark::Lsn(from)) => {
                let to = query_one(db, "SELECT pg_current_wal_insert_lsn()::text AS lsn").await?;
                let to: String = to.try_get("", "lsn").map_err(|e| e.to_string())?;
                // pg_walinspect reads only flushed WAL: a commit with an xid after `to`
                // (outside the window) has the WAL writer flush past it.
                query_one(db, "SELECT pg_current_xact_id()::text AS xid").await?;
                let flushed =
                    format!("SELECT pg_current_wal_flush_lsn() >= '{to}'::pg_lsn AS flushed");
                while !query_one(db, &flushed)
                    .await?
                    .try_get::<bool>("", "flushed")
                    .map_err(|e| e.to_string())?
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let sql = PHASE_SQL
                    .replace(":'from'", &format!("'{from}'"))
                    .replace(":'to'", &format!("'{to}'"));
                let row = query_one(db, sql.trim().trim_end_matches(';')).await?;
                let mut figures = Vec::new();
                for (column, name) in [
                    ("wal_bytes_no_fpi", "wal_bytes"),
                    ("commit_bytes", "of_it_commits"),
                    ("fpi_bytes", "fpi_bytes"),
                    ("btree_entries", "btree_entries"),
                    ("other_index_records", "other_index_records"),
                    ("heap_inserts", "heap_inserts"),
                    ("heap_updates", "heap_updates"),
                    ("heap_hot_updates", "heap_hot_updates"),
                    ("heap_locks", "heap_locks"),
                    ("records", "records"),
                ] {
                    let value: i64 = row.try_get("", column).map_err(|e| e.to_string())?;
                    figures.push((name, value as f64 / n));
                }
                Ok(figures)
            }
            (Meter::MySql, Mark::Status(before)) => {
                let after = mysql_status(db).await?;
                Ok(before
                    .iter()
                    .zip(after)
                    .map(|((name, b), (_, a))| {
                        let label = match name.as_str() {
                            "Innodb_lsn_current" => "redo_bytes",
                            "Innodb_log_write_requests" => "redo_records",
                            "Handler_write" => "rows_written",
                            "Handler_update" => "rows_updated",
                            _ => "rows_deleted",
                        };
                        (label, (a - b) / n)
                    })
                    .collect())
            }
            _ => Err("a mark of another dialect".into()),
        }
    }
}

async fn mysql_status(db: &DatabaseConnection) -> Result<Vec<(String, f64)>, String> {
    let mut values = Vec::new();
    for name in MYSQL_STATUS {
        let row = query_one(
            db,
            &format!(
                "SELECT CAST(VARIABLE_VALUE AS DOUBLE) AS v FROM information_schema.GLOBAL_STATUS \
                 WHERE VARIABLE_NAME = '{}'",
                name.to_uppercase()
            ),
        )
        .await?;
        values.push((
            name.to_owned(),
            row.try_get("", "v").map_err(|e| e.to_string())?,
        ));
    }
    Ok(values)
}

async fn query_one(db: &DatabaseConnection, sql: &str) -> Result<sea_orm::QueryResult, String> {
    db.query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no row: {sql}"))
}
