//! The typed tasks the `http_api` example enqueues and the `worker` example runs: one
//! definition of each, shared by both.

use serde::{Deserialize, Serialize};
use task_dedup::{Scope, Task, TaskOptions};

/// Export a user's report. The simulated work takes `work_ms` (default 200 ms), fails for
/// good when `fail` is set and retryably when `flaky` is set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Export {
    pub user: String,
    pub report: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_ms: Option<u64>,
    #[serde(default)]
    pub fail: bool,
    #[serde(default)]
    pub flaky: bool,
}

impl Task for Export {
    const TASK_TYPE: &'static str = "export";

    fn user_id(&self) -> Option<String> {
        Some(self.user.clone())
    }

    fn resource_key(&self) -> String {
        format!("report/{}", self.report)
    }

    /// Re-do on change: a request while an export runs queues one follow-up, so the
    /// export reflects the latest data.
    fn options() -> TaskOptions {
        TaskOptions::default().scope(Scope::Queued).concurrency(2)
    }
}
