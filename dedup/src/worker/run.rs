//! Running one claimed task: its handler in a task of its own (a panic stays there), a
//! heartbeat beside it, then its end handed to [`record`](super::record).

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::handler::HandlerError;
use super::job::Lease;
use super::outcome::{Ended, TakenAway};
use super::route::RunContext;
use super::{Shared, record};
use crate::lifecycle::TaskLifecycle;
use crate::values::error::DedupError;
use task_dedup_entity::{TaskStatus, task_run};

/// Runs one claimed task, then records how it ended.
#[tracing::instrument(level = "debug", name = "task", skip_all, fields(task_id = %task.id, task_type = %task.task_type, attempt = task.attempts))]
pub(super) async fn run_task(shared: &Arc<Shared>, task: task_run::Model) {
    let started = Instant::now();
    let (id, attempts) = (task.id, task.attempts);
    let config = &shared.config;
    let typed = shared.routes.typed.get(&task.task_type);
    let (lease, heartbeat_every, retry) = match typed {
        Some(typed) => (typed.lease, typed.heartbeat_every, typed.retry),
        None => (config.lease, config.heartbeat_every, config.retry),
    };
    let timeout = config
        .timeouts
        .get(&task.task_type)
        .copied()
        .or(config.timeout);
    let snoozes = task.snoozes;
    let lease = Lease::new(
        shared.db.clone(),
        config.retry_budget,
        shared.worker_id.clone(),
        id,
        lease,
        heartbeat_every,
    );
    let cancel = shared.abort.child_token();
    let taken = Arc::new(TakenAway::default());
    shared
        .handlers
        .started(id, (attempts, snoozes), cancel.clone(), taken.clone());
    let heartbeat = tokio::spawn(heartbeat(
        shared.clone(),
        lease.clone(),
        cancel.clone(),
        taken.clone(),
    ));
    let route = shared.routes.get(&task.task_type).cloned();
    let mut handle = tokio::spawn({
        let context = RunContext {
            cancel: cancel.clone(),
            lease,
        };
        async move {
            match route {
                Some(route) => route.run(task, context).await,
                // Claims ask only for the types the worker has a route for.
                None => Err(HandlerError::fail(format_args!(
                    "no handler for task type `{}` on this worker",
                    task.task_type
                ))),
            }
        }
    });
    let deadline = async {
        match timeout {
            Some(timeout) => tokio::time::sleep(timeout).await,
            None => std::future::pending().await,
        }
    };
    let mut timed_out = None;
    let ended = tokio::select! {
        joined = &mut handle => ended(joined),
        () = cancel.cancelled() => grace(shared, &mut handle).await,
        () = deadline => {
            timed_out = timeout;
            cancel.cancel();
            grace(shared, &mut handle).await
        }
    };
    shared.handlers.ended(id);
    // What a handler returns after its cancellation fired is discarded (a task cancelled
    // or lost), handed back (shutdown) or a timed-out attempt, unless it finished its work.
    let finished = matches!(ended, Ended::Returned(Ok(_)));
    let ended = if let Some(taken) = taken.ended() {
        taken
    } else if shared.abort.is_cancelled() && !finished {
        Ended::Aborted
    } else if let Some(timeout) = timed_out.filter(|_| !finished) {
        Ended::TimedOut(timeout)
    } else {
        ended
    };
    heartbeat.abort();
    if matches!(
        ended,
        Ended::Cancelled | Ended::Lost | Ended::Aborted | Ended::TimedOut(_)
    ) {
        handle.abort();
    }
    let claimed = record::Claimed {
        id,
        attempts,
        snoozes,
        started,
    };
    record::record(shared, claimed, &retry, ended).await;
}

/// Once the handler's cancellation fired: the time to stop on its own (and, on
/// shutdown, to finish) before it is dropped.
async fn grace(
    shared: &Shared,
    handle: &mut tokio::task::JoinHandle<Result<Option<serde_json::Value>, HandlerError>>,
) -> Ended {
    match tokio::time::timeout(shared.config.cancel_grace, handle).await {
        Ok(joined) => ended(joined),
        Err(_) => Ended::Aborted,
    }
}

/// How the handler's task ended, as far as it returned.
fn ended(
    joined: Result<Result<Option<serde_json::Value>, HandlerError>, tokio::task::JoinError>,
) -> Ended {
    match joined {
        Ok(returned) => Ended::Returned(returned),
        Err(err) if err.is_panic() => Ended::Panicked(panic_message(err)),
        Err(_) => Ended::Aborted,
    }
}

/// Renews the task's `lease` every heartbeat interval (at once first when the claim
/// took another lease than the task's type asks for) while its handler runs. When
/// the task is gone from under it (cancelled, finished, or reaped and claimed by another
/// worker), marks it taken away (cancelled, or lost) and fires the handler's
/// cancellation. Other errors (a lost
/// connection) are retried at the next beat: the lease outlasts a few of them.
async fn heartbeat(
    shared: Arc<Shared>,
    lease: Lease,
    cancel: CancellationToken,
    taken: Arc<TakenAway>,
) {
    let config = &shared.config;
    let id = lease.task_id();
    // A type whose lease differs from the worker's: the claim took the worker's.
    let mut wait = if lease.current() == config.lease {
        lease.heartbeat_every()
    } else {
        std::time::Duration::ZERO
    };
    loop {
        tokio::time::sleep(wait).await;
        wait = lease.heartbeat_every();
        match shared.db().heartbeat(id, &config.id, lease.current()).await {
            Ok(_) => {}
            Err(
                err @ (DedupError::InvalidTransition { .. }
                | DedupError::LeaseNotHeld { .. }
                | DedupError::NotFound { .. }),
            ) => {
                tracing::info!(task_id = %id, error = %err, "task taken away while it ran; cancelling its handler");
                let cancelled = matches!(
                    err,
                    DedupError::InvalidTransition {
                        status: TaskStatus::Cancelled,
                        ..
                    }
                );
                taken.set(cancelled);
                cancel.cancel();
                return;
            }
            Err(err) => {
                tracing::warn!(task_id = %id, error = %err, "heartbeat failed; trying at the next beat")
            }
        }
    }
}

/// A panic's message, as far as it has one.
fn panic_message(err: tokio::task::JoinError) -> String {
    match err.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned()),
        Err(_) => "cancelled".to_owned(),
    }
}
