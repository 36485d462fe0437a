//! The cancel watch: a task cancelled from outside while it runs (`TaskAdmin`, the
//! command, the dashboard) has its handler's cancellation fired here at once, not at the
//! task's next heartbeat (a third of its lease).
//!
//! The database row is the only truth: whatever rings (PostgreSQL's `task_dedup_cancel`
//! notification, SQLite's in-process cancel bell) or, where nothing does, the
//! [`cancel_poll`](super::WorkerBuilder::cancel_poll), the watch reads the rows of the
//! tasks whose handlers run here and cancels those that are no longer running under
//! this worker's lease (cancelled, deleted, or reaped and claimed elsewhere), as the
//! heartbeat does when it finds them gone. Their results are then discarded: the
//! handler's return after a cancel never overwrites `cancelled` (the ending's own guard
//! would refuse it too).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::Shared;
use super::outcome::TakenAway;
use crate::executor::Executor;
use task_dedup_entity::TaskStatus;

/// The most ids one look-up reads.
const LOOKUP_CHUNK: usize = 500;

/// Which claim of a task a handler runs: its `attempts` and `snoozes` as claimed (a
/// claim counts an attempt, a snooze gives it back and counts a snooze), so that a look-up
/// that read the row before a retry's claim does not cancel the new run.
pub(super) type Claim = (i32, i32);

/// A running handler, as the watch cancels it.
struct Handler {
    claim: Claim,
    cancel: CancellationToken,
    /// Read by the task once its handler ended: set, its result is discarded.
    taken: Arc<TakenAway>,
}

/// The tasks whose handlers run in this worker.
#[derive(Default)]
pub(super) struct Running(Mutex<HashMap<Uuid, Handler>>);

impl Running {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Handler>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A handler started for task `id`.
    pub(super) fn started(
        &self,
        id: Uuid,
        claim: Claim,
        cancel: CancellationToken,
        taken: Arc<TakenAway>,
    ) {
        self.map().insert(
            id,
            Handler {
                claim,
                cancel,
                taken,
            },
        );
    }

    /// The handler of task `id` ended. Called before the task reads whether it was taken
    /// away:
    /// under the same lock as [`Running::take_away`], so the flag is set before that
    /// read or not at all.
    pub(super) fn ended(&self, id: Uuid) {
        self.map().remove(&id);
    }

    fn claims(&self) -> Vec<(Uuid, Claim)> {
        self.map()
            .iter()
            .map(|(id, handler)| (*id, handler.claim))
            .collect()
    }

    /// Marks task `id` taken away (`cancelled`, or lost) and cancels its handler, if it
    /// still runs the same `claim`.
    fn take_away(&self, id: Uuid, claim: Claim, cancelled: bool) -> bool {
        match self.map().get(&id) {
            Some(handler) if handler.claim == claim => {
                handler.taken.set(cancelled);
                handler.cancel.cancel();
                true
            }
            _ => false,
        }
    }
}

/// Watches for cancels until `stop`: at each ring of `cancels` and every
/// [`cancel_poll`](super::WorkerBuilder::cancel_poll) (the longer
/// [`fallback_poll`](super::WorkerBuilder::fallback_poll) while `hears_every_cancel`).
pub(super) async fn watch(
    shared: Arc<Shared>,
    cancels: Option<Arc<Notify>>,
    hears_every_cancel: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let config = &shared.config;
    let mut rung = armed(cancels.as_deref());
    loop {
        let every = if hears_every_cancel.load(Ordering::Relaxed) {
            config.cancel_poll.max(config.fallback_poll)
        } else {
            config.cancel_poll
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
            () = async {
                match rung.as_mut() {
                    Some(rung) => rung.await,
                    None => std::future::pending().await,
                }
            } => {}
        }
        // Armed before the look-up, so that a cancel rung during it is looked up again.
        rung = armed(cancels.as_deref());
        look_up(&shared).await;
    }
}

/// A wait for the next ring of `bell`, registered now.
fn armed(bell: Option<&Notify>) -> Option<Pin<Box<Notified<'_>>>> {
    let mut notified = Box::pin(bell?.notified());
    notified.as_mut().enable();
    Some(notified)
}

/// Reads the rows of the tasks whose handlers run here and takes away those that are no
/// longer running under this worker's lease. A failed read is logged: the next ring or
/// poll, or the heartbeat, tries again.
async fn look_up(shared: &Shared) {
    let claims = shared.handlers.claims();
    for chunk in claims.chunks(LOOKUP_CHUNK) {
        let ids: Vec<Uuid> = chunk.iter().map(|(id, _)| *id).collect();
        let rows = async { Executor::on(&shared.db)?.by_ids(&ids).await };
        let rows = match Box::pin(rows).await {
            Ok(rows) => rows,
            Err(failure) => {
                tracing::debug!(error = %failure.err, "looking up running tasks for cancels failed; trying at the next poll");
                return;
            }
        };
        // Each task's status, when it no longer runs under this worker's lease.
        let taken: HashMap<Uuid, Option<TaskStatus>> = rows
            .iter()
            .map(|row| {
                let ours = row.status == TaskStatus::Running
                    && row.lease_owner.as_deref() == Some(&*shared.worker_id);
                (row.id, (!ours).then_some(row.status))
            })
            .collect();
        for (id, claim) in chunk {
            // `Some(cancelled)`: taken away, by a cancel or otherwise (a deleted task has
            // no row).
            let taken_away = match taken.get(id) {
                None => Some(false),
                Some(None) => None,
                Some(Some(status)) => Some(*status == TaskStatus::Cancelled),
            };
            if let Some(cancelled) = taken_away
                && shared.handlers.take_away(*id, *claim, cancelled)
            {
                tracing::info!(task_id = %id, "task cancelled or taken away while it ran; cancelling its handler");
            }
        }
    }
}
