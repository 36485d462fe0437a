//! The admin API's statements ([`Admin`]: whole texts, in each dialect's `admin.sql`)
//! and the one statement built from parts: a list of tasks ([`list`]), whose filters are
//! each there or not. Its parts are fixed texts chosen by a [`ListShape`] (which clauses, how
//! many statuses), never by values: every value is a bound parameter, so the number of
//! distinct texts is bounded (each dialect's are pinned by the snapshot tests for a few
//! shapes).

use super::Dialect;
use super::render::{COLUMNS, Files, Template};
use task_dedup_entity::TaskStatus;

/// The statuses `Admin::counts_of_type` has an arm for: every status there is
/// (MySQL/MariaDB bind the type and the limit once per arm).
#[cfg(feature = "mysql")]
pub(crate) const COUNTED_STATUSES: usize = 5;

/// What the admin API runs besides lists, per dialect. PostgreSQL and SQLite end their
/// updates in `RETURNING` the row; MySQL/MariaDB read it by id in the same transaction.
pub(crate) struct Admin {
    /// The database's clock: one row, `now`.
    pub now: String,
    /// failed or cancelled → queued, due now, attempts back to 0, the lease, the
    /// lease's expiry and `finished_at` cleared (`error` stays: the last failure): id.
    /// The unique index refuses it when another task holds the key.
    pub retry: String,
    /// Deletes a finished task: id.
    pub delete: String,
    /// The number of tasks per type and status: `task_type`, `status`, `n`.
    pub counts: String,
    /// Every task type there is: `task_type`, in order. No parameters.
    pub task_types: String,
    /// The tasks of one type per status, each count stopping at a limit: `status`, `n`,
    /// a row per status (0 included). Parameters: the type, the limit (MySQL/MariaDB:
    /// both again for each status). Reads at most the limit's index entries per
    /// status, not the table.
    pub counts_of_type: String,
    /// Tasks created, succeeded and failed per minute over the current minute and the 59
    /// before it, by the database's clock: `what` (`created`, `succeeded`, `failed`),
    /// `minute` (minutes since the Unix epoch), `n`. No parameters.
    pub throughput: String,
    /// The oldest queued task of each type: `task_type`, `oldest`. No parameters.
    pub oldest_queued: String,
    /// queued or running → cancelled: the reason, then the ids (PostgreSQL: one array;
    /// elsewhere the list `ids`). Counts the rows it changed.
    pub cancel_many: Template,
    /// Deletes the finished tasks of some ids: the ids (PostgreSQL: one array; elsewhere
    /// the list `ids`).
    pub delete_many: Template,
}

impl Admin {
    /// The statements of a dialect's `admin.sql`; `task_types` from it or from
    /// `shared.sql`.
    pub(crate) fn read(files: &mut Files) -> Admin {
        let task_types = files.own_or_shared("admin", "task_types");
        let file = files.file("admin");
        Admin {
            now: file.text("now"),
            retry: file.text("retry"),
            delete: file.text("delete"),
            counts: file.text("counts"),
            task_types,
            counts_of_type: file.text("counts_of_type"),
            throughput: file.text("throughput"),
            oldest_queued: file.text("oldest_queued"),
            cancel_many: file.template("cancel_many"),
            delete_many: file.template("delete_many"),
        }
    }
}

/// Which clauses a list has. Their values are bound in this order: the statuses (but on
/// PostgreSQL, whose text names them), the task type, the user, the key prefix
/// (PostgreSQL: a LIKE pattern; elsewhere the prefix, then its successor), created from,
/// created before, the cursor (`created_at`, `id`; MySQL/MariaDB: `created_at`,
/// `created_at`, `created_at`, `id`), the limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ListShape {
    /// The statuses (none: any).
    pub statuses: Statuses,
    pub task_type: bool,
    pub user_id: bool,
    pub key_prefix: bool,
    pub created_from: bool,
    pub created_before: bool,
    /// A cursor: the page after it.
    pub after: bool,
    /// Newest first (else oldest first).
    pub newest_first: bool,
    /// The smallest power of two at least the page's size (`LIMIT`, 1 to 1,024):
    /// PostgreSQL's arms stop there (a literal bound, as in its claims: with `LIMIT $n`
    /// alone the generic plan's guess of a tenth of each arm's rows cost it past
    /// `jit_above_cost`, 440 ms of JIT compilation on 1,000,000 tasks).
    pub bound: i64,
}

