//! MySQL/MariaDB: a plain INSERT against the unique index over the generated `occupied`
//! column, claims with `FOR UPDATE SKIP LOCKED`, and no `RETURNING` (MariaDB has one,
//! MySQL 8 does not): a write and the read of its row run in one short transaction
//! (`executor::mysql`). Its statements are this folder's SQL files, read into [`Sql`]
//! once per process ([`sql`]). Times are `UTC_TIMESTAMP(6)`: `datetime(6)` columns hold
//! UTC whatever the session's time zone.

use std::sync::OnceLock;

use sea_orm::sqlx::mysql::MySqlDatabaseError;
use task_dedup_entity::task_run::{ACTIVE_RESOURCE_UIDX, RUNNING_RESOURCE_UIDX};

use super::limits::{Limits, SLOT_UIDX};
use super::render::{Files, Template};
use super::{Admin, Bulk, Endings, Guarded, Kind, SHARED, Statements, squeeze};

/// The dialect's SQL files, by family.
pub(crate) const FILES: [(&str, &str); 9] = [
    ("mysql/enqueue.sql", include_str!("enqueue.sql")),
    ("mysql/claim.sql", include_str!("claim.sql")),
    ("mysql/lifecycle.sql", include_str!("lifecycle.sql")),
    ("mysql/endings.sql", include_str!("endings.sql")),
    ("mysql/bulk.sql", include_str!("bulk.sql")),
    ("mysql/limits.sql", include_str!("limits.sql")),
    ("mysql/admin.sql", include_str!("admin.sql")),
    ("mysql/maintenance.sql", include_str!("maintenance.sql")),
    ("mysql/schema.sql", include_str!("schema.sql")),
];

/// Every MySQL/MariaDB statement, rendered from [`FILES`]: what every dialect has, and
/// the steps of MySQL's flows of its own (`executor::mysql`).
pub(crate) struct Sql {
    pub statements: Statements,
    pub bulk: Bulk,
    pub endings: Endings,
    pub admin: Admin,
    pub limits: Limits,
    pub claims: Claims,
    /// `ReplaceIfQueued`, run after the INSERT's duplicate-key error: payload, run_at,
    /// priority, updated_at, then the key and window. Only a queued task is updated.
    pub replace: String,
    /// Which of the given ids exist (the list `ids`): which rows a bulk insert put in.
    pub ids_in: Template,
    /// Deletes the batch `prune` locked: the ids (the list `ids`).
    pub prune_ids: Template,
    /// Which of the given ids (the list `rows`) are in a status under a lease owner,
    /// after a batch ending changed fewer rows than it was given: the ids, the status, the
    /// worker's id.
    pub ended_by: Template,
    /// The table, the columns of the unique index and the expression of the generated
    /// column it reads ([`guarded`] reads the row).
    pub guard: String,
    /// Whether the server is a node of a MariaDB Galera cluster
    /// (`executor::galera`): `wsrep_on`'s row, if any.
    pub galera: String,
    /// What rendering [`FILES`] met: nothing (a unit test checks).
    #[cfg_attr(not(test), allow(dead_code))]
    pub problems: Vec<String>,
}

/// A claim's steps (`claim.sql`): its selection locked, the update of the ids kept, the
/// read of the rows; and the lock-free first try of a limited type (`limits.sql`).
pub(crate) struct Claims {
    /// The next due queued tasks of any type, locked (id, key, `concurrent`): how many.
    pub claim_any: String,
    /// The same for some task types (the list `types`), then how many.
    pub claim_types: Template,
    /// [`claim_any`](Self::claim_any) without the probe for running tasks of the keys.
    pub optimistic_claim_any: String,
    /// [`claim_types`](Self::claim_types) without the probe.
    pub optimistic_claim_types: Template,
    /// Marks the locked tasks claimed, with no run slot: worker_id, lease, the ids (the
    /// list `ids`).
    pub claim_update: Template,
    /// The claimed tasks: the ids (the list `ids`).
    pub claimed: Template,
    /// A type whose only limit is `max_running`, in one statement: its next due tasks
    /// locked, its limit and its running tasks' slots. Parameters: the type, how many,
    /// the type.
    pub slots_and_candidates: String,
    /// [`slots_and_candidates`](Self::slots_and_candidates) without the probe for
    /// running tasks of the keys.
    pub slots_and_optimistic_candidates: String,
}

/// The statements, rendered on first use.
pub(crate) fn sql() -> &'static Sql {
    static SQL: OnceLock<Sql> = OnceLock::new();
    SQL.get_or_init(build)
}

