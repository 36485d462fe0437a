//! The queue as a whole: `tasks stats`, `pause`, `resume`, `paused`, `prune`.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;
use sea_orm::DatabaseConnection;
use serde::Serialize;
use task_dedup::{MAX_PRUNE_BATCH, PausedType, Retention, TaskAdmin, TaskLifecycle, TaskStatus};

use crate::failure::Failure;
use crate::output::{Human, age, emit, seconds, table, time};

/// `tasks stats`.
pub(crate) async fn stats(db: &DatabaseConnection, json: bool) -> Result<(), Failure> {
    let counts = db
        .counts()
        .await?
        .into_iter()
        .map(|count| Count {
            task_type: count.task_type,
            status: count.status,
            count: count.count,
        })
        .collect();
    let throughput = db.throughput().await?;
    let last_hour = LastHour {
        since: throughput.minutes.first().map(|minute| minute.minute),
        created: throughput.minutes.iter().map(|m| m.created).sum(),
        succeeded: throughput.minutes.iter().map(|m| m.succeeded).sum(),
        failed: throughput.minutes.iter().map(|m| m.failed).sum(),
    };
    let oldest_queued = db
        .oldest_queued()
        .await?
        .into_iter()
        .map(|oldest| Oldest {
            task_type: oldest.task_type,
            created_at: oldest.created_at,
            age: oldest.age,
        })
        .collect();
    let paused = db.paused().await?.into_iter().map(Paused::from).collect();
    let stats = Stats {
        counts,
        last_hour,
        oldest_queued,
        paused,
    };
    emit(&stats, json)
}

/// `tasks stats`: `{"counts": [{"task_type", "status", "count"}], "last_hour": {"since",
/// "created", "succeeded", "failed"}, "oldest_queued": [{"task_type", "created_at",
/// "age_seconds"}], "paused": [{"task_type", "paused_at"}]}`.
#[derive(Serialize)]
struct Stats {
    counts: Vec<Count>,
    last_hour: LastHour,
    oldest_queued: Vec<Oldest>,
    paused: Vec<Paused>,
}

#[derive(Serialize)]
struct Count {
    task_type: String,
    status: TaskStatus,
    count: u64,
}

/// The sums of the last 60 minutes of `TaskAdmin::throughput`.
#[derive(Serialize)]
struct LastHour {
    since: Option<DateTime<Utc>>,
    created: u64,
    succeeded: u64,
    failed: u64,
}

#[derive(Serialize)]
struct Oldest {
    task_type: String,
    created_at: DateTime<Utc>,
    #[serde(rename = "age_seconds", serialize_with = "seconds")]
    age: Duration,
}

#[derive(Serialize)]
struct Paused {
    task_type: String,
    paused_at: DateTime<Utc>,
}

impl From<PausedType> for Paused {
    fn from(paused: PausedType) -> Paused {
        Paused {
            task_type: paused.task_type,
            paused_at: paused.paused_at,
        }
    }
}

/// The statuses in lifecycle order, the columns of the counts table.
const STATUSES: [TaskStatus; 5] = [
    TaskStatus::Queued,
    TaskStatus::Running,
    TaskStatus::Succeeded,
    TaskStatus::Failed,
    TaskStatus::Cancelled,
];

impl Human for Stats {
    fn human(&self) -> String {
        let mut by_type: BTreeMap<&str, [u64; 5]> = BTreeMap::new();
        for count in &self.counts {
            let row = by_type.entry(&count.task_type).or_default();
            if let Some(column) = STATUSES.iter().position(|s| *s == count.status) {
                row[column] += count.count;
            }
        }
        let mut text = table(
            [
                "TYPE",
                "QUEUED",
                "RUNNING",
                "SUCCEEDED",
                "FAILED",
                "CANCELLED",
            ],
            by_type.iter().map(|(task_type, counts)| {
                let [a, b, c, d, e] = counts.map(|n| n.to_string());
                [(*task_type).to_owned(), a, b, c, d, e]
            }),
        );
        text.push_str(&format!(
            "\nlast hour: {} created, {} succeeded, {} failed\n",
            self.last_hour.created, self.last_hour.succeeded, self.last_hour.failed
        ));
        if self.oldest_queued.is_empty() {
            text.push_str("\nno task is queued\n");
        } else {
            text.push('\n');
            text.push_str(&table(
                ["TYPE", "OLDEST QUEUED", "AGE"],
                self.oldest_queued
                    .iter()
                    .map(|o| [o.task_type.clone(), time(o.created_at), age(o.age)]),
            ));
        }
        if !self.paused.is_empty() {
            let names: Vec<&str> = self.paused.iter().map(|p| p.task_type.as_str()).collect();
            text.push_str(&format!("\npaused: {}\n", names.join(", ")));
        }
        text
    }
}

