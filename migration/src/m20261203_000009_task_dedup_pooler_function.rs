//! The insert-or-find function: `task_dedup_insert_or_find_v1`, what a hit or a create
//! runs on PostgreSQL in `PoolerMode::NoPreparedStatements` (task-dedup's pooler mode
//! for PgBouncer before 1.21).
//!
//! Without named prepared statements the server parses and plans `find_or_enqueue`'s
//! statement on every call (0.57 ms against 0.06 ms prepared). A PL/pgSQL function keeps
//! the plans of its statements for the life of the server session, and a pooler's server
//! sessions live long: called in one simple-protocol message with its values written in,
//! the call itself is a trivial statement to plan. What it runs is what the prepared
//! statement does, split where a function can do better: the holder first (a hit is one
//! index probe), then the insert against the unique index (`DO NOTHING`), then, when
//! the insert yielded to a holder that committed meanwhile, the holder again: the
//! function's statements each read a fresh snapshot (READ COMMITTED), so that holder is
//! seen at once. The unique index still decides: the first read only answers early.
//!
//! The name carries a version: a later change of its arguments or its answer comes as a
//! new function in a new migration, and the library calls the version it knows (falling
//! back to the plain statement while that version is missing).
//!
//! SQLite and MySQL/MariaDB: nothing (their pooler question does not arise).
//!
//! Frozen once released: this file states its DDL and never changes.

use sea_orm_migration::prelude::*;

use crate::sql::{self, Dialect};

/// Creates `task_dedup_insert_or_find_v1` on PostgreSQL.
#[derive(DeriveMigrationName)]
pub struct Migration;

/// The function's read of the key's holder (before the insert, and after it yielded).
macro_rules! holder {
    () => {
        "    SELECT * INTO holder FROM task_run t
     WHERE t.user_id = p_user_id AND t.task_type = p_task_type
       AND t.resource_key = p_resource_key AND t.dedup_window_end = p_dedup_window_end
       AND ((t.scope = 'active' AND t.status IN ('queued', 'running'))
            OR (t.scope = 'queued' AND t.status = 'queued') OR t.scope = 'period');
"
    };
}

/// `SETOF task_run` and `SELECT *`: its rows are `task_run`'s rows as the table is when
/// the session first runs it (the caller names the columns it reads). The key's
/// predicate is written out as literals, as in the statements: with parameters in it the
/// conflict target no longer matches the partial index once a plan turns generic
/// (42P10).
const POSTGRES_FUNCTION: &str = concat!(
    "CREATE OR REPLACE FUNCTION task_dedup_insert_or_find_v1( \
    p_id uuid, p_user_id text, p_task_type text, p_resource_key text, p_payload jsonb, \
    p_created_at timestamptz, p_updated_at timestamptz, p_run_at timestamptz, \
    p_priority int2, p_scope text, p_dedup_window_end int8, p_concurrent bool) \
RETURNS SETOF task_run LANGUAGE plpgsql VOLATILE AS $task_dedup$
DECLARE
    holder task_run;
BEGIN
",
    holder!(),
    "    IF FOUND THEN
        RETURN NEXT holder;
        RETURN;
    END IF;
    INSERT INTO task_run (id, user_id, task_type, resource_key, status, payload, attempts,
            created_at, updated_at, run_at, priority, scope, dedup_window_end, concurrent)
    VALUES (p_id, p_user_id, p_task_type, p_resource_key, 'queued', p_payload, 0,
            p_created_at, p_updated_at, p_run_at, p_priority, p_scope, p_dedup_window_end,
            p_concurrent)
    ON CONFLICT (user_id, task_type, resource_key, dedup_window_end)
       WHERE ((scope = 'active' AND status IN ('queued', 'running'))
              OR (scope = 'queued' AND status = 'queued') OR scope = 'period')
    DO NOTHING
    RETURNING * INTO holder;
    IF FOUND THEN
        RETURN NEXT holder;
        RETURN;
    END IF;
",
    holder!(),
    "    IF FOUND THEN
        RETURN NEXT holder;
    END IF;
    RETURN;
END
$task_dedup$"
);

const POSTGRES_DOWN: &str = "DROP FUNCTION IF EXISTS task_dedup_insert_or_find_v1( \
    uuid, text, text, text, jsonb, timestamptz, timestamptz, timestamptz, int2, text, int8, bool)";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        match Dialect::of(manager)? {
            Dialect::Postgres => sql::run(manager, &[POSTGRES_FUNCTION]).await,
            Dialect::Sqlite | Dialect::MySql => Ok(()),
        }
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        match Dialect::of(manager)? {
            Dialect::Postgres => sql::run(manager, &[POSTGRES_DOWN]).await,
            Dialect::Sqlite | Dialect::MySql => Ok(()),
        }
    }

    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }
}