/// A set of task statuses, as a list filter names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Statuses(u8);

impl Statuses {
    /// Every status, in the entity's order.
    const ALL: [TaskStatus; 5] = [
        TaskStatus::Queued,
        TaskStatus::Running,
        TaskStatus::Succeeded,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ];

    /// The set of `names` (statuses' names; others are not in it).
    pub(crate) fn of(names: &[&str]) -> Statuses {
        let mut bits = 0;
        for (i, status) in Statuses::ALL.iter().enumerate() {
            if names.contains(&status.as_str()) {
                bits |= 1 << i;
            }
        }
        Statuses(bits)
    }

    /// How many statuses the set holds.
    pub(crate) fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// The names of the set's statuses, each once, in the entity's order: what a list
    /// binds where its text has a placeholder per status.
    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    pub(crate) fn names(self) -> impl Iterator<Item = &'static str> {
        Statuses::ALL
            .into_iter()
            .enumerate()
            .filter(move |(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, status)| status.as_str())
    }

    /// The statuses of the set, or every status when it is empty.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn or_all(self) -> impl Iterator<Item = TaskStatus> {
        Statuses::ALL
            .into_iter()
            .enumerate()
            .filter(move |(i, _)| self.0 == 0 || self.0 & (1 << i) != 0)
            .map(|(_, status)| status)
    }
}

/// Numbers placeholders as the dialect writes them: `$1, $2, ...` on PostgreSQL, `?`
/// elsewhere.
struct Placeholders {
    dialect: Dialect,
    next: usize,
}

impl Placeholders {
    fn take(&mut self) -> String {
        self.next += 1;
        match self.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => format!("${}", self.next),
            #[allow(unreachable_patterns)]
            _ => "?".to_owned(),
        }
    }
}

/// The list statement of `shape`: the filters ANDed, ordered by `(created_at, id)` one
/// way or the other, the page after the cursor, `LIMIT`. The indexes of the admin
/// migration serve it: `(task_type, status, created_at, id)` with a type,
/// `(status, created_at, id)` with a status, `(created_at, id)` otherwise.
pub(crate) fn list(dialect: Dialect, shape: ListShape) -> String {
    #[cfg(feature = "postgres")]
    if dialect == Dialect::Postgres {
        return postgres_list(shape);
    }
    let mut p = Placeholders { dialect, next: 0 };
    let mut conditions: Vec<String> = Vec::new();
    match shape.statuses.len() {
        0 => {}
        1 => conditions.push(format!("status = {}", p.take())),
        n => {
            let list: Vec<String> = (0..n).map(|_| p.take()).collect();
            conditions.push(format!("status IN ({})", list.join(", ")));
        }
    }
    if shape.task_type {
        conditions.push(format!("task_type = {}", p.take()));
    }
    if shape.user_id {
        conditions.push(format!("user_id = {}", p.take()));
    }
    if shape.key_prefix {
        conditions.push(key_prefix(dialect, &mut p));
    }
    if shape.created_from {
        conditions.push(format!("created_at >= {}", p.take()));
    }
    if shape.created_before {
        conditions.push(format!("created_at < {}", p.take()));
    }
    let (direction, beyond) = if shape.newest_first {
        ("DESC", "<")
    } else {
        ("ASC", ">")
    };
    if shape.after {
        conditions.push(after(dialect, beyond, &mut p));
    }
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!("\nWHERE {}", conditions.join("\n    AND "))
    };
    format!(
        "SELECT {COLUMNS}\nFROM task_run{filter}\nORDER BY created_at {dir}, id {dir}\nLIMIT {limit}",
        dir = direction,
        limit = p.take()
    )
}

