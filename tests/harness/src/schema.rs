//! The schema of `task_run` as the database itself describes it, one line per column,
//! index and constraint, for snapshot tests that pin what each migration step leaves.

use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};
use sea_orm_migration::SchemaManager;

use crate::{Dialect, TestDb};

/// The catalog's description of `task_run` on `db`; empty when the table does not exist.
///
/// SQLite: the DDL text `sqlite_master` keeps. PostgreSQL: each column's type, length,
/// precision, nullability and default, every index definition and every constraint.
/// MySQL/MariaDB: `SHOW CREATE TABLE`. Then `task_dedup_paused` (step 6 on) and
/// `task_dedup_limits` (step 11 on), the same way.
pub async fn describe(db: &DatabaseConnection, dialect: Dialect) -> String {
    let mut described = describe_task_run(db, dialect).await;
    // (table, the prefix of its lines): the paused types (step 6 on), the limits (11 on).
    for (table, prefix) in [
        ("task_dedup_paused", "paused"),
        ("task_dedup_limits", "limits"),
    ] {
        let exists = SchemaManager::new(db)
            .has_table(table)
            .await
            .expect("has_table");
        if !exists {
            continue;
        }
        let sql = match dialect {
            Dialect::Sqlite => format!(
                "SELECT type || ' ' || name || ': ' || COALESCE(sql, '') AS line \
                 FROM sqlite_master WHERE tbl_name = '{table}' ORDER BY type, name"
            ),
            Dialect::Postgres => format!(
                "SELECT '{prefix} column ' || lpad(ordinal_position::text, 2, '0') || ' ' \
                        || column_name || ' ' || udt_name \
                        || COALESCE('(' || character_maximum_length || ')', '') \
                        || COALESCE(' precision ' || datetime_precision, '') \
                        || CASE is_nullable WHEN 'YES' THEN ' null' ELSE ' not null' END \
                        || COALESCE(' default ' || column_default, '') AS line \
                 FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = '{table}' \
                 UNION ALL SELECT '{prefix} index ' || indexdef FROM pg_indexes \
                 WHERE schemaname = current_schema() AND tablename = '{table}' \
                 ORDER BY 1"
            ),
            Dialect::MySql => format!("SHOW CREATE TABLE {table}"),
        };
        described.push('\n');
        described.push_str(&lines(db, dialect, &sql).await);
    }
    described
}

async fn describe_task_run(db: &DatabaseConnection, dialect: Dialect) -> String {
    let has_table = SchemaManager::new(db)
        .has_table("task_run")
        .await
        .expect("has_table");
    if !has_table {
        return String::new();
    }
    let sql = match dialect {
        Dialect::Sqlite => {
            "SELECT type || ' ' || name || ': ' || COALESCE(sql, '') AS line FROM sqlite_master \
             WHERE tbl_name = 'task_run' ORDER BY type, name"
        }
        Dialect::Postgres => {
            "SELECT 'column ' || lpad(ordinal_position::text, 2, '0') || ' ' || column_name \
                    || ' ' || udt_name \
                    || COALESCE('(' || character_maximum_length || ')', '') \
                    || COALESCE(' precision ' || datetime_precision, '') \
                    || CASE is_nullable WHEN 'YES' THEN ' null' ELSE ' not null' END \
                    || COALESCE(' default ' || column_default, '') \
                    || CASE is_generated WHEN 'ALWAYS' \
                       THEN ' generated ' || generation_expression ELSE '' END AS line \
             FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name = 'task_run' \
             UNION ALL SELECT 'index ' || indexdef FROM pg_indexes \
             WHERE schemaname = current_schema() AND tablename = 'task_run' \
             UNION ALL SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid) \
             FROM pg_constraint WHERE conrelid = 'task_run'::regclass AND contype <> 'n' \
             UNION ALL SELECT 'trigger ' || pg_get_triggerdef(oid) FROM pg_trigger \
             WHERE tgrelid = 'task_run'::regclass AND NOT tgisinternal \
             UNION ALL SELECT 'storage ' || array_to_string(reloptions, ', ') FROM pg_class \
             WHERE oid = 'task_run'::regclass AND reloptions IS NOT NULL \
             UNION ALL SELECT 'function ' || p.proname || ' ' || p.prosrc \
             FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = current_schema() AND p.proname LIKE 'task_dedup%' \
             ORDER BY 1"
        }
        Dialect::MySql => "SHOW CREATE TABLE task_run",
    };
    lines(db, dialect, sql).await
}

/// The rows of `sql` (one `line` each; MySQL: the second column), one per line.
async fn lines(db: &DatabaseConnection, dialect: Dialect, sql: &str) -> String {
    let rows = db
        .query_all_raw(Statement::from_string(dialect.backend(), sql))
        .await
        .expect("schema query");
    let lines: Vec<String> = rows
        .iter()
        .map(|row| match dialect {
            Dialect::MySql => row
                .try_get_by_index::<String>(1)
                .expect("create table text"),
            _ => row.try_get::<String>("", "line").expect("schema line"),
        })
        .collect();
    lines.join("\n")
}

/// A `task_run` made by hand before the migrations existed: no unique index, none of the
/// lease columns and, on MySQL/MariaDB, key columns with the default case-insensitive
/// collation.
pub async fn create_legacy_table(db: &TestDb) {
    let (uuid, json, time) = match db.dialect {
        Dialect::Sqlite => ("uuid_text", "json_text", "timestamp_with_timezone_text"),
        Dialect::Postgres => ("uuid", "jsonb", "timestamptz"),
        Dialect::MySql => ("binary(16)", "json", "datetime(6)"),
    };
    // MySQL/MariaDB: the character set a table made by hand most likely has, whatever
    // the server's default.
    let charset = match db.dialect {
        Dialect::MySql => " DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci",
        Dialect::Sqlite | Dialect::Postgres => "",
    };
    db.exec(&format!(
        "CREATE TABLE task_run (
            id {uuid} NOT NULL PRIMARY KEY,
            user_id varchar(64) NOT NULL,
            task_type varchar(64) NOT NULL,
            resource_key varchar(255) NOT NULL,
            status varchar(16) NOT NULL,
            payload {json},
            result {json},
            error text,
            attempts integer NOT NULL DEFAULT 0,
            created_at {time} NOT NULL,
            updated_at {time} NOT NULL
        ){charset}"
    ))
    .await;
    db.exec("CREATE INDEX legacy_status_idx ON task_run (status)")
        .await;
}
