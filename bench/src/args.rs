//! Command-line arguments.

use clap::{Parser, ValueEnum};

/// One benchmark run.
#[derive(Debug, Clone, Parser)]
#[command(
    version,
    about = "Benchmark find_or_enqueue against raw SQL and unsafe strategies"
)]
pub struct Args {
    /// Database URL (sqlite://file?mode=rwc, postgres://..., mysql://...). The bench drops
    /// and recreates task-dedup's tables there.
    #[arg(long, env = "DATABASE_URL")]
    pub url: String,
    /// What the callers do.
    #[arg(long, value_enum)]
    pub workload: Workload,
    /// How each call enqueues.
    #[arg(long, value_enum)]
    pub strategy: Strategy,
    /// Concurrent callers.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Connections in the pool, shared by every strategy.
    #[arg(long, default_value_t = 16)]
    pub pool: u32,
    /// Timed calls in all.
    #[arg(long, default_value_t = 10_000)]
    pub ops: usize,
    /// Distinct keys for `dup`, `churn`, `replace` and the held half of `bulk-mixed`.
    #[arg(long, default_value_t = 64)]
    pub keys: usize,
    /// Tasks per call of the bulk workloads (`--ops` counts tasks).
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Untimed calls before the run.
    #[arg(long, default_value_t = 1_000)]
    pub warmup: usize,
    /// The warm-up and the run each stop by themselves after this long, with the calls
    /// done so far.
    #[arg(long, default_value_t = 120)]
    pub deadline_secs: u64,
    /// Worker workloads: library workers (or hand-written loops, `raw-dedup`: workers x
    /// concurrency of them).
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Worker workloads: tasks each worker runs at a time.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Worker workloads: how the workers learn of new tasks.
    #[arg(long, value_enum, default_value_t = WakeupMode::Auto)]
    pub wakeups: WakeupMode,
    /// Worker workloads, PostgreSQL: the workers' wake-up listener connects here, on a
    /// connection of its own (`WorkerBuilder::listen_url`: a direct URL when `--url` goes
    /// through a transaction pooler), instead of taking one from the pool.
    #[arg(long)]
    pub listen_url: Option<String>,
    /// PostgreSQL: task-dedup's statements without named prepared statements
    /// (`PoolerMode::NoPreparedStatements`, for PgBouncer before 1.21 in transaction
    /// mode).
    #[arg(long)]
    pub no_prepared_statements: bool,
    /// Where the schema is prepared and the table checked (SeaORM statements, the
    /// migrations) when `--url` goes through a pooler that cannot run them: a direct URL
    /// of the same database. Default: `--url`.
    #[arg(long)]
    pub direct_url: Option<String>,
    /// `worker-latency`: tasks enqueued per second, over `--clients` callers.
    #[arg(long, default_value_t = 2.0)]
    pub rate: f64,
    /// `worker-latency`: each task enqueued in a transaction of the caller's, committed
    /// right after.
    #[arg(long)]
    pub in_transaction: bool,
    /// `worker-latency`: this many simulated requests keep a transaction of the
    /// application's pool open (`--hog-ms` each, one after the other), as a busy web
    /// service does. Tasks are enqueued through a pool of their own.
    #[arg(long, default_value_t = 0)]
    pub hog: usize,
    /// `worker-latency`: how long each simulated request holds its transaction.
    #[arg(long, default_value_t = 50)]
    pub hog_ms: u64,
    /// `worker-latency`: the workers get a pool of their own (of `--pool` connections)
    /// instead of sharing the application's.
    #[arg(long)]
    pub own_pool: bool,
    /// `worker`: count the statements sent (sqlx's statement log; costs a little).
    #[arg(long)]
    pub count_statements: bool,
    /// `worker`: the drained tasks opt out of one run per key (`NewTask::concurrent`), so
    /// claims neither probe for a running task of their key nor take its slot: the drain
    /// without the rule, in the same binary, to measure what the rule costs.
    #[arg(long)]
    pub concurrent: bool,
    /// `worker-blocked`: follow-ups waiting behind running tasks of their keys, ahead of
    /// the `--ops` free tasks in claim order.
    #[arg(long, default_value_t = 10_000)]
    pub blocked: usize,
    /// `worker-idle`: seconds counted.
    #[arg(long, default_value_t = 20)]
    pub idle_secs: u64,
    /// Finished tasks preloaded after the warm-up (finished within the last day, which the
    /// default retention keeps), with a pruner running beside the callers (its own pool,
    /// the default retention, every second). `prune`: expired rows for the pruner alone.
    #[arg(long, default_value_t = 0)]
    pub history: u64,
    /// Print one JSON object instead of the two text lines.
    #[arg(long)]
    pub json: bool,
}

