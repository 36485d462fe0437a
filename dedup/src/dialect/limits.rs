//! The statements of limits per task type (`task_dedup_limits`, migration 11): the
//! claim of a limited type ([`crate::lifecycle`]'s `limited`) and the settings behind
//! [`TaskAdmin::set_limits`](crate::TaskAdmin::set_limits). Whole texts, one set per
//! dialect in its file; the lists of users and ids are the only parts that vary.
//!
//! A limited type is claimed in a transaction of its own that first locks the type's
//! row ([`Limits::lock`]; SQLite: the transaction's write lock), so its claims run one
//! at a time across every process, and each counts the type's running tasks afresh
//! ([`Limits::running`]) after the previous one committed. A type whose only limit is
//! `max_running` is first tried without the lock: run slots under a unique index
//! (PostgreSQL, MySQL/MariaDB) or a count in the claim's own statement (SQLite). Every
//! other claim passes over limited types (the main claims' "not limited" probe), so no
//! task of a limited type starts but under its limits.

use std::borrow::Cow;

/// The task type of the row that holds the limit across all types
/// ([`TaskAdmin::set_user_limit`](crate::TaskAdmin::set_user_limit)): empty, which no
/// task's type is.
pub(crate) const ALL_TYPES: &str = "";

/// The unique index of run slots: `(task_type, run_slot)` over running tasks with one
/// (migration 11).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const SLOT_UIDX: &str = "task_run_slot_uidx";

/// What a limited type's claim and the limits' settings run, per dialect.
pub(crate) struct Limits {
    /// The limited types: `task_type`. No parameters.
    pub types: &'static str,
    /// One type's limits and the limit across all types ([`ALL_TYPES`]' row), the rows
    /// locked until the transaction ends, in that order (the empty type first: every
    /// claim that locks both takes them in the same order): the type. Columns
    /// `task_type`, `max_running`, `max_running_per_user`, `rate_starts`,
    /// `rate_window_micros`, `window_start_micros`, `window_starts`, `fair`,
    /// `fair_cursor`, and `now_micros`, the database's clock in microseconds since the
    /// Unix epoch.
    pub lock: &'static str,
    /// One type's running tasks: the type. Columns `user_id`, `run_slot`.
    /// MySQL/MariaDB: a locking read, which sees the latest commits whatever snapshot
    /// the transaction holds (a plain read could miss the previous claim's tasks).
    pub running: &'static str,
    /// Every running task's user (the limit across all types counts them per user).
    /// MySQL/MariaDB: a locking read, as [`running`](Self::running). No parameters.
    pub running_users: &'static str,
    /// The claim of a type whose only limit is `max_running`, in one statement and
    /// without the type's lock (PostgreSQL; `None` elsewhere): the next due tasks of the
    /// type, one per key, each given a free run slot below the limit (from a random one
    /// on, so that concurrent claims seldom pick the same; only as many slots are
    /// looked at as it may need, not all the limit's); a slot taken meanwhile by
    /// another claim fails it in `task_run_slot_uidx`
    /// ([`Kind::SlotTaken`](super::Kind::SlotTaken)). Starts nothing when the type has
    /// other limits, or while one of its running tasks holds no slot below the limit
    /// (started before the limit, or before it was lowered): the locked claim counts
    /// those. Parameters: worker_id, lease, the type, how many.
    pub slot_claim: Option<fn(i64) -> &'static str>,
    /// The first try of a type whose only limit is `max_running` (PostgreSQL and
    /// SQLite; `None` elsewhere), one statement without the type's lock: the next due
    /// tasks of the type, one per key, as many as the limit leaves. PostgreSQL: as
    /// [`slot_claim`](Self::slot_claim), with the slots of a random range that no
    /// running task holds (a few ranges are probed in `task_run_slot_uidx`), without
    /// reading every running task's slot; it starts nothing when no range it tried was
    /// free, and then `slot_claim` runs. SQLite: the type's running tasks counted in the
    /// statement (writers take turns, so the count holds until it commits) and no run
    /// slot. Same parameters.
    pub window_claim: Option<fn(i64) -> &'static str>,
    /// [`window_claim`](Self::window_claim) without the probe for running tasks of the
    /// keys and without the one-per-key step (PostgreSQL and SQLite; `None` elsewhere),
    /// as the main claim's optimistic form: `task_running_resource_uidx` fails it
    /// ([`Kind::RunningKey`](super::Kind::RunningKey)) when it picked a task whose key
    /// runs, or two of one key, and then it took nothing and the probing form runs. Run
    /// when the main claim would run optimistically (`lifecycle::claim_mode`). Same
    /// parameters.
    pub optimistic_window_claim: Option<fn(i64) -> &'static str>,
    /// MySQL/MariaDB's first try for a type whose only limit is `max_running` (`None`
    /// elsewhere), in one statement of two parts: the next due tasks of the type as
    /// [`candidates`](Self::candidates) selects them (locked, skipping rows other
    /// claimers hold; rows with an `id`), and the limit `m` with each running task's
    /// `slot` (`NULL`: none), one row per running task or one with `status` `NULL`
    /// when none runs (rows without an `id`; none when the type has other limits). The
    /// claim picks free slots from it and starts the tasks with them in the same
    /// transaction, without the type's lock. Parameters: the type, how many, the type.
    pub slots_and_candidates: Option<&'static str>,
    /// [`slots_and_candidates`](Self::slots_and_candidates) in the optimistic form:
    /// without the probe for running tasks of the keys; a picked task whose key runs
    /// fails the claim's update in `task_running_resource_uidx`
    /// ([`Kind::RunningKey`](super::Kind::RunningKey)), and the probing form runs.
    /// Same parameters.
    pub slots_and_optimistic_candidates: Option<&'static str>,
    /// The next due tasks of one type, as the claims select them (not paused, none of a
    /// key with a task running unless `concurrent`), in claim order, locked and skipping
    /// rows other claimers hold: `id`, `user_id`, `task_type`, `resource_key`, `concurrent`.
    /// Parameters: the type, the users to pass over (PostgreSQL: one array; SQLite: one
    /// JSON array; MySQL/MariaDB: one placeholder each, as many as the argument says),
    /// how many (the last also the text's, as for the claims: PostgreSQL's bound).
    pub candidates: fn(usize, i64) -> Cow<'static, str>,
    /// [`candidates`](Self::candidates) of every type without limits of its own, for
    /// the claim of those types while a limit across all types is set: the types to
    /// take (none: any), then the users to pass over (each list bound as `candidates`
    /// binds its users; on MySQL/MariaDB the arguments are their lengths), how many.
    pub rest_candidates: fn(usize, usize, i64) -> Cow<'static, str>,
    /// A fair claim's walk over the users with queued tasks of one type, in order from
    /// the one after a cursor (one index lookup per user, `task_run_user_queue_idx`):
    /// `user_id`. Parameters: the type, the cursor, how many users at most
    /// (MySQL/MariaDB and SQLite: the type, the cursor, the type again, how many).
    pub fair_users: &'static str,
    /// One user's next due tasks of one type, as [`candidates`](Self::candidates)
    /// selects them, without locks (the type's lock keeps other claims of the type out,
    /// and [`claim_ids`](Self::claim_ids) starts only what is still queued): the type,
    /// the user, how many.
    pub fair_heads: &'static str,
    /// Records the last user a fair claim served: the user, the type.
    pub fair_cursor: &'static str,
    /// Moves tasks that are still queued to `running` under a lease, as a claim does,
    /// each with its run slot (none: NULL; PostgreSQL: -1): worker_id, lease, then
    /// PostgreSQL the ids and the slots (two arrays), elsewhere an (id, slot) pair per
    /// task and the ids. PostgreSQL and SQLite return the rows; MySQL/MariaDB read them
    /// by id afterwards (`mysql::claimed`).
    pub claim_ids: fn(usize) -> Cow<'static, str>,
    /// Records the rate's current window: its start, the starts in it, the type.
    pub window: &'static str,
    /// Inserts or replaces a type's limits, keeping the window's count and the fair
    /// cursor: the type, `max_running`, `max_running_per_user`, `rate_starts`,
    /// `rate_window_micros`, `fair`.
    pub set: &'static str,
    /// Removes a type's limits; one row affected when it had any: the type.
    pub clear: &'static str,
    /// Every limited type by name, its limits, the window's columns, `fair`,
    /// `fair_cursor`, `updated_at`, `running` (its running tasks now) and `now_micros`.
    /// No parameters.
    pub list: &'static str,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::Limits;
    use crate::dialect::tests::PINNED_MAX;

