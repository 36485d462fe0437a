//! `task-dedup tasks ...`: list, show, retry, cancel, delete (one task, or in bulk by
//! filter up to a required `--limit`), stats.

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use sea_orm::DatabaseConnection;
use serde::Serialize;
use task_dedup::{
    BulkOutcome, Cursor, DEFAULT_PAGE_SIZE, ListTasks, MAX_ADMIN_BATCH, Order, TaskAdmin,
    TaskFilter, TaskStatus, task_run,
};
use uuid::Uuid;

use crate::failure::Failure;
use crate::output::{Human, emit, maybe_time, table, time};

/// The reason `tasks cancel` records unless `--reason` gives one.
const DEFAULT_REASON: &str = "cancelled by an operator (task-dedup tasks cancel)";

#[derive(Debug, Subcommand)]
pub(crate) enum TasksCommand {
    /// List tasks, newest first, a page at a time; prints the cursor of the next page.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// Oldest first.
        #[arg(long)]
        oldest: bool,
        /// Tasks per page (1 to 1,000).
        #[arg(long, default_value_t = DEFAULT_PAGE_SIZE, value_parser = parse_limit)]
        limit: usize,
        /// The page after this cursor (printed by the previous page).
        #[arg(long, value_parser = parse_cursor)]
        after: Option<Cursor>,
    },
    /// Show one task, every field.
    Show {
        /// The task's id.
        #[arg(value_parser = parse_id)]
        id: Uuid,
    },
    /// Put a failed or cancelled task back in the queue (refused while another task holds
    /// its key); or, with a filter and --limit, up to that many.
    Retry(ActionArgs),
    /// Cancel a queued or running task; or, with a filter and --limit, up to that many.
    Cancel {
        #[command(flatten)]
        action: ActionArgs,
        /// Recorded in the task's `error`.
        #[arg(long, default_value = DEFAULT_REASON)]
        reason: String,
    },
    /// Delete a finished task; or, with a filter and --limit, up to that many.
    Delete(ActionArgs),
    /// Tasks per type and status, throughput over the last hour, the oldest queued task
    /// per type, the paused types.
    Stats,
}

/// Which tasks: every condition given must hold.
#[derive(Debug, Clone, Args)]
pub(crate) struct FilterArgs {
    /// Tasks in this status: queued, running, succeeded, failed, cancelled (repeatable).
    #[arg(long = "status", value_name = "STATUS", value_parser = parse_status)]
    statuses: Vec<TaskStatus>,
    /// Tasks of this type.
    #[arg(long = "type", value_name = "TYPE")]
    task_type: Option<String>,
    /// Tasks of this user ("" for keys without one).
    #[arg(long = "user", value_name = "USER")]
    user_id: Option<String>,
    /// Tasks whose resource key starts with this.
    #[arg(long, value_name = "PREFIX")]
    key_prefix: Option<String>,
    /// Tasks created at or after this instant (RFC 3339: 2026-12-02T14:00:00Z).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    created_after: Option<DateTime<Utc>>,
    /// Tasks created before this instant (RFC 3339).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    created_before: Option<DateTime<Utc>>,
}

impl FilterArgs {
    fn filter(&self) -> TaskFilter {
        let mut filter = TaskFilter::new().statuses(self.statuses.iter().copied());
        filter.task_type.clone_from(&self.task_type);
        filter.user_id.clone_from(&self.user_id);
        filter.key_prefix.clone_from(&self.key_prefix);
        filter.created_from = self.created_after;
        filter.created_before = self.created_before;
        filter
    }
}

/// One task by id, or the tasks a filter selects, at most `--limit` of them.
#[derive(Debug, Clone, Args)]
pub(crate) struct ActionArgs {
    /// The task's id; without it, the tasks the filter selects (oldest first).
    #[arg(value_parser = parse_id, conflicts_with = "FilterArgs")]
    id: Option<Uuid>,
    #[command(flatten)]
    filter: FilterArgs,
    /// Without an id: act on at most this many tasks (1 to 1,000). Required.
    #[arg(long, value_parser = parse_limit, required_unless_present = "id", conflicts_with = "id")]
    limit: Option<usize>,
}