/// What the callers do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Every call a new key: all creates.
    Unique,
    /// Keys drawn from `--keys` keys that never finish: almost all hits.
    Dup,
    /// Like `dup`, while a finisher keeps completing the active tasks of those keys.
    Churn,
    /// All callers behind a barrier on one key, round after round.
    Race,
    /// Like `dup`, with a new payload each call that replaces the queued task's
    /// (`OnConflict::ReplaceIfQueued`; raw-dedup: the hand-written upsert).
    Replace,
    /// Batches of `--batch` tasks, every one a new key (`find_or_enqueue_many`; raw-dedup:
    /// the hand-written bulk insert-or-nothing and lookup; raw-insert: COPY or a
    /// multi-row INSERT).
    Bulk,
    /// Batches of `--batch` tasks, half of them on `--keys` keys that stay queued.
    BulkMixed,
    /// `--ops` no-op tasks enqueued up front, then drained (library `Worker`s; raw-dedup:
    /// hand-written claim/complete loops).
    Worker,
    /// Enqueue-to-start latency of tasks enqueued at `--rate` while workers run.
    WorkerLatency,
    /// Statements per second of workers on an empty queue.
    WorkerIdle,
    /// Claim latency (`claim_many` of `--concurrency` tasks) of `--ops` free tasks queued
    /// behind `--blocked` follow-ups whose keys run: head-of-line blocking, against the
    /// same free tasks alone.
    WorkerBlocked,
    /// The pruner alone on `--history` expired finished tasks, in the default batches:
    /// its time per 10,000 rows.
    Prune,
    /// The physical work per task (WAL or redo bytes, index entries) of each phase of a
    /// task's life (`cost.rs`); PostgreSQL and MySQL/MariaDB.
    Cost,
}

/// How bench workers learn of new tasks (`task_dedup::Wakeups`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WakeupMode {
    /// LISTEN/NOTIFY on PostgreSQL, the doorbell and polling on SQLite, polling on MySQL.
    Auto,
    /// Polling only.
    Poll,
}

impl Workload {
    /// Whether a call enqueues a batch.
    pub fn is_bulk(self) -> bool {
        matches!(self, Workload::Bulk | Workload::BulkMixed)
    }

    /// Whether the workload runs workers (`worker.rs`).
    pub fn is_worker(self) -> bool {
        matches!(
            self,
            Workload::Worker
                | Workload::WorkerLatency
                | Workload::WorkerIdle
                | Workload::WorkerBlocked
        )
    }
}

/// How a call enqueues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// task-dedup's `find_or_enqueue`.
    FindOrEnqueue,
    /// `find_or_enqueue` with the payload a typed task carries, built as JSON by hand:
    /// the baseline of `typed`.
    FindOrEnqueuePayload,
    /// task-dedup's typed `enqueue` of a `Task` (key from its fields, payload
    /// serialized); in the worker workload, a Worker with a registered typed handler.
    Typed,
    /// A plain prepared INSERT through sqlx, no dedup at all: the write ceiling.
    RawInsert,
    /// The best hand-written SQL through sqlx: insert-or-nothing, then a SELECT on a miss.
    RawDedup,
    /// PostgreSQL only: the best hand-written SQL in one statement, `WITH ins AS (INSERT
    /// ... DO NOTHING RETURNING ...) SELECT ... FROM ins UNION ALL SELECT ... WHERE NOT
    /// EXISTS (SELECT 1 FROM ins)`, and the SELECT of `raw-dedup` when it returns nothing
    /// (the holder committed after the statement's snapshot).
    RawOneStatement,
    /// Read, then insert when nothing was found, without the unique index. Unsafe.
    Naive,
    /// Read-then-insert in a SERIALIZABLE transaction, retried on serialization failure.
    Serializable,
    /// PostgreSQL only: transaction-scoped advisory lock on the key's hash, read, insert.
    AdvisoryLock,
}

impl Strategy {
    /// Whether the strategy relies on `task_active_resource_uidx`. The others run on a
    /// table without it, so that their own correctness is what gets measured.
    pub fn uses_unique_index(self) -> bool {
        matches!(
            self,
            Strategy::FindOrEnqueue
                | Strategy::FindOrEnqueuePayload
                | Strategy::Typed
                | Strategy::RawDedup
                | Strategy::RawOneStatement
        )
    }
}

/// The name as given on the command line.
pub fn name(value: &impl ValueEnum) -> String {
    value
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

/// The pooler mode `--no-prepared-statements` asks for.
pub fn pooler_mode(args: &Args) -> task_dedup::PoolerMode {
    if args.no_prepared_statements {
        task_dedup::PoolerMode::NoPreparedStatements
    } else {
        task_dedup::PoolerMode::PreparedStatements
    }
}