/// `pause TYPE` (`pause` true) and `resume TYPE`.
pub(crate) async fn pause(
    db: &DatabaseConnection,
    task_type: &str,
    pause: bool,
    json: bool,
) -> Result<(), Failure> {
    let changed = if pause {
        db.pause(task_type).await?
    } else {
        db.resume(task_type).await?
    };
    let outcome = PauseOutcome {
        task_type: task_type.to_owned(),
        paused: pause,
        changed,
    };
    emit(&outcome, json)
}

/// `pause`, `resume`: `{"task_type", "paused", "changed"}` (`changed`: false when the
/// type already was in that state).
#[derive(Serialize)]
struct PauseOutcome {
    task_type: String,
    paused: bool,
    changed: bool,
}

impl Human for PauseOutcome {
    fn human(&self) -> String {
        let state = if self.paused { "paused" } else { "resumed" };
        if self.changed {
            format!("{state} {}\n", self.task_type)
        } else if self.paused {
            format!("{} was already paused\n", self.task_type)
        } else {
            format!("{} was not paused\n", self.task_type)
        }
    }
}

/// `paused`.
pub(crate) async fn paused(db: &DatabaseConnection, json: bool) -> Result<(), Failure> {
    let paused = PausedList {
        paused: db.paused().await?.into_iter().map(Paused::from).collect(),
    };
    emit(&paused, json)
}

/// `paused`: `{"paused": [{"task_type", "paused_at"}]}`.
#[derive(Serialize)]
struct PausedList {
    paused: Vec<Paused>,
}

impl Human for PausedList {
    fn human(&self) -> String {
        if self.paused.is_empty() {
            return "no task type is paused\n".to_owned();
        }
        table(
            ["TYPE", "PAUSED AT"],
            self.paused
                .iter()
                .map(|p| [p.task_type.clone(), time(p.paused_at)]),
        )
    }
}

/// How long each status is kept: a worker's defaults (`Retention::default()`) unless
/// given. An age is a duration (`36h`, `30d`, `1w 2d`) or `forever`.
#[derive(Debug, Clone, Args)]
pub(crate) struct PruneArgs {
    /// Keep succeeded tasks this long after they finished. Default: 24h.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    succeeded: Option<Keep>,
    /// Keep failed tasks this long after they finished. Default: 7d.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    failed: Option<Keep>,
    /// Keep cancelled tasks this long after they finished. Default: 24h.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    cancelled: Option<Keep>,
    /// Rows one statement deletes (1 to 100,000). Default: 1000.
    #[arg(long, value_name = "ROWS", value_parser = parse_batch)]
    batch_size: Option<usize>,
}

/// How long a status is kept: `Some(age)`, or `None` for forever.
#[derive(Debug, Clone, Copy)]
struct Keep(Option<Duration>);

impl PruneArgs {
    pub(crate) async fn run(self, db: &DatabaseConnection, json: bool) -> Result<(), Failure> {
        let mut retention = Retention::default();
        if let Some(Keep(age)) = self.succeeded {
            retention = retention.succeeded(age);
        }
        if let Some(Keep(age)) = self.failed {
            retention = retention.failed(age);
        }
        if let Some(Keep(age)) = self.cancelled {
            retention = retention.cancelled(age);
        }
        if let Some(rows) = self.batch_size {
            retention = retention.batch_size(rows);
        }
        let report = db.prune(&retention).await?;
        let pruned = Pruned {
            succeeded: report.succeeded,
            failed: report.failed,
            cancelled: report.cancelled,
            total: report.total(),
        };
        emit(&pruned, json)
    }
}

/// `prune`: `{"succeeded", "failed", "cancelled", "total"}`, tasks deleted.
#[derive(Serialize)]
struct Pruned {
    succeeded: u64,
    failed: u64,
    cancelled: u64,
    total: u64,
}

impl Human for Pruned {
    fn human(&self) -> String {
        format!(
            "pruned {} task(s): {} succeeded, {} failed, {} cancelled\n",
            self.total, self.succeeded, self.failed, self.cancelled
        )
    }
}

fn parse_age(text: &str) -> Result<Keep, String> {
    if text == "forever" {
        return Ok(Keep(None));
    }
    humantime::parse_duration(text)
        .map(|age| Keep(Some(age)))
        .map_err(|err| format!("{err} (a duration such as 36h or 30d, or `forever`)"))
}

fn parse_batch(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(rows) if (1..=MAX_PRUNE_BATCH).contains(&rows) => Ok(rows),
        _ => Err(format!("not a number from 1 to {MAX_PRUNE_BATCH}")),
    }
}
