//! [`claim_many`](super::TaskLifecycle::claim_many): take due tasks under a lease, run again
//! when it lost a key's one run to another claim; which of the dialect's two claims runs
//! is [`claim_mode`]'s choice. Limited types are claimed apart, each under its limits
//! ([`limited`]).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{MAX_CLAIM_RACES, claim_mode, limited};
use crate::connect::retry::Retrying;
use crate::dialect::Claim;
use crate::dialect::limits::ALL_TYPES;
use crate::executor::Executor;
use crate::values::connection::DedupConnection;
use crate::values::error::DedupError;
use crate::values::validate;
use task_dedup_entity::task_run;

/// Which limited type's claim goes first, and whether the claim of the types without
/// limits does: taken in turn, so that none of them always fills the batch first.
static TURN: AtomicUsize = AtomicUsize::new(0);

/// One claim in this many takes the types without limits before the limited ones,
/// while that claim finds tasks.
const MAIN_FIRST_EVERY: usize = 32;

/// How many claims of the types without limits in a row found none: each doubles the
/// turns between two that go first, up to [`MAX_MAIN_BACKOFF`] times (one claim in 512).
/// Behind a limited type's backlog such a claim reads past every queued task of it (the
/// claim index is not by type: 7 ms behind 10,000 on PostgreSQL, some 15 claims) to
/// find nothing; a drain of the limited type paid that one claim in 32.
static MAIN_IDLE: AtomicU32 = AtomicU32::new(0);

/// The most doublings of [`MAIN_FIRST_EVERY`] while the types without limits have none
/// due.
const MAX_MAIN_BACKOFF: u32 = 4;

/// What a claim took, and when a rate-limited type it claimed lets a claim start tasks
/// again.
pub(crate) struct Claimed {
    /// The tasks, in claim order.
    pub tasks: Vec<task_run::Model>,
    /// For a rate-limited type whose tasks are due: when its window opens (the next
    /// window when this one is full, by the database's clock; now when this claim's
    /// tasks went to a window with room left). The earliest of the types claimed;
    /// `None` when no rate decided what this claim took. Read by the Worker.
    #[cfg_attr(not(feature = "worker"), allow(dead_code))]
    pub window_opens: Option<Instant>,
}

