//! Compiles against the PostgreSQL-only feature set; never run by CI.
use task_dedup::{NewTask, TaskDedup, TaskKey};
use task_dedup_migration::{Migrator, MigratorTrait};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = task_dedup::connect("postgres://postgres@127.0.0.1/app").await?;
    Migrator::up(&db, None).await?;
    let key = TaskKey::new("user-1", "render", "doc-1")?;
    println!("{:?}", db.find_or_enqueue(NewTask::new(key)).await?);
    Ok(())
}
