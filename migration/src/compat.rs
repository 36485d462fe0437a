//! [`ensure_schema`]: the compat patch for a `task_run` table that predates the migrations.

use std::fmt;

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::Iterable;
use task_dedup_entity::task_run::{Column, Entity};

use crate::{ddl, duplicates};

/// What [`ensure_schema`] changed. `CompatReport::default()` (see [`is_unchanged`])
/// means the schema already held the guarantee.
///
/// [`is_unchanged`]: CompatReport::is_unchanged
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompatReport {
    /// `task_run` did not exist and was created.
    pub created_table: bool,
    /// Nullable or defaulted columns that were missing and were added.
    pub added_columns: Vec<&'static str>,
    /// MySQL/MariaDB: key columns converted to byte-exact `VARBINARY`.
    pub converted_columns: Vec<&'static str>,
    /// Duplicate active rows marked `cancelled` (the oldest task of each key stays).
    pub cancelled_duplicates: u64,
    /// MySQL/MariaDB: the generated `active_marker` column was added.
    pub added_marker_column: bool,
    /// Indexes that were missing and were created.
    pub created_indexes: Vec<&'static str>,
}

impl CompatReport {
    /// Whether nothing had to change.
    pub fn is_unchanged(&self) -> bool {
        *self == CompatReport::default()
    }
}

impl fmt::Display for CompatReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_unchanged() {
            return f.write_str("task_run already up to date");
        }
        let mut parts = Vec::new();
        if self.created_table {
            parts.push("created table task_run".to_owned());
        }
        if !self.added_columns.is_empty() {
            parts.push(format!("added columns {}", self.added_columns.join(", ")));
        }
        if !self.converted_columns.is_empty() {
            parts.push(format!(
                "made columns byte-exact: {}",
                self.converted_columns.join(", ")
            ));
        }
        if self.cancelled_duplicates > 0 {
            parts.push(format!(
                "cancelled {} duplicate active task(s)",
                self.cancelled_duplicates
            ));
        }
        if self.added_marker_column {
            parts.push(format!("added column {}", ddl::ACTIVE_MARKER));
        }
        if !self.created_indexes.is_empty() {
            parts.push(format!("created {}", self.created_indexes.join(", ")));
        }
        f.write_str(&parts.join("; "))
    }
}

/// Brings `task_run` up to the dedup guarantee, whatever state it is in, and reports what
/// it changed.
///
/// For a table created before these migrations (by hand or by an older release): adds
/// missing nullable columns, makes MySQL/MariaDB key columns byte-exact, creates missing
/// indexes, cancels duplicate active rows exactly as the unique-index migration does, and
/// then creates `task_active_resource_uidx`. Creates the table when it does not exist.
/// Idempotent and cheap when there is nothing to do, so it is safe to call at every
/// start-up. It does not record anything in `seaql_migrations`; the migrations are
/// idempotent too, so running [`Migrator`](crate::Migrator) afterwards is fine.
///
/// # Errors
/// Any database error. A legacy table that lacks a required column (`id`, a key column,
/// `status`, `created_at`, `updated_at`) gives `DbErr::Migration` naming it: no value
/// could be invented for the existing rows. Steps already applied stay applied; calling
/// again after fixing the cause picks up where it stopped.
///
/// # Example
/// ```
/// # async fn run() -> Result<(), sea_orm_migration::DbErr> {
/// let db = sea_orm_migration::sea_orm::Database::connect("sqlite::memory:").await?;
/// let report = task_dedup_migration::ensure_schema(&db).await?;
/// assert!(report.created_table);
/// assert!(task_dedup_migration::ensure_schema(&db).await?.is_unchanged());
/// # Ok(())
/// # }
/// # tokio::runtime::Runtime::new().unwrap().block_on(run()).unwrap();
/// ```
pub async fn ensure_schema<'c, C>(db: C) -> Result<CompatReport, DbErr>
where
    C: IntoSchemaManagerConnection<'c>,
{
    let manager = SchemaManager::new(db);
    let mut report = CompatReport {
        created_table: ddl::ensure_table(&manager).await?,
        ..CompatReport::default()
    };
    if !report.created_table {
        report.added_columns = add_missing_columns(&manager).await?;
        report.converted_columns = ddl::ensure_exact_key_columns(&manager).await?;
    }
    report.created_indexes = ddl::ensure_support_indexes(&manager).await?;
    report.cancelled_duplicates =
        duplicates::cancel_duplicate_active(manager.get_connection()).await?;
    let change = ddl::ensure_active_index(&manager).await?;
    report.added_marker_column = change.added_marker_column;
    if change.created_index {
        report.created_indexes.push(ddl::ACTIVE_RESOURCE_UIDX);
    }
    Ok(report)
}

async fn add_missing_columns(manager: &SchemaManager<'_>) -> Result<Vec<&'static str>, DbErr> {
    let backend = manager.get_database_backend();
    let mut added = Vec::new();
    for column in Column::iter() {
        let name = ddl::column_name(column);
        if manager.has_column(ddl::TABLE, name).await? {
            continue;
        }
        if !ddl::can_add_to_existing_rows(column) {
            return Err(DbErr::Migration(format!(
                "task_run has no column {name}, and it cannot be added to existing rows; \
                 add it by hand, then call ensure_schema again"
            )));
        }
        manager
            .alter_table(
                Table::alter()
                    .table(Entity)
                    .add_column(ddl::column_def(backend, column))
                    .to_owned(),
            )
            .await?;
        added.push(name);
    }
    Ok(added)
}
