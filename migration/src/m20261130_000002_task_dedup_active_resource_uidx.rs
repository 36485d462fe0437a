//! Creates `task_active_resource_uidx`, the dedup guarantee, after resolving duplicate
//! active rows that the old read-then-insert flow may have left.

use sea_orm_migration::prelude::*;

use crate::{ddl, duplicates};

/// Cancels duplicate active rows, then creates the partial unique index (PostgreSQL,
/// SQLite) or the generated marker column and its unique index (MySQL/MariaDB).
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        duplicates::cancel_duplicate_active(manager.get_connection()).await?;
        ddl::ensure_active_index(manager).await?;
        Ok(())
    }

    /// Drops the index (and the marker column). Tasks cancelled as duplicates stay
    /// cancelled: reviving them would bring the duplicate work back.
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        ddl::drop_active_index(manager).await
    }
}