    /// Every statement of `limits`, the generated ones for 2 users or ids.
    pub(crate) fn render(limits: &Limits) -> String {
        [
            ("types", limits.types.into()),
            ("lock", limits.lock.into()),
            ("running", limits.running.into()),
            (
                "window_claim",
                limits.window_claim.map_or("-", |of| of(PINNED_MAX)).into(),
            ),
            (
                "optimistic_window_claim",
                limits
                    .optimistic_window_claim
                    .map_or("-", |of| of(PINNED_MAX))
                    .into(),
            ),
            (
                "slots_and_candidates",
                limits.slots_and_candidates.unwrap_or("-").into(),
            ),
            (
                "slot_claim",
                limits.slot_claim.map_or("-", |of| of(PINNED_MAX)).into(),
            ),
            (
                "slots_and_optimistic_candidates",
                limits.slots_and_optimistic_candidates.unwrap_or("-").into(),
            ),
            ("candidates", (limits.candidates)(2, PINNED_MAX)),
            ("running_users", limits.running_users.into()),
            (
                "rest_candidates",
                (limits.rest_candidates)(2, 2, PINNED_MAX),
            ),
            ("fair_users", limits.fair_users.into()),
            ("fair_heads", limits.fair_heads.into()),
            ("fair_cursor", limits.fair_cursor.into()),
            ("claim_ids", (limits.claim_ids)(2)),
            ("window", limits.window.into()),
            ("set", limits.set.into()),
            ("clear", limits.clear.into()),
            ("list", limits.list.into()),
        ]
        .iter()
        .map(|(name, sql): &(&str, std::borrow::Cow<'static, str>)| format!("{name}:\n{sql}\n"))
        .collect::<Vec<_>>()
        .join("\n")
    }
}
