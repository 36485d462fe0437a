//! The completer: records the endings of a worker's tasks (completed, failed, back to
//! the queue for a retry) in batches, in the manner of River's batch completer. A task
//! hands its ending over and frees its slot; the completer records what has gathered in
//! one statement per shape once the batch is full or its first ending has waited the
//! batch delay, and everything left at shutdown.
//!
//! Nothing is weakened by the wait: each row is still a compare-and-set on status and
//! lease owner ([`endings::end_many`]), so an ending whose task was taken over in the
//! meantime is not applied and is counted lost. A batch lost with its connection is run
//! again by the retry driver (rows it had already ended are found ended by this worker),
//! and a worker that dies with endings unrecorded leaves its tasks running under leases
//! that run out: the reaper takes them back. The queue is bounded (one batch): while a
//! batch cannot be recorded, finished tasks wait to hand over their endings and keep
//! their slots, so the worker stops claiming.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::outcome::{End, Ending, Recorded, counted};
use crate::lifecycle::TaskLifecycle;
use crate::lifecycle::endings::{self, EndMany, EndedMany};
use crate::values::backoff::Retry;
use task_dedup_entity::TaskStatus;

/// The queue tasks hand their endings to: one batch long.
pub(super) fn queue(size: usize) -> (mpsc::Sender<Ending>, mpsc::Receiver<Ending>) {
    mpsc::channel(size)
}

/// Records the endings that come through `endings` in batches until `stop`, then the
/// ones still queued. Dropped with the worker (its `run` future), it records nothing
/// more: as if the process died.
pub(super) async fn run(
    shared: Arc<Shared>,
    mut endings: mpsc::Receiver<Ending>,
    stop: CancellationToken,
) {
    let (size, delay) = (shared.config.end_batch, shared.config.end_delay);
    let mut batch = Batch {
        endings: Vec::with_capacity(size),
        due: None,
    };
    loop {
        while batch.endings.len() < size
            && let Ok(ending) = endings.try_recv()
        {
            batch.add(&shared, ending, delay).await;
        }
        let due = batch.due.is_some_and(|due| due <= Instant::now());
        if batch.endings.len() >= size || due {
            batch.flush(&shared).await;
            continue;
        }
        let wait = batch.due;
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            received = endings.recv() => match received {
                Some(ending) => batch.add(&shared, ending, delay).await,
                None => break,
            },
            () = async { if let Some(at) = wait { tokio::time::sleep_until(at).await } },
                if wait.is_some() => {}
        }
    }
    // The handlers are done (the worker waited for them): record what they left.
    endings.close();
    loop {
        while batch.endings.len() < size
            && let Ok(ending) = endings.try_recv()
        {
            batch.add(&shared, ending, delay).await;
        }
        if batch.endings.is_empty() {
            return;
        }
        batch.flush(&shared).await;
    }
}

/// The endings gathered so far, and when they are due to be recorded.
struct Batch {
    endings: Vec<Ending>,
    due: Option<Instant>,
}

impl Batch {
    /// Adds `ending`; a second ending of a task already in the batch (the same worker
    /// claimed it again after its lease ran out) goes into the next one, in order.
    async fn add(&mut self, shared: &Shared, ending: Ending, delay: Duration) {
        if self.endings.iter().any(|queued| queued.id == ending.id) {
            self.flush(shared).await;
        }
        if self.endings.is_empty() {
            self.due = Some(Instant::now() + delay);
        }
        self.endings.push(ending);
    }

