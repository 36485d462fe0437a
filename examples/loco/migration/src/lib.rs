#![allow(elided_lifetimes_in_paths)]
#![allow(clippy::wildcard_imports)]
pub use sea_orm_migration::prelude::*;
mod m20220101_000001_users;

pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        let mut migrations: Vec<Box<dyn MigrationTrait>> = vec![
            Box::new(m20220101_000001_users::Migration),
            // inject-above (do not remove this comment)
        ];
        // task-dedup's `task_run`, after the application's own tables.
        migrations.extend(task_dedup_migration::migrations());
        migrations
    }
}
