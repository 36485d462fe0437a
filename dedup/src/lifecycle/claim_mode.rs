//! Which claim statement a claim runs ([`Claim`]): the optimistic one (no probe for
//! running tasks of the keys; `task_running_resource_uidx` refuses a second run) where
//! that index exists and no claim on the database met a running key lately; the probing
//! one otherwise.
//!
//! On a queue of distinct keys the optimistic claim never fails, and the rule of one run
//! per key then costs the drain about the index's upkeep alone (BENCHMARKS.md). Where
//! follow-ups wait behind running tasks the optimistic claim would fail at every turn;
//! after one failure this process's claims on that database probe for
//! [`PROBE_AFTER_CONFLICT`], so a busy queue of follow-ups costs one failed statement per
//! second, and the batch still fills from the free keys.
//!
//! One catalog read per database and process says whether the index exists (a table
//! made from the entity, or whose migration 5 was rolled back, has none: its claims
//! probe, and a warning says that the rule is not guaranteed there). Claims in a caller's
//! transaction always probe: the transaction does not say which database it is on.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::dialect::{Claim, Dialect};
use crate::executor::Executor;

/// How long claims probe after an optimistic claim met a running key.
pub(crate) const PROBE_AFTER_CONFLICT: Duration = Duration::from_secs(1);

/// What this process knows of a database's claims.
struct Known {
    /// Whether `task_run` has `task_running_resource_uidx`.
    indexed: bool,
    /// Until when claims probe, after an optimistic one met a running key.
    probe_until: Option<Instant>,
}

/// A pool's database: its dialect and identity.
type Database = (Dialect, u64);

static KNOWN: LazyLock<Mutex<HashMap<Database, Known>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The claim to run next through `exec`.
pub(crate) async fn choose(exec: &mut Executor<'_>) -> Claim {
    let Some(identity) = exec.database_identity() else {
        return Claim::Probing;
    };
    let database = (exec.dialect(), identity);
    if let Some(known) = lock().get(&database) {
        return pick(known, Instant::now());
    }
    // Boxed: once per database, and its statement's state would otherwise sit in every
    // claim's future.
    match Box::pin(exec.has_running_index()).await {
        Ok(indexed) => {
            if !indexed {
                tracing::warn!(
                    "task_run has no task_running_resource_uidx (run the migrations): one run \
                     per key is not guaranteed; claims look for running tasks of their keys"
                );
            }
            let mut known = lock();
            let known = known.entry(database).or_insert(Known {
                indexed,
                probe_until: None,
            });
            pick(known, Instant::now())
        }
        Err(failure) => {
            // The claim itself will meet the same trouble, or not; read again next time.
            tracing::debug!(error = %failure.err, "could not read task_run's indexes; claim probes");
            Claim::Probing
        }
    }
}

/// An optimistic claim through `exec` met a running key: probe for a while.
pub(crate) fn met_running_key(exec: &Executor<'_>) {
    let Some(identity) = exec.database_identity() else {
        return;
    };
    if let Some(known) = lock().get_mut(&(exec.dialect(), identity)) {
        known.probe_until = Some(Instant::now() + PROBE_AFTER_CONFLICT);
    }
}

fn pick(known: &Known, now: Instant) -> Claim {
    let probing = !known.indexed || known.probe_until.is_some_and(|until| now < until);
    if probing {
        Claim::Probing
    } else {
        Claim::Optimistic
    }
}

fn lock() -> MutexGuard<'static, HashMap<Database, Known>> {
    KNOWN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_without_the_index_and_for_a_while_after_a_conflict() {
        let now = Instant::now();
        let fresh = Known {
            indexed: true,
            probe_until: None,
        };
        assert_eq!(pick(&fresh, now), Claim::Optimistic);
        let unindexed = Known {
            indexed: false,
            probe_until: None,
        };
        assert_eq!(pick(&unindexed, now), Claim::Probing);
        let conflicted = Known {
            indexed: true,
            probe_until: Some(now + PROBE_AFTER_CONFLICT),
        };
        assert_eq!(pick(&conflicted, now), Claim::Probing);
        assert_eq!(
            pick(&conflicted, now + PROBE_AFTER_CONFLICT),
            Claim::Optimistic
        );
    }
}
