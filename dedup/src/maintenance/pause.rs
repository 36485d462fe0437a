//! Paused task types, stored in the database (`task_dedup_paused`), behind
//! [`TaskLifecycle::pause`](crate::TaskLifecycle::pause), `resume` and `paused`. Every claim
//! reads the table, so every worker of every process honours a pause from its next
//! claim on; enqueueing is not affected.

use chrono::{DateTime, Utc};

use crate::connect::retry::Retrying;
use crate::executor::Executor;
use crate::values::connection::DedupConnection;
use crate::values::error::DedupError;
use crate::values::validate::{self, InvalidArgument};
use task_dedup_entity::task_run::TASK_TYPE_MAX_CHARS;

/// A paused task type, as [`TaskLifecycle::paused`](crate::TaskLifecycle::paused) lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PausedType {
    /// The task type.
    pub task_type: String,
    /// When it was paused, by the database's clock.
    pub paused_at: DateTime<Utc>,
}

/// What a call does to a type.
#[derive(Clone, Copy)]
pub(crate) enum Action {
    Pause,
    Resume,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Resume => "resume",
        }
    }
}

/// Pauses or resumes `task_type`; whether that changed anything. A resume wakes the
/// workers that wait for notifications (its tasks are due again).
pub(crate) async fn set<C: DedupConnection + ?Sized>(
    db: &C,
    task_type: &str,
    action: Action,
) -> Result<bool, DedupError> {
    validate::text(task_type, TASK_TYPE_MAX_CHARS)
        .map_err(|reason| InvalidArgument::new("task_type", reason))?;
    let mut exec = Executor::on(db)?;
    let mut retrying = Retrying::new(db, None, action.name());
    let changed = loop {
        let attempt = async {
            Ok::<_, DedupError>(match action {
                Action::Pause => exec.pause(task_type).await?,
                Action::Resume => exec.resume(task_type).await?,
            })
        };
        // Boxed, as in the lifecycle's `retried`.
        if let Some(outcome) = retrying.run(Box::pin(attempt)).await {
            break outcome?;
        }
    };
    if changed {
        crate::metrics::pause_changed(action.name());
        tracing::info!(
            task_type,
            action = action.name(),
            "task type paused or resumed"
        );
        if let Action::Resume = action {
            crate::executor::notify::task_due(&mut exec).await?;
        }
    }
    Ok(changed)
}

/// The paused types, by name.
pub(crate) async fn list<C: DedupConnection + ?Sized>(
    db: &C,
) -> Result<Vec<PausedType>, DedupError> {
    let mut exec = Executor::on(db)?;
    let mut retrying = Retrying::new(db, None, "paused");
    let paused = loop {
        let attempt = async { Ok::<_, DedupError>(exec.paused().await?) };
        if let Some(outcome) = retrying.run(Box::pin(attempt)).await {
            break outcome?;
        }
    };
    Ok(paused
        .into_iter()
        .map(|(task_type, paused_at)| PausedType {
            task_type,
            paused_at,
        })
        .collect())
}
