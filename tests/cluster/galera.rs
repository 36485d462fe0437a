//! MariaDB Galera, three nodes taking writes at once: the dedup race across nodes, a
//! drain by one Worker per node, a follow-up enqueued on one node right after another
//! node's worker started the task before it, and a node killed under load.
//!
//! What Galera changes: a node applies the others' commits a little after they return,
//! row locks (`FOR UPDATE SKIP LOCKED`) are seen by their own node only, and two nodes'
//! conflicting writes are settled at commit (certification: the later one fails with
//! 1213, as a deadlock).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::cluster::{Galera, control, required};

use crate::load::Load;
use sea_orm::{ConnectionTrait, DatabaseConnection};
use task_dedup::{
    Enqueued, NewTask, Scope, TaskDedup, TaskKey, TaskLifecycle, Worker, WorkerReport, task_run,
};
use tokio::sync::Barrier;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

fn key(resource: &str) -> TaskKey {
    TaskKey::new("user-1", "render", resource).expect("valid key")
}

/// A connection to a node whose reads see every commit of the cluster made before
/// them (a pool of one, so that the session setting holds for every read).
async fn causal(url: &str) -> DatabaseConnection {
    let node = harness::cluster::node_pool(url, 1).await;
    node.execute_unprepared("SET SESSION wsrep_sync_wait = 1")
        .await
        .expect("causal reads");
    node
}

/// Keys with more than one active task, on each node.
async fn assert_no_key_twice_active(cluster: &Galera) {
    for (n, url) in cluster.urls.iter().enumerate() {
        let node = causal(url).await;
        assert_eq!(
            harness::keys_with_two_active(&node).await,
            0,
            "node {}",
            n + 1
        );
        node.close().await.expect("close");
    }
}

/// 64 callers spread over the three nodes ask for one key at once, ten times: each
/// round exactly one task is created and every caller gets its id. The nodes' inserts
/// of the same key conflict at certification (1213, retried as a deadlock) or on the
/// unique index once a node has applied the winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_across_nodes_creates_one_task_per_key() {
    let _serial = crate::serial().await;
    let Some(cluster) = Galera::create("storm").await else {
        return;
    };
    const CALLERS: usize = 64;
    for round in 0..10 {
        let resource = format!("doc-{round}");
        let barrier = Arc::new(Barrier::new(CALLERS));
        let mut callers = Vec::new();
        for i in 0..CALLERS {
            let (node, barrier) = (cluster.nodes[i % 3].clone(), barrier.clone());
            let key = key(&resource);
            callers.push(tokio::spawn(async move {
                barrier.wait().await;
                node.find_or_enqueue(NewTask::new(key)).await
            }));
        }
        let mut created = 0;
        let mut ids = HashSet::new();
        for caller in callers {
            let outcome = caller
                .await
                .expect("caller")
                .unwrap_or_else(|e| panic!("round {round}: a caller got an error: {e:?}"));
            created += usize::from(outcome.is_created());
            ids.insert(outcome.task().id);
        }
        assert_eq!(created, 1, "round {round}: tasks created");
        assert_eq!(ids.len(), 1, "round {round}: callers saw {ids:?}");
    }
    assert_no_key_twice_active(&cluster).await;
    cluster.remove().await;
}

/// One run of a task, as its handler saw it.
struct Run {
    task: Uuid,
    key: String,
    started: Instant,
    ended: Instant,
}

/// A Worker on `node` whose handler records each run in `runs` and takes 5 ms.
fn recording_worker(node: &DatabaseConnection, id: &str, runs: Arc<Mutex<Vec<Run>>>) -> Worker {
    Worker::builder(node.clone())
        .id(id)
        .concurrency(8)
        .lease(Duration::from_secs(60))
        .poll_interval(Duration::from_millis(10), Duration::from_millis(100))
        .handler(move |task: task_run::Model, _cancel: CancellationToken| {
            let runs = runs.clone();
            async move {
                let started = Instant::now();
                tokio::time::sleep(Duration::from_millis(5)).await;
                runs.lock().expect("runs").push(Run {
                    task: task.id,
                    key: task.resource_key.clone(),
                    started,
                    ended: Instant::now(),
                });
                Ok(None)
            }
        })
        .build()
        .expect("worker")
}

