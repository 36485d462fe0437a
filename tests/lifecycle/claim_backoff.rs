//! The main claim's backoff behind a limited type's backlog
//! (`dedup/src/lifecycle/claim.rs`): while a limited type fills every claim and the types
//! without limits have nothing due, their claim goes first less and less often, down to
//! one claim in 512; a task of theirs that arrives then waits at most that many claims.
//!
//! A test binary of its own (`[[test]] claim_backoff` in Cargo.toml, not a module of
//! `lifecycle/main.rs`) with one test that takes the three dialects in turn: the
//! claims' turn counter and the backoff are process-wide, and the claims of tests
//! running beside it would move them. Here they are this test's claims alone, so the
//! test knows the turn of each (counted from 0, one a claim) and makes the task arrive
//! at the worst turn for a longer backoff: just after one claim in 1,024, where the
//! next claim that goes first for the types without limits is 506 claims away at one in
//! 512, and 1,018 or more at one in 1,024 or less often.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use harness::{Dialect, TestDb, run};
use task_dedup::{NewTask, TaskAdmin, TaskDedup, TaskKey, TaskLifecycle, TypeLimits};

/// The most claims a task without limits waits behind a limited backlog: one claim in
/// 32 goes to the types without limits first, one in 512 once they kept finding none.
const BOUND: usize = 512;

const TYPES: [&str; 2] = ["limited", "free"];

/// The claims made so far in this process: the claims' turn counter.
static TURN: AtomicUsize = AtomicUsize::new(0);

/// Claims before the arrival, at least: enough for the backoff to reach one claim in
/// 1,024 from any turn (32 + 64 + 128 + 256 + 512), were it allowed to.
const QUIET: usize = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_without_limits_waits_at_most_512_claims_behind_a_limited_backlog() {
    for dialect in [Dialect::Sqlite, Dialect::Postgres, Dialect::MySql] {
        run(dialect, "claim_backoff", waits_at_most_the_bound).await;
    }
}

async fn waits_at_most_the_bound(db: &TestDb) {
    db.migrate().await;
    // A limit that never binds: every claim of the type is a limited one.
    db.db
        .set_limits("limited", &TypeLimits::new().max_running(100_000))
        .await
        .expect("limit");
    // The arrival's turn: 6 past a multiple of 1,024, after the quiet spell.
    let start = TURN.load(Ordering::Relaxed);
    let arrival = (start + QUIET).next_multiple_of(1_024) + 6;
    let backlog: Vec<NewTask> = (0..arrival - start + BOUND + 10)
        .map(|i| NewTask::new(TaskKey::new("u", "limited", format!("r{i}")).expect("key")))
        .collect();
    db.db.find_or_enqueue_many(backlog).await.expect("backlog");

    // A quiet spell for the types without limits: every claim takes a limited task.
    while TURN.load(Ordering::Relaxed) < arrival {
        let claimed = claim_one(db).await;
        assert_eq!(
            claimed
                .iter()
                .map(|t| t.task_type.as_str())
                .collect::<Vec<_>>(),
            ["limited"],
            "turn {} of the quiet spell",
            TURN.load(Ordering::Relaxed) - 1
        );
    }

    db.db
        .find_or_enqueue(NewTask::new(
            TaskKey::new("u", "free", "arrives").expect("key"),
        ))
        .await
        .expect("a task without limits");
    for waited in 1..=BOUND {
        let claimed = claim_one(db).await;
        assert_eq!(claimed.len(), 1, "claim {waited} after the arrival");
        if claimed[0].task_type == "free" {
            return;
        }
    }
    panic!("the task without limits waited more than {BOUND} claims");
}

/// One claim of one task of either type.
async fn claim_one(db: &TestDb) -> Vec<task_dedup::task_run::Model> {
    TURN.fetch_add(1, Ordering::Relaxed);
    db.db
        .claim_many("worker-1", &TYPES, Duration::from_secs(300), 1)
        .await
        .expect("claim")
}
