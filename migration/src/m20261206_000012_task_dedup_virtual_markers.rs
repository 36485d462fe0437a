//! MySQL/MariaDB: the generated columns behind the unique indexes (`occupied`, step 4;
//! `running_slot`, step 5) become VIRTUAL instead of STORED. Nothing on PostgreSQL and
//! SQLite (partial indexes, no such columns).
//!
//! Why: a STORED generated column can only be added by copying the table
//! (`ALGORITHM=COPY`, writes wait), so an upgrade of a big live table stopped writes for
//! minutes at each of them. A VIRTUAL one is added `ALGORITHM=INSTANT` and its index
//! built `INPLACE, LOCK=NONE`: with this step among the pending ones,
//! [`online`](crate::online) adds them VIRTUAL from the start and this step finds
//! nothing to do. The unique indexes read the value from the index either way (InnoDB
//! stores an indexed virtual column's value in the index), so what they enforce is
//! unchanged.
//!
//! A table that has them STORED (an install past step 5 before this step existed) is
//! converted by one `ALTER TABLE`: a table copy (`ALGORITHM=COPY, LOCK=SHARED`: reads go
//! on, writes wait), since InnoDB cannot turn a STORED column VIRTUAL in place. Each
//! column is dropped and added again at its place, and the three unique indexes are
//! dropped and added again in their order, in the same statement: the table never lacks
//! them, and `SHOW CREATE TABLE` reads the same whichever way the table got here.
//!
//! Frozen once released: this file states its DDL per dialect and never changes.
//!
//! Idempotent (converts only STORED columns), so it also runs after
//! [`ensure_schema`](crate::ensure_schema).

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::Statement;

use crate::sql::{self, Dialect};

/// Makes `occupied` and `running_slot` VIRTUAL on MySQL/MariaDB.
#[derive(DeriveMigrationName)]
pub struct Migration;

/// `occupied`, VIRTUAL: the definition of step 4 otherwise.
pub(crate) const MYSQL_OCCUPIED: &str = "occupied tinyint GENERATED ALWAYS AS \
    (CASE WHEN ((scope = 'active' AND status IN ('queued', 'running')) \
    OR (scope = 'queued' AND status = 'queued') OR scope = 'period') THEN 1 END) VIRTUAL";
/// `running_slot`, VIRTUAL: the definition of step 5 otherwise.
pub(crate) const MYSQL_RUNNING_SLOT: &str = "running_slot tinyint GENERATED ALWAYS AS \
    (CASE WHEN (status = 'running' AND NOT concurrent) THEN 1 END) VIRTUAL";

/// Each column with the column it follows.
const MYSQL_COLUMNS: [(&str, &str, &str); 2] = [
    ("occupied", MYSQL_OCCUPIED, "dedup_window_end"),
    ("running_slot", MYSQL_RUNNING_SLOT, "concurrent"),
];
/// The unique indexes, in the order the migrations create them.
const MYSQL_UNIQUE_INDEXES: [(&str, &str); 3] = [
    (
        "task_active_resource_uidx",
        "(user_id, task_type, resource_key, dedup_window_end, occupied)",
    ),
    (
        "task_running_resource_uidx",
        "(user_id, task_type, resource_key, running_slot)",
    ),
    ("task_run_slot_uidx", "(task_type, running_run_slot)"),
];

/// `task_run`'s generated columns of `MYSQL_COLUMNS` that are STORED (MariaDB says
/// `STORED GENERATED`, older releases `PERSISTENT GENERATED`; MySQL `STORED GENERATED`).
const MYSQL_STORED: &str = "SELECT CAST(COLUMN_NAME AS CHAR) AS name \
    FROM information_schema.COLUMNS \
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'task_run' \
    AND COLUMN_NAME IN ('occupied', 'running_slot') \
    AND (EXTRA LIKE 'STORED%' OR EXTRA LIKE 'PERSISTENT%') ORDER BY ORDINAL_POSITION";

