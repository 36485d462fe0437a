//! Compiles against the PostgreSQL-only feature set of README's install section, with
//! what its later sections use (migrations, the Worker, the cancellation token); never
//! run by CI.
use task_dedup::migration::{Migrator, MigratorTrait};
use task_dedup::{CancellationToken, HandlerError, NewTask, TaskDedup, TaskKey, Worker, task_run};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = task_dedup::connect("postgres://postgres@127.0.0.1/app").await?;
    Migrator::up(&db, None).await?;
    let key = TaskKey::new("user-1", "render", "doc-1")?;
    println!("{:?}", db.find_or_enqueue(NewTask::new(key)).await?);
    let worker = Worker::builder(db)
        .handler(|task: task_run::Model, _cancel: CancellationToken| async move {
            println!("{}", task.resource_key);
            Ok::<_, HandlerError>(None)
        })
        .build()?;
    worker.run(CancellationToken::new()).await?;
    Ok(())
}
