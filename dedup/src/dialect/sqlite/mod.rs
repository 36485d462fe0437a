//! SQLite: `ON CONFLICT` against the partial unique index, `UPDATE ... RETURNING`, claims
//! in one UPDATE (no row locks: one statement is atomic under the database's write
//! lock). Its statements are this folder's SQL files, read into [`Sql`] once per process
//! ([`sql`]).
//!
//! Timestamps are RFC 3339 text in UTC, the shape sqlx writes for `DateTime<Utc>`, so
//! values the database writes (`strftime(..., 'now')`, millisecond resolution) and values
//! the library writes compare correctly as text.

use std::sync::OnceLock;

use sea_orm::sqlx::error::DatabaseError;
use sea_orm::sqlx::sqlite::SqliteError;
use task_dedup_entity::OCCUPIES_KEY_SQL;

use super::limits::Limits;
use super::render::Files;
use super::{Admin, Bulk, Endings, Guarded, Kind, Returning, SHARED, Statements, squeeze};

/// The dialect's SQL files, by family.
pub(crate) const FILES: [(&str, &str); 9] = [
    ("sqlite/enqueue.sql", include_str!("enqueue.sql")),
    ("sqlite/claim.sql", include_str!("claim.sql")),
    ("sqlite/lifecycle.sql", include_str!("lifecycle.sql")),
    ("sqlite/endings.sql", include_str!("endings.sql")),
    ("sqlite/bulk.sql", include_str!("bulk.sql")),
    ("sqlite/limits.sql", include_str!("limits.sql")),
    ("sqlite/admin.sql", include_str!("admin.sql")),
    ("sqlite/maintenance.sql", include_str!("maintenance.sql")),
    ("sqlite/schema.sql", include_str!("schema.sql")),
];

/// Every SQLite statement, rendered from [`FILES`].
pub(crate) struct Sql {
    pub statements: Statements,
    pub returning: Returning,
    pub bulk: Bulk,
    pub endings: Endings,
    pub admin: Admin,
    pub limits: Limits,
    pub lock_free: LockFree,
    /// The table and the unique index as the schema has them ([`guarded`] reads them).
    pub guard: String,
    /// What rendering [`FILES`] met: nothing (a unit test checks).
    #[cfg_attr(not(test), allow(dead_code))]
    pub problems: Vec<String>,
}

/// The lock-free claims of a type whose only limit is `max_running` (`limits.sql`): its
/// running tasks counted in the statement (writers take turns, so the count holds until
/// it commits), no run slot. Parameters: worker_id, lease, the type, how many.
pub(crate) struct LockFree {
    /// Probing the keys, one task per key.
    pub window_claim: String,
    /// Without the probe for running tasks of the keys.
    pub optimistic_window_claim: String,
}

/// The statements, rendered on first use.
pub(crate) fn sql() -> &'static Sql {
    static SQL: OnceLock<Sql> = OnceLock::new();
    SQL.get_or_init(build)
}

fn build() -> Sql {
    let mut files = Files::parse(&FILES, SHARED);
    Sql {
        // Writers are serialized: the row a conflict met is committed and visible to the
        // plain read (`find_occupant`).
        statements: Statements::read(&mut files),
        returning: Returning::read(&mut files),
        bulk: Bulk::read(&mut files, 2_000),
        endings: Endings::read(&mut files),
        admin: Admin::read(&mut files),
        limits: Limits::read(&mut files),
        lock_free: LockFree {
            window_claim: files.text("limits", "window_claim"),
            optimistic_window_claim: files.text("limits", "optimistic_window_claim"),
        },
        guard: files.text("schema", "guard"),
        problems: files.finish(),
    }
}

/// What the rows of `schema.sql`'s `guard` (type, sql) say.
pub(crate) fn guarded(rows: &[(String, Option<String>)]) -> Guarded {
    if !rows.iter().any(|(kind, _)| kind == "table") {
        return Guarded::NoTable;
    }
    let Some(sql) = rows
        .iter()
        .find(|(kind, _)| kind == "index")
        .and_then(|(_, sql)| sql.as_deref())
    else {
        return Guarded::No("task_active_resource_uidx is missing".to_owned());
    };
    let wanted = squeeze(&format!(
        "CREATE UNIQUE INDEX task_active_resource_uidx ON task_run \
         (user_id, task_type, resource_key, dedup_window_end) WHERE {OCCUPIES_KEY_SQL}"
    ));
    if squeeze(sql) == wanted {
        Guarded::Yes
    } else {
        Guarded::No(format!(
            "task_active_resource_uidx is not the guarantee: {sql}"
        ))
    }
}

/// Extended result code of a UNIQUE constraint failure.
const SQLITE_CONSTRAINT_UNIQUE: &str = "2067";
/// Primary result code of a lock not obtained within the busy timeout
/// (SQLITE_BUSY and its extended codes: 5, 261, 517, ...).
const SQLITE_BUSY: i32 = 5;
/// The columns of `task_active_resource_uidx`, as SQLite names them in the message of a
/// UNIQUE failure.
const HELD_KEY_COLUMNS: &str = "task_run.user_id, task_run.task_type, \
                                task_run.resource_key, task_run.dedup_window_end";
/// The same for `task_running_resource_uidx`, after the colon that ends the prefix.
const RUNNING_KEY_COLUMNS: &str = ": task_run.user_id, task_run.task_type, \
                                   task_run.resource_key";
/// `task_run_slot_uidx`'s columns.
const SLOT_COLUMNS: &str = ": task_run.task_type, task_run.run_slot";

/// What a SQLite error means. SQLite names the columns of the violated index, not the
/// index: `UNIQUE constraint failed: task_run.user_id, ..., task_run.dedup_window_end`.
/// Reading the message is the only way to tell ours; this is the one place that does.
pub(super) fn kind(e: &SqliteError) -> Kind {
    let code = e.code();
    let code = code.as_deref();
    if code == Some(SQLITE_CONSTRAINT_UNIQUE) && e.message().ends_with(HELD_KEY_COLUMNS) {
        return Kind::HeldKey;
    }
    if code == Some(SQLITE_CONSTRAINT_UNIQUE) && e.message().ends_with(RUNNING_KEY_COLUMNS) {
        return Kind::RunningKey;
    }
    if code == Some(SQLITE_CONSTRAINT_UNIQUE) && e.message().ends_with(SLOT_COLUMNS) {
        return Kind::SlotTaken;
    }
    match code.and_then(|code| code.parse::<i32>().ok()) {
        Some(code) if code & 0xff == SQLITE_BUSY => Kind::Timeout,
        _ => Kind::Other,
    }
}

/// A date-function modifier such as `+30.000000 seconds`.
pub(crate) fn seconds_modifier(micros: i64) -> String {
    let sign = if micros < 0 { '-' } else { '+' };
    let abs = micros.unsigned_abs();
    format!("{sign}{}.{:06} seconds", abs / 1_000_000, abs % 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::seconds_modifier;

    #[test]
    fn modifier_keeps_sign_and_microseconds() {
        assert_eq!(seconds_modifier(30_000_000), "+30.000000 seconds");
        assert_eq!(seconds_modifier(-1_500), "-0.001500 seconds");
    }
}
