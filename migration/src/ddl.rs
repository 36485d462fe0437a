//! The `task_run` schema, written once and used by the migrations and by
//! [`ensure_schema`](crate::ensure_schema) alike, so the two can never drift apart.
//!
//! Every step here is idempotent: it checks what exists and reports whether it changed
//! anything, which is what lets the migrations re-run and the compat patch run at every
//! start-up.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend, Statement};
use task_dedup_entity::active_status_sql;
use task_dedup_entity::task_run::{
    Column, Entity, LEASE_OWNER_MAX_CHARS, RESOURCE_KEY_MAX_CHARS, TASK_TYPE_MAX_CHARS,
    USER_ID_MAX_CHARS,
};

/// Name of the table.
pub const TABLE: &str = "task_run";
pub use task_dedup_entity::task_run::ACTIVE_RESOURCE_UIDX;
/// Serves `find_active` and history lookups by key.
pub const LOOKUP_IDX: &str = "task_run_lookup_idx";
/// Serves worker claims (oldest queued first) and the reaper.
pub const CLAIM_IDX: &str = "task_run_claim_idx";
/// MySQL/MariaDB only: 1 while the row is active, NULL otherwise. MySQL has no partial
/// indexes; a unique index admits any number of NULLs, so only active rows compete.
pub const ACTIVE_MARKER: &str = "active_marker";

/// UTF-8 takes up to 4 bytes a character; VARBINARY lengths are in bytes.
const UTF8_MAX_BYTES: u32 = 4;

/// A string column that compares byte for byte on every dialect.
///
/// PostgreSQL (deterministic collations) and SQLite (`BINARY`) already compare strings
/// that way. MySQL/MariaDB collations are case-insensitive by default and `utf8mb4_bin`
/// pads trailing spaces on MariaDB; `VARBINARY` compares bytes, without padding, on both
/// servers and reads back into `String` unchanged.
fn exact_string(backend: DbBackend, column: Column, max_chars: usize) -> ColumnDef {
    let mut def = ColumnDef::new(column);
    let max_chars = <u32 as TryFrom<usize>>::try_from(max_chars).unwrap_or(u32::MAX);
    match backend {
        DbBackend::MySql => def.var_binary(max_chars * UTF8_MAX_BYTES),
        _ => def.string_len(max_chars),
    };
    def
}

/// A UTC timestamp with microsecond precision.
///
/// sea-query maps `timestamp_with_time_zone` to MySQL `timestamp`: whole seconds and the
/// 2038 limit. `datetime(6)` holds microseconds; the library always writes UTC into it.
fn timestamp(backend: DbBackend, column: Column) -> ColumnDef {
    let mut def = ColumnDef::new(column);
    match backend {
        DbBackend::MySql => def.custom("datetime(6)"),
        _ => def.timestamp_with_time_zone(),
    };
    def
}

/// The definition of one entity column on `backend`.
pub(crate) fn column_def(backend: DbBackend, column: Column) -> ColumnDef {
    let mut def = match column {
        Column::Id => ColumnDef::new(column).uuid().primary_key().to_owned(),
        Column::UserId => exact_string(backend, column, USER_ID_MAX_CHARS),
        Column::TaskType => exact_string(backend, column, TASK_TYPE_MAX_CHARS),
        Column::ResourceKey => exact_string(backend, column, RESOURCE_KEY_MAX_CHARS),
        Column::LeaseOwner => exact_string(backend, column, LEASE_OWNER_MAX_CHARS),
        Column::Status => ColumnDef::new(column).string_len(16).to_owned(),
        Column::Payload | Column::Result => ColumnDef::new(column).json_binary().to_owned(),
        Column::Error => ColumnDef::new(column).text().to_owned(),
        Column::Attempts => ColumnDef::new(column).integer().default(0).to_owned(),
        Column::LeaseExpiresAt
        | Column::CreatedAt
        | Column::UpdatedAt
        | Column::StartedAt
        | Column::FinishedAt => timestamp(backend, column),
    };
    if is_nullable(column) {
        def.null();
    } else {
        def.not_null();
    }
    def
}

