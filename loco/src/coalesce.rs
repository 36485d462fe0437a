//! Group enqueue: the `perform_later` calls that arrive while others are being written
//! go to the database together, as one [`find_or_enqueue_many`](TaskDedup::find_or_enqueue_many).
//!
//! A lone call is written at once, as a batch of one: no timer, no added wait. Calls
//! that find every flush slot busy queue up, and the first of them to get a slot takes
//! every queued call with it. So under load each round trip, each commit and each
//! wake-up serves many calls (Loco's own queues pay one `INSERT` and one commit per
//! job), and each call still gets the outcome `find_or_enqueue` would have given it
//! (the bulk path decides repeats of a key within a batch as sequential calls would).
//!
//! Failures: a call the library refuses ([`NewTask::validate`]) fails before it joins
//! a batch. A batch that fails as a whole (a connection lost past the retry budget, the
//! unique index missing) is run again call by call, concurrently, so that each
//! caller gets its own outcome or its own error. A caller dropped while it writes a
//! batch (a cancelled request) hands the calls it carried back to their callers, which
//! queue them again; a job that batch wrote meanwhile is then found in flight by its
//! key, so nothing is enqueued twice. A caller dropped while its call still waits in
//! the queue takes it out: it is not written later by whoever calls next.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use futures_util::future::join_all;
use sea_orm::DatabaseConnection;
use task_dedup::{Enqueued, NewTask, TaskDedup};
use tokio::sync::{Semaphore, oneshot};

use crate::error::QueueError;

/// How many batches one queue writes at once, by default.
pub(crate) const DEFAULT_FLUSHES: usize = 4;

/// What a queued call hears back.
enum Reply {
    /// Its outcome.
    Done(Result<Enqueued, QueueError>),
    /// The caller that carried it was dropped before it finished: queue it again.
    Again(NewTask),
}

/// A queued call: its number (to take it back), its task, where its answer goes.
type Call = (u64, NewTask, oneshot::Sender<Reply>);

/// The calls waiting for a flush slot, and the slots.
pub(crate) struct Coalescer {
    queued: Mutex<VecDeque<Call>>,
    slots: Semaphore,
    enabled: bool,
    numbers: AtomicU64,
}

impl Coalescer {
    /// `flushes` batches at most in flight at once; 0 turns grouping off (every call
    /// is its own `find_or_enqueue`).
    pub(crate) fn new(flushes: usize) -> Coalescer {
        Coalescer {
            queued: Mutex::new(VecDeque::new()),
            slots: Semaphore::new(flushes),
            enabled: flushes > 0,
            numbers: AtomicU64::new(0),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Call>> {
        // Every critical section is one push or one drain: a panic cannot leave it
        // half-done.
        self.queued.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Enqueues `task` on `db`, in a batch with the calls queued beside it.
    pub(crate) async fn enqueue(
        &self,
        db: &DatabaseConnection,
        mut task: NewTask,
    ) -> Result<Enqueued, QueueError> {
        // A call the library refuses fails alone, before it can fail a batch.
        task.validate()?;
        if !self.enabled {
            return Ok(db.find_or_enqueue(task).await?);
        }
        loop {
            let (reply, outcome) = oneshot::channel();
            let number = self.numbers.fetch_add(1, Ordering::Relaxed);
            self.queue().push_back((number, task, reply));
            // A caller dropped before its call is taken takes it back: it is never
            // written later, by whoever calls next.
            let _queued = Queued {
                coalescer: self,
                number,
            };
            {
                // Never closed; without a permit the call would only write alone.
                let _slot = self.slots.acquire().await.ok();
                let batch: Vec<Call> = self.queue().drain(..).collect();
                // Empty when a caller before this one took this call with its own.
                if !batch.is_empty() {
                    flush(db, batch).await;
                }
            }
            // Answered by this caller's flush, or by the one that carries the call.
            task = match outcome.await {
                Ok(Reply::Done(result)) => return result,
                Ok(Reply::Again(task)) => task,
                // A sender is always answered or handed back (`InFlight`'s drop).
                Err(_) => return Err(QueueError::Interrupted),
            };
        }
    }
}

/// A call in the queue: dropped, it takes the call out if no batch took it yet.
struct Queued<'a> {
    coalescer: &'a Coalescer,
    number: u64,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.coalescer
            .queue()
            .retain(|(number, _, _)| *number != self.number);
    }
}

/// The calls of one batch while it is written; dropped unfinished (its caller was
/// cancelled), it hands every unanswered call back.
struct InFlight {
    calls: Vec<(NewTask, Option<oneshot::Sender<Reply>>)>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        for (task, reply) in self.calls.drain(..) {
            if let Some(reply) = reply {
                // A caller that went away meanwhile needs no answer.
                let _ = reply.send(Reply::Again(task));
            }
        }
    }
}

impl InFlight {
    fn answer(&mut self, index: usize, result: Result<Enqueued, QueueError>) {
        if let Some(reply) = self.calls[index].1.take() {
            let _ = reply.send(Reply::Done(result));
        }
    }
}

/// Writes `batch` as one `find_or_enqueue_many`; if that fails as a whole, call by call.
async fn flush(db: &DatabaseConnection, batch: Vec<Call>) {
    let mut in_flight = InFlight {
        calls: batch
            .into_iter()
            .map(|(_, task, reply)| (task, Some(reply)))
            .collect(),
    };
    let tasks: Vec<NewTask> = in_flight.calls.iter().map(|(t, _)| t.clone()).collect();
    match db.find_or_enqueue_many(tasks).await {
        Ok(outcomes) => {
            for (index, outcome) in outcomes.into_iter().enumerate() {
                in_flight.answer(index, Ok(outcome));
            }
        }
        Err(batch_error) => {
            tracing::debug!(error = %batch_error, "a grouped enqueue failed: call by call");
            let alone = in_flight
                .calls
                .iter()
                .map(|(task, _)| db.find_or_enqueue(task.clone()));
            for (index, result) in join_all(alone).await.into_iter().enumerate() {
                in_flight.answer(index, result.map_err(QueueError::from));
            }
        }
    }
}