/// A Worker on each node drains 600 tasks of distinct keys while callers on every node
/// queue follow-ups of 12 hot keys (`Scope::Queued`): each task runs exactly once, no
/// key runs twice at once, and the Workers claimed exactly as many tasks as there were.
///
/// The bug it guards: a claim that updated the rows it had selected without checking
/// they were still queued took, on one node, a task another node's worker had claimed
/// meanwhile (its `SKIP LOCKED` does not see the other node's locks, and the other
/// claim's write applied before this one's UPDATE read the row): 8 of 600 tasks ran
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 6)]
async fn a_drain_across_nodes_runs_each_task_once() {
    let _serial = crate::serial().await;
    let Some(cluster) = Galera::create("drain").await else {
        return;
    };
    let mut created: HashSet<Uuid> = HashSet::new();
    let tasks: Vec<NewTask> = (0..600)
        .map(|i| NewTask::new(key(&format!("doc-{i}"))))
        .collect();
    for (n, chunk) in tasks.chunks(200).enumerate() {
        for outcome in cluster.nodes[n]
            .find_or_enqueue_many(chunk.to_vec())
            .await
            .expect("enqueue")
        {
            assert!(outcome.is_created());
            created.insert(outcome.task().id);
        }
    }

    let runs = Arc::new(Mutex::new(Vec::new()));
    let shutdown = CancellationToken::new();
    let workers: Vec<_> = cluster
        .nodes
        .iter()
        .enumerate()
        .map(|(n, node)| {
            let worker = recording_worker(node, &format!("node-{}", n + 1), runs.clone());
            tokio::spawn(worker.run(shutdown.clone()))
        })
        .collect();

    // Follow-ups of the hot keys from every node while the drain runs.
    let followers: Vec<_> = cluster
        .nodes
        .iter()
        .cloned()
        .enumerate()
        .map(|(n, node)| {
            tokio::spawn(async move {
                let mut created = HashSet::new();
                for round in 0..40 {
                    let hot = key(&format!("hot-{}", (round + n) % 12));
                    let outcome = node
                        .find_or_enqueue(NewTask::new(hot).scope(Scope::Queued))
                        .await
                        .expect("follow-up");
                    if outcome.is_created() {
                        created.insert(outcome.task().id);
                    }
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
                created
            })
        })
        .collect();
    for follower in followers {
        created.extend(follower.await.expect("follower"));
    }

    let started = Instant::now();
    loop {
        let done = runs.lock().expect("runs").len();
        if done >= created.len() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{done} of {} ran",
            created.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Time for a second run of any task to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    shutdown.cancel();
    let mut reports: Vec<WorkerReport> = Vec::new();
    for worker in workers {
        reports.push(worker.await.expect("worker task").expect("worker"));
    }

    let runs = std::mem::take(&mut *runs.lock().expect("runs"));
    let mut per_task: HashMap<Uuid, usize> = HashMap::new();
    for run in runs.iter() {
        *per_task.entry(run.task).or_default() += 1;
    }
    let twice: Vec<_> = per_task.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "tasks run more than once: {twice:?}");
    assert_eq!(
        per_task.keys().copied().collect::<HashSet<_>>(),
        created,
        "every created task ran"
    );
    let mut by_key: HashMap<&str, Vec<&Run>> = HashMap::new();
    for run in runs.iter() {
        by_key.entry(&run.key).or_default().push(run);
    }
    for (key, mut runs) in by_key {
        runs.sort_by_key(|run| run.started);
        for pair in runs.windows(2) {
            assert!(
                pair[1].started >= pair[0].ended,
                "key {key} ran twice at once: {} and {}",
                pair[0].task,
                pair[1].task
            );
        }
    }
    let claimed: u64 = reports.iter().map(|r| r.claimed).sum();
    let completed: u64 = reports.iter().map(|r| r.completed).sum();
    let lost: u64 = reports.iter().map(|r| r.lost).sum();
    assert_eq!(
        (claimed, completed, lost),
        (created.len() as u64, created.len() as u64, 0),
        "claims, completions, lost runs: {reports:?}"
    );
    assert_no_key_twice_active(&cluster).await;
    cluster.remove().await;
}

/// A task is queued on node 1 and started by a worker on node 2; right after, node 3
/// is asked for a follow-up of its key (`Scope::Queued`): it must be queued, a new task,
/// 200 times out of 200. Node 3 may not have applied the start yet when asked: its
/// insert runs into the task, still `queued` there, and without a causal read the
/// caller would be told `Existing` with a task that is already running, and its
/// follow-up silently dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follow_up_on_another_node_sees_the_start() {
    let _serial = crate::serial().await;
    let Some(cluster) = Galera::create("follow_up").await else {
        return;
    };
    let (first, second, third) = (&cluster.nodes[0], &cluster.nodes[1], &cluster.nodes[2]);
    let mut stale = Vec::new();
    for round in 0..200 {
        let key = key(&format!("doc-{round}"));
        let queued = first
            .find_or_enqueue(NewTask::new(key.clone()).scope(Scope::Queued))
            .await
            .expect("enqueue");
        assert!(queued.is_created());
        // Node 2 may not have applied the insert yet: its worker polls.
        let polled = Instant::now();
        let started = loop {
            if let Some(task) = second
                .claim("node-2", &["render"], Duration::from_secs(60))
                .await
                .expect("claim")
            {
                break task;
            }
            assert!(polled.elapsed() < Duration::from_secs(5), "never due");
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        assert_eq!(started.id, queued.task().id);
        match third
            .find_or_enqueue(NewTask::new(key).scope(Scope::Queued))
            .await
            .expect("follow-up")
        {
            Enqueued::Created(_) => {}
            other => stale.push((round, other.task().status)),
        }
    }
    assert!(stale.is_empty(), "follow-ups answered Existing: {stale:?}");
    cluster.remove().await;
}

/// Sixteen callers, spread over the three nodes, create tasks while node 3 is killed
/// with `kill -9` and restarted: every create a caller was told of is in the cluster
/// afterwards, on every node; no key has two active tasks; at most 0.5 % of the calls
/// failed; node 3 rejoined.
///
/// The callers' retry budget (30 s) covers the node's absence: callers bound to node 3
/// wait for it (its connections are refused until it is back, and its pool times out:
/// both a lost connection), callers on nodes 1 and 2 wait while the cluster decides
/// the node is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 6)]
async fn a_node_killed_under_load_loses_no_acknowledged_create() {
    let _serial = crate::serial().await;
    let (Some(kill), Some(restart)) = (
        required("TASK_DEDUP_GALERA_KILL", "killing a Galera node"),
        required("TASK_DEDUP_GALERA_RESTART", "restarting a Galera node"),
    ) else {
        return;
    };
    let Some(cluster) = Galera::create("node_killed").await else {
        return;
    };
    let load = Load::start(&cluster.nodes, 16, Duration::ZERO);
    tokio::time::sleep(Duration::from_secs(3)).await;
    control(&kill, &["3"]).await;
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    control(&restart, &["3"]).await;
    let rejoined = killed.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tally = load.finish().await;

    eprintln!(
        "[galera] {} calls, {} failed ({:?}), {} acknowledged creates; node 3 back after \
         {rejoined:?}",
        tally.calls,
        tally.errors.len(),
        tally.failures(),
        tally.acknowledged.len()
    );
    tally.assert_few_failed();
    assert_no_key_twice_active(&cluster).await;
    for (n, url) in cluster.urls.iter().enumerate() {
        let node = causal(url).await;
        let stored: HashSet<Uuid> = harness::rows::all(&node)
            .await
            .into_iter()
            .map(|t| t.id)
            .collect();
        tally.assert_all_stored(&stored, &format!("node {}", n + 1));
    }
    cluster.remove().await;
}
