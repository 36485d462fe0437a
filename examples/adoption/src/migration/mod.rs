//! The application's migrator: its own migrations first, task-dedup's appended after
//! them (so that `down` on an already-migrated database rolls back what was added last).

mod m20270101_000001_create_post;

use sea_orm_migration::prelude::*;

/// The application's migrator.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        let mut migrations: Vec<Box<dyn MigrationTrait>> =
            vec![Box::new(m20270101_000001_create_post::Migration)];
        migrations.extend(task_dedup::migration::migrations());
        migrations
    }
}
