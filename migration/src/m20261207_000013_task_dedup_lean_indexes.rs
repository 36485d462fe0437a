//! PostgreSQL: the indexes of `task_run` partial to the rows each serves, so that a
//! task's life writes what the hot path needs and little more (issue 52).
//!
//! Every change of a task's state rewrites the indexed `status`, so no update of a task
//! is HOT: each of its three row versions (queued, running, ended) adds an entry to every
//! index whose predicate it meets. Before this step eight of `task_run`'s twelve indexes
//! covered every row, 28 entries per task's life; after it, twelve:
//!
//! | index | rows | entries per life |
//! |---|---|---|
//! | `task_run_pkey` | all | 3 |
//! | `task_active_resource_uidx` | holding their key (unchanged) | 2 |
//! | `task_running_resource_uidx` | running (was: running and not `concurrent`) | 1 |
//! | `task_run_queue_idx` | queued: the claims' order (was `task_run_claim_idx`, every row) | 1 |
//! | `task_run_type_status_idx` | not running: per type and status by creation, for the admin API (was `task_run_type_status_created_idx` and `task_run_status_created_idx`, every row) | 2 |
//! | `task_run_key_idx` | not running: keys in byte order (was `task_run_key_prefix_idx`, every row) | 2 |
//! | `task_run_retention_idx` | finished: by end, for the pruner and the throughput (was `task_run_finished_idx`, every row) | 1 |
//! | `task_run_slot_uidx` | running with a run slot (unchanged) | 0 without limits |
//!
//! Dropped besides: `task_run_lookup_idx` (the key and status: the unique indexes serve
//! every lookup of a key), `task_run_created_idx` (lists read creation order per type
//! from `task_run_type_status_idx`) and `task_run_user_queue_idx` (fair claims find a
//! user's queued tasks through `task_active_resource_uidx`, which holds every queued
//! task). `task_running_resource_uidx` keeps its guarantee (one run per key for tasks
//! that are not `concurrent`: they share the last column's zero UUID) and now holds
//! every running task (a `concurrent` one under its own id), so the reaper, the limits
//! and the admin API find running tasks in it. The table's `fillfactor` becomes 70: a
//! claim or an ending then finds room for the new row version on the same page more
//! often, which writes a smaller record and no lock record for the old version.
//!
//! Measured on PostgreSQL 15 (BENCHMARKS.md, "Cost per task"): WAL per task's life 0.52 ×
//! what it was (0.49 × through a Worker), per create 0.59 × (737 bytes).
//!
//! SQLite and MySQL/MariaDB are left as they are: neither has partial indexes, so this
//! step's design does not carry over, and nothing they run depends on it.
//!
//! Online ([`online`](crate::online)): each new index is built `CONCURRENTLY` before
//! anything is dropped; the running index under an interim name, then put in the old
//! one's place. Frozen once released: this file states its DDL per dialect and never
//! changes. Idempotent (builds only what is missing, drops only what is there).

use sea_orm_migration::prelude::*;

use crate::sql::{self, Dialect};

/// Replaces PostgreSQL's indexes of `task_run` by the lean set.
#[derive(DeriveMigrationName)]
pub struct Migration;

/// The new indexes, in the order they are built.
pub(crate) const POSTGRES_INDEXES: [(&str, &str); 4] = [
    (
        "task_run_queue_idx",
        "CREATE INDEX task_run_queue_idx ON task_run \
         (priority DESC, run_at, created_at, id) WHERE status = 'queued'",
    ),
    (
        "task_run_type_status_idx",
        "CREATE INDEX task_run_type_status_idx ON task_run \
         (task_type, status, created_at, id) WHERE status <> 'running'",
    ),
    (
        "task_run_key_idx",
        "CREATE INDEX task_run_key_idx ON task_run (resource_key COLLATE \"C\") \
         WHERE status <> 'running'",
    ),
    (
        "task_run_retention_idx",
        "CREATE INDEX task_run_retention_idx ON task_run (status, finished_at) \
         WHERE status IN ('succeeded', 'failed', 'cancelled')",
    ),
];

/// The interim name of the new running index, until it takes the old one's place.
pub(crate) const RUNNING_INTERIM: &str = "task_run_running_uidx_lean";

/// The running index over every running task: one run per key for tasks that are not
/// `concurrent` (the zero UUID in the last column for all of them), and a `concurrent`
/// task under its own id.
pub(crate) const POSTGRES_RUNNING: &str = "CREATE UNIQUE INDEX task_run_running_uidx_lean \
    ON task_run (task_type, user_id, resource_key, \
    (CASE WHEN concurrent THEN id ELSE '00000000-0000-0000-0000-000000000000'::uuid END)) \
    WHERE status = 'running'";