    /// Records the batch: one statement per shape present.
    async fn flush(&mut self, shared: &Shared) {
        self.due = None;
        let (mut complete, mut fail, mut retry) = (Vec::new(), Vec::new(), Vec::new());
        for ending in self.endings.drain(..) {
            match ending.end {
                End::Complete(_) => complete.push(ending),
                End::Fail(_) => fail.push(ending),
                End::Retry { .. } => retry.push(ending),
            }
        }
        if !complete.is_empty() {
            let rows: Vec<_> = complete
                .iter()
                .filter_map(|e| match &e.end {
                    End::Complete(result) => Some((e.id, result.as_ref())),
                    _ => None,
                })
                .collect();
            let ended =
                endings::end_many(&shared.db(), &shared.config.id, EndMany::Complete(&rows)).await;
            settle(shared, &complete, ended, Recorded::Completed).await;
        }
        if !fail.is_empty() {
            let rows: Vec<_> = fail
                .iter()
                .filter_map(|e| match &e.end {
                    End::Fail(error) => Some((e.id, error.as_str())),
                    _ => None,
                })
                .collect();
            let ended =
                endings::end_many(&shared.db(), &shared.config.id, EndMany::Fail(&rows)).await;
            settle(shared, &fail, ended, Recorded::Failed).await;
        }
        if !retry.is_empty() {
            let rows: Vec<_> = retry
                .iter()
                .filter_map(|e| match &e.end {
                    End::Retry {
                        error,
                        delay_micros,
                        ..
                    } => Some((e.id, error.as_str(), *delay_micros)),
                    _ => None,
                })
                .collect();
            let ended =
                endings::end_many(&shared.db(), &shared.config.id, EndMany::Retry(&rows)).await;
            settle(shared, &retry, ended, Recorded::Retried).await;
        }
        // The runs just recorded ended: a follow-up of their keys may be due now. The
        // claim loop woke when the handlers returned, before this, and found it still
        // blocked (one run per key).
        shared.task_ended.notify_waiters();
    }
}

/// Counts each ending of a batch by how it went.
async fn settle(
    shared: &Shared,
    endings: &[Ending],
    ended: Result<EndedMany, crate::values::error::DedupError>,
    recorded: Recorded,
) {
    match ended {
        Ok(EndedMany::Each(each)) => {
            for (ending, outcome) in endings.iter().zip(each) {
                match outcome {
                    Ok(()) => {
                        if recorded == Recorded::Retried {
                            retry_scheduled(shared, ending);
                        }
                        counted(shared, ending.id, recorded, ending.started);
                    }
                    Err(err) => {
                        tracing::info!(task_id = %ending.id, error = %err, "task taken away before its end was recorded; result discarded");
                        counted(shared, ending.id, Recorded::Lost, ending.started);
                    }
                }
            }
        }
        // A retry whose key a queued follow-up took: one at a time, as `fail` decides
        // (the follow-up does the work, and this task fails for good).
        Ok(EndedMany::HeldKey) => {
            for ending in endings {
                let outcome = one_retry(shared, ending).await;
                counted(shared, ending.id, outcome, ending.started);
            }
        }
        Err(err) => {
            tracing::warn!(error = %err, tasks = endings.len(), "could not record a batch of task endings; their leases will run out");
            for ending in endings {
                counted(shared, ending.id, Recorded::Lost, ending.started);
            }
        }
    }
}

/// Records a retry on its own ([`TaskLifecycle::fail`]).
async fn one_retry(shared: &Shared, ending: &Ending) -> Recorded {
    let End::Retry { error, delay, .. } = &ending.end else {
        return Recorded::Lost;
    };
    let worker_id = shared.config.id.as_str();
    match shared
        .db()
        .fail(ending.id, worker_id, error, Retry::After(*delay))
        .await
    {
        Ok(task) if task.status == TaskStatus::Queued => {
            retry_scheduled(shared, ending);
            Recorded::Retried
        }
        Ok(_) => Recorded::Failed,
        Err(err) => {
            tracing::warn!(task_id = %ending.id, error = %err, "could not record the task's end; its lease will run out");
            Recorded::Lost
        }
    }
}

/// A retry this worker scheduled is claimed when it falls due, whatever the poll
/// interval.
fn retry_scheduled(shared: &Shared, ending: &Ending) {
    if let End::Retry { delay, .. } = ending.end {
        shared.claim_after(delay);
    }
}
