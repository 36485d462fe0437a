//! The statements of limits per task type (`task_dedup_limits`, migration 11): the
//! claim of a limited type ([`crate::lifecycle`]'s `limited`) and the settings behind
//! [`TaskAdmin::set_limits`](crate::TaskAdmin::set_limits). Whole texts, in each
//! dialect's `limits.sql`; the lists of users and ids are the only parts that vary.
//!
//! A limited type is claimed in a transaction of its own that first locks the type's
//! row ([`Limits::lock`]; SQLite: the transaction's write lock), so its claims run one
//! at a time across every process, and each counts the type's running tasks afresh
//! ([`Limits::running`]) after the previous one committed. A type whose only limit is
//! `max_running` is first tried without the lock: run slots under a unique index
//! (PostgreSQL, MySQL/MariaDB) or a count in the claim's own statement (SQLite). Every
//! other claim passes over limited types (the main claims' "not limited" probe), so no
//! task of a limited type starts but under its limits.

use super::render::{Files, Template};

/// The task type of the row that holds the limit across all types
/// ([`TaskAdmin::set_user_limit`](crate::TaskAdmin::set_user_limit)): empty, which no
/// task's type is.
pub(crate) const ALL_TYPES: &str = "";

/// The unique index of run slots: `(task_type, run_slot)` over running tasks with one
/// (migration 11).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const SLOT_UIDX: &str = "task_run_slot_uidx";

/// What a limited type's claim and the limits' settings run, in every dialect (the
/// lock-free claims of a type whose only limit is `max_running` differ per dialect: each
/// dialect's `LockFree`). Parameters are listed beside each statement in its dialect's
/// `limits.sql`.
pub(crate) struct Limits {
    /// The limited types: `task_type`. No parameters.
    pub types: String,
    /// One type's limits and the limit across all types ([`ALL_TYPES`]' row), the rows
    /// locked until the transaction ends, in that order (the empty type first: every
    /// claim that locks both takes them in the same order): the type. Columns
    /// `task_type`, `max_running`, `max_running_per_user`, `rate_starts`,
    /// `rate_window_micros`, `window_start_micros`, `window_starts`, `fair`,
    /// `fair_cursor`, and `now_micros`, the database's clock in microseconds since the
    /// Unix epoch.
    pub lock: String,
    /// One type's running tasks: the type. Columns `user_id`, `run_slot`.
    /// MySQL/MariaDB: a locking read, which sees the latest commits whatever snapshot
    /// the transaction holds (a plain read could miss the previous claim's tasks).
    pub running: String,
    /// Every running task's user (the limit across all types counts them per user).
    /// MySQL/MariaDB: a locking read, as [`running`](Self::running). No parameters.
    pub running_users: String,
    /// The next due tasks of one type, as the claims select them (not paused, none of a
    /// key with a task running unless `concurrent`), in claim order, locked and skipping
    /// rows other claimers hold: `id`, `user_id`, `task_type`, `resource_key`, `concurrent`.
    /// Parameters: the type, the users to pass over (PostgreSQL: one array; SQLite: one
    /// JSON array; MySQL/MariaDB: the list `users`, a clause only when there are some),
    /// how many (PostgreSQL: also the text's bound, as for the claims).
    pub candidates: Template,
    /// [`candidates`](Self::candidates) of every type without limits of its own, for
    /// the claim of those types while a limit across all types is set: the types to
    /// take (none: any), then the users to pass over (each bound as `candidates` binds
    /// its users; MySQL/MariaDB: the lists `types` and `users`), how many.
    pub rest_candidates: Template,
    /// A fair claim's walk over the users with queued tasks of one type, in order from
    /// the one after a cursor (one index lookup per user: `task_run_user_queue_idx`,
    /// on PostgreSQL `task_active_resource_uidx`):
    /// `user_id`. Parameters: the type, the cursor, how many users at most
    /// (MySQL/MariaDB and SQLite: the type, the cursor, the type again, how many).
    pub fair_users: String,
    /// One user's next due tasks of one type, as [`candidates`](Self::candidates)
    /// selects them, without locks (the type's lock keeps other claims of the type out,
    /// and [`claim_ids`](Self::claim_ids) starts only what is still queued): the type,
    /// the user, how many.
    pub fair_heads: String,
    /// Records the last user a fair claim served: the user, the type.
    pub fair_cursor: String,
    /// Moves tasks that are still queued to `running` under a lease, as a claim does,
    /// each with its run slot (none: NULL; PostgreSQL: -1): worker_id, lease, then
    /// PostgreSQL the ids and the slots (two arrays), elsewhere an (id, slot) pair per
    /// task (the list `slots`) and the ids (the list `ids`). PostgreSQL and SQLite return
    /// the rows; MySQL/MariaDB read them by id afterwards (its `by_ids`).
    pub claim_ids: Template,
    /// Records the rate's current window: its start, the starts in it, the type.
    pub window: String,
    /// Inserts or replaces a type's limits, keeping the window's count and the fair
    /// cursor: the type, `max_running`, `max_running_per_user`, `rate_starts`,
    /// `rate_window_micros`, `fair`.
    pub set: String,
    /// Removes a type's limits; one row affected when it had any: the type.
    pub clear: String,
    /// Every limited type by name, its limits, the window's columns, `fair`,
    /// `fair_cursor`, `updated_at`, `running` (its running tasks now) and `now_micros`.
    /// No parameters.
    pub list: String,
}

impl Limits {
    /// The statements every dialect's `limits.sql` has; `fair_users` from it or from
    /// `shared.sql`.
    pub(crate) fn read(files: &mut Files) -> Limits {
        let fair_users = files.own_or_shared("limits", "fair_users");
        let file = files.file("limits");
        Limits {
            types: file.text("types"),
            lock: file.text("lock"),
            running: file.text("running"),
            running_users: file.text("running_users"),
            candidates: file.template("candidates"),
            rest_candidates: file.template("rest_candidates"),
            fair_users,
            fair_heads: file.text("fair_heads"),
            fair_cursor: file.text("fair_cursor"),
            claim_ids: file.template("claim_ids"),
            window: file.text("window"),
            set: file.text("set"),
            clear: file.text("clear"),
            list: file.text("list"),
        }
    }
}