/// What a bulk action names itself in its outcome.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
enum Action {
    Retry,
    Cancel,
    Delete,
}

impl TasksCommand {
    pub(crate) async fn run(self, db: &DatabaseConnection, json: bool) -> Result<(), Failure> {
        match self {
            TasksCommand::List {
                filter,
                oldest,
                limit,
                after,
            } => {
                let order = if oldest {
                    Order::OldestFirst
                } else {
                    Order::NewestFirst
                };
                let query = ListTasks::new(filter.filter())
                    .order(order)
                    .limit(limit)
                    .after(after);
                let page = db.list_tasks(&query).await?;
                let listed = Listed {
                    tasks: page.tasks,
                    next: page.next.map(|cursor| cursor.to_string()),
                };
                emit(&listed, json)
            }
            TasksCommand::Show { id } => {
                let task = db
                    .get_task(id)
                    .await?
                    .ok_or_else(|| Failure::failed(format!("task {id} not found")))?;
                emit(&Shown(task), json)
            }
            TasksCommand::Retry(args) => match args.target()? {
                Target::One(id) => emit(&Changed::new("retried", db.retry_task(id).await?), json),
                Target::Many(filter, limit) => {
                    let outcome = db.retry_tasks(&filter, limit).await?;
                    emit(&Bulk::new(Action::Retry, outcome), json)
                }
            },
            TasksCommand::Cancel { action, reason } => match action.target()? {
                Target::One(id) => {
                    let task = db.cancel_task(id, &reason).await?;
                    emit(&Changed::new("cancelled", task), json)
                }
                Target::Many(filter, limit) => {
                    let outcome = db.cancel_tasks(&filter, limit, &reason).await?;
                    emit(&Bulk::new(Action::Cancel, outcome), json)
                }
            },
            TasksCommand::Delete(args) => match args.target()? {
                Target::One(id) => {
                    db.delete_task(id).await?;
                    emit(&Deleted { deleted: id }, json)
                }
                Target::Many(filter, limit) => {
                    let outcome = db.delete_tasks(&filter, limit).await?;
                    emit(&Bulk::new(Action::Delete, outcome), json)
                }
            },
            TasksCommand::Stats => crate::ops::stats(db, json).await,
        }
    }
}

/// What an action is about.
enum Target {
    One(Uuid),
    Many(TaskFilter, usize),
}

impl ActionArgs {
    fn target(&self) -> Result<Target, Failure> {
        match (self.id, self.limit) {
            (Some(id), _) => Ok(Target::One(id)),
            (None, Some(limit)) => Ok(Target::Many(self.filter.filter(), limit)),
            // clap requires one of the two.
            (None, None) => Err(Failure::usage("give a task id, or a filter and --limit")),
        }
    }
}

/// `tasks list`: `{"tasks": [task, ...], "next": "<cursor>" | null}`.
#[derive(Serialize)]
struct Listed {
    tasks: Vec<task_run::Model>,
    next: Option<String>,
}

impl Human for Listed {
    fn human(&self) -> String {
        let mut text = table(
            ["ID", "TYPE", "USER", "KEY", "STATUS", "ATTEMPTS", "CREATED"],
            self.tasks.iter().map(|task| {
                [
                    task.id.to_string(),
                    task.task_type.clone(),
                    task.user_id.clone(),
                    task.resource_key.clone(),
                    task.status.to_string(),
                    task.attempts.to_string(),
                    time(task.created_at),
                ]
            }),
        );
        match &self.next {
            Some(next) => text.push_str(&format!("next page: --after {next}\n")),
            None => text.push_str(&format!("{} task(s), last page\n", self.tasks.len())),
        }
        text
    }
}

/// `tasks show`: the task, every column.
#[derive(Serialize)]
#[serde(transparent)]
struct Shown(task_run::Model);