/// Whether the column can be added to a table that already has rows: it admits NULL or
/// has a default.
pub(crate) fn can_add_to_existing_rows(column: Column) -> bool {
    is_nullable(column) || matches!(column, Column::Attempts)
}

/// Whether the column admits NULL.
fn is_nullable(column: Column) -> bool {
    matches!(
        column,
        Column::Payload
            | Column::Result
            | Column::Error
            | Column::LeaseOwner
            | Column::LeaseExpiresAt
            | Column::StartedAt
            | Column::FinishedAt
    )
}

/// `CREATE TABLE IF NOT EXISTS task_run (...)`.
pub(crate) fn create_table(backend: DbBackend) -> TableCreateStatement {
    let mut table = Table::create();
    table.table(Entity).if_not_exists();
    for column in <Column as sea_orm_migration::sea_orm::Iterable>::iter() {
        table.col(column_def(backend, column));
    }
    table.to_owned()
}

/// An index on `task_run` over `columns`, in order.
fn index(name: &str, columns: impl IntoIterator<Item = Column>) -> IndexCreateStatement {
    let mut index = Index::create();
    index.name(name).table(Entity);
    for column in columns {
        index.col(column);
    }
    index
}

/// The key columns of the dedup guarantee.
const KEY: [Column; 3] = [Column::UserId, Column::TaskType, Column::ResourceKey];

fn lookup_index() -> IndexCreateStatement {
    index(
        LOOKUP_IDX,
        KEY.into_iter().chain([Column::Status, Column::CreatedAt]),
    )
}

fn claim_index() -> IndexCreateStatement {
    index(CLAIM_IDX, [Column::Status, Column::CreatedAt, Column::Id])
}

/// The partial unique index of PostgreSQL and SQLite. Its predicate is the text of
/// [`active_status_sql`], the same text PostgreSQL's `ON CONFLICT` target and every
/// lookup use.
fn partial_unique_index() -> IndexCreateStatement {
    index(ACTIVE_RESOURCE_UIDX, KEY)
        .unique()
        .and_where(Expr::cust(active_status_sql()))
        .to_owned()
}

/// The MySQL/MariaDB counterpart: the key plus the generated marker column.
fn marker_unique_index() -> IndexCreateStatement {
    index(ACTIVE_RESOURCE_UIDX, KEY)
        .col(ACTIVE_MARKER)
        .unique()
        .to_owned()
}

/// `active_marker`: 1 while the row is active, NULL otherwise. STORED so the unique index
/// reads it like any other column. No NULL/NOT NULL clause: sea-query would write it
/// before GENERATED, which MariaDB rejects.
fn marker_column() -> ColumnDef {
    ColumnDef::new(ACTIVE_MARKER)
        .tiny_integer()
        .generated(
            Expr::cust(format!("CASE WHEN {} THEN 1 END", active_status_sql())),
            true,
        )
        .to_owned()
}

/// Creates `task_run` if it does not exist. Returns whether it did.
pub(crate) async fn ensure_table(manager: &SchemaManager<'_>) -> Result<bool, DbErr> {
    if manager.has_table(TABLE).await? {
        return Ok(false);
    }
    manager
        .create_table(create_table(manager.get_database_backend()))
        .await?;
    Ok(true)
}

/// Creates the lookup and claim indexes where missing. Returns the names it created.
pub(crate) async fn ensure_support_indexes(
    manager: &SchemaManager<'_>,
) -> Result<Vec<&'static str>, DbErr> {
    let mut created = Vec::new();
    for (name, index) in [(LOOKUP_IDX, lookup_index()), (CLAIM_IDX, claim_index())] {
        if create_index_if_missing(manager, name, index).await? {
            created.push(name);
        }
    }
    Ok(created)
}

