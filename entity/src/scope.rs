use std::fmt;

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

/// Which of a task's states occupy its key, stored on the row (`scope`) when the task is
/// created. The unique index reads it: a row holds its key exactly while
/// [`occupies_key_sql!`](crate::occupies_key_sql) holds for it.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
#[serde(rename_all = "snake_case")]
pub enum TaskScope {
    /// `active`: the key is held while the task is `queued` or `running`.
    #[sea_orm(string_value = "active")]
    Active,
    /// `queued`: the key is held only while the task is `queued`; once it runs, one new
    /// task may queue behind it.
    #[sea_orm(string_value = "queued")]
    Queued,
    /// `period`: the key is held, whatever the task's status, for the period window in
    /// `dedup_window_end`.
    #[sea_orm(string_value = "period")]
    Period,
}

impl TaskScope {
    /// The string stored in the `scope` column.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskScope::Active => "active",
            TaskScope::Queued => "queued",
            TaskScope::Period => "period",
        }
    }
}

impl fmt::Display for TaskScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The SQL predicate that is true while a row holds its key, as a string literal for
/// `concat!`. The unique index `task_active_resource_uidx` (PostgreSQL, SQLite: its
/// `WHERE`; MySQL/MariaDB: the generated `occupied` column), PostgreSQL's `ON CONFLICT`
/// target and every lookup of the task holding a key use this text, so they cannot
/// disagree. Literals, not parameters: PostgreSQL infers a partial index as the arbiter
/// of `ON CONFLICT` only from a predicate it can prove at plan time.
#[macro_export]
macro_rules! occupies_key_sql {
    () => {
        "((scope = 'active' AND status IN ('queued', 'running')) \
         OR (scope = 'queued' AND status = 'queued') OR scope = 'period')"
    };
}

/// The SQL predicate that is true while a row takes its key's one run: running, and not
/// [`concurrent`](crate::task_run::Model::concurrent). The unique index
/// `task_running_resource_uidx` (PostgreSQL, SQLite: its `WHERE`; MySQL/MariaDB: the
/// generated `running_slot` column) and the claim statements' probe for a running task
/// of a key use this text. Unqualified: inside a correlated subquery it reads the
/// subquery's row.
#[macro_export]
macro_rules! runs_serially_sql {
    () => {
        "(status = 'running' AND NOT concurrent)"
    };
}

/// [`runs_serially_sql!`] as a constant.
pub const RUNS_SERIALLY_SQL: &str = runs_serially_sql!();

/// [`occupies_key_sql!`] as a constant.
pub const OCCUPIES_KEY_SQL: &str = occupies_key_sql!();

#[cfg(test)]
mod tests {
    use sea_orm::Iterable;

    use super::*;
    use crate::TaskStatus;

    /// The predicate, evaluated by hand: what each scope's states mean.
    fn holds(scope: TaskScope, status: TaskStatus) -> bool {
        match scope {
            TaskScope::Active => status.is_active(),
            TaskScope::Queued => status == TaskStatus::Queued,
            TaskScope::Period => true,
        }
    }

    #[test]
    fn predicate_names_each_scope_and_its_states() {
        assert_eq!(
            OCCUPIES_KEY_SQL,
            "((scope = 'active' AND status IN ('queued', 'running')) \
             OR (scope = 'queued' AND status = 'queued') OR scope = 'period')"
        );
        for scope in TaskScope::iter() {
            assert!(OCCUPIES_KEY_SQL.contains(&format!("scope = '{scope}'")));
            let holding: Vec<_> = TaskStatus::iter().filter(|s| holds(scope, *s)).collect();
            assert!(!holding.is_empty(), "{scope}");
        }
    }

    #[test]
    fn strings_round_trip_and_fit_the_column() {
        for scope in TaskScope::iter() {
            assert_eq!(scope.to_value(), scope.as_str());
            assert!(scope.as_str().len() <= crate::task_run::SCOPE_MAX_CHARS);
        }
    }
}