impl Human for Shown {
    fn human(&self) -> String {
        let task = &self.0;
        let json = |value: &Option<serde_json::Value>| {
            value
                .as_ref()
                .map_or_else(|| "-".to_owned(), serde_json::Value::to_string)
        };
        let fields = [
            ("id", task.id.to_string()),
            ("user_id", task.user_id.clone()),
            ("task_type", task.task_type.clone()),
            ("resource_key", task.resource_key.clone()),
            ("status", task.status.to_string()),
            ("scope", task.scope.as_str().to_owned()),
            ("attempts", task.attempts.to_string()),
            ("priority", task.priority.to_string()),
            ("concurrent", task.concurrent.to_string()),
            ("payload", json(&task.payload)),
            ("result", json(&task.result)),
            (
                "error",
                task.error.clone().unwrap_or_else(|| "-".to_owned()),
            ),
            (
                "lease_owner",
                task.lease_owner.clone().unwrap_or_else(|| "-".to_owned()),
            ),
            ("lease_expires_at", maybe_time(task.lease_expires_at)),
            ("created_at", time(task.created_at)),
            ("updated_at", time(task.updated_at)),
            ("run_at", time(task.run_at)),
            ("started_at", maybe_time(task.started_at)),
            ("finished_at", maybe_time(task.finished_at)),
            ("dedup_window_end", task.dedup_window_end.to_string()),
        ];
        table(
            ["FIELD", "VALUE"],
            fields.map(|(name, value)| [name.to_owned(), value]),
        )
    }
}

/// A single retry or cancel: the task as it is now (as `tasks show` prints it).
#[derive(Serialize)]
#[serde(transparent)]
struct Changed {
    #[serde(skip)]
    verb: &'static str,
    task: task_run::Model,
}

impl Changed {
    fn new(verb: &'static str, task: task_run::Model) -> Changed {
        Changed { verb, task }
    }
}

impl Human for Changed {
    fn human(&self) -> String {
        format!(
            "{} task {}: now {}\n",
            self.verb, self.task.id, self.task.status
        )
    }
}

/// A single delete: `{"deleted": "<id>"}`.
#[derive(Serialize)]
struct Deleted {
    deleted: Uuid,
}

impl Human for Deleted {
    fn human(&self) -> String {
        format!("deleted task {}\n", self.deleted)
    }
}

/// A bulk action: `{"action", "selected", "applied", "key_held", "skipped"}`.
#[derive(Serialize)]
struct Bulk {
    action: Action,
    selected: u64,
    applied: u64,
    key_held: u64,
    skipped: u64,
}

impl Bulk {
    fn new(action: Action, outcome: BulkOutcome) -> Bulk {
        Bulk {
            action,
            selected: outcome.selected,
            applied: outcome.applied,
            key_held: outcome.key_held,
            skipped: outcome.skipped,
        }
    }
}

impl Human for Bulk {
    fn human(&self) -> String {
        let done = match self.action {
            Action::Retry => "retried",
            Action::Cancel => "cancelled",
            Action::Delete => "deleted",
        };
        let mut text = format!("{done} {} of {} selected", self.applied, self.selected);
        if self.key_held > 0 {
            text.push_str(&format!(
                "; {} left as they were: another task holds their key",
                self.key_held
            ));
        }
        if self.skipped > 0 {
            text.push_str(&format!("; {} changed meanwhile, skipped", self.skipped));
        }
        text.push('\n');
        text
    }
}

fn parse_id(text: &str) -> Result<Uuid, String> {
    Uuid::try_parse(text).map_err(|_| {
        "not a task id (a UUID such as 0190a8c2-5b1e-7c3d-8e4f-a1b2c3d4e5f6)".to_owned()
    })
}

fn parse_status(text: &str) -> Result<TaskStatus, String> {
    text.parse()
        .map_err(|err| format!("{err} (queued, running, succeeded, failed, cancelled)"))
}

fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text)
        .map(|time| time.with_timezone(&Utc))
        .map_err(|err| format!("not an RFC 3339 time such as 2026-12-02T14:00:00Z: {err}"))
}

fn parse_cursor(text: &str) -> Result<Cursor, String> {
    text.parse()
        .map_err(|err: task_dedup::DedupError| err.to_string())
}

fn parse_limit(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(limit) if (1..=MAX_ADMIN_BATCH).contains(&limit) => Ok(limit),
        _ => Err(format!("not a number from 1 to {MAX_ADMIN_BATCH}")),
    }
}
