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
use super::render::File;
use super::{Admin, Bulk, Endings, Guarded, Kind, Returning, Statements, squeeze};

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
    let [
        mut enqueue,
        mut claim,
        mut lifecycle,
        mut endings,
        mut bulk,
        mut limits,
        mut admin,
        mut maintenance,
        mut schema,
    ] = FILES.map(|(path, text)| File::parse(path, text));
    // Writers are serialized: the row a conflict met is committed and visible to the
    // plain read.
    let find_occupant = enqueue.text("find_occupant");
    let statements = Statements {
        insert: enqueue.text("insert"),
        insert_or_find: None,
        find_occupant_after_conflict: find_occupant.clone(),
        find_occupant,
        by_id: enqueue.text("by_id"),
        heartbeat: lifecycle.text("heartbeat"),
        complete: lifecycle.text("complete"),
        fail: lifecycle.text("fail"),
        retry: lifecycle.text("retry"),
        cancel: lifecycle.text("cancel"),
        release: lifecycle.text("release"),
        snooze: lifecycle.text("snooze"),
        expired: lifecycle.text("expired"),
        reap_fail: lifecycle.text("reap_fail"),
        reap_requeue: lifecycle.text("reap_requeue"),
        prune: maintenance.text("prune"),
        pause: maintenance.text("pause"),
        resume: maintenance.text("resume"),
        paused: maintenance.text("paused"),
        running_index: schema.text("running_index"),
    };
    let returning = Returning {
        replace: enqueue.text("replace"),
        claim_any: claim.template("claim_any"),
        claim_types: claim.template("claim_types"),
        optimistic_claim_any: claim.template("optimistic_claim_any"),
        optimistic_claim_types: claim.template("optimistic_claim_types"),
    };
    let bulk_statements = Bulk {
        chunk: 2_000,
        insert: bulk.template("insert"),
        replace: bulk.template("replace"),
        find_occupants: bulk.template("find_occupants"),
        // No locks to avoid: the same read.
        find_occupants_after_own_insert: bulk.template("find_occupants"),
        by_ids: bulk.template("by_ids"),
    };
    let ending_statements = Endings {
        complete: endings.template("complete"),
        fail: endings.template("fail"),
        retry: endings.template("retry"),
    };
    let lock_free = LockFree {
        window_claim: limits.text("window_claim"),
        optimistic_window_claim: limits.text("optimistic_window_claim"),
    };
    let limit_statements = Limits::read(&mut limits);
    let admin_statements = Admin::read(&mut admin);
    Sql {
        statements,
        returning,
        bulk: bulk_statements,
        endings: ending_statements,
        admin: admin_statements,
        limits: limit_statements,
        lock_free,
        guard: schema.text("guard"),
        problems: [
            enqueue,
            claim,
            lifecycle,
            endings,
            bulk,
            limits,
            admin,
            maintenance,
            schema,
        ]
        .into_iter()
        .flat_map(File::finish)
        .collect(),
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
