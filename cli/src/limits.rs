//! `limits list`, `limits set TYPE ...`, `limits clear TYPE`: the limits per task type
//! (`TaskAdmin::set_limits`); `limits set-user N`, `limits clear-user`: the limit per
//! user across all types (`TaskAdmin::set_user_limit`). Every worker of every process
//! enforces them.

use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use sea_orm::DatabaseConnection;
use serde::Serialize;
use task_dedup::{LimitedType, TaskAdmin, TypeLimits, UserLimit};

use crate::failure::Failure;
use crate::output::{Human, emit, table, time};

#[derive(Debug, Subcommand)]
pub(crate) enum LimitsCommand {
    /// List the limited task types with their limits, tasks running and starts in the
    /// rate's window.
    List,
    /// Set a task type's limits, replacing any it had (at least one option).
    Set(SetArgs),
    /// Remove every limit of a task type.
    Clear {
        /// The task type.
        task_type: String,
    },
    /// Set the limit per user across all types: at most N tasks of one user running at
    /// once, whatever their types.
    SetUser {
        /// At most this many of one user's tasks running at once.
        #[arg(value_name = "N")]
        max_running: u32,
    },
    /// Remove the limit per user across all types.
    ClearUser,
}

#[derive(Debug, Args)]
pub(crate) struct SetArgs {
    /// The task type.
    task_type: String,
    /// At most this many of its tasks running at once, across every worker.
    #[arg(long, value_name = "N")]
    max_running: Option<u32>,
    /// At most this many of its tasks running at once per user.
    #[arg(long, value_name = "N")]
    per_user: Option<u32>,
    /// At most STARTS starts per window, e.g. `60/1m` (windows aligned on the epoch).
    #[arg(long, value_name = "STARTS/WINDOW", value_parser = parse_rate)]
    rate: Option<(u32, Duration)>,
    /// Take users in turn: one task per user with queued work before a second of any.
    #[arg(long)]
    fair: bool,
}

impl LimitsCommand {
    pub(crate) async fn run(self, db: &DatabaseConnection, json: bool) -> Result<(), Failure> {
        match self {
            LimitsCommand::List => {
                let limits = db.limits().await?.into_iter().map(Limit::from).collect();
                let user_limit = db.user_limit().await?.map(UserLimitView::from);
                emit(&LimitList { limits, user_limit }, json)
            }
            LimitsCommand::Set(args) => {
                let mut limits = TypeLimits::new();
                if let Some(n) = args.max_running {
                    limits = limits.max_running(n);
                }
                if let Some(n) = args.per_user {
                    limits = limits.max_running_per_user(n);
                }
                if let Some((starts, per)) = args.rate {
                    limits = limits.rate(starts, per);
                }
                if args.fair {
                    limits = limits.fair_between_users();
                }
                db.set_limits(&args.task_type, &limits).await?;
                let set = db
                    .limits()
                    .await?
                    .into_iter()
                    .find(|l| l.task_type == args.task_type)
                    .map(Limit::from);
                emit(&LimitSet { set }, json)
            }
            LimitsCommand::Clear { task_type } => {
                let cleared = db.clear_limits(&task_type).await?;
                emit(&Cleared { task_type, cleared }, json)
            }
            LimitsCommand::SetUser { max_running } => {
                db.set_user_limit(max_running).await?;
                let set = db.user_limit().await?.map(UserLimitView::from);
                emit(&UserLimitSet { set }, json)
            }
            LimitsCommand::ClearUser => {
                let cleared = db.clear_user_limit().await?;
                emit(&UserLimitCleared { cleared }, json)
            }
        }
    }
}

fn parse_rate(text: &str) -> Result<(u32, Duration), String> {
    let usage = "STARTS/WINDOW, such as 60/1m or 5/1s";
    let (starts, window) = text.split_once('/').ok_or(usage)?;
    let starts = starts.trim().parse::<u32>().map_err(|_| usage)?;
    let window =
        humantime::parse_duration(window.trim()).map_err(|err| format!("{err} ({usage})"))?;
    Ok((starts, window))
}

/// One limited type: `{"task_type", "max_running", "max_running_per_user", "rate":
/// {"starts", "per_seconds"} | null, "fair", "running", "starts_in_window",
/// "updated_at"}` (a limit not set is null).
#[derive(Serialize)]
struct Limit {
    task_type: String,
    max_running: Option<u32>,
    max_running_per_user: Option<u32>,
    rate: Option<Rate>,
    fair: bool,
    running: u64,
    starts_in_window: u64,
    updated_at: DateTime<Utc>,
}

#[derive(Serialize)]
struct Rate {
    starts: u32,
    per_seconds: f64,
}