/// The indexes the lean set replaces, dropped once it stands.
pub(crate) const POSTGRES_DROPPED: [&str; 8] = [
    "task_run_lookup_idx",
    "task_run_claim_idx",
    "task_run_status_created_idx",
    "task_run_type_status_created_idx",
    "task_run_created_idx",
    "task_run_key_prefix_idx",
    "task_run_user_queue_idx",
    "task_run_finished_idx",
];

/// Room on each page for a task's later row versions.
pub(crate) const POSTGRES_FILLFACTOR: &str = "ALTER TABLE task_run SET (fillfactor = 70)";

/// What step 12 left, for `down`.
const POSTGRES_DOWN: [&str; 16] = [
    "CREATE INDEX IF NOT EXISTS task_run_lookup_idx ON task_run \
     (user_id, task_type, resource_key, status, created_at)",
    "CREATE INDEX IF NOT EXISTS task_run_claim_idx ON task_run \
     (status, priority DESC, run_at, created_at, id)",
    "CREATE INDEX IF NOT EXISTS task_run_status_created_idx ON task_run (status, created_at, id)",
    "CREATE INDEX IF NOT EXISTS task_run_type_status_created_idx ON task_run \
     (task_type, status, created_at, id)",
    "CREATE INDEX IF NOT EXISTS task_run_created_idx ON task_run (created_at, id)",
    "CREATE INDEX IF NOT EXISTS task_run_key_prefix_idx ON task_run (resource_key COLLATE \"C\")",
    "CREATE INDEX IF NOT EXISTS task_run_user_queue_idx ON task_run \
     (task_type, user_id, priority DESC, run_at, created_at, id) WHERE status = 'queued'",
    "CREATE INDEX IF NOT EXISTS task_run_finished_idx ON task_run (status, finished_at)",
    "CREATE UNIQUE INDEX IF NOT EXISTS task_run_running_uidx_serial ON task_run \
     (user_id, task_type, resource_key) WHERE (status = 'running' AND NOT concurrent)",
    "DROP INDEX IF EXISTS task_running_resource_uidx",
    "ALTER INDEX task_run_running_uidx_serial RENAME TO task_running_resource_uidx",
    "DROP INDEX IF EXISTS task_run_queue_idx",
    "DROP INDEX IF EXISTS task_run_type_status_idx",
    "DROP INDEX IF EXISTS task_run_key_idx",
    "DROP INDEX IF EXISTS task_run_retention_idx",
    "ALTER TABLE task_run RESET (fillfactor)",
];

/// Whether `task_running_resource_uidx` is the lean one (it leads with the type; step
/// 5's leads with the user).
pub(crate) async fn running_is_lean(manager: &SchemaManager<'_>) -> Result<bool, DbErr> {
    let columns = sql::index_columns(manager, Dialect::Postgres, "task_running_resource_uidx");
    Ok(columns.await?.first().is_some_and(|c| c == "task_type"))
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if Dialect::of(manager)? != Dialect::Postgres {
            return Ok(());
        }
        for (name, create) in POSTGRES_INDEXES {
            sql::create_index_if_missing(manager, name, create).await?;
        }
        if !running_is_lean(manager).await? {
            // In this migration's transaction: the old index stands until the new one
            // takes its name, so the guarantee never lapses.
            sql::create_index_if_missing(manager, RUNNING_INTERIM, POSTGRES_RUNNING).await?;
            sql::run(
                manager,
                &[
                    "DROP INDEX IF EXISTS task_running_resource_uidx",
                    "ALTER INDEX task_run_running_uidx_lean RENAME TO task_running_resource_uidx",
                ],
            )
            .await?;
        }
        for name in POSTGRES_DROPPED {
            sql::run(manager, &[&format!("DROP INDEX IF EXISTS {name}")]).await?;
        }
        sql::run(manager, &[POSTGRES_FILLFACTOR]).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if Dialect::of(manager)? != Dialect::Postgres {
            return Ok(());
        }
        sql::run(manager, &POSTGRES_DOWN).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each statement creates the index of its name; none is dropped that is built.
    #[test]
    fn statements_create_the_named_indexes() {
        for (name, sql) in POSTGRES_INDEXES {
            assert!(sql.contains(&format!("INDEX {name} ON")), "{sql}");
            assert!(!POSTGRES_DROPPED.contains(&name));
        }
        assert!(POSTGRES_RUNNING.contains(&format!("INDEX {RUNNING_INTERIM} ON")));
    }
}
