//! `cargo loco start` with the queue installed in `Hooks::after_context`: Loco 1.2's
//! `cli::main` builds the context (`boot::create_context`), then, for `start`, builds it
//! again in `boot::create_app` from the first one's config, and refuses that second build
//! if the config says `BackgroundQueue` without a `queue:` section. The child test below
//! runs that sequence in a process whose arguments are Loco's `start` command; other
//! commands build once and get `BackgroundQueue` at once.
//!
//! `.ci/loco-start.sh` runs the real thing: `cargo loco start` on examples/loco.
// A test file: a panic is how it fails.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use async_trait::async_trait;
use loco_rs::app::{AppContext, Hooks};
use loco_rs::bgworker::Queue;
use loco_rs::boot::{BootResult, StartMode, create_app, create_context};
use loco_rs::config::{Config, WorkerMode};
use loco_rs::controller::AppRoutes;
use loco_rs::environment::Environment;
use loco_rs::task::Tasks;
use task_dedup_loco::TaskDedupQueue;

/// A Loco application whose `after_context` is the README's line.
struct App;

#[async_trait]
impl Hooks for App {
    fn app_name() -> &'static str {
        "task_dedup_loco_start"
    }

    async fn boot(
        mode: StartMode,
        environment: &Environment,
        config: Config,
    ) -> loco_rs::Result<BootResult> {
        create_app::<Self, task_dedup_migration::Migrator>(mode, environment, config).await
    }

    fn routes(_ctx: &AppContext) -> AppRoutes {
        AppRoutes::empty()
    }

    async fn after_context(ctx: AppContext) -> loco_rs::Result<AppContext> {
        Ok(TaskDedupQueue::builder(ctx.db.clone()).build().install(ctx))
    }

    async fn connect_workers(_ctx: &AppContext, _queue: &Queue) -> loco_rs::Result<()> {
        Ok(())
    }

    fn register_tasks(_tasks: &mut Tasks) {}

    async fn truncate(_ctx: &AppContext) -> loco_rs::Result<()> {
        Ok(())
    }

    async fn seed(_ctx: &AppContext, _path: &Path) -> loco_rs::Result<()> {
        Ok(())
    }
}

/// What `loco new --bg async` writes: `BackgroundAsync`, no `queue:` section.
fn config() -> Config {
    let mut config = Config::from_folder(
        &Environment::Test,
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/config"),
    )
    .expect("tests/config/test.yaml");
    config.workers.mode = WorkerMode::BackgroundAsync;
    assert!(config.queue.is_none());
    config
}

/// `cargo loco start --server-and-worker` boots: this test binary run again with
/// `start` as its first argument, as Loco's command line has it (libtest reads it as
/// the filter that selects the child below).
#[test]
fn start_boots_with_the_queue_installed() {
    let exe = std::env::current_exe().expect("the test binary");
    let out = Command::new(exe)
        .args(["start", "--ignored", "--test-threads=1", "--nocapture"])
        .output()
        .expect("the child runs");
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{output}");
    assert!(
        output.contains("1 passed"),
        "the child did not run: {output}"
    );
}

/// Loco's `start` in this process: the first build keeps the configured mode (its
/// config is the second build's), the second boots and runs on the queue.
#[tokio::test]
#[ignore = "run by start_boots_with_the_queue_installed, with `start` as its first argument"]
async fn child_loco_start() {
    assert_eq!(
        std::env::args().nth(1).as_deref(),
        Some("start"),
        "run through start_boots_with_the_queue_installed"
    );
    let environment = Environment::Test;
    // cli::main: the context of every command,
    let first = create_context::<App>(&environment, config()).await.unwrap();
    let first_mode = first.config.workers.mode.clone();
    // then, for `start`, the application, built again from that context's config (Loco
    // refuses `BackgroundQueue` without a `queue:` section here).
    let boot = create_app::<App, task_dedup_migration::Migrator>(
        StartMode::ServerAndWorker,
        &environment,
        first.config,
    )
    .await
    .unwrap();
    assert_eq!(first_mode, WorkerMode::BackgroundAsync);
    let ctx = &boot.app_context;
    assert_eq!(ctx.config.workers.mode, WorkerMode::BackgroundQueue);
    let queue = ctx.queue_provider.as_ref().expect("the queue is installed");
    assert!(
        queue.describe().starts_with("task-dedup queue"),
        "{}",
        queue.describe()
    );
    assert_eq!(
        boot.worker,
        Some(Vec::new()),
        "a worker runs beside the server"
    );
    assert!(boot.router.is_some());
}

/// Every other command (`task`, `jobs`, `scheduler`, ...) builds the context once: it
/// gets `BackgroundQueue` at once, so a task's `perform_later` enqueues.
#[tokio::test]
async fn other_commands_get_the_queue_from_their_one_build() {
    let ctx = create_context::<App>(&Environment::Test, config())
        .await
        .unwrap();
    assert_eq!(ctx.config.workers.mode, WorkerMode::BackgroundQueue);
    assert!(ctx.queue_provider.is_some());
}