/// PostgreSQL's list of `shape` on the lean indexes of migration 13, where no index
/// holds every row in creation order. A page is put together from arms, each reading
/// one index in the list's order and stopping at the page's size: per status that is
/// not `running` and per task type (the given one, or each type there is, from a
/// recursive skip over `task_run_type_status_idx`), a walk of `task_run_type_status_idx`
/// `(task_type, status, created_at, id)`; the running tasks, as many as run, from
/// `task_running_resource_uidx`. The arms select `created_at` and `id` only; the page's
/// rows are read by id once it is chosen. The statuses are written in the text (they are
/// the entity's names, not input): a partial index serves a status only when the
/// statement names it. The other filters are bound and ANDed in every arm; a key prefix
/// (`LIKE`) lets the planner read an arm from `task_run_key_idx` where the prefix is
/// selective. Each arm reads at most a page, so a page costs the number of types times
/// the statuses asked for, not the table.
#[cfg(feature = "postgres")]
fn postgres_list(shape: ListShape) -> String {
    let mut p = Placeholders {
        dialect: Dialect::Postgres,
        next: 0,
    };
    let task_type = shape.task_type.then(|| p.take());
    let mut filters: Vec<String> = Vec::new();
    if shape.user_id {
        filters.push(format!("user_id = {}", p.take()));
    }
    if shape.key_prefix {
        filters.push(key_prefix(Dialect::Postgres, &mut p));
    }
    if shape.created_from {
        filters.push(format!("created_at >= {}", p.take()));
    }
    if shape.created_before {
        filters.push(format!("created_at < {}", p.take()));
    }
    let (direction, beyond) = if shape.newest_first {
        ("DESC", "<")
    } else {
        ("ASC", ">")
    };
    if shape.after {
        filters.push(after(Dialect::Postgres, beyond, &mut p));
    }
    let limit = p.take();
    let bound = shape.bound.max(1);
    let order = format!("ORDER BY created_at {direction}, id {direction}");
    let and_filters: String = filters
        .iter()
        .map(|f| format!("\n            AND {f}"))
        .collect();
    let mut arms: Vec<String> = Vec::new();
    let mut per_type = false;
    for status in shape.statuses.or_all() {
        let status = status.as_str();
        if status == "running" {
            let of_type = task_type
                .as_ref()
                .map(|t| format!("\n            AND task_type = {t}"))
                .unwrap_or_default();
            arms.push(format!(
                "    (\n        SELECT created_at, id\n        FROM task_run\n        \
                 WHERE status = 'running'{of_type}{and_filters}\n        {order}\n        \
                 LIMIT {bound}\n    )"
            ));
        } else if let Some(t) = &task_type {
            arms.push(format!(
                "    (\n        SELECT created_at, id\n        FROM task_run\n        \
                 WHERE task_type = {t}\n            AND status = '{status}'{and_filters}\n        \
                 {order}\n        LIMIT {bound}\n    )"
            ));
        } else {
            per_type = true;
            let and_filters = and_filters.replace("\n            ", "\n                ");
            arms.push(format!(
                "    (\n        SELECT c.created_at, c.id\n        FROM types\n        \
                 CROSS JOIN LATERAL (\n            SELECT created_at, id\n            \
                 FROM task_run\n            WHERE task_type = types.task_type\n                \
                 AND status = '{status}'{and_filters}\n            {order}\n            \
                 LIMIT {bound}\n        ) AS c\n        WHERE types.task_type IS NOT NULL\n    )"
            ));
        }
    }
    let types = if per_type {
        "WITH RECURSIVE types(task_type) AS (\n    SELECT MIN(task_type)\n    FROM task_run\n    \
         WHERE status <> 'running'\n    UNION ALL\n    SELECT (\n        SELECT r.task_type\n        \
         FROM task_run r\n        WHERE r.task_type > types.task_type\n            \
         AND r.status <> 'running'\n        ORDER BY r.task_type\n        LIMIT 1\n    )\n    \
         FROM types\n    WHERE types.task_type IS NOT NULL\n),\n"
    } else {
        "WITH "
    };
    format!(
        "{types}page(pcreated, pid) AS (\n    SELECT created_at, id\n    FROM (\n{arms}\n    ) AS arms\n    \
         {order}\n    LIMIT {limit}\n)\n\
         SELECT {COLUMNS}\nFROM page\nJOIN task_run ON id = pid\n\
         ORDER BY pcreated {direction}, pid {direction}",
        arms = arms.join("\n    UNION ALL\n")
    )
}

