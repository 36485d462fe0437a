//! The callers of the fault tests: each creates tasks of fresh keys in a loop until
//! stopped, and counts what it was told.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sea_orm::DatabaseConnection;
use task_dedup::{NewTask, TaskDedup, TaskKey};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Callers running.
pub struct Load {
    stop: CancellationToken,
    calls: Arc<AtomicU64>,
    callers: Vec<JoinHandle<(Vec<Uuid>, Vec<String>)>>,
}

/// What the callers were told.
pub struct Tally {
    pub calls: u64,
    /// The tasks callers were told are stored.
    pub acknowledged: HashSet<Uuid>,
    /// Each failed call's error.
    pub errors: Vec<String>,
}

impl Load {
    /// `callers` callers, caller `i` on `pools[i % pools.len()]`, each call with a retry
    /// budget of 30 s, `pause` between a caller's calls.
    pub fn start(pools: &[DatabaseConnection], callers: usize, pause: Duration) -> Load {
        let stop = CancellationToken::new();
        let calls = Arc::new(AtomicU64::new(0));
        let callers = (0..callers)
            .map(|i| {
                let pool = pools[i % pools.len()].clone();
                let (stop, calls) = (stop.clone(), calls.clone());
                tokio::spawn(async move {
                    let (mut acknowledged, mut errors) = (Vec::new(), Vec::new());
                    let mut seq = 0;
                    while !stop.is_cancelled() {
                        seq += 1;
                        let key = TaskKey::new("user-1", "render", format!("caller-{i}-{seq}"))
                            .expect("valid key");
                        calls.fetch_add(1, Ordering::Relaxed);
                        let task = NewTask::new(key).retry_budget(Duration::from_secs(30));
                        match pool.find_or_enqueue(task).await {
                            // A fresh key: created, or `Existing` when an attempt lost
                            // with its connection had created it (the retry finds it
                            // by id).
                            Ok(outcome) => acknowledged.push(outcome.task().id),
                            Err(e) => errors.push(format!("{e:?}")),
                        }
                        tokio::time::sleep(pause).await;
                    }
                    (acknowledged, errors)
                })
            })
            .collect();
        Load {
            stop,
            calls,
            callers,
        }
    }

    /// Stops the callers; what they were told.
    pub async fn finish(self) -> Tally {
        self.stop.cancel();
        let (mut acknowledged, mut errors) = (HashSet::new(), Vec::new());
        for caller in self.callers {
            let (ids, errs) = caller.await.expect("caller");
            acknowledged.extend(ids);
            errors.extend(errs);
        }
        Tally {
            calls: self.calls.load(Ordering::Relaxed),
            acknowledged,
            errors,
        }
    }
}

impl Tally {
    /// The failed calls by the error's variant, for the test's line.
    pub fn failures(&self) -> HashMap<&str, usize> {
        let mut kinds = HashMap::new();
        for error in &self.errors {
            *kinds
                .entry(error.split(['(', ' ']).next().unwrap_or(error))
                .or_default() += 1;
        }
        kinds
    }

    /// At most 0.5 % of the calls failed.
    pub fn assert_few_failed(&self) {
        let failed = self.errors.len() as u64;
        assert!(
            failed * 200 <= self.calls,
            "{failed} of {} calls failed: {:?}",
            self.calls,
            self.errors
        );
    }

    /// Every acknowledged create is among `stored` (one node's rows).
    pub fn assert_all_stored(&self, stored: &HashSet<Uuid>, on: &str) {
        let missing: Vec<_> = self.acknowledged.difference(stored).collect();
        assert!(
            missing.is_empty(),
            "{on}: {} acknowledged creates missing: {missing:?}",
            missing.len()
        );
    }
}