impl From<LimitedType> for Limit {
    fn from(limited: LimitedType) -> Limit {
        Limit {
            max_running: limited.limits.max_running,
            max_running_per_user: limited.limits.max_running_per_user,
            rate: limited.limits.rate.map(|rate| Rate {
                starts: rate.starts,
                per_seconds: rate.per.as_secs_f64(),
            }),
            fair: limited.limits.fair,
            running: limited.running,
            starts_in_window: limited.starts_in_window,
            updated_at: limited.updated_at,
            task_type: limited.task_type,
        }
    }
}

impl Limit {
    fn row(&self) -> [String; 6] {
        let count = |n: Option<u32>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
        let running = match self.max_running {
            Some(max) => format!("{}/{max}", self.running),
            None => self.running.to_string(),
        };
        let rate = self.rate.as_ref().map_or_else(
            || "-".to_owned(),
            |rate| {
                let per = humantime::format_duration(Duration::from_secs_f64(rate.per_seconds));
                format!("{}/{} ({} used)", rate.starts, per, self.starts_in_window)
            },
        );
        [
            self.task_type.clone(),
            running,
            count(self.max_running_per_user),
            rate,
            if self.fair { "yes" } else { "no" }.to_owned(),
            time(self.updated_at),
        ]
    }
}

/// The limit per user across all types: `{"max_running", "users_running",
/// "users_at_limit", "busiest", "updated_at"}`.
#[derive(Serialize)]
struct UserLimitView {
    max_running: u32,
    users_running: u64,
    users_at_limit: u64,
    busiest: u64,
    updated_at: DateTime<Utc>,
}

impl From<UserLimit> for UserLimitView {
    fn from(limit: UserLimit) -> UserLimitView {
        UserLimitView {
            max_running: limit.max_running,
            users_running: limit.users_running,
            users_at_limit: limit.users_at_limit,
            busiest: limit.busiest,
            updated_at: limit.updated_at,
        }
    }
}

impl UserLimitView {
    fn line(&self) -> String {
        format!(
            "at most {} running per user across all types: {} users running, {} at the limit, \
             busiest {} (set at {})\n",
            self.max_running,
            self.users_running,
            self.users_at_limit,
            self.busiest,
            time(self.updated_at)
        )
    }
}

/// `limits list`: `{"limits": [Limit], "user_limit": UserLimitView | null}`.
#[derive(Serialize)]
struct LimitList {
    limits: Vec<Limit>,
    user_limit: Option<UserLimitView>,
}

impl Human for LimitList {
    fn human(&self) -> String {
        let user = self.user_limit.as_ref().map(UserLimitView::line);
        if self.limits.is_empty() {
            return user.unwrap_or_default() + "no task type is limited\n";
        }
        user.unwrap_or_default()
            + &table(
                ["TYPE", "RUNNING", "PER USER", "RATE", "FAIR", "SET AT"],
                self.limits.iter().map(Limit::row),
            )
    }
}

/// `limits set-user`: `{"set": UserLimitView}`, as stored.
#[derive(Serialize)]
struct UserLimitSet {
    set: Option<UserLimitView>,
}

impl Human for UserLimitSet {
    fn human(&self) -> String {
        match &self.set {
            Some(limit) => limit.line(),
            None => "set, and cleared since\n".to_owned(),
        }
    }
}

/// `limits clear-user`: `{"cleared"}` (false when none was set).
#[derive(Serialize)]
struct UserLimitCleared {
    cleared: bool,
}

impl Human for UserLimitCleared {
    fn human(&self) -> String {
        if self.cleared {
            "cleared the limit per user across all types\n".to_owned()
        } else {
            "no limit per user across all types was set\n".to_owned()
        }
    }
}

/// `limits set`: `{"set": Limit}`, the type's limits as stored.
#[derive(Serialize)]
struct LimitSet {
    set: Option<Limit>,
}

impl Human for LimitSet {
    fn human(&self) -> String {
        match &self.set {
            Some(limit) => format!("limited {}\n", limit.task_type),
            None => "set, and cleared since\n".to_owned(),
        }
    }
}

/// `limits clear`: `{"task_type", "cleared"}` (`cleared`: false when it had none).
#[derive(Serialize)]
struct Cleared {
    task_type: String,
    cleared: bool,
}

impl Human for Cleared {
    fn human(&self) -> String {
        if self.cleared {
            format!("cleared the limits of {}\n", self.task_type)
        } else {
            format!("{} had no limits\n", self.task_type)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_starts_per_window() {
        assert_eq!(parse_rate("60/1m"), Ok((60, Duration::from_secs(60))));
        assert_eq!(parse_rate("5 / 500ms"), Ok((5, Duration::from_millis(500))));
        assert!(parse_rate("60").is_err());
        assert!(parse_rate("x/1m").is_err());
        assert!(parse_rate("6/soon").is_err());
    }
}
