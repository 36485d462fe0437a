use async_trait::async_trait;
use loco_rs::{
    app::{AppContext, Hooks, Initializer},
    bgworker::{BackgroundWorker, Queue},
    boot::{create_app, BootResult, StartMode},
    config::Config,
    controller::AppRoutes,
    db::{self, truncate_table},
    environment::Environment,
    task::Tasks,
    Result,
};
use migration::Migrator;
use std::path::Path;
use task_dedup_loco::{Dedup, JobKey, TaskDedupQueue};

#[allow(unused_imports)]
use crate::{
    controllers,
    models::_entities::users,
    tasks,
    workers::{downloader::DownloadWorker, report},
};

pub struct App;
#[async_trait]
impl Hooks for App {
    fn app_name() -> &'static str {
        env!("CARGO_CRATE_NAME")
    }

    fn app_version() -> String {
        format!(
            "{} ({})",
            env!("CARGO_PKG_VERSION"),
            option_env!("BUILD_SHA")
                .or(option_env!("GITHUB_SHA"))
                .unwrap_or("dev")
        )
    }

    async fn boot(
        mode: StartMode,
        environment: &Environment,
        config: Config,
    ) -> Result<BootResult> {
        create_app::<Self, Migrator>(mode, environment, config).await
    }

    /// task-dedup as the queue: every `perform_later` deduplicated, on the app's own
    /// database (SQLite, PostgreSQL or MySQL/MariaDB). The queue is also kept in the
    /// shared store, for controllers that want to know created vs existing or to enqueue
    /// in their transaction (`TaskDedupQueue::enqueue`).
    async fn after_context(ctx: AppContext) -> Result<AppContext> {
        let queue = TaskDedupQueue::builder(ctx.db.clone())
            .class::<report::Worker, report::WorkerArgs>(Dedup::by_key(
                |args: &report::WorkerArgs| {
                    JobKey::new(format!("report/{}", args.month)).user(args.user_id.to_string())
                },
            ))
            .build();
        let ctx = queue.install(ctx);
        ctx.shared_store.insert(queue);
        Ok(ctx)
    }

    async fn initializers(_ctx: &AppContext) -> Result<Vec<Box<dyn Initializer>>> {
        Ok(vec![])
    }

    fn routes(_ctx: &AppContext) -> AppRoutes {
        AppRoutes::with_default_routes() // controller routes below
            .add_route(controllers::reports::routes())
            .add_route(controllers::auth::routes())
    }
    async fn connect_workers(ctx: &AppContext, queue: &Queue) -> Result<()> {
        queue
            .register(crate::workers::report::Worker::build(ctx))
            .await?;
        queue.register(DownloadWorker::build(ctx)).await?;
        Ok(())
    }

    #[allow(unused_variables)]
    fn register_tasks(tasks: &mut Tasks) {
        // tasks-inject (do not remove)
        tasks.register(tasks::user_create::UserCreate);
        tasks.register(tasks::user_delete::UserDelete);
    }
    async fn truncate(ctx: &AppContext) -> Result<()> {
        truncate_table(&ctx.db, users::Entity).await?;
        truncate_table(&ctx.db, task_dedup::task_run::Entity).await?;
        Ok(())
    }
    async fn seed(ctx: &AppContext, base: &Path) -> Result<()> {
        db::seed::<users::ActiveModel>(&ctx.db, &base.join("users.yaml").display().to_string())
            .await?;
        Ok(())
    }
}
