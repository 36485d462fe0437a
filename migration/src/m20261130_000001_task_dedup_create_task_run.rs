//! Creates `task_run` with its lookup and claim indexes.
//!
//! Released in 0.1.0 and frozen: this file states the DDL as it was released, per
//! dialect, and must never change (the snapshot tests in `tests/schema/migrations.rs` fail if
//! what it creates does). A schema change is a new migration file.
//!
//! Idempotent (`IF NOT EXISTS`, indexes created only when missing), so it also runs
//! cleanly on a table that [`ensure_schema`](crate::ensure_schema) already brought up to
//! date.

use sea_orm_migration::prelude::*;

use crate::sql::{self, Dialect};

/// Creates `task_run`, `task_run_lookup_idx` and `task_run_claim_idx`.
#[derive(DeriveMigrationName)]
pub struct Migration;

/// SQLite keeps the CREATE TABLE text in `sqlite_master`: this is, byte for byte, what
/// the release wrote. UUIDs are 16-byte blobs, JSON and timestamps text (RFC 3339 UTC).
const SQLITE_TABLE: &str = "CREATE TABLE IF NOT EXISTS \"task_run\" ( \
    \"id\" uuid_text NOT NULL PRIMARY KEY, \
    \"user_id\" varchar(64) NOT NULL, \
    \"task_type\" varchar(64) NOT NULL, \
    \"resource_key\" varchar(255) NOT NULL, \
    \"status\" varchar(16) NOT NULL, \
    \"payload\" jsonb_text NULL, \
    \"result\" jsonb_text NULL, \
    \"error\" text NULL, \
    \"attempts\" integer NOT NULL DEFAULT 0, \
    \"lease_owner\" varchar(64) NULL, \
    \"lease_expires_at\" timestamp_with_timezone_text NULL, \
    \"created_at\" timestamp_with_timezone_text NOT NULL, \
    \"updated_at\" timestamp_with_timezone_text NOT NULL, \
    \"started_at\" timestamp_with_timezone_text NULL, \
    \"finished_at\" timestamp_with_timezone_text NULL )";

const SQLITE_INDEXES: [(&str, &str); 2] = [
    (
        LOOKUP_IDX,
        "CREATE INDEX \"task_run_lookup_idx\" ON \"task_run\" \
         (\"user_id\", \"task_type\", \"resource_key\", \"status\", \"created_at\")",
    ),
    (
        CLAIM_IDX,
        "CREATE INDEX \"task_run_claim_idx\" ON \"task_run\" (\"status\", \"created_at\", \"id\")",
    ),
];

/// Deterministic collations: `varchar` compares byte for byte. `timestamptz` holds
/// microseconds.
const POSTGRES_TABLE: &str = "CREATE TABLE IF NOT EXISTS task_run (
    id uuid NOT NULL PRIMARY KEY,
    user_id varchar(64) NOT NULL,
    task_type varchar(64) NOT NULL,
    resource_key varchar(255) NOT NULL,
    status varchar(16) NOT NULL,
    payload jsonb NULL,
    result jsonb NULL,
    error text NULL,
    attempts integer NOT NULL DEFAULT 0,
    lease_owner varchar(64) NULL,
    lease_expires_at timestamp with time zone NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone NULL,
    finished_at timestamp with time zone NULL
)";

const POSTGRES_INDEXES: [(&str, &str); 2] = [
    (
        LOOKUP_IDX,
        "CREATE INDEX task_run_lookup_idx ON task_run \
         (user_id, task_type, resource_key, status, created_at)",
    ),
    (
        CLAIM_IDX,
        "CREATE INDEX task_run_claim_idx ON task_run (status, created_at, id)",
    ),
];

/// Key columns are `VARBINARY` (bytes, no padding, 4 bytes a character): the default
/// collations ignore case and `utf8mb4_bin` pads trailing spaces on MariaDB.
/// `datetime(6)`: `timestamp` would have whole seconds and the 2038 limit.
const MYSQL_TABLE: &str = "CREATE TABLE IF NOT EXISTS task_run (
    id binary(16) NOT NULL PRIMARY KEY,
    user_id varbinary(256) NOT NULL,
    task_type varbinary(256) NOT NULL,
    resource_key varbinary(1020) NOT NULL,
    status varchar(16) NOT NULL,
    payload json NULL,
    result json NULL,
    error text NULL,
    attempts int NOT NULL DEFAULT 0,
    lease_owner varbinary(256) NULL,
    lease_expires_at datetime(6) NULL,
    created_at datetime(6) NOT NULL,
    updated_at datetime(6) NOT NULL,
    started_at datetime(6) NULL,
    finished_at datetime(6) NULL
)";

const MYSQL_INDEXES: [(&str, &str); 2] = [
    (
        LOOKUP_IDX,
        "CREATE INDEX task_run_lookup_idx ON task_run \
         (user_id, task_type, resource_key, status, created_at)",
    ),
    (
        CLAIM_IDX,
        "CREATE INDEX task_run_claim_idx ON task_run (status, created_at, id)",
    ),
];

const LOOKUP_IDX: &str = "task_run_lookup_idx";
const CLAIM_IDX: &str = "task_run_claim_idx";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let (table, indexes) = match Dialect::of(manager)? {
            Dialect::Sqlite => (SQLITE_TABLE, SQLITE_INDEXES),
            Dialect::Postgres => (POSTGRES_TABLE, POSTGRES_INDEXES),
            Dialect::MySql => (MYSQL_TABLE, MYSQL_INDEXES),
        };
        sql::run(manager, &[table]).await?;
        for (name, index) in indexes {
            sql::create_index_if_missing(manager, name, index).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        Dialect::of(manager)?;
        sql::run(manager, &["DROP TABLE IF EXISTS task_run"]).await
    }
}