/// What [`ensure_active_index`] changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ActiveIndexChange {
    pub added_marker_column: bool,
    pub created_index: bool,
}

/// Creates `task_active_resource_uidx` (and on MySQL/MariaDB its marker column) where
/// missing. Duplicate active rows must be resolved first or the index creation fails.
pub(crate) async fn ensure_active_index(
    manager: &SchemaManager<'_>,
) -> Result<ActiveIndexChange, DbErr> {
    let mut change = ActiveIndexChange::default();
    let index = match manager.get_database_backend() {
        DbBackend::MySql => {
            if !manager.has_column(TABLE, ACTIVE_MARKER).await? {
                manager
                    .alter_table(
                        Table::alter()
                            .table(Entity)
                            .add_column(marker_column())
                            .to_owned(),
                    )
                    .await?;
                change.added_marker_column = true;
            }
            marker_unique_index()
        }
        _ => partial_unique_index(),
    };
    change.created_index = create_index_if_missing(manager, ACTIVE_RESOURCE_UIDX, index).await?;
    Ok(change)
}

/// Drops `task_active_resource_uidx` and, on MySQL/MariaDB, the marker column.
pub(crate) async fn drop_active_index(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    if manager.has_index(TABLE, ACTIVE_RESOURCE_UIDX).await? {
        manager
            .drop_index(
                Index::drop()
                    .name(ACTIVE_RESOURCE_UIDX)
                    .table(Entity)
                    .to_owned(),
            )
            .await?;
    }
    if manager.get_database_backend() == DbBackend::MySql
        && manager.has_column(TABLE, ACTIVE_MARKER).await?
    {
        manager
            .alter_table(
                Table::alter()
                    .table(Entity)
                    .drop_column(ACTIVE_MARKER)
                    .to_owned(),
            )
            .await?;
    }
    Ok(())
}

/// The MySQL builder drops `IF NOT EXISTS` on indexes, so ask first on every dialect.
async fn create_index_if_missing(
    manager: &SchemaManager<'_>,
    name: &str,
    index: IndexCreateStatement,
) -> Result<bool, DbErr> {
    if manager.has_index(TABLE, name).await? {
        return Ok(false);
    }
    manager.create_index(index).await?;
    Ok(true)
}

/// MySQL/MariaDB: converts key and lease-owner columns that are not `VARBINARY` (a table
/// made by hand or by an older release, with a case-insensitive or PAD SPACE collation)
/// to the byte-exact types. Returns the names of the columns it converted.
pub(crate) async fn ensure_exact_key_columns(
    manager: &SchemaManager<'_>,
) -> Result<Vec<&'static str>, DbErr> {
    let backend = manager.get_database_backend();
    if backend != DbBackend::MySql {
        return Ok(Vec::new());
    }
    let mut converted = Vec::new();
    let mut alter = Table::alter();
    alter.table(Entity);
    for column in [
        Column::UserId,
        Column::TaskType,
        Column::ResourceKey,
        Column::LeaseOwner,
    ] {
        let name = column_name(column);
        let row = manager
            .get_connection()
            .query_one_raw(Statement::from_sql_and_values(
                backend,
                "SELECT DATA_TYPE AS data_type FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?",
                [TABLE.into(), name.into()],
            ))
            .await?;
        let Some(row) = row else { continue };
        let data_type: String = row.try_get("", "data_type")?;
        if !data_type.eq_ignore_ascii_case("varbinary") {
            alter.modify_column(column_def(backend, column));
            converted.push(name);
        }
    }
    if !converted.is_empty() {
        manager.alter_table(alter).await?;
    }
    Ok(converted)
}

/// The column's name in the table.
pub(crate) fn column_name(column: Column) -> &'static str {
    sea_orm_migration::sea_orm::IdenStatic::as_str(&column)
}
