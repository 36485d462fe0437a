//! Creates `task_run` with its lookup and claim indexes.

use sea_orm_migration::prelude::*;
use task_dedup_entity::task_run::Entity;

use crate::ddl;

/// Creates `task_run`, `task_run_lookup_idx` and `task_run_claim_idx`.
#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        ddl::ensure_table(manager).await?;
        ddl::ensure_support_indexes(manager).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Entity).if_exists().to_owned())
            .await
    }
}