/// Claims up to `max` due tasks of `task_types` for `worker_id` (the trait method, and
/// the Worker's claim, which also reads [`Claimed::window_opens`]).
pub(crate) async fn claim_many<C: DedupConnection>(
    db: &C,
    worker_id: &str,
    task_types: &[&str],
    lease: Duration,
    max: usize,
) -> Result<Claimed, DedupError> {
    validate::worker_id(worker_id)?;
    validate::task_types(task_types)?;
    let lease_micros = validate::lease_micros(lease)?;
    let max = validate::claim_max(max)?;
    let mut exec = Executor::on(db)?;
    let limited = crate::maintenance::limits::limited_types(&mut exec).await?;
    // A limit across all types: every claim counts each user's running tasks under its
    // row's lock, the types without limits of their own included (`claim_rest`).
    let across = limited.iter().any(|t| t == ALL_TYPES);
    let wanted: Vec<&str> = limited
        .iter()
        .map(String::as_str)
        .filter(|t| *t != ALL_TYPES && (task_types.is_empty() || task_types.contains(t)))
        .collect();
    let mut window_opens: Option<Instant> = None;
    let claimed = if wanted.is_empty() && !across {
        unlimited(db, &mut exec, worker_id, task_types, lease_micros, max).await?
    } else {
        // The limited types first, each first in turn, then the others (`None`: the main
        // claim, which passes over limited types) with the room left; one claim in
        // `MAIN_FIRST_EVERY` takes the others first, so that a limited type with a long
        // backlog under a limit it does not reach cannot keep them waiting (less often
        // while they have none due: `MAIN_IDLE`). Not the main claim at every turn:
        // behind such a backlog it reads every queued task of the limited type to pass
        // over them.
        let turn = TURN.fetch_add(1, Ordering::Relaxed);
        let mut parts: Vec<Option<&str>> = Vec::with_capacity(wanted.len() + 1);
        let first = turn % wanted.len().max(1);
        parts.extend(
            wanted
                .iter()
                .cycle()
                .skip(first)
                .take(wanted.len())
                .copied()
                .map(Some),
        );
        if task_types.is_empty() || task_types.len() != wanted.len() {
            let backoff = MAIN_IDLE.load(Ordering::Relaxed).min(MAX_MAIN_BACKOFF);
            if turn.is_multiple_of(MAIN_FIRST_EVERY << backoff) {
                parts.insert(0, None);
            } else {
                parts.push(None);
            }
        }
        let mut claimed = Vec::new();
        for part in &parts {
            let room = max - claimed.len() as i64;
            if room <= 0 {
                break;
            }
            claimed.extend(match part {
                None => {
                    let rest = if across {
                        limited::claim_rest(
                            db,
                            &mut exec,
                            worker_id,
                            task_types,
                            lease_micros,
                            room,
                        )
                        .await?
                    } else {
                        None
                    };
                    let tasks = match rest {
                        Some(tasks) => tasks,
                        None => {
                            unlimited(db, &mut exec, worker_id, task_types, lease_micros, room)
                                .await?
                        }
                    };
                    if tasks.is_empty() {
                        let _ = MAIN_IDLE.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                            (n < MAX_MAIN_BACKOFF).then_some(n + 1)
                        });
                    } else {
                        MAIN_IDLE.store(0, Ordering::Relaxed);
                    }
                    tasks
                }
                Some(task_type) => {
                    let (tasks, opens) = limited::claim(
                        db,
                        &mut exec,
                        worker_id,
                        task_type,
                        lease_micros,
                        room,
                        across,
                    )
                    .await?;
                    window_opens = match (window_opens, opens) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    tasks
                }
            });
        }
        claimed.sort_by_key(|t| (std::cmp::Reverse(t.priority), t.run_at, t.created_at, t.id));
        claimed
    };
    for task in &claimed {
        tracing::debug!(task_id = %task.id, worker_id, attempts = task.attempts, "task claimed");
        let waited = task
            .started_at
            .and_then(|started| (started - task.run_at).to_std().ok());
        crate::metrics::claimed(waited.unwrap_or_default());
    }
    Ok(Claimed {
        tasks: claimed,
        window_opens,
    })
}

/// The claim of the types without limits: up to `max` due tasks of `task_types` (any
/// when empty) that no limit covers.
async fn unlimited<C: DedupConnection>(
    db: &C,
    exec: &mut Executor<'_>,
    worker_id: &str,
    task_types: &[&str],
    lease_micros: i64,
    max: i64,
) -> Result<Vec<task_run::Model>, DedupError> {
    // A claim lost with its connection is not run again (it may have taken effect:
    // its tasks come back through the reaper); an aborted one took nothing.
    let mut retrying = Retrying::new(db, Some(Duration::ZERO), "claim");
    let mut races = 0;
    let mut how = claim_mode::choose(exec).await;
    let claimed = loop {
        // `None`: the claim lost the race for a key's one run to another claim
        // (`task_running_resource_uidx`), or an optimistic one picked a task whose
        // key runs, and took nothing.
        let attempt = async {
            // A rerun after a lost race on another connection could pass over the
            // tasks the failed claim picked: see `Executor::hold`.
            exec.hold().await?;
            match exec
                .claim(how, worker_id, task_types, lease_micros, max)
                .await
            {
                Err(failure) if failure.is_running_key() => Ok(None),
                outcome => Ok(Some(outcome?)),
            }
        };
        // Boxed, as in `retried`.
        match retrying.run(Box::pin(attempt)).await {
            Some(Ok(Some(claimed))) => break claimed,
            // Follow-ups wait behind running keys: probe, now and for a while.
            Some(Ok(None)) if how == Claim::Optimistic => {
                claim_mode::met_running_key(exec);
                how = Claim::Probing;
            }
            // Run again: it now sees the winner's task running and passes over its
            // key, filling the batch from other keys.
            Some(Ok(None)) if races < MAX_CLAIM_RACES => {
                races += 1;
                tracing::debug!(
                    worker_id,
                    races,
                    "claim lost a key's run to another claim; claiming again"
                );
            }
            // Others keep winning: nothing for now, which a worker treats as an empty
            // queue until its next wake-up or poll.
            Some(Ok(None)) => break Vec::new(),
            Some(Err(err)) => return Err(err),
            None => {}
        }
    };
    Ok(claimed)
}
