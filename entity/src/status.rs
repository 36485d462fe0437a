use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;

use sea_orm::Iterable;
use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// Where a task is in its lifecycle. Stored as the short lowercase strings shown.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// `queued`: waiting for a worker. Active.
    #[sea_orm(string_value = "queued")]
    Queued,
    /// `running`: claimed by a worker that holds a lease. Active.
    #[sea_orm(string_value = "running")]
    Running,
    /// `succeeded`: finished with a result.
    #[sea_orm(string_value = "succeeded")]
    Succeeded,
    /// `failed`: finished with an error.
    #[sea_orm(string_value = "failed")]
    Failed,
    /// `cancelled`: stopped before it finished.
    #[sea_orm(string_value = "cancelled")]
    Cancelled,
}

impl TaskStatus {
    /// The active set: a task in one of these states holds its key.
    pub const ACTIVE: [TaskStatus; 2] = [TaskStatus::Queued, TaskStatus::Running];

    /// Whether a task in this state holds its key (is `queued` or `running`).
    pub fn is_active(self) -> bool {
        Self::ACTIVE.contains(&self)
    }

    /// The string stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Queued => "queued",
            TaskStatus::Running => "running",
            TaskStatus::Succeeded => "succeeded",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of parsing an unknown status string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStatus(pub String);

impl fmt::Display for UnknownStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown task status {:?}", self.0)
    }
}

impl std::error::Error for UnknownStatus {}

impl FromStr for TaskStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskStatus::iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

static ACTIVE_STATUS_SQL: LazyLock<String> = LazyLock::new(|| {
    let values: Vec<String> = TaskStatus::ACTIVE
        .iter()
        .map(|status| format!("'{}'", status.as_str()))
        .collect();
    format!("status IN ({})", values.join(", "))
});

/// `status IN ('queued', 'running')`: the active set as an SQL predicate, valid on
/// SQLite, PostgreSQL and MySQL/MariaDB. Whether a task holds its key depends on its
/// scope as well: that is [`occupies_key_sql!`](crate::occupies_key_sql).
pub fn active_status_sql() -> &'static str {
    &ACTIVE_STATUS_SQL
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_set_is_queued_and_running() {
        let active: Vec<_> = TaskStatus::iter().filter(|s| s.is_active()).collect();
        assert_eq!(active, vec![TaskStatus::Queued, TaskStatus::Running]);
        assert_eq!(active_status_sql(), "status IN ('queued', 'running')");
    }

    #[test]
    fn strings_round_trip_and_fit_the_column() {
        for status in TaskStatus::iter() {
            assert_eq!(status.as_str().parse::<TaskStatus>(), Ok(status));
            assert_eq!(status.to_value(), status.as_str());
            assert!(status.as_str().len() <= crate::task_run::STATUS_MAX_CHARS);
        }
        assert!("QUEUED".parse::<TaskStatus>().is_err());
    }
}