/// The one `ALTER TABLE` that makes `columns` (of `occupied`, `running_slot`) `storage`
/// (`VIRTUAL` or `STORED`), keeping each column's place and the unique indexes' order.
pub(crate) fn mysql_conversion(columns: &[String], storage: &str) -> String {
    let mut parts: Vec<String> = MYSQL_UNIQUE_INDEXES
        .iter()
        .map(|(name, _)| format!("DROP INDEX {name}"))
        .collect();
    for (column, definition, after) in MYSQL_COLUMNS {
        if columns.iter().any(|c| c == column) {
            let definition = definition.replace(" VIRTUAL", &format!(" {storage}"));
            parts.push(format!("DROP COLUMN {column}"));
            parts.push(format!("ADD COLUMN {definition} AFTER {after}"));
        }
    }
    for (name, columns) in MYSQL_UNIQUE_INDEXES {
        parts.push(format!("ADD UNIQUE INDEX {name} {columns}"));
    }
    format!("ALTER TABLE task_run {}", parts.join(", "))
}

/// The STORED ones of `occupied` and `running_slot` (MySQL/MariaDB).
pub(crate) async fn mysql_stored_columns(
    manager: &SchemaManager<'_>,
) -> Result<Vec<String>, DbErr> {
    let rows = manager
        .get_connection()
        .query_all_raw(Statement::from_string(
            manager.get_database_backend(),
            MYSQL_STORED,
        ))
        .await?;
    rows.iter().map(|row| row.try_get("", "name")).collect()
}

/// The generated columns of `MYSQL_COLUMNS` the table has (by name).
async fn mysql_generated(manager: &SchemaManager<'_>) -> Result<Vec<String>, DbErr> {
    let mut found = Vec::new();
    for (column, _, _) in MYSQL_COLUMNS {
        if manager.has_column("task_run", column).await? {
            found.push(column.to_owned());
        }
    }
    Ok(found)
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if Dialect::of(manager)? != Dialect::MySql {
            return Ok(());
        }
        let stored = mysql_stored_columns(manager).await?;
        if stored.is_empty() {
            return Ok(());
        }
        sql::run(manager, &[&mysql_conversion(&stored, "VIRTUAL")]).await
    }

    /// Makes them STORED again, as steps 4 and 5 made them.
    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if Dialect::of(manager)? != Dialect::MySql {
            return Ok(());
        }
        let stored = mysql_stored_columns(manager).await?;
        let virtual_columns: Vec<String> = mysql_generated(manager)
            .await?
            .into_iter()
            .filter(|c| !stored.contains(c))
            .collect();
        if virtual_columns.is_empty() {
            return Ok(());
        }
        sql::run(manager, &[&mysql_conversion(&virtual_columns, "STORED")]).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conversion_keeps_places_and_index_order() {
        let sql = mysql_conversion(&["running_slot".to_owned()], "VIRTUAL");
        assert_eq!(
            sql,
            "ALTER TABLE task_run DROP INDEX task_active_resource_uidx, \
             DROP INDEX task_running_resource_uidx, DROP INDEX task_run_slot_uidx, \
             DROP COLUMN running_slot, ADD COLUMN running_slot tinyint GENERATED ALWAYS AS \
             (CASE WHEN (status = 'running' AND NOT concurrent) THEN 1 END) VIRTUAL \
             AFTER concurrent, \
             ADD UNIQUE INDEX task_active_resource_uidx \
             (user_id, task_type, resource_key, dedup_window_end, occupied), \
             ADD UNIQUE INDEX task_running_resource_uidx \
             (user_id, task_type, resource_key, running_slot), \
             ADD UNIQUE INDEX task_run_slot_uidx (task_type, running_run_slot)"
        );
        let back = mysql_conversion(&["occupied".to_owned()], "STORED");
        assert!(
            back.contains("THEN 1 END) STORED AFTER dedup_window_end"),
            "{back}"
        );
    }
}