fn build() -> Sql {
    let mut files = Files::parse(&FILES, SHARED);
    Sql {
        statements: Statements::read(&mut files),
        bulk: Bulk::read(&mut files, 2_000),
        endings: Endings::read(&mut files),
        admin: Admin::read(&mut files),
        limits: Limits::read(&mut files),
        claims: Claims {
            claim_any: files.text("claim", "claim_any"),
            claim_types: files.template("claim", "claim_types"),
            optimistic_claim_any: files.text("claim", "optimistic_claim_any"),
            optimistic_claim_types: files.template("claim", "optimistic_claim_types"),
            claim_update: files.template("claim", "claim_update"),
            // The rows by id, as a bulk enqueue reads them.
            claimed: files.template("bulk", "by_ids"),
            slots_and_candidates: files.text("limits", "slots_and_candidates"),
            slots_and_optimistic_candidates: files
                .text("limits", "slots_and_optimistic_candidates"),
        },
        replace: files.text("enqueue", "replace"),
        ids_in: files.template("bulk", "ids_in"),
        prune_ids: files.template("maintenance", "prune_ids"),
        ended_by: files.template("endings", "ended_by"),
        guard: files.text("schema", "guard"),
        galera: files.text("schema", "galera"),
        problems: files.finish(),
    }
}

/// What `schema.sql`'s `guard` row says.
pub(crate) fn guarded(
    has_table: i64,
    key_columns: Option<&str>,
    occupied: Option<&str>,
) -> Guarded {
    const KEY_COLUMNS: &str = "user_id,task_type,resource_key,dedup_window_end,occupied";
    if has_table == 0 {
        return Guarded::NoTable;
    }
    match key_columns {
        None => return Guarded::No("task_active_resource_uidx is missing".to_owned()),
        Some(columns) if columns != KEY_COLUMNS => {
            return Guarded::No(format!(
                "task_active_resource_uidx is on ({columns}), not ({KEY_COLUMNS})"
            ));
        }
        Some(_) => {}
    }
    // The server rewrites the expression (quotes, parentheses); its terms stay.
    let expression = occupied.map(squeeze).unwrap_or_default();
    let reads_the_key = [
        "'active'",
        "'queued'",
        "'running'",
        "'period'",
        "scope",
        "status",
    ]
    .iter()
    .all(|term| expression.contains(term));
    if reads_the_key {
        Guarded::Yes
    } else {
        Guarded::No("the column `occupied` is not generated from scope and status".to_owned())
    }
}

/// A duplicate key in a unique index (or the primary key).
const ER_DUP_ENTRY: u16 = 1062;
/// InnoDB broke a deadlock by rolling back this statement's transaction.
const ER_LOCK_DEADLOCK: u16 = 1213;

/// The server went away or the connection dropped during a query (client-side codes).
const CR_SERVER_GONE_ERROR: u16 = 2006;
const CR_SERVER_LOST: u16 = 2013;
/// The server is shutting down (its sessions get this before they close).
const ER_SERVER_SHUTDOWN: u16 = 1053;
/// MariaDB: the session was killed (`KILL CONNECTION`).
const ER_CONNECTION_KILLED: u16 = 1927;
/// MySQL 8: the server disconnected an idle client.
const ER_CLIENT_INTERACTION_TIMEOUT: u16 = 4031;
/// MariaDB Galera (SQLSTATE 08S01): "WSREP has not yet prepared node for application
/// use", the answer to every statement of a node that is joining the cluster or has
/// lost its quorum: as a server that is starting, it will take them once it has caught
/// up (`ER_UNKNOWN_COM_ERROR`, which nothing else sends a well-formed statement).
const ER_WSREP_NOT_READY: u16 = 1047;
/// InnoDB gave up waiting for a row lock (`innodb_lock_wait_timeout`).
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
/// MariaDB `max_statement_time`, MySQL `max_execution_time`.
const ER_STATEMENT_TIMEOUT: u16 = 1969;
const ER_QUERY_TIMEOUT: u16 = 3024;

/// What a MySQL/MariaDB error means. The driver gives the violated index only in the
/// message (`Duplicate entry '...' for key 'task_active_resource_uidx'`; MySQL 8 prefixes
/// the table), so a duplicate key is told ours by reading it: the one place that does.
pub(super) fn kind(e: &MySqlDatabaseError) -> Kind {
    match e.number() {
        ER_DUP_ENTRY if names_index(e.message(), ACTIVE_RESOURCE_UIDX) => Kind::HeldKey,
        ER_DUP_ENTRY if names_index(e.message(), RUNNING_RESOURCE_UIDX) => Kind::RunningKey,
        ER_DUP_ENTRY if names_index(e.message(), SLOT_UIDX) => Kind::SlotTaken,
        ER_LOCK_DEADLOCK => Kind::TransactionConflict,
        CR_SERVER_GONE_ERROR
        | CR_SERVER_LOST
        | ER_SERVER_SHUTDOWN
        | ER_CONNECTION_KILLED
        | ER_CLIENT_INTERACTION_TIMEOUT
        | ER_WSREP_NOT_READY => Kind::ConnectionLost,
        ER_LOCK_WAIT_TIMEOUT | ER_STATEMENT_TIMEOUT | ER_QUERY_TIMEOUT => Kind::Timeout,
        _ => Kind::Other,
    }
}

fn names_index(message: &str, index: &str) -> bool {
    message
        .strip_suffix('\'')
        .and_then(|m| m.strip_suffix(index))
        .is_some_and(|m| m.ends_with('\'') || m.ends_with('.'))
}
