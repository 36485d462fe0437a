use loco_rs::prelude::*;
use serde::{Deserialize, Serialize};

pub struct Worker {
    pub ctx: AppContext,
}

/// One monthly report of one user: at most one in flight per user and month (the
/// key `App::after_context` gives the class).
#[derive(Deserialize, Debug, Serialize, Clone)]
pub struct WorkerArgs {
    pub user_id: i32,
    pub month: String,
    /// How long rendering takes, simulated: milliseconds, none by default. Not part of
    /// the key (user and month are): a repeated request while the report renders gets
    /// the job in flight.
    #[serde(default)]
    pub render_ms: u64,
}

#[async_trait]
impl BackgroundWorker<WorkerArgs> for Worker {
    /// Creates a new instance of the Worker with the given application context.
    ///
    /// This function is called when registering the worker with the queue system.
    ///
    /// # Parameters
    /// * `ctx` - The application context containing shared resources
    fn build(ctx: &AppContext) -> Self {
        Self { ctx: ctx.clone() }
    }

    /// Returns the class name of the worker.
    ///
    /// This name is used when enqueueing jobs and identifying the worker in logs.
    /// The implementation returns the struct name as a string.
    fn class_name() -> String {
        "Report".to_string()
    }

    /// Returns tags associated with this worker.
    ///
    /// Tags can be used to filter which workers run during startup.
    /// The default implementation returns an empty vector (no tags).
    fn tags() -> Vec<String> {
        Vec::new()
    }

    /// Performs the actual work when a job is processed.
    ///
    /// This is the main function that contains the worker's logic.
    /// It gets executed when a job is dequeued from the job queue.
    ///
    /// # Returns
    /// * `Result<()>` - Ok if the job completed successfully, Err otherwise
    async fn perform(&self, args: WorkerArgs) -> Result<()> {
        tokio::time::sleep(std::time::Duration::from_millis(args.render_ms)).await;
        tracing::info!(user_id = args.user_id, month = %args.month, "report rendered");
        Ok(())
    }
}