/// Keys that start with a prefix, byte for byte as keys compare, in a form that
/// `task_run_key_prefix_idx` (the keys in byte order) serves: a prefix that matches few
/// tasks reads its range, not `task_run_created_idx` to the end.
fn key_prefix(dialect: Dialect, p: &mut Placeholders) -> String {
    match dialect {
        // A LIKE pattern whose wildcards in the prefix are escaped with `!` (not `\`:
        // the pattern is a bound value, but the same escape as before this index), by
        // `executor::admin::like_prefix`. A custom plan (the pattern known) reads the
        // pattern's range from the `COLLATE "C"` index whatever the column's collation
        // (LIKE's meaning does not depend on a deterministic collation). Not a range of
        // two parameters: PostgreSQL's generic plan guesses a range's size (0.5 % of the
        // table) and would read a prefix that matches every task through the index and
        // sort it all (1.3 s on 1,000,000 tasks); a generic plan of LIKE walks
        // `task_run_created_idx` and stops after a page, as before the index.
        #[cfg(feature = "postgres")]
        Dialect::Postgres => format!("resource_key LIKE {} ESCAPE '!'", p.take()),
        // The range from the prefix to its successor (`executor::admin::prefix_range`),
        // which in byte order holds exactly the keys that start with it (UTF-8's byte
        // order is the order of code points). MySQL/MariaDB's VARBINARY and SQLite's
        // BINARY collation (the column's) compare bytes; MySQL/MariaDB plan each
        // execution with its values. SQLite's LIKE would use no index: it ignores ASCII
        // case unless `case_sensitive_like` is set (and then only an index of the
        // column's collation serves it); GLOB would need its `*?[` escaped.
        #[allow(unreachable_patterns)]
        _ => format!(
            "resource_key >= {} AND resource_key < {}",
            p.take(),
            p.take()
        ),
    }
}

/// The rows beyond the cursor in the list's order (`<` newest first, `>` oldest first).
fn after(dialect: Dialect, beyond: &str, p: &mut Placeholders) -> String {
    match dialect {
        // A row comparison is not a range MariaDB's optimizer reads an index with: the
        // same condition spelled out, with `created_at` bounded first so that the index
        // scan starts at the cursor.
        #[cfg(feature = "mysql")]
        Dialect::MySql => format!(
            "created_at {beyond}= {} AND (created_at {beyond} {} OR (created_at = {} AND id {beyond} {}))",
            p.take(),
            p.take(),
            p.take(),
            p.take()
        ),
        // PostgreSQL and SQLite read a row comparison as an index range.
        #[allow(unreachable_patterns)]
        _ => format!("(created_at, id) {beyond} ({}, {})", p.take(), p.take()),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The shapes the snapshots pin: none, a status and a type, a key prefix alone (the
    /// dashboard's search), all of them.
    pub(crate) fn lists(dialect: Dialect) -> Vec<(&'static str, String)> {
        let shapes = [
            (
                "list_all_newest",
                ListShape {
                    newest_first: true,
                    ..ListShape::default()
                },
            ),
            (
                "list_status_type_newest_after",
                ListShape {
                    statuses: Statuses::of(&["failed"]),
                    task_type: true,
                    after: true,
                    newest_first: true,
                    ..ListShape::default()
                },
            ),
            (
                "list_key_prefix_oldest",
                ListShape {
                    key_prefix: true,
                    ..ListShape::default()
                },
            ),
            (
                "list_every_filter_oldest_after",
                ListShape {
                    statuses: Statuses::of(&["queued", "running"]),
                    task_type: true,
                    user_id: true,
                    key_prefix: true,
                    created_from: true,
                    created_before: true,
                    after: true,
                    newest_first: false,
                    bound: 64,
                },
            ),
        ];
        shapes
            .into_iter()
            .map(|(name, shape)| {
                let shape = ListShape { bound: 64, ..shape };
                (name, list(dialect, shape))
            })
            .collect()
    }
}
